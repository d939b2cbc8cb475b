//! `goodput bench`: a load generator for OpenAI-compatible servers in the manner of
//! `vllm bench serve`, measuring from the client side: TTFT, TPOT, ITL and e2e latency, request
//! and token throughput, goodput against `--goodput` SLOs, and optionally the perplexity of the
//! outputs under the reference model (the seed's tput-vs-ppl picture, one run per backend).
//!
//! Arrivals are open-loop (Poisson, or gamma with `--burstiness`, at `--rate`) or closed-loop
//! (`--concurrency` clients as fast as they are served); both may be combined, as in vLLM.

pub mod plot;
pub mod quality;
pub mod report;
pub mod workload;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use rand::SeedableRng;
use rand::rngs::StdRng;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::openai::{SseReader, parse_chunk, parse_response};
pub use report::{Report, SloSpec};
pub use workload::{Input, Workload};

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// What to send and how.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Base URL, e.g. http://127.0.0.1:8080.
    pub target: String,
    /// `chat` (/v1/chat/completions) or `completions` (/v1/completions).
    pub chat: bool,
    pub model: String,
    pub stream: bool,
    /// Requests per second; `None`: as fast as the concurrency allows.
    pub rate: Option<f64>,
    /// Gamma shape of the inter-arrival times: 1 = Poisson, < 1 burstier, > 1 more regular.
    pub burstiness: f64,
    /// Requests in flight at most; `None`: unbounded (open loop only).
    pub concurrency: Option<usize>,
    pub num_requests: usize,
    pub ignore_eos: bool,
    pub timeout: Duration,
    pub seed: u64,
    /// Print a progress line every second on stderr.
    pub progress: bool,
    /// Keep the outputs (for scoring); otherwise they are dropped as they arrive.
    pub keep_text: bool,
    /// Extra headers (e.g. authorization, x-class).
    pub headers: Vec<(http::HeaderName, http::HeaderValue)>,
}

/// One request as the client saw it.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    pub ok: bool,
    pub error: Option<String>,
    /// Seconds since the run started at which it was sent.
    pub sent_at: f64,
    pub ttft: Option<f64>,
    /// Gaps between content-bearing chunks, seconds.
    pub itl: Vec<f64>,
    pub e2e: f64,
    pub prompt_tokens: u64,
    pub output_tokens: u64,
    /// Chosen from `usage` when the server reports it, else content chunks.
    pub tokens_from_usage: bool,
    pub text: Option<String>,
    /// The request body (kept with the text, for scoring).
    pub request: Option<Bytes>,
}

impl Sample {
    /// (e2e - TTFT) / (output tokens - 1), as vllm bench serve defines TPOT.
    pub fn tpot(&self) -> Option<f64> {
        let ttft = self.ttft?;
        (self.ok && self.output_tokens > 1).then(|| (self.e2e - ttft) / (self.output_tokens - 1) as f64)
    }
}

/// Inter-arrival times: gamma(shape = burstiness, scale = 1 / (rate x burstiness)), whose mean
/// is 1 / rate; shape 1 is the exponential (Poisson arrivals).
pub fn arrivals(n: usize, rate: f64, burstiness: f64, seed: u64) -> Vec<f64> {
    use rand_distr::{Distribution, Gamma};
    let mut rng = StdRng::seed_from_u64(seed);
    let g = Gamma::new(burstiness, 1.0 / (rate * burstiness)).expect("positive shape and scale");
    let mut t = 0.0;
    (0..n)
        .map(|_| {
            let at = t;
            t += g.sample(&mut rng);
            at
        })
        .collect()
}

fn body(plan: &Plan, input: &Input) -> Bytes {
    let mut v = if plan.chat {
        serde_json::json!({"model": plan.model, "messages": [{"role": "user", "content": input.prompt}]})
    } else {
        serde_json::json!({"model": plan.model, "prompt": input.prompt})
    };
    v["max_tokens"] = input.output_len.into();
    v["stream"] = plan.stream.into();
    if plan.stream {
        v["stream_options"] = serde_json::json!({"include_usage": true});
    }
    if plan.ignore_eos {
        v["ignore_eos"] = true.into();
    }
    Bytes::from(serde_json::to_vec(&v).expect("serializable"))
}

async fn one(client: &HttpClient, plan: &Plan, uri: &http::Uri, payload: Bytes, t_run: Instant) -> Sample {
    let mut s = Sample { sent_at: t_run.elapsed().as_secs_f64(), ..Default::default() };
    let mut req = http::Request::post(uri.clone())
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(payload.clone()))
        .expect("valid request");
    for (k, v) in &plan.headers {
        req.headers_mut().insert(k.clone(), v.clone());
    }
    let t0 = Instant::now();
    let fail = |mut s: Sample, e: String| {
        s.e2e = t0.elapsed().as_secs_f64();
        s.error = Some(e);
        s
    };
    let resp = match tokio::time::timeout(plan.timeout, client.request(req)).await {
        Err(_) => return fail(s, format!("no response within {:?}", plan.timeout)),
        Ok(Err(e)) => return fail(s, format!("request failed: {e}")),
        Ok(Ok(r)) => r,
    };
    let status = resp.status();
    let mut body = resp.into_body();
    let mut sse = SseReader::new(16 * 1024 * 1024);
    let mut whole = Vec::new();
    let mut last_content: Option<Instant> = None;
    let mut chunks = 0u64;
    let mut text = String::new();
    let deadline = t0 + plan.timeout;
    loop {
        let frame = match tokio::time::timeout_at(deadline.into(), body.frame()).await {
            Err(_) => return fail(s, format!("response not finished within {:?}", plan.timeout)),
            Ok(None) => break,
            Ok(Some(Err(e))) => return fail(s, format!("response cut: {e}")),
            Ok(Some(Ok(f))) => f,
        };
        let Ok(data) = frame.into_data() else { continue };
        let now = Instant::now();
        if !(plan.stream && status.is_success()) {
            whole.extend_from_slice(&data);
            continue;
        }
        sse.feed(&data, |ev| {
            if ev.is_done() || ev.truncated {
                return;
            }
            let Some(c) = parse_chunk(ev.data, plan.keep_text) else { return };
            if c.content {
                match last_content {
                    None => s.ttft = Some(now.duration_since(t0).as_secs_f64()),
                    Some(prev) => s.itl.push(now.duration_since(prev).as_secs_f64()),
                }
                last_content = Some(now);
                chunks += u64::from(c.content_choices);
                if plan.keep_text {
                    for (i, t) in &c.texts {
                        if *i == 0 {
                            text.push_str(t);
                        }
                    }
                }
            }
            if let Some(u) = c.usage {
                s.prompt_tokens = u.prompt_tokens.unwrap_or(0);
                if let Some(n) = u.completion_tokens {
                    s.output_tokens = n;
                    s.tokens_from_usage = true;
                }
            }
        });
    }
    s.e2e = t0.elapsed().as_secs_f64();
    if !status.is_success() {
        let msg = String::from_utf8_lossy(&whole[..whole.len().min(300)]).into_owned();
        return fail(s, format!("HTTP {status}: {msg}"));
    }
    if plan.stream {
        if !s.tokens_from_usage {
            s.output_tokens = chunks;
        }
    } else {
        // A non-streaming answer arrives whole: its first token reaches the client with it.
        s.ttft = Some(s.e2e);
        match parse_response(&whole, plan.keep_text) {
            Some(c) => {
                if let Some(u) = c.usage {
                    s.prompt_tokens = u.prompt_tokens.unwrap_or(0);
                    s.output_tokens = u.completion_tokens.unwrap_or(0);
                    s.tokens_from_usage = u.completion_tokens.is_some();
                }
                if plan.keep_text {
                    text = c.texts.iter().filter(|(i, _)| *i == 0).map(|(_, t)| t.as_ref()).collect();
                }
            }
            None => return fail(s, "the response is not OpenAI JSON".into()),
        }
    }
    s.ok = true;
    if plan.keep_text {
        s.text = Some(text);
        s.request = Some(payload);
    }
    s
}

/// Run the workload; returns every request's sample (in completion order) and the run's
/// wall time in seconds.
pub async fn run(plan: &Plan, work: &Workload) -> Result<(Vec<Sample>, f64), String> {
    let path = if plan.chat { "/v1/chat/completions" } else { "/v1/completions" };
    let uri: http::Uri = format!("{}{path}", plan.target.trim_end_matches('/'))
        .parse()
        .map_err(|e| format!("--target {}: {e}", plan.target))?;
    if uri.scheme_str() != Some("http") {
        return Err(format!("--target {}: only http:// is supported", plan.target));
    }
    if plan.rate.is_none() && plan.concurrency.is_none() {
        return Err("give --rate, --concurrency or both".into());
    }
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: HttpClient = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(4096)
        .pool_timer(TokioTimer::new())
        .timer(TokioTimer::new())
        .build(connector);
    let schedule = match plan.rate {
        Some(r) => arrivals(plan.num_requests, r, plan.burstiness, plan.seed),
        None => vec![0.0; plan.num_requests],
    };
    let permits = Arc::new(tokio::sync::Semaphore::new(
        plan.concurrency.unwrap_or(tokio::sync::Semaphore::MAX_PERMITS),
    ));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Sample>();
    let done = Arc::new(AtomicU64::new(0));
    let t_run = Instant::now();
    let progress = plan.progress.then(|| {
        let done = done.clone();
        let n = plan.num_requests;
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let d = done.load(Ordering::Relaxed);
                let secs = t_run.elapsed().as_secs_f64();
                eprintln!("[{secs:6.1} s] {d}/{n} done, {:.1} req/s", d as f64 / secs);
            }
        })
    });
    let sender = {
        let plan = Arc::new(plan.clone());
        let inputs: Vec<Bytes> =
            (0..plan.num_requests).map(|i| body(&plan, &work.inputs[i % work.inputs.len()])).collect();
        let (client, uri, done) = (client.clone(), uri.clone(), done.clone());
        tokio::spawn(async move {
            for (payload, at) in inputs.into_iter().zip(schedule) {
                let due = t_run + Duration::from_secs_f64(at);
                tokio::time::sleep_until(due.into()).await;
                // Closed loop: wait for a free client (the arrival is late then, as in vLLM).
                let permit = permits.clone().acquire_owned().await.expect("semaphore open");
                let (client, plan, uri, tx, done) =
                    (client.clone(), plan.clone(), uri.clone(), tx.clone(), done.clone());
                tokio::spawn(async move {
                    let s = one(&client, &plan, &uri, payload, t_run).await;
                    drop(permit);
                    done.fetch_add(1, Ordering::Relaxed);
                    let _ = tx.send(s);
                });
            }
        })
    };
    let mut samples = Vec::with_capacity(plan.num_requests);
    while samples.len() < plan.num_requests {
        match rx.recv().await {
            Some(s) => samples.push(s),
            None => break,
        }
    }
    let wall = t_run.elapsed().as_secs_f64();
    sender.abort();
    if let Some(p) = progress {
        p.abort();
    }
    Ok((samples, wall))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrivals_have_the_rate_and_the_burstiness() {
        let n = 20_000;
        let cv = |b: f64| {
            let t = arrivals(n, 50.0, b, 1);
            let gaps: Vec<f64> = t.windows(2).map(|w| w[1] - w[0]).collect();
            let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
            let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
            assert!((mean - 0.02).abs() < 0.001, "mean gap {mean}");
            var.sqrt() / mean
        };
        // The gamma's coefficient of variation is 1 / sqrt(shape): 1 for Poisson.
        assert!((cv(1.0) - 1.0).abs() < 0.05);
        assert!((cv(0.25) - 2.0).abs() < 0.15);
        assert!((cv(4.0) - 0.5).abs() < 0.05);
        assert_eq!(arrivals(5, 10.0, 1.0, 7), arrivals(5, 10.0, 1.0, 7));
    }

    #[test]
    fn tpot_as_vllm_defines_it() {
        let s = Sample { ok: true, ttft: Some(0.1), e2e: 1.1, output_tokens: 11, ..Default::default() };
        assert!((s.tpot().unwrap() - 0.1).abs() < 1e-12);
        assert_eq!(Sample { output_tokens: 1, ..s.clone() }.tpot(), None);
    }
}
