//! A simulated OpenAI-compatible backend: a test double and a demo, never a model.
//!
//! It serves chat and legacy completions (streaming or not, `n`, usage and include_usage),
//! /v1/models and /v1/embeddings, with seeded deterministic text, configurable TTFT/TPOT
//! distributions and lengths, and injected errors and resets. Its own /metrics counts the
//! cancellations it saw: a client (or proxy) that closes the connection mid-stream.

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Either, Full, Limited};
use hyper::body::{Frame, Incoming};
use prometheus::{IntCounter, IntGauge, Registry};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// Behaviour of the simulated backend. Every field has a default, so `sim: {}` works.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SimConfig {
    /// Model name reported in responses and /v1/models.
    pub model: String,
    /// Seed of the text and timing generators; same seed and prompt give the same text.
    pub seed: u64,
    /// Median time to first token.
    pub ttft_ms: f64,
    /// Median time per output token after the first.
    pub tpot_ms: f64,
    /// Log-normal sigma applied to TTFT and each inter-token gap (0 = fixed delays).
    pub jitter: f64,
    /// Mean number of output tokens per choice.
    pub output_tokens: u32,
    /// Output length is uniform in output_tokens * [1 - spread, 1 + spread].
    pub output_tokens_spread: f64,
    /// Share of requests answered 500 before any byte of the body.
    pub error_rate: f64,
    /// Share of streams reset (connection aborted) halfway through.
    pub reset_rate: f64,
    /// Text quality. Unset: words drawn from a small vocabulary (the default text). A number
    /// in [0, 1]: the share of words taken from fixed English prose, the same for every
    /// re-sample of a prompt; the others are random letter strings that differ per request. Low
    /// quality shows as high perplexity and as re-samples that disagree.
    pub quality: Option<f64>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            model: "sim-model".into(),
            seed: 42,
            ttft_ms: 50.0,
            tpot_ms: 10.0,
            jitter: 0.0,
            output_tokens: 32,
            output_tokens_spread: 0.0,
            error_rate: 0.0,
            reset_rate: 0.0,
            quality: None,
        }
    }
}

impl SimConfig {
    /// Returns the offending field and why.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        for (f, v) in [("ttft_ms", self.ttft_ms), ("tpot_ms", self.tpot_ms), ("jitter", self.jitter)] {
            if !(v.is_finite() && v >= 0.0) {
                return Err((f, format!("must be >= 0, got {v}")));
            }
        }
        for (f, v) in [
            ("output_tokens_spread", self.output_tokens_spread),
            ("error_rate", self.error_rate),
            ("reset_rate", self.reset_rate),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err((f, format!("must be within [0, 1], got {v}")));
            }
        }
        if let Some(q) = self.quality
            && !(0.0..=1.0).contains(&q)
        {
            return Err(("quality", format!("must be within [0, 1], got {q}")));
        }
        if self.output_tokens == 0 {
            return Err(("output_tokens", "must be >= 1".into()));
        }
        Ok(())
    }
}

pub struct Sim {
    cfg: arc_swap::ArcSwap<SimConfig>,
    counter: AtomicU64,
    registry: Registry,
    requests: IntCounter,
    completed: IntCounter,
    cancelled: IntCounter,
    errors: IntCounter,
    resets: IntCounter,
    output_tokens: IntCounter,
    in_flight: IntGauge,
}

impl Sim {
    pub fn new(cfg: SimConfig) -> Arc<Sim> {
        let registry = Registry::new();
        let c = |name: &str, help: &str| {
            let m = IntCounter::new(name, help).expect("valid metric");
            registry.register(Box::new(m.clone())).expect("unique metric");
            m
        };
        let requests = c("sim_requests_total", "Generation requests received.");
        let completed = c("sim_completed_requests_total", "Generations that ran to the end.");
        let cancelled = c(
            "sim_cancelled_requests_total",
            "Generations aborted because the client closed the connection.",
        );
        let errors = c("sim_injected_errors_total", "Requests answered with an injected 500.");
        let resets = c("sim_injected_resets_total", "Streams reset on purpose mid-way.");
        let output_tokens = c("sim_output_tokens_total", "Output tokens generated.");
        let in_flight = IntGauge::new("sim_in_flight_requests", "Generations running now.").expect("valid");
        registry.register(Box::new(in_flight.clone())).expect("unique metric");
        Arc::new(Sim {
            cfg: arc_swap::ArcSwap::from_pointee(cfg),
            counter: AtomicU64::new(0),
            registry,
            requests,
            completed,
            cancelled,
            errors,
            resets,
            output_tokens,
            in_flight,
        })
    }

    pub fn set_config(&self, cfg: SimConfig) {
        self.cfg.store(Arc::new(cfg));
    }

    /// Change some settings at run time (a JSON object merged into the config), e.g.
    /// `{"ttft_ms": 2000}` to degrade it and the old values to recover. Validated first.
    pub fn patch(&self, patch: &Value) -> Result<SimConfig, String> {
        let Value::Object(fields) = patch else { return Err("expected a JSON object".into()) };
        let mut v = serde_json::to_value(&*self.config()).map_err(|e| e.to_string())?;
        if let Value::Object(cur) = &mut v {
            for (k, x) in fields {
                cur.insert(k.clone(), x.clone());
            }
        }
        let cfg: SimConfig = serde_json::from_value(v).map_err(|e| e.to_string())?;
        cfg.validate().map_err(|(f, why)| format!("{f}: {why}"))?;
        self.set_config(cfg.clone());
        Ok(cfg)
    }

    pub fn config(&self) -> Arc<SimConfig> {
        self.cfg.load_full()
    }

    pub fn cancelled(&self) -> u64 {
        self.cancelled.get()
    }

    pub fn completed(&self) -> u64 {
        self.completed.get()
    }

    pub fn requests(&self) -> u64 {
        self.requests.get()
    }

    pub fn in_flight(&self) -> i64 {
        self.in_flight.get()
    }

    fn metrics_text(&self) -> String {
        let mut out = String::new();
        let _ = prometheus::TextEncoder::new().encode_utf8(&self.registry.gather(), &mut out);
        out
    }
}

/// The simulated backends a `goodput serve` runs in-process, by backend name. The command
/// starts them (`start`) before the config that names them is resolved; resolving a config,
/// at start-up or on reload, only looks them up and may change their settings.
#[derive(Default)]
pub struct Sims {
    running: std::sync::Mutex<std::collections::HashMap<String, (SocketAddr, Arc<Sim>)>>,
}

impl Sims {
    /// Start the simulator for backend `name` on a loopback port, unless it runs already.
    pub async fn start(&self, name: &str, cfg: SimConfig) -> std::io::Result<SocketAddr> {
        if let Some((addr, _)) = self.get(name) {
            return Ok(addr);
        }
        let (addr, sim) = spawn(cfg, "127.0.0.1:0").await?;
        tracing::info!(backend = %name, %addr, "in-process simulated backend started");
        self.running.lock().unwrap_or_else(|p| p.into_inner()).insert(name.to_string(), (addr, sim));
        Ok(addr)
    }

    pub fn get(&self, name: &str) -> Option<(SocketAddr, Arc<Sim>)> {
        self.running.lock().unwrap_or_else(|p| p.into_inner()).get(name).cloned()
    }
}

/// Bind `addr` and serve the simulator in the background. Returns the bound address.
pub async fn spawn(cfg: SimConfig, addr: &str) -> std::io::Result<(SocketAddr, Arc<Sim>)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let sim = Sim::new(cfg);
    tokio::spawn(serve(listener, sim.clone()));
    Ok((local, sim))
}

pub async fn serve(listener: TcpListener, sim: Arc<Sim>) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "sim accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let sim = sim.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| handle(sim.clone(), req));
            let _ = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                .await;
        });
    }
}

type SimBody = Either<Full<Bytes>, ChannelBody>;

fn json_response(status: StatusCode, v: &Value) -> Response<SimBody> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Either::Left(Full::new(Bytes::from(v.to_string()))))
        .expect("valid response")
}

async fn handle(sim: Arc<Sim>, req: Request<Incoming>) -> Result<Response<SimBody>, Infallible> {
    let path = req.uri().path().trim_end_matches('/').to_string();
    let method = req.method().clone();
    let cfg = sim.config();
    let resp = match (method, path.as_str()) {
        (Method::GET, "/metrics") => Response::builder()
            .header(header::CONTENT_TYPE, "text/plain; version=0.0.4")
            .body(Either::Left(Full::new(Bytes::from(sim.metrics_text()))))
            .expect("valid response"),
        (Method::GET, "/health") => json_response(StatusCode::OK, &json!({"status": "ok"})),
        (Method::GET, "/sim/config") => json_response(StatusCode::OK, &json!(&*cfg)),
        (Method::POST, "/sim/config") => match read_json(req).await {
            Ok(patch) => match sim.patch(&patch) {
                Ok(c) => json_response(StatusCode::OK, &json!(c)),
                Err(e) => json_response(
                    StatusCode::BAD_REQUEST,
                    &json!({"error": {"message": e, "type": "invalid_request_error", "code": 400}}),
                ),
            },
            Err(r) => r,
        },
        (Method::GET, "/v1/models") => json_response(
            StatusCode::OK,
            &json!({"object": "list", "data": [{"id": cfg.model, "object": "model", "owned_by": "goodput-sim"}]}),
        ),
        (Method::POST, p) if p.ends_with("/chat/completions") || p.ends_with("/completions") => {
            let chat = p.ends_with("/chat/completions");
            match read_json(req).await {
                Ok(body) => generate(&sim, &cfg, chat, &body).await,
                Err(r) => r,
            }
        }
        (Method::POST, p) if p.ends_with("/embeddings") => match read_json(req).await {
            Ok(body) => embeddings(&cfg, &body),
            Err(r) => r,
        },
        _ => json_response(
            StatusCode::NOT_FOUND,
            &json!({"error": {"message": format!("no route for {path}"), "type": "not_found", "code": 404}}),
        ),
    };
    Ok(resp)
}

async fn read_json(req: Request<Incoming>) -> Result<Value, Response<SimBody>> {
    let bad = |msg: String| {
        json_response(
            StatusCode::BAD_REQUEST,
            &json!({"error": {"message": msg, "type": "invalid_request_error", "code": 400}}),
        )
    };
    let bytes = Limited::new(req.into_body(), 64 * 1024 * 1024)
        .collect()
        .await
        .map_err(|e| bad(format!("cannot read body: {e}")))?
        .to_bytes();
    serde_json::from_slice(&bytes).map_err(|e| bad(format!("invalid JSON: {e}")))
}

/// The sim's "tokenizer": whitespace-separated words of every string in the prompt.
fn prompt_words(body: &Value, chat: bool) -> (u64, u64) {
    fn count(v: &Value, words: &mut u64, hash: &mut u64) {
        match v {
            Value::String(s) => {
                *words += s.split_whitespace().count() as u64;
                for b in s.bytes() {
                    *hash = (*hash ^ b as u64).wrapping_mul(0x100000001b3);
                }
            }
            Value::Array(a) => a.iter().for_each(|x| count(x, words, hash)),
            // Content parts: count their text, not their type tags.
            Value::Object(o) => o.get("text").into_iter().for_each(|x| count(x, words, hash)),
            _ => {}
        }
    }
    let (mut words, mut hash) = (0, 0xcbf29ce484222325u64);
    if chat {
        for m in body.get("messages").and_then(Value::as_array).into_iter().flatten() {
            if let Some(c) = m.get("content") {
                count(c, &mut words, &mut hash);
            }
        }
    } else if let Some(p) = body.get("prompt") {
        count(p, &mut words, &mut hash);
    }
    (words.max(1), hash)
}

const WORDS: &[&str] = &[
    "the",
    "model",
    "serves",
    "tokens",
    "quickly",
    "while",
    "latency",
    "stays",
    "low",
    "and",
    "throughput",
    "grows",
    "with",
    "batch",
    "size",
    "under",
    "steady",
    "load",
    "a",
    "request",
    "arrives",
    "at",
    "the",
    "gateway",
    "which",
    "measures",
    "time",
    "to",
    "first",
    "token",
    "before",
    "streaming",
    "each",
    "chunk",
    "back",
    "clients",
    "expect",
    "answers",
    "that",
    "are",
    "useful",
    "correct",
    "and",
    "timely",
    "so",
    "operators",
    "watch",
    "goodput",
    "closely",
    "every",
    "second",
    "of",
    "the",
    "day",
    "cache",
    "memory",
    "scheduler",
    "prefill",
    "decode",
    "phase",
    "kernel",
    "attention",
    "weights",
    "GPU",
    "queue",
    "depth",
    "budget",
    "price",
    "quality",
    "perplexity",
    "sample",
    "answer",
    "river",
    "mountain",
    "history",
    "science",
    "city",
    "north",
    "south",
    "bright",
    "quiet",
    "simple",
    "careful",
];

fn sample_delay(rng: &mut StdRng, median_ms: f64, jitter: f64) -> Duration {
    if median_ms <= 0.0 {
        return Duration::ZERO;
    }
    let ms = if jitter > 0.0 {
        use rand_distr::Distribution;
        rand_distr::LogNormal::new(median_ms.ln(), jitter).map(|d| d.sample(rng)).unwrap_or(median_ms)
    } else {
        median_ms
    };
    Duration::from_secs_f64(ms.min(3_600_000.0) / 1000.0)
}

struct Plan {
    choices: Vec<Vec<String>>,
    finish: Vec<&'static str>,
    ttft: Duration,
    gaps: Vec<Duration>,
    reset_at: Option<usize>,
}

fn plan(nth: u64, cfg: &SimConfig, body: &Value, prompt_hash: u64) -> Plan {
    let n = body.get("n").and_then(Value::as_u64).unwrap_or(1).clamp(1, 16) as usize;
    let max_tokens = body
        .get("max_completion_tokens")
        .or_else(|| body.get("max_tokens"))
        .and_then(Value::as_u64)
        .map(|m| m.max(1) as usize);
    let temperature = body.get("temperature").and_then(Value::as_f64).unwrap_or(1.0);
    let req_seed = body.get("seed").and_then(Value::as_u64).unwrap_or(0);
    // Greedy requests get the same text for the same prompt; sampled ones vary per request.
    let text_seed = cfg.seed
        ^ prompt_hash
        ^ req_seed.rotate_left(17)
        ^ if temperature > 0.0 { nth.wrapping_mul(0x9e3779b97f4a7c15) } else { 0 };
    let mut text_rng = StdRng::seed_from_u64(text_seed);
    let mut time_rng = StdRng::seed_from_u64(cfg.seed ^ nth.wrapping_mul(0x2545f4914f6cdd1d));
    let mut choices = Vec::with_capacity(n);
    let mut finish = Vec::with_capacity(n);
    for _ in 0..n {
        let spread = cfg.output_tokens_spread;
        let lo = (cfg.output_tokens as f64 * (1.0 - spread)).round().max(1.0) as usize;
        let hi = (cfg.output_tokens as f64 * (1.0 + spread)).round().max(lo as f64) as usize;
        let natural = if hi > lo { text_rng.random_range(lo..=hi) } else { lo };
        let len = max_tokens.map_or(natural, |m| natural.min(m));
        finish.push(if max_tokens.is_some_and(|m| m < natural) { "length" } else { "stop" });
        if let Some(q) = cfg.quality {
            choices.push(prose(q, len, cfg.seed ^ prompt_hash, &mut time_rng));
            continue;
        }
        let mut words = Vec::with_capacity(len);
        let mut since_stop = 0;
        for i in 0..len {
            let w = WORDS[text_rng.random_range(0..WORDS.len())];
            since_stop += 1;
            let end = i + 1 == len || (since_stop >= 8 && text_rng.random_bool(0.15));
            let mut tok = if i == 0 { capitalize(w) } else { format!(" {w}") };
            if end {
                tok.push('.');
                since_stop = 0;
            } else if since_stop == 1 && i > 0 && words.last().is_some_and(|p: &String| p.ends_with('.')) {
                tok = format!(" {}", capitalize(w));
            }
            words.push(tok);
        }
        choices.push(words);
    }
    let steps = choices.iter().map(Vec::len).max().unwrap_or(0);
    let ttft = sample_delay(&mut time_rng, cfg.ttft_ms, cfg.jitter);
    let gaps = (1..steps).map(|_| sample_delay(&mut time_rng, cfg.tpot_ms, cfg.jitter)).collect();
    let reset_at = (cfg.reset_rate > 0.0 && time_rng.random_bool(cfg.reset_rate)).then_some(steps / 2);
    Plan { choices, finish, ttft, gaps, reset_at }
}

const PROSE: &str = "The river runs north through the old city, past the market and the stone bridge. \
In the morning the streets are quiet, and the bakers open their doors before the sun is up. \
Children walk to school along the water, and their parents stop for coffee at the corner. \
By noon the square is full of people who buy fruit, bread and fresh fish from the coast. \
In the evening the lights come on along the river, and the city slowly goes to sleep.";

/// `len` words of `PROSE` from a prompt-chosen start, each replaced with probability
/// 1 - `quality` by a random letter string drawn from `noise` (different per request).
fn prose(quality: f64, len: usize, stable_seed: u64, noise: &mut StdRng) -> Vec<String> {
    let words: Vec<&str> = PROSE.split_whitespace().collect();
    let start = (stable_seed % words.len() as u64) as usize;
    // Start at a sentence boundary so the text reads as prose.
    let start = (start..start + words.len())
        .find(|i| words[(i + words.len() - 1) % words.len()].ends_with('.'))
        .unwrap_or(0);
    (0..len)
        .map(|i| {
            let w = if noise.random_bool(quality) {
                words[(start + i) % words.len()].to_string()
            } else {
                let n = noise.random_range(3..9);
                (0..n).map(|_| char::from(b'a' + noise.random_range(0..26u8))).collect()
            };
            if i == 0 { w } else { format!(" {w}") }
        })
        .collect()
}

fn capitalize(w: &str) -> String {
    let mut c = w.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

fn now_unix() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

async fn generate(sim: &Arc<Sim>, cfg: &SimConfig, chat: bool, body: &Value) -> Response<SimBody> {
    sim.requests.inc();
    // Every request draws its own number, errors included (an error that did not advance it
    // would repeat for every request after it).
    let nth = sim.counter.fetch_add(1, Ordering::Relaxed);
    let mut err_rng = StdRng::seed_from_u64(cfg.seed.wrapping_add(nth).wrapping_mul(31));
    if cfg.error_rate > 0.0 && err_rng.random_bool(cfg.error_rate) {
        sim.errors.inc();
        return json_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            &json!({"error": {"message": "injected error", "type": "server_error", "code": 500}}),
        );
    }
    let (prompt_tokens, prompt_hash) = prompt_words(body, chat);
    let plan = plan(nth, cfg, body, prompt_hash);
    let model = body.get("model").and_then(Value::as_str).unwrap_or(&cfg.model).to_string();
    let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let include_usage =
        body.pointer("/stream_options/include_usage").and_then(Value::as_bool).unwrap_or(false);
    let id = format!("{}-{nth}", if chat { "chatcmpl-sim" } else { "cmpl-sim" });
    let completion_tokens: u64 = plan.choices.iter().map(|c| c.len() as u64).sum();
    let usage = json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    });
    let object = if chat { "chat.completion" } else { "text_completion" };
    if !stream {
        let _guard = InFlight::new(sim);
        // Dropped before the end (hyper drops the handler when the client closes the connection):
        // the generation is aborted, as vLLM aborts a request whose client went away.
        let mut abort = AbortOnDrop(Some(sim));
        let total = plan.ttft + plan.gaps.iter().sum::<Duration>();
        if !total.is_zero() {
            tokio::time::sleep(total).await;
        }
        abort.0 = None;
        let choices: Vec<Value> = plan
            .choices
            .iter()
            .enumerate()
            .map(|(i, words)| {
                let text = words.concat();
                if chat {
                    json!({"index": i, "message": {"role": "assistant", "content": text}, "finish_reason": plan.finish[i]})
                } else {
                    json!({"index": i, "text": text, "logprobs": null, "finish_reason": plan.finish[i]})
                }
            })
            .collect();
        sim.output_tokens.inc_by(completion_tokens);
        sim.completed.inc();
        return json_response(
            StatusCode::OK,
            &json!({"id": id, "object": object, "created": now_unix(), "model": model, "choices": choices, "usage": usage}),
        );
    }

    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(64);
    let sim2 = sim.clone();
    tokio::spawn(async move {
        let _guard = InFlight::new(&sim2);
        let created = now_unix();
        let obj = if chat { "chat.completion.chunk" } else { "text_completion" };
        let event = |choices: Value, usage: Option<&Value>| {
            let mut v =
                json!({"id": id, "object": obj, "created": created, "model": model, "choices": choices});
            if let Some(u) = usage {
                v["usage"] = u.clone();
            }
            Bytes::from(format!("data: {v}\n\n"))
        };
        // Like llama.cpp and vLLM, a chat stream opens with the assistant role and no content.
        if chat {
            let roles: Vec<Value> = (0..plan.choices.len())
                .map(|i| json!({"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}))
                .collect();
            if tx.send(Ok(event(Value::Array(roles), None))).await.is_err() {
                sim2.cancelled.inc();
                return;
            }
        }
        let steps = plan.choices.iter().map(Vec::len).max().unwrap_or(0);
        let mut emitted = 0u64;
        for step in 0..steps {
            let wait = if step == 0 { plan.ttft } else { plan.gaps[step - 1] };
            if !wait.is_zero() {
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = tx.closed() => { sim2.cancelled.inc(); return; }
                }
            }
            if plan.reset_at == Some(step) {
                sim2.resets.inc();
                let _ = tx.send(Err(std::io::Error::other("injected reset"))).await;
                return;
            }
            for (i, words) in plan.choices.iter().enumerate() {
                let Some(w) = words.get(step) else { continue };
                let last = step + 1 == words.len();
                let fr = if last { json!(plan.finish[i]) } else { Value::Null };
                let c = if chat {
                    json!([{"index": i, "delta": {"content": w}, "finish_reason": fr}])
                } else {
                    json!([{"index": i, "text": w, "logprobs": null, "finish_reason": fr}])
                };
                if tx.send(Ok(event(c, None))).await.is_err() {
                    sim2.cancelled.inc();
                    sim2.output_tokens.inc_by(emitted);
                    return;
                }
                emitted += 1;
            }
        }
        sim2.output_tokens.inc_by(emitted);
        if include_usage && tx.send(Ok(event(json!([]), Some(&usage)))).await.is_err() {
            sim2.cancelled.inc();
            return;
        }
        if tx.send(Ok(Bytes::from_static(b"data: [DONE]\n\n"))).await.is_err() {
            sim2.cancelled.inc();
            return;
        }
        sim2.completed.inc();
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Either::Right(ChannelBody { rx }))
        .expect("valid response")
}

fn embeddings(cfg: &SimConfig, body: &Value) -> Response<SimBody> {
    let inputs: Vec<String> = match body.get("input") {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a.iter().map(|v| v.to_string()).collect(),
        _ => vec![],
    };
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut rng =
                StdRng::seed_from_u64(cfg.seed ^ s.len() as u64 ^ s.bytes().map(u64::from).sum::<u64>());
            let v: Vec<f32> = (0..8).map(|_| rng.random_range(-1.0..1.0)).collect();
            json!({"object": "embedding", "index": i, "embedding": v})
        })
        .collect();
    let tokens: usize = inputs.iter().map(|s| s.split_whitespace().count()).sum();
    json_response(
        StatusCode::OK,
        &json!({"object": "list", "data": data, "model": cfg.model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}),
    )
}

struct AbortOnDrop<'a>(Option<&'a Sim>);

impl Drop for AbortOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(sim) = self.0 {
            sim.cancelled.inc();
        }
    }
}

struct InFlight<'a>(&'a Sim);

impl<'a> InFlight<'a> {
    fn new(sim: &'a Sim) -> Self {
        sim.in_flight.inc();
        InFlight(sim)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.dec();
    }
}

/// A response body fed by a channel; dropping it (the connection closed) closes the channel,
/// which is how the generator task learns of a cancellation.
pub struct ChannelBody {
    rx: mpsc::Receiver<Result<Bytes, std::io::Error>>,
}

impl ChannelBody {
    pub fn new(rx: mpsc::Receiver<Result<Bytes, std::io::Error>>) -> Self {
        ChannelBody { rx }
    }
}

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.rx.poll_recv(cx).map(|o| o.map(|r| r.map(Frame::data)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(cfg: &SimConfig, n: usize) -> Vec<String> {
        let body = json!({"messages": [{"role": "user", "content": "tell me"}], "temperature": 1.0});
        (0..n as u64).map(|nth| plan(nth, cfg, &body, 7).choices[0].concat()).collect()
    }

    #[tokio::test]
    async fn an_injected_error_does_not_repeat_for_every_request_after_it() {
        let sim = Sim::new(SimConfig { error_rate: 0.3, ttft_ms: 0.0, tpot_ms: 0.0, ..Default::default() });
        let body = json!({"messages": [{"role": "user", "content": "x"}]});
        let mut errors = 0;
        for _ in 0..200 {
            let cfg = sim.config();
            errors += u32::from(
                generate(&sim, &cfg, true, &body).await.status() == StatusCode::INTERNAL_SERVER_ERROR,
            );
        }
        assert!((30..90).contains(&errors), "about 30% of 200: {errors}");
    }

    #[test]
    fn quality_sets_how_much_of_the_text_is_stable_prose() {
        let good = SimConfig { quality: Some(1.0), output_tokens: 20, ..Default::default() };
        let t = texts(&good, 3);
        assert!(t.iter().all(|x| *x == t[0]), "re-samples agree at quality 1: {t:?}");
        assert!(PROSE.contains(&t[0]), "{}", t[0]);
        let poor = SimConfig { quality: Some(0.3), ..good };
        let t = texts(&poor, 3);
        assert!(t[0] != t[1] && t[1] != t[2], "re-samples differ at quality 0.3: {t:?}");
        let words = t.iter().flat_map(|x| x.split_whitespace()).count();
        let prose = t.iter().flat_map(|x| x.split_whitespace()).filter(|w| PROSE.contains(*w)).count();
        let share = prose as f64 / words as f64;
        assert!((0.15..0.5).contains(&share), "about 30% prose words: {share}");
        assert!(SimConfig { quality: Some(1.5), ..Default::default() }.validate().is_err());
    }
}
