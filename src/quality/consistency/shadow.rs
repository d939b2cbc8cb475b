//! Shadow re-sampling and the checks that use it. Shadow requests go straight to the backend
//! (not through the proxy's listener), carry `x-goodput-shadow: 1`, have their own metrics
//! (`goodput_shadow_*`) and run under a budget: a share of the user traffic's tokens and a cap
//! on concurrent requests. They never hold up user requests (their own connection pool, bounded
//! concurrency, optional vLLM `priority`) and are aborted on shutdown, which closes their
//! connections so that the server stops generating.

use bytes::Bytes;
use http::{Request, header};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Semaphore, mpsc, watch};

use super::{ngram, text};
use crate::config::reload::ResolvedBackend;
use crate::config::{ConfigHandle, ConsistencyConfig, Method, Resample};
use crate::meter::metrics::Metrics;
use crate::openai::Operation;
use crate::openai::response::parse_response;
use crate::quality::budget::CpuBudget;
use crate::quality::embed::{Embedder, bertscore_like};
use crate::quality::lm::LmError;
use crate::quality::{QualityEvent, Subject};

/// Marks a shadow request for the backend's logs and for any proxy in between.
pub const SHADOW_HEADER: &str = "x-goodput-shadow";

/// One sampled response to check: the request as the client sent it and choice 0's text. User
/// data, held in memory only until checked, never logged.
pub struct ConsistencyJob {
    pub of: Subject,
    pub operation: Operation,
    pub request: Bytes,
    pub response: String,
    /// Tokens of the original request: the basis of the cost estimate.
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

/// Numbers only.
#[derive(Debug, Clone)]
pub struct ConsistencyResult {
    pub of: Subject,
    /// The first configured method, which `score` is from.
    pub method: Method,
    /// In [0, 1], from the first configured method: the mean of the sentence scores. Whether
    /// it makes the response count as hallucinated is the recorder's call
    /// (`quality::calibration`).
    pub score: f64,
    pub sentence_scores: Vec<f64>,
    /// Every method's response score in [0, 1].
    pub method_scores: Vec<(Method, f64)>,
    pub samples: usize,
}

#[derive(Clone)]
pub struct Checker {
    tx: mpsc::Sender<ConsistencyJob>,
    cancel: watch::Sender<bool>,
    metrics: Metrics,
    user_tokens: Arc<AtomicU64>,
}

impl Checker {
    /// Start the engine task on the current tokio runtime.
    /// Start the engine task on the current tokio runtime. `embedder` is required by the
    /// `embedding` method (load it with `Embedder::load`, off the async runtime).
    pub fn start(
        cfg: ConsistencyConfig,
        config: Arc<ConfigHandle>,
        metrics: Metrics,
        results: std::sync::mpsc::Sender<QualityEvent>,
        embedder: Option<Embedder>,
        connector: crate::tls::Connector,
        budget: Arc<CpuBudget>,
    ) -> Checker {
        let (tx, rx) = mpsc::channel(cfg.queue_capacity);
        let (cancel, cancelled) = watch::channel(false);
        let user_tokens = Arc::new(AtomicU64::new(0));
        let pool_idle = Duration::from_millis(config.load().config.timeouts.pool_idle_ms);
        let client = crate::tls::client_builder(pool_idle).build(connector);
        let engine = Engine {
            permits: Arc::new(Semaphore::new(cfg.max_concurrent)),
            cfg: Arc::new(cfg),
            config,
            metrics: metrics.clone(),
            client,
            results,
            user_tokens: user_tokens.clone(),
            shadow_tokens: Arc::new(AtomicU64::new(0)),
            reserved: Arc::new(AtomicU64::new(0)),
            embedder: embedder.map(|e| EmbedWorker::start(e, budget, &metrics)),
            honours_n: Mutex::new(HashMap::new()),
        };
        tokio::spawn(engine.run(rx, cancelled));
        Checker { tx, cancel, metrics, user_tokens }
    }

    /// Count a finished user request's tokens toward the shadow budget.
    pub fn note_user_tokens(&self, n: u64) {
        self.user_tokens.fetch_add(n, Ordering::Relaxed);
    }

    /// Queue a check; never blocks.
    pub fn offer(&self, job: ConsistencyJob) {
        if self.tx.try_send(job).is_err() {
            self.metrics.shadow_skipped.with_label_values(&["queue_full"]).inc();
        }
    }

    /// Abort every check in flight (shutdown).
    pub fn cancel(&self) {
        let _ = self.cancel.send(true);
    }
}

struct Engine {
    cfg: Arc<ConsistencyConfig>,
    config: Arc<ConfigHandle>,
    metrics: Metrics,
    client: Client<crate::tls::Connector, Full<Bytes>>,
    results: std::sync::mpsc::Sender<QualityEvent>,
    permits: Arc<Semaphore>,
    user_tokens: Arc<AtomicU64>,
    shadow_tokens: Arc<AtomicU64>,
    /// Estimated cost of the checks in flight, held against the budget until they end.
    reserved: Arc<AtomicU64>,
    /// The embedding session's own thread (SCHED_IDLE, like the perplexity scorer's).
    embedder: Option<EmbedWorker>,
    /// Per backend name, whether it answered `n: K` with K choices (`resample: auto`).
    honours_n: Mutex<HashMap<String, bool>>,
}

/// Why a shadow request gave no text: the upstream's status, when it answered one.
#[derive(Debug)]
struct CallFailed(Option<http::StatusCode>);

type EmbedTask = (Vec<String>, Vec<String>, tokio::sync::oneshot::Sender<Result<Vec<f64>, LmError>>);

/// A thread that owns the embedding session and scores (sentences, samples) pairs in turn, at
/// idle priority (the proxy's threads preempt it whenever they wake) and within the scorers'
/// shared CPU budget.
struct EmbedWorker {
    tx: std::sync::mpsc::Sender<EmbedTask>,
    budget: Arc<CpuBudget>,
}

impl EmbedWorker {
    fn start(mut e: Embedder, budget: Arc<CpuBudget>, metrics: &Metrics) -> EmbedWorker {
        let (tx, rx) = std::sync::mpsc::channel::<EmbedTask>();
        let (paced, cpu_used) = (budget.clone(), metrics.scoring_cpu.with_label_values(&["embedding"]));
        let threads = e.intra_op_threads();
        let spawned = std::thread::Builder::new().name("goodput-embed".into()).spawn(move || {
            crate::quality::scorer::lower_priority();
            for (sentences, samples, reply) in rx {
                paced.wait();
                let run = || -> Result<Vec<f64>, LmError> {
                    let refs: Vec<&str> = sentences.iter().map(String::as_str).collect();
                    let sent_vecs = e.embed(&refs)?;
                    let mut sample_vecs = Vec::with_capacity(samples.len());
                    for sample in &samples {
                        sample_vecs.push(e.embed(&text::sentences(sample))?);
                    }
                    Ok(bertscore_like(&sent_vecs, &sample_vecs))
                };
                let _ = reply.send(paced.spend(threads, &cpu_used, run));
            }
        });
        if let Err(err) = spawned {
            tracing::error!(%err, "cannot start the embedding thread");
        }
        EmbedWorker { tx, budget }
    }

    async fn score(&self, sentences: Vec<String>, samples: Vec<String>) -> Result<Vec<f64>, LmError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.tx.send((sentences, samples, tx)).map_err(|_| LmError("embedding thread gone".into()))?;
        rx.await.map_err(|_| LmError("embedding thread gone".into()))?
    }
}

impl Engine {
    async fn run(self, mut rx: mpsc::Receiver<ConsistencyJob>, mut cancelled: watch::Receiver<bool>) {
        let this = Arc::new(self);
        let mut checks = tokio::task::JoinSet::new();
        loop {
            tokio::select! {
                job = rx.recv() => {
                    let Some(job) = job else { break };
                    // Re-samples whose embeddings would wait out the CPU budget are not drawn.
                    if this.embedder.as_ref().is_some_and(|e| !e.budget.available()) {
                        this.metrics.shadow_skipped.with_label_values(&["cpu_budget"]).inc();
                        continue;
                    }
                    let estimate = this.estimate(&job);
                    let budget = this.user_tokens.load(Ordering::Relaxed) as f64 * this.cfg.max_token_share;
                    let committed = this.shadow_tokens.load(Ordering::Relaxed) + this.reserved.load(Ordering::Relaxed);
                    if (committed + estimate) as f64 > budget {
                        this.metrics.shadow_skipped.with_label_values(&["token_budget"]).inc();
                        continue;
                    }
                    this.reserved.fetch_add(estimate, Ordering::Relaxed);
                    let t = this.clone();
                    checks.spawn(async move {
                        t.clone().check(job).await;
                        t.reserved.fetch_sub(estimate, Ordering::Relaxed);
                    });
                }
                Some(_) = checks.join_next(), if !checks.is_empty() => {}
                _ = cancelled.changed() => break,
            }
        }
        // Dropping the requests closes their connections: the server aborts the generations.
        let n = checks.len();
        checks.abort_all();
        if n > 0 {
            tracing::info!(checks = n, "consistency checks cancelled at shutdown");
            this.metrics.shadow_skipped.with_label_values(&["shutdown"]).inc_by(n as u64);
        }
    }

    /// An upper bound on a check's upstream tokens when the server honours max_tokens: K
    /// re-samples of the prompt with at most the shadow max_tokens each, and for `prompt` one
    /// judge call per (sentence, sample) holding a sample and a sentence.
    fn estimate(&self, job: &ConsistencyJob) -> u64 {
        let c = &self.cfg;
        let out = shadow_max_tokens(&job.request, c);
        // With `n`, the prompt is counted once.
        let prompts = if self.uses_n(&job.of.backend) == Some(true) { 1 } else { c.samples as u64 };
        let samples = prompts * job.prompt_tokens + c.samples as u64 * out;
        let judge = if c.methods.contains(&Method::Prompt) {
            (c.samples * c.max_sentences) as u64 * (out + job.completion_tokens + 64)
        } else {
            0
        };
        samples + judge
    }

    /// One check: re-sample, split the response into sentences, score them by each configured
    /// method, report. A check that cannot be made is counted as skipped or failed.
    async fn check(self: Arc<Self>, job: ConsistencyJob) {
        let snap = self.config.load_full();
        let Some(backend) = snap.backends.iter().find(|b| b.name == job.of.backend).cloned() else { return };
        let Ok(request) = serde_json::from_slice::<Map<String, Value>>(&job.request) else {
            self.metrics.shadow_skipped.with_label_values(&["bad_request"]).inc();
            return;
        };
        let path = match job.operation {
            Operation::Chat => "/v1/chat/completions",
            Operation::Completion => "/v1/completions",
        };
        let samples = self.resample(&backend, &job.of.endpoint, path, &job.request).await;
        if samples.is_empty() {
            self.metrics.consistency_failed.inc();
            return;
        }
        let sentences: Vec<String> = text::sentences(&job.response).into_iter().map(str::to_string).collect();
        if sentences.is_empty() {
            self.metrics.shadow_skipped.with_label_values(&["nothing_to_check"]).inc();
            return;
        }
        let mut per_method: Vec<(Method, Vec<f64>)> = Vec::new();
        for &m in &self.cfg.methods {
            let scores = match m {
                Method::Unigram => unigram(&sentences, &job.response, &samples).await,
                Method::Embedding => self.embedding(&sentences, &samples).await,
                Method::Prompt => {
                    let judge = self
                        .cfg
                        .judge_backend
                        .as_ref()
                        .and_then(|j| snap.backends.iter().find(|b| &*b.name == j.as_str()));
                    let model = judge_model(self.cfg.judge_model.as_deref(), &request, &job.of.model);
                    Some(self.ask_judge(judge.unwrap_or(&backend), model, &sentences, &samples).await)
                }
            };
            if let Some(scores) = scores {
                per_method.push((m, scores));
            }
        }
        self.report(&job, per_method, samples.len());
    }

    /// The check's score (the first method's mean over its sentences) to the recorder, and
    /// every method's to the metrics.
    fn report(&self, job: &ConsistencyJob, per_method: Vec<(Method, Vec<f64>)>, samples: usize) {
        let Some((method, primary)) = per_method.first() else { return };
        let mean = |v: &[f64]| {
            let ok: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
            (!ok.is_empty()).then(|| ok.iter().sum::<f64>() / ok.len() as f64)
        };
        let Some(score) = mean(primary) else {
            self.metrics.consistency_failed.inc();
            return;
        };
        let method_scores: Vec<(Method, f64)> =
            per_method.iter().filter_map(|(m, v)| mean(v).map(|s| (*m, s))).collect();
        let labels = job.of.labels();
        for (m, s) in &method_scores {
            self.metrics
                .consistency_score
                .with_label_values(&[labels[0], labels[1], labels[2], m.as_str()])
                .observe(*s);
        }
        self.metrics.consistency_checked.with_label_values(&labels).inc();
        let _ = self.results.send(QualityEvent::Consistency(ConsistencyResult {
            of: job.of.clone(),
            method: *method,
            score,
            sentence_scores: primary.clone(),
            method_scores,
            samples,
        }));
    }

    /// Each sentence against the samples with the sentence encoder (`None`: none configured, or
    /// it failed).
    async fn embedding(&self, sentences: &[String], samples: &[String]) -> Option<Vec<f64>> {
        let emb = self.embedder.as_ref()?;
        emb.score(sentences.to_vec(), samples.to_vec())
            .await
            .inspect_err(|e| tracing::warn!(error = %e, "embedding failed"))
            .ok()
    }

    /// SelfCheckGPT's prompt variant: `judge` answers, per sentence and sample, whether the
    /// sample supports the sentence; the sentence's score is the mean over the samples that
    /// got an answer (NaN when none did).
    async fn ask_judge(
        self: &Arc<Self>,
        judge: &Arc<ResolvedBackend>,
        model: &str,
        sentences: &[String],
        samples: &[String],
    ) -> Vec<f64> {
        let c = &self.cfg;
        let mut scores = Vec::new();
        for s in sentences.iter().take(c.max_sentences) {
            let mut calls = tokio::task::JoinSet::new();
            for sample in samples {
                let body = Bytes::from(judge_body(model, sample, s, c.priority));
                let (this, to) = (self.clone(), judge.clone());
                calls.spawn(async move {
                    let answer = this.call(&to, "", "/v1/chat/completions", body, "judge").await;
                    answer.ok().and_then(|mut choices| choices.drain(..).next())
                });
            }
            let mut sum = 0.0;
            let mut n = 0;
            while let Some(r) = calls.join_next().await {
                if let Ok(Some(answer)) = r {
                    sum += judge_answer(&answer);
                    n += 1;
                }
            }
            scores.push(if n > 0 { sum / n as f64 } else { f64::NAN });
        }
        scores
    }

    /// The K re-samples of `request` from `backend`, as `resample` says: one request with
    /// `n: K`, or K requests, or (auto, on a backend that showed it does not honour `n`) the
    /// rest of them one by one, from the endpoint that served the response while it is in the
    /// pool. Fewer than K when some failed; empty when all did.
    async fn resample(
        self: &Arc<Self>,
        backend: &Arc<ResolvedBackend>,
        endpoint: &Arc<str>,
        path: &'static str,
        request: &[u8],
    ) -> Vec<String> {
        let k = self.cfg.samples;
        let auto = self.cfg.resample == Resample::Auto;
        let mut samples = Vec::new();
        // Set when `n` was refused with a client error: only single requests that succeed
        // show that it was `n` that the backend refused.
        let mut refused = None;
        if k > 1 && self.uses_n(&backend.name) != Some(false) {
            let Some(body) = shadow_body(request, &self.cfg, k) else { return samples };
            match self.call(backend, endpoint, path, Bytes::from(body), "samples_n").await {
                Ok(choices) => {
                    let got = choices.len();
                    samples = choices;
                    if auto {
                        self.note_n(&backend.name, got >= k, || format!("it answered {got} of {k} choices"));
                    }
                }
                Err(CallFailed(Some(status))) if auto && status.is_client_error() => refused = Some(status),
                Err(_) => return samples,
            }
            if !auto || samples.len() >= k {
                samples.truncate(k);
                return samples;
            }
        }
        let Some(body) = shadow_body(request, &self.cfg, 1) else { return samples };
        let body = Bytes::from(body);
        let mut pending = tokio::task::JoinSet::new();
        for _ in samples.len()..k {
            let (this, to, body, ep) = (self.clone(), backend.clone(), body.clone(), endpoint.clone());
            pending.spawn(async move { this.call(&to, &ep, path, body, "sample").await });
        }
        while let Some(r) = pending.join_next().await {
            if let Ok(Ok(mut choices)) = r
                && let Some(text) = choices.drain(..).next()
            {
                samples.push(text);
            }
        }
        if let Some(status) = refused
            && !samples.is_empty()
        {
            self.note_n(&backend.name, false, || format!("it answered {status} to `n`"));
        }
        samples
    }

    /// Whether re-samples to `backend` go as one request with `n`: `None` while unknown (auto).
    fn uses_n(&self, backend: &str) -> Option<bool> {
        match self.cfg.resample {
            Resample::N => Some(self.cfg.samples > 1),
            Resample::Separate => Some(false),
            Resample::Auto if self.cfg.samples <= 1 => Some(false),
            Resample::Auto => self.honours_n.lock().ok()?.get(backend).copied(),
        }
    }

    fn note_n(&self, backend: &str, honours: bool, why: impl FnOnce() -> String) {
        let Ok(mut known) = self.honours_n.lock() else { return };
        if known.insert(backend.to_string(), honours) != Some(honours) && !honours {
            tracing::info!(backend, "consistency: {}; its re-samples go as separate requests", why());
        }
    }

    /// One shadow request to `to`'s `path`: the text of each choice in index order, or why it
    /// failed (counted).
    async fn call(
        &self,
        to: &ResolvedBackend,
        endpoint: &str,
        path: &str,
        body: Bytes,
        kind: &'static str,
    ) -> Result<Vec<String>, CallFailed> {
        let permit = self.permits.acquire().await.map_err(|_| CallFailed(None))?;
        let endpoint = to.endpoint_or_any(endpoint).ok_or(CallFailed(None))?;
        let target = http::uri::PathAndQuery::try_from(path).map_err(|_| CallFailed(None))?;
        let uri = to.uri(&endpoint, &target).map_err(|_| CallFailed(None))?;
        let mut req = Request::post(uri)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::USER_AGENT, "goodput-shadow")
            // The answer is parsed, so it must come uncoded (a request that names no coding
            // lets the server choose one).
            .header(header::ACCEPT_ENCODING, "identity")
            .header(SHADOW_HEADER, "1")
            .body(Full::new(body))
            .map_err(|_| CallFailed(None))?;
        for (k, v) in &to.headers {
            req.headers_mut().insert(k.clone(), v.clone());
        }
        let backend = &*to.name;
        let timeout = Duration::from_millis(self.cfg.timeout_ms);
        let outcome = tokio::time::timeout(timeout, async {
            let resp = self.client.request(req).await.map_err(|_| ("error", None))?;
            let status = resp.status();
            let bytes = resp.into_body().collect().await.map_err(|_| ("error", None))?.to_bytes();
            if !status.is_success() {
                return Err(("error", Some(status)));
            }
            Ok(bytes)
        })
        .await
        .unwrap_or(Err(("timeout", None)));
        drop(permit);
        let bytes = match outcome {
            Ok(b) => b,
            Err((o, status)) => {
                self.metrics.shadow_requests.with_label_values(&[backend, kind, o]).inc();
                return Err(CallFailed(status));
            }
        };
        self.metrics.shadow_requests.with_label_values(&[backend, kind, "ok"]).inc();
        let info = parse_response(&bytes, true).ok_or(CallFailed(None))?;
        if let Some(u) = info.usage {
            let n = u.prompt_tokens.unwrap_or(0) + u.completion_tokens.unwrap_or(0);
            self.shadow_tokens.fetch_add(n, Ordering::Relaxed);
            for (ty, v) in [("input", u.prompt_tokens), ("output", u.completion_tokens)] {
                self.metrics.shadow_tokens.with_label_values(&[backend, kind, ty]).inc_by(v.unwrap_or(0));
            }
        }
        // A choice that generated nothing has a finish reason and no text: still a re-sample.
        let mut choices: std::collections::BTreeMap<_, String> = Default::default();
        for (i, _) in &info.finish_reasons {
            choices.entry(*i).or_default();
        }
        for (i, t) in &info.texts {
            choices.entry(*i).or_default().push_str(t);
        }
        Ok(choices.into_values().collect())
    }
}

/// Each sentence's unigram score against the samples (`None`: the blocking task failed). CPU
/// work, off the tokio workers.
async fn unigram(sentences: &[String], response: &str, samples: &[String]) -> Option<Vec<f64>> {
    let (s, resp, samp) = (sentences.to_vec(), response.to_string(), samples.to_vec());
    let n = tokio::task::spawn_blocking(move || {
        let refs: Vec<&str> = s.iter().map(String::as_str).collect();
        let samp: Vec<&str> = samp.iter().map(String::as_str).collect();
        ngram::score(&refs, &resp, &samp)
    })
    .await
    .ok()?;
    Some(n.avg_neg_logprob.iter().map(|&v| ngram::bounded(v)).collect())
}

/// The re-sample request: the client's body with temperature set, one non-streamed choice, no
/// seed (a seed would make every re-sample the same), max_tokens capped, and the optional
/// priority. `None` when the body is not a JSON object.
/// The max_tokens a re-sample of `request` gets: the client's (max_completion_tokens or
/// max_tokens) capped by the config's.
pub fn shadow_max_tokens(request: &[u8], c: &ConsistencyConfig) -> u64 {
    let v: Value = serde_json::from_slice(request).unwrap_or(Value::Null);
    let asked =
        ["max_completion_tokens", "max_tokens"].iter().find_map(|k| v.get(*k).and_then(Value::as_u64));
    asked.map_or(c.max_tokens, |a| a.min(c.max_tokens))
}

pub fn shadow_body(request: &[u8], c: &ConsistencyConfig, n: usize) -> Option<Vec<u8>> {
    let mut v: Map<String, Value> = serde_json::from_slice(request).ok()?;
    for k in ["stream", "stream_options", "seed", "n", "logprobs", "top_logprobs", "best_of"] {
        v.remove(k);
    }
    v.insert("temperature".into(), Value::from(c.temperature));
    let asked =
        ["max_completion_tokens", "max_tokens"].iter().find_map(|k| v.get(*k).and_then(Value::as_u64));
    v.remove("max_completion_tokens");
    v.insert("max_tokens".into(), Value::from(asked.map_or(c.max_tokens, |a| a.min(c.max_tokens))));
    if let Some(p) = c.priority {
        v.insert("priority".into(), Value::from(p));
    }
    if n > 1 {
        v.insert("n".into(), Value::from(n));
    }
    serde_json::to_vec(&v).ok()
}

/// The judge's model: as configured, else the one the client asked for, else the record's.
fn judge_model<'a>(
    configured: Option<&'a str>,
    request: &'a Map<String, Value>,
    recorded: &'a str,
) -> &'a str {
    configured.or_else(|| request.get("model").and_then(Value::as_str)).unwrap_or(recorded)
}

/// SelfCheck-Prompt's question, as a chat request at temperature 0.
pub fn judge_body(model: &str, sample: &str, sentence: &str, priority: Option<i64>) -> Vec<u8> {
    let prompt = format!(
        "Context: {sample}\nSentence: {sentence}\nIs the sentence supported by the context above? Answer Yes or No.\nAnswer: "
    );
    let mut v = serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": 5,
        "stream": false,
    });
    if let Some(p) = priority {
        v["priority"] = Value::from(p);
    }
    serde_json::to_vec(&v).unwrap_or_default()
}

/// Yes (supported) → 0, No → 1, anything else → 0.5 (SelfCheckGPT's post-processing: the
/// lower-cased, trimmed answer starting with "yes" or "no").
pub fn judge_answer(answer: &str) -> f64 {
    let a = answer.trim().to_lowercase();
    if a.starts_with("yes") {
        0.0
    } else if a.starts_with("no") {
        1.0
    } else {
        0.5
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_judge_model_is_the_configured_one_else_the_requests_else_the_records() {
        let req: Map<String, Value> = serde_json::from_str(r#"{"model":"asked","messages":[]}"#).unwrap();
        assert_eq!(judge_model(Some("judge"), &req, "recorded"), "judge");
        assert_eq!(judge_model(None, &req, "recorded"), "asked");
        assert_eq!(judge_model(None, &Map::new(), "recorded"), "recorded");
        let odd: Map<String, Value> = serde_json::from_str(r#"{"model":7}"#).unwrap();
        assert_eq!(judge_model(None, &odd, "recorded"), "recorded");
    }

    fn cfg() -> ConsistencyConfig {
        serde_yaml_ng::from_str("priority: 5\nmax_tokens: 64\n").unwrap()
    }

    #[test]
    fn shadow_request_rewrites_only_what_it_must() {
        let req = br#"{"model":"m","stream":true,"stream_options":{"include_usage":true},"seed":7,"n":2,"max_tokens":500,"temperature":0,"messages":[{"role":"user","content":"hi"}]}"#;
        let v: Value = serde_json::from_slice(&shadow_body(req, &cfg(), 1).unwrap()).unwrap();
        assert_eq!(v["temperature"], 1.0);
        assert_eq!(v["max_tokens"], 64);
        assert_eq!(v["priority"], 5);
        assert_eq!(v["messages"][0]["content"], "hi");
        for gone in ["stream", "stream_options", "seed", "n"] {
            assert!(v.get(gone).is_none(), "{gone}");
        }
        let small: Value =
            serde_json::from_slice(&shadow_body(br#"{"max_completion_tokens":10}"#, &cfg(), 1).unwrap())
                .unwrap();
        assert_eq!(small["max_tokens"], 10);
        assert!(shadow_body(b"[1,2]", &cfg(), 1).is_none());
        // K re-samples in one request: the client's `n` replaced by K.
        let v: Value = serde_json::from_slice(&shadow_body(req, &cfg(), 3).unwrap()).unwrap();
        assert_eq!(v["n"], 3);
    }

    #[test]
    fn judge_answers_map_like_selfcheckgpt() {
        assert_eq!(judge_answer(" Yes, it is."), 0.0);
        assert_eq!(judge_answer("no"), 1.0);
        assert_eq!(judge_answer("NO."), 1.0);
        assert_eq!(judge_answer("Maybe"), 0.5);
        assert_eq!(judge_answer(""), 0.5);
        let b: Value = serde_json::from_slice(&judge_body("m", "ctx", "s.", None)).unwrap();
        assert!(b["messages"][0]["content"].as_str().unwrap().starts_with("Context: ctx\nSentence: s.\n"));
        assert!(b.get("priority").is_none());
    }
}
