//! `RequestRecord`: one finished (or cancelled) metered request, as numbers only.

use serde::Serialize;
use std::sync::Arc;
use std::time::Duration;

use crate::openai::Operation;

/// How a metered request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    #[default]
    Ok,
    /// The upstream answered 4xx.
    ClientError,
    /// The upstream answered 5xx, or sent an error event inside a stream.
    UpstreamError,
    /// The upstream connection broke mid-response.
    UpstreamReset,
    /// The upstream could not be reached.
    ConnectError,
    Timeout,
    /// The client went away before the response ended.
    Cancelled,
    /// The proxy refused the request (e.g. 413).
    Rejected,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::ClientError => "client_error",
            Outcome::UpstreamError => "upstream_error",
            Outcome::UpstreamReset => "upstream_reset",
            Outcome::ConnectError => "connect_error",
            Outcome::Timeout => "timeout",
            Outcome::Cancelled => "cancelled",
            Outcome::Rejected => "rejected",
        }
    }

    pub fn is_error(self) -> bool {
        !matches!(self, Outcome::Ok | Outcome::Cancelled)
    }

    /// The backend failed (what the circuit breaker counts): not the client's doing.
    pub fn is_upstream_failure(self) -> bool {
        matches!(
            self,
            Outcome::UpstreamError | Outcome::UpstreamReset | Outcome::ConnectError | Outcome::Timeout
        )
    }
}

/// Where a token count came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum TokenSource {
    /// The server's `usage` object.
    Usage,
    /// Counted with the served model's tokenizer.json.
    Tokenizer,
    /// One per content-bearing chunk per choice (a lower bound when chunks carry several).
    Chunks,
    /// Not known.
    #[default]
    None,
}

impl TokenSource {
    pub fn as_str(self) -> &'static str {
        match self {
            TokenSource::Usage => "usage",
            TokenSource::Tokenizer => "tokenizer",
            TokenSource::Chunks => "chunks",
            TokenSource::None => "none",
        }
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct RequestRecord {
    pub id: u64,
    /// The client's `x-request-id`, to find the request in the client's traces and the
    /// server's log (vLLM names its request after it); absent when none was sent, or one
    /// that is not a short printable token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_id: Option<Arc<str>>,
    /// Wall-clock start, milliseconds since the Unix epoch.
    pub start_unix_ms: u64,
    pub backend: Arc<str>,
    /// The backend's endpoint that served it (`host:port`); empty when none was reached.
    pub endpoint: Arc<str>,
    pub route: Arc<str>,
    /// The SLA class the request was routed under.
    pub class: Arc<str>,
    /// The latency SLOs it is judged against (its class's, with x-slo-* header overrides);
    /// `None`: the global `slo`.
    pub slo: Option<crate::config::Slo>,
    /// Bounded label value: a configured model name, `other` or `unknown`.
    pub model: Arc<str>,
    #[serde(serialize_with = "ser_op")]
    pub operation: Operation,
    pub stream: bool,
    pub n: u32,
    pub status: u16,
    pub outcome: Outcome,
    pub finish_reason: Option<&'static str>,
    /// Streams only: first byte from the client to the first content-bearing chunk.
    #[serde(serialize_with = "ser_secs")]
    pub ttft: Option<Duration>,
    #[serde(serialize_with = "ser_secs")]
    pub tpot: Option<Duration>,
    /// Mean gap between content-bearing chunks (streams only).
    #[serde(serialize_with = "ser_secs")]
    pub itl_mean: Option<Duration>,
    #[serde(serialize_with = "ser_dur")]
    pub e2e: Duration,
    pub prompt_tokens: Option<u64>,
    pub prompt_source: TokenSource,
    pub completion_tokens: Option<u64>,
    pub completion_source: TokenSource,
    pub content_chunks: u64,
    /// Time spent in the proxy outside the upstream call.
    #[serde(serialize_with = "ser_dur")]
    pub overhead: Duration,
    /// Met every SLO; `None` when not judged (client cancellation).
    pub slo_met: Option<bool>,
    /// Perplexity and bits per byte under the reference LM, once a sampled response is scored.
    pub perplexity: Option<f64>,
    pub bits_per_byte: Option<f64>,
    /// Consistency check (SelfCheckGPT), once done: the first method's score in [0, 1] and
    /// the score of each response sentence (numbers only).
    pub hallucination_score: Option<f64>,
    pub sentence_scores: Option<Vec<f64>>,
    /// Every configured method's score, by method.
    pub consistency_scores: Option<std::collections::BTreeMap<&'static str, f64>>,
    /// The verdict, when the method gives one (a probability or a calibrated threshold).
    pub hallucinated: Option<bool>,
}

/// The user data that rides along with a record to the recorder, apart from the record's
/// numbers: the generated text (for the tokenizer count and the scorers) and, for a sampled
/// request, its body. Held in memory only until it is counted and handed to the scorers.
#[derive(Debug, Default)]
pub struct Payload {
    /// Generated text per choice.
    pub texts: Option<Vec<String>>,
    /// Sampled for scoring: the request body as the client sent it.
    pub request: Option<bytes::Bytes>,
    pub perplexity: bool,
    pub consistency: bool,
}

pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn ser_op<S: serde::Serializer>(op: &Operation, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(op.as_str())
}

fn ser_secs<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_some(&d.as_secs_f64()),
        None => s.serialize_none(),
    }
}

fn ser_dur<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

impl RequestRecord {
    /// A record at the start of a request; the proxy fills in the rest as it proceeds.
    pub fn start(id: u64, operation: Operation) -> Self {
        RequestRecord { id, start_unix_ms: unix_ms(), operation, n: 1, ..Default::default() }
    }

    /// The client's request id as the record keeps it: at most 128 printable ASCII bytes.
    pub fn client_request_id(value: Option<&http::HeaderValue>) -> Option<Arc<str>> {
        let v = value?.to_str().ok()?;
        let ok = !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic());
        ok.then(|| Arc::from(v))
    }

    /// What the SLO judgement reads of this request.
    pub fn latencies(&self) -> crate::goodput::Latencies {
        use crate::goodput::Ending;
        let ending = match self.outcome {
            Outcome::Ok => Ending::Answered,
            Outcome::Cancelled => Ending::Cancelled,
            // A 4xx is the client's request at fault (malformed, too large, an unknown model,
            // a prompt over the context length), except 429: the service had no capacity.
            Outcome::ClientError | Outcome::Rejected
                if (400..500).contains(&self.status) && self.status != 429 =>
            {
                Ending::ClientFault
            }
            _ => Ending::Failed,
        };
        crate::goodput::Latencies { ending, ttft: self.ttft, tpot: self.tpot, e2e: self.e2e }
    }

    /// TPOT as `vllm bench serve` defines it: (e2e - TTFT) / (tokens per choice - 1).
    pub fn compute_tpot(&mut self) {
        self.tpot = match (self.ttft, self.completion_tokens) {
            (Some(ttft), Some(tokens)) => {
                let per_choice = tokens / u64::from(self.n.max(1));
                (per_choice > 1 && self.e2e > ttft).then(|| {
                    Duration::from_secs_f64((self.e2e - ttft).as_secs_f64() / (per_choice - 1) as f64)
                })
            }
            _ => None,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::goodput::Ending;

    #[test]
    fn the_clients_own_errors_are_not_judged_and_capacity_refusals_miss() {
        let ending =
            |outcome, status| RequestRecord { outcome, status, ..Default::default() }.latencies().ending;
        assert_eq!(ending(Outcome::Ok, 200), Ending::Answered);
        assert_eq!(ending(Outcome::Cancelled, 200), Ending::Cancelled);
        // The upstream's 400 (e.g. vLLM's prompt over the context length), 404, 413 and 422.
        for status in [400, 404, 408, 413, 422] {
            assert_eq!(ending(Outcome::ClientError, status), Ending::ClientFault, "{status}");
        }
        // goodput's own refusal of a bad request (400 bad target, 413 body too large).
        assert_eq!(ending(Outcome::Rejected, 413), Ending::ClientFault);
        // No capacity, upstream or here: the service missed.
        assert_eq!(ending(Outcome::ClientError, 429), Ending::Failed);
        assert_eq!(ending(Outcome::Rejected, 429), Ending::Failed);
        assert_eq!(ending(Outcome::Rejected, 503), Ending::Failed);
        for outcome in
            [Outcome::UpstreamError, Outcome::UpstreamReset, Outcome::ConnectError, Outcome::Timeout]
        {
            assert_eq!(ending(outcome, 502), Ending::Failed, "{outcome:?}");
        }
    }
}
