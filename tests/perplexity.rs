//! Perplexity with the real reference model: SmolLM2-135M converted to ONNX by the project's
//! own script (scripts/setup-models.sh), run by ONNX Runtime through `ort`, checked against
//! llama.cpp on the same GGUF; then sampled responses scored behind the proxy.

use crate::common::llama::{llm_env, start_llama};
use crate::common::*;
use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

struct Model {
    dir: PathBuf,
    ort: PathBuf,
    python: PathBuf,
}

fn model_env() -> Model {
    let get = |k: &str| {
        std::env::var_os(k).map(PathBuf::from).unwrap_or_else(|| {
            panic!("{k} is not set: run the suite with scripts/test.sh (it runs scripts/setup-models.sh)")
        })
    };
    Model { dir: get("GOODPUT_MODEL_DIR"), ort: get("ORT_DYLIB_PATH"), python: get("GOODPUT_MODELS_PYTHON") }
}

const PARAGRAPH: &str = "tests/fixtures/paragraph.txt";

fn goodput_ppl(m: &Model, extra: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_goodput"))
        .args(["ppl", "--json", "--threads", "2", "--model"])
        .arg(&m.dir)
        .arg("--onnxruntime")
        .arg(&m.ort)
        .args(extra)
        .arg(PARAGRAPH)
        .output()
        .unwrap();
    assert!(out.status.success(), "goodput ppl failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / b
}

#[test]
fn reference_model_agrees_with_llama_cpp() {
    let m = model_env();
    let llm = llm_env();
    // llama.cpp's logits (llama-cpp-python), its server's echo logprobs, and Python onnxruntime.
    let out = Command::new(&m.python)
        .arg("scripts/models/reference_ppl.py")
        .arg(&llm.gguf)
        .arg(&m.dir)
        .arg(PARAGRAPH)
        .arg("--server")
        .arg(llm.venv.join("bin/python"))
        .output()
        .unwrap();
    assert!(out.status.success(), "reference failed: {}", String::from_utf8_lossy(&out.stderr));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    let ours = goodput_ppl(&m, &[]);

    // The tokenizer built from the GGUF tokenizes as llama.cpp does.
    let text = std::fs::read_to_string(PARAGRAPH).unwrap();
    let assets = goodput::quality::lm::LmAssets::load(&m.dir).unwrap();
    let ids: Vec<u64> = assets.encode(&text).unwrap().into_iter().map(u64::from).collect();
    let theirs: Vec<u64> = r["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    assert_eq!(ids, theirs, "token ids differ from llama.cpp's");
    assert_eq!(ours["tokens"].as_u64().unwrap(), ids.len() as u64);
    assert!(ids.len() > 300, "a paragraph long enough to average out per-token noise");

    let p = ours["token_perplexity"].as_f64().unwrap();
    let llama = r["ppl_llama_cpp"].as_f64().unwrap();
    assert!(rel(p, llama) < 0.01, "goodput {p} vs llama.cpp {llama}");
    // Same ONNX model in Python onnxruntime: the Rust path adds no error of its own.
    let py = r["ppl_onnx"].as_f64().unwrap();
    assert!(rel(p, py) < 1e-4, "goodput {p} vs Python onnxruntime {py}");
    // The server scores tokens 1.. (OpenAI's echo nulls the first); compare like with like.
    let server = r["ppl_server"].as_f64().unwrap();
    let onnx_same = r["ppl_onnx_server_tokens"].as_f64().unwrap();
    assert!(rel(onnx_same, server) < 0.01, "ONNX {onnx_same} vs llama.cpp server {server}");
    assert!(r["logprobs_max_abs_diff"].as_f64().unwrap() < 1e-3, "token_logprobs output vs logits");
    assert!(r["padded_batch_max_abs_diff"].as_f64().unwrap() < 1e-3, "padding leaks into a row");

    // lm-evaluation-harness's other units, from the same log-likelihood.
    let ll = ours["log_likelihood"].as_f64().unwrap();
    assert_eq!(ours["bytes"].as_u64().unwrap(), text.len() as u64);
    assert_eq!(ours["words"].as_u64().unwrap(), text.split_whitespace().count() as u64);
    let bpb = -ll / text.len() as f64 / std::f64::consts::LN_2;
    assert!((ours["bits_per_byte"].as_f64().unwrap() - bpb).abs() < 1e-9);
    let wp = (-ll / text.split_whitespace().count() as f64).exp();
    assert!(rel(ours["word_perplexity"].as_f64().unwrap(), wp) < 1e-9);
}

#[test]
fn rolling_windows_batched_equal_unbatched() {
    let m = model_env();
    let one = goodput_ppl(&m, &["--max-length", "64", "--batch", "1"]);
    let four = goodput_ppl(&m, &["--max-length", "64", "--batch", "4"]);
    let whole = goodput_ppl(&m, &[]);
    let (a, b) = (one["token_perplexity"].as_f64().unwrap(), four["token_perplexity"].as_f64().unwrap());
    assert!(rel(a, b) < 1e-4, "batching (right padding) changed the result: {a} vs {b}");
    assert_eq!(one["tokens"], whole["tokens"], "every token is predicted once");
    // Windows of 64 tokens see less context than one window over the paragraph.
    assert!(a > whole["token_perplexity"].as_f64().unwrap() * 1.2, "{a} vs {}", whole["token_perplexity"]);
}

#[test]
fn ppl_reports_a_missing_library_or_model_clearly() {
    let m = model_env();
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_goodput"))
            .arg("ppl")
            .args(args)
            .arg(PARAGRAPH)
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let e = run(&["--model", m.dir.to_str().unwrap(), "--onnxruntime", "/nonexistent/libonnxruntime.so"]);
    assert!(e.contains("/nonexistent/libonnxruntime.so does not exist"), "{e}");
    let e = run(&["--model", "/nonexistent-model", "--onnxruntime", m.ort.to_str().unwrap()]);
    assert!(e.contains("/nonexistent-model/tokenizer.json"), "{e}");
}

#[test]
fn cuda_that_cannot_be_used_fails_clearly_or_falls_back_when_allowed() {
    // This machine has no GPU and the CPU build of ONNX Runtime: goodput built without the
    // `cuda` feature says so; one built with it relays ONNX Runtime's refusal (tests/cuda.rs and
    // scripts/gpu-check.sh cover a real GPU).
    let m = model_env();
    let out = Command::new(env!("CARGO_BIN_EXE_goodput"))
        .args(["ppl", "--device", "cuda:0", "--model"])
        .arg(&m.dir)
        .arg("--onnxruntime")
        .arg(&m.ort)
        .arg(PARAGRAPH)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("built without the `cuda` feature")
            || e.contains("device cuda:0: CUDA execution provider"),
        "{e}"
    );
    let gp = Goodput::start_logged(
        &format!(
            "backends:\n  - name: sim\n    url: http://127.0.0.1:9\n    models: [sim-model]\n{}",
            quality_yaml(&m, "").replace(
                "  perplexity:\n",
                "  perplexity:\n    device: cuda:0\n    allow_cpu_fallback: true\n"
            )
        ),
        &[],
        &[("RUST_LOG", "info")],
    );
    // The scorer loads in the background while the proxy already serves.
    let deadline = Instant::now() + SCORER_PATIENCE;
    let log = loop {
        let log = gp.log();
        if log.contains("perplexity scorer ready") || Instant::now() > deadline {
            break log;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(log.contains("Cuda(0) unavailable, falling back to the CPU"), "{log}");
    assert!(log.contains("perplexity scorer ready") && log.contains("device=Cpu"), "{log}");
}

/// These tests score as fast as the machine allows: a CPU budget well above what one scoring
/// thread can use (the budget's own test sets a small one).
fn quality_yaml(m: &Model, extra: &str) -> String {
    format!(
        "quality:\n  window_secs: 600\n  max_cpu: 8\n{extra}  perplexity:\n    model_dir: {}\n    onnxruntime: {}\n    max_response_tokens: 256\n",
        m.dir.display(),
        m.ort.display()
    )
}

fn chat(content: &str) -> String {
    serde_json::json!({
        "model": "smollm2", "temperature": 0, "seed": 1, "max_tokens": 40,
        "messages": [{"role": "user", "content": content}]
    })
    .to_string()
}

/// Wait until `n` responses are scored; return the records that carry a perplexity.
async fn scored(gp: &Goodput, n: usize) -> Vec<Value> {
    let has = |r: &Value| !r["perplexity"].is_null();
    let recs = gp.scored_when(n, "with a perplexity", |a| a.iter().filter(|r| has(r)).count() >= n).await;
    recs.into_iter().filter(has).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampled_responses_are_scored_off_the_hot_path() {
    let m = model_env();
    let llm = llm_env();
    let llama = start_llama(&llm).await;
    // Nothing sampled by rate; a route for x-tenant: eval samples everything; the header forces.
    let gp = Goodput::start(&format!(
        "backends:\n  - name: llama\n    url: http://127.0.0.1:{}\n    models: [smollm2]\n\
         routes:\n  - name: eval\n    match:\n      headers:\n        x-tenant: eval\n    sample_rate: 1.0\n{}",
        llama.port,
        quality_yaml(&m, "  sample_rate: 0.0\n")
    ));
    let mut replies = Vec::new();
    for (i, headers) in
        [vec![], vec![("x-goodput-score", "1")], vec![("x-tenant", "eval")]].into_iter().enumerate()
    {
        let mut req =
            post_json("/v1/chat/completions", &chat(&format!("Name {} colours of the rainbow.", i + 2)));
        for (k, v) in headers {
            req.headers_mut().insert(k, v.parse().unwrap());
        }
        let r = send(gp.proxy, req).await;
        assert_eq!(r.status, 200, "{}", r.text());
        replies.push(r);
    }
    let s = scored(&gp, 2).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let recs = gp.records(3).await;
    let by_route = |route: &str| recs.iter().filter(|r| r["route"] == route).count();
    assert_eq!((by_route("default"), by_route("eval")), (2, 1));
    let scored_now: Vec<&Value> = recs.iter().filter(|r| !r["perplexity"].is_null()).collect();
    assert_eq!(scored_now.len(), 2, "the unsampled, unforced request is not scored: {recs:?}");
    // Greedy output of the reference model itself: its perplexity under that model is low.
    for r in &s {
        let p = r["perplexity"].as_f64().unwrap();
        assert!((1.0..3.0).contains(&p), "greedy SmolLM2 text scored {p}");
        assert!(r["bits_per_byte"].as_f64().unwrap() > 0.0);
    }
    let text = gp.metrics().await;
    let labels = [("gen_ai_request_model", "smollm2"), ("backend", "llama")];
    let count =
        |route| metric(&text, "goodput_response_perplexity_count", &[labels[0], labels[1], ("route", route)]);
    assert_eq!((count("default"), count("eval")), (1.0, 1.0));
    assert_eq!(metric(&text, "goodput_scoring_queue_depth", &[]), 0.0);
    assert!(text.contains("goodput_response_bits_per_byte_bucket"));
    // The CPU budget in effect, and what scoring used of it.
    assert_eq!(metric(&text, "goodput_scoring_cpu_budget_cores", &[]), 8.0);
    assert!(metric(&text, "goodput_scoring_cpu_seconds_total", &[("scorer", "perplexity")]) > 0.0);
    // The router's view: per-backend quality over the window.
    let backends = gp.admin_json("/admin/backends").await;
    let llama_b = backends["backends"].as_array().unwrap().iter().find(|b| b["name"] == "llama").unwrap();
    let q = &llama_b["window"]["quality"];
    assert_eq!(q["scored"], 2, "{backends}");
    assert!(q["perplexity_geomean"].as_f64().unwrap() < 3.0);
    drop(llama);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn word_salad_scores_high_and_a_full_queue_drops_without_touching_traffic() {
    let m = model_env();
    let (sim, _) = spawn_sim(0.0, 0.0, 60).await;
    let gp = Goodput::start(&format!(
        "backends:\n  - name: sim\n    url: http://{sim}\n    models: [sim-model]\n{}",
        quality_yaml(&m, "  sample_rate: 1.0\n  queue_capacity: 1\n")
    ));
    // Concurrent requests, all sampled: one scorer thread and a queue of one cannot keep up.
    let n = 24;
    let mut tasks = Vec::new();
    for i in 0..n {
        let body = chat(&format!("Tell me a story number {i}."));
        let stream = i % 2 == 0;
        let body = if stream { body.replacen('{', "{\"stream\":true,", 1) } else { body };
        let addr = gp.proxy;
        tasks.push(tokio::spawn(async move { send(addr, post_json("/v1/chat/completions", &body)).await }));
    }
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(r.status, 200);
        assert!(!r.body.is_empty());
    }
    let deadline = Instant::now() + SCORER_PATIENCE;
    let (scored_n, dropped) = loop {
        let text = gp.metrics().await;
        let s = metric(&text, "goodput_scored_responses_total", &[("backend", "sim")]);
        let d = metric(&text, "goodput_scoring_dropped_total", &[("reason", "queue_full")]);
        let depth = metric(&text, "goodput_scoring_queue_depth", &[]);
        if s + d >= n as f64 && depth == 0.0 {
            break (s, d);
        }
        assert!(Instant::now() < deadline, "scored {s} + dropped {d} < {n}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(scored_n + dropped, n as f64, "every sampled response is scored or counted as dropped");
    assert!(dropped >= 1.0 && scored_n >= 1.0, "scored {scored_n}, dropped {dropped}");
    // Random dictionary words are far less likely than fluent text under the reference LM.
    for r in scored(&gp, scored_n as usize).await {
        let p = r["perplexity"].as_f64().unwrap();
        assert!(p > 50.0, "word salad scored {p}");
    }
}

#[test]
fn a_model_with_logits_only_scores_the_same() {
    // Models exported with optimum output `logits` only: goodput then takes the log-softmax itself.
    let m = model_env();
    let dir = temp_dir("logits-only");
    let script = "import onnx, sys\n\
                  m = onnx.load(sys.argv[1])\n\
                  keep = [o for o in m.graph.output if o.name == 'logits']\n\
                  del m.graph.output[:]\n\
                  m.graph.output.extend(keep)\n\
                  onnx.save(m, sys.argv[2])\n";
    let out = Command::new(&m.python)
        .args(["-c", script])
        .arg(m.dir.join("model.onnx"))
        .arg(dir.join("model.onnx"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for f in ["tokenizer.json", "special_tokens.json", "chat_template.jinja"] {
        std::fs::copy(m.dir.join(f), dir.join(f)).unwrap();
    }
    let other = Model { dir: dir.clone(), ort: m.ort.clone(), python: m.python.clone() };
    let a = goodput_ppl(&m, &["--max-length", "128", "--batch", "2"]);
    let b = goodput_ppl(&other, &["--max-length", "128", "--batch", "2"]);
    let _ = std::fs::remove_dir_all(&dir);
    let (pa, pb) = (a["token_perplexity"].as_f64().unwrap(), b["token_perplexity"].as_f64().unwrap());
    // f32 log-sum-exp in the graph vs f64 in goodput: equal to 0.1% (a shift by one token would
    // not be).
    assert!(rel(pa, pb) < 1e-3, "token_logprobs {pa} vs logits {pb}");
}

#[test]
fn batched_scoring_equals_one_response_at_a_time() {
    use goodput::config::QualityConfig;
    use goodput::meter::metrics::Metrics;
    use goodput::openai::Operation;
    use goodput::quality::budget::CpuBudget;
    use goodput::quality::scorer::{ScoreJob, Scorer};
    use goodput::quality::{QualityEvent, Subject};
    use std::sync::Arc;

    let m = model_env();
    // Unequal lengths, so that a batch is right-padded; the first is the longest, so that the
    // rest queue up while it is scored and go into one batch.
    let replies = [
        "Paris is the capital of France. It lies on the Seine, and about two million people live in the city itself, more in the region around it.",
        "Blue.",
        "The mitochondria is the powerhouse of the cell.",
        "banana keyboard swiftly the of purple seventeen",
        "Water boils at 100 degrees Celsius at sea level.",
    ];
    let run = |max_batch: usize| -> (Vec<(u64, f64, f64)>, String) {
        let cfg: QualityConfig = serde_yaml_ng::from_str(&format!(
            "queue_capacity: 16\nperplexity:\n  model_dir: {}\n  onnxruntime: {}\n  max_batch: {max_batch}\n",
            m.dir.display(),
            m.ort.display()
        ))
        .unwrap();
        let metrics = Metrics::new();
        let (tx, rx) = std::sync::mpsc::channel();
        let scorer =
            Scorer::start(&cfg, metrics.clone(), tx, Arc::new(CpuBudget::unlimited())).unwrap().unwrap();
        for (i, reply) in replies.iter().enumerate() {
            let of = Subject {
                id: i as u64,
                backend: "b".into(),
                model: "m".into(),
                route: "default".into(),
                class: "default".into(),
                endpoint: "".into(),
            };
            let request = chat(&format!("Question {i}?")).into();
            assert!(scorer.offer(ScoreJob {
                of,
                operation: Operation::Chat,
                request,
                response: reply.to_string()
            }));
        }
        let mut out: Vec<(u64, f64, f64)> = (0..replies.len())
            .map(|_| match rx.recv_timeout(SCORER_PATIENCE).expect("scored") {
                QualityEvent::Perplexity(r) => (r.of.id, r.perplexity, r.bits_per_byte),
                QualityEvent::Consistency(_) => unreachable!(),
            })
            .collect();
        out.sort_by_key(|r| r.0);
        (out, metrics.encode())
    };
    let (one, _) = run(1);
    let (batched, text) = run(8);
    // Fewer model calls than responses: the batch path really ran.
    let calls = metric(&text, "goodput_scoring_batch_size_count", &[]);
    assert_eq!(metric(&text, "goodput_scoring_batch_size_sum", &[]), replies.len() as f64);
    assert!(calls < replies.len() as f64, "{calls} model calls for {} responses", replies.len());
    for (a, b) in one.iter().zip(&batched) {
        assert!(rel(b.1, a.1) < 1e-4, "response {}: perplexity {} alone, {} batched", a.0, a.1, b.1);
        assert!(rel(b.2, a.2) < 1e-4, "response {}: bits/byte {} alone, {} batched", a.0, a.2, b.2);
    }
    assert!(one[3].1 > one[0].1 * 5.0, "word salad scores above fluent text: {one:?}");
}

#[test]
fn scoring_rests_within_its_cpu_budget_and_counts_what_it_drops() {
    use goodput::config::QualityConfig;
    use goodput::meter::metrics::Metrics;
    use goodput::openai::Operation;
    use goodput::quality::budget::CpuBudget;
    use goodput::quality::scorer::{ScoreJob, Scorer};
    use goodput::quality::{QualityEvent, Subject};
    use std::sync::Arc;

    let m = model_env();
    let cfg: QualityConfig = serde_yaml_ng::from_str(&format!(
        "queue_capacity: 16\nperplexity:\n  model_dir: {}\n  onnxruntime: {}\n",
        m.dir.display(),
        m.ort.display()
    ))
    .unwrap();
    let cores = 0.05;
    let budget = Arc::new(CpuBudget::new(cores));
    let metrics = Metrics::new();
    let (tx, rx) = std::sync::mpsc::channel();
    let scorer = Scorer::start(&cfg, metrics.clone(), tx, budget.clone()).unwrap().unwrap();
    let job = |i: u64| ScoreJob {
        of: Subject {
            id: i,
            backend: "b".into(),
            model: "m".into(),
            route: "default".into(),
            class: "default".into(),
            endpoint: "".into(),
        },
        operation: Operation::Chat,
        request: chat("Where is Paris?").into(),
        response: "Paris is the capital of France, on the Seine.".into(),
    };
    let cpu = || metric(&metrics.encode(), "goodput_scoring_cpu_seconds_total", &[("scorer", "perplexity")]);
    let offered = Instant::now();
    assert!(scorer.offer(job(1)), "a scorer within its budget takes work");
    assert!(matches!(rx.recv_timeout(SCORER_PATIENCE), Ok(QualityEvent::Perplexity(_))));
    // The CPU it used is counted, and buys a rest of cpu / cores from when the work began.
    let deadline = Instant::now() + SCORER_PATIENCE;
    while cpu() == 0.0 || budget.available() {
        assert!(Instant::now() < deadline, "no CPU time counted, or no rest owed");
        std::thread::sleep(Duration::from_millis(5));
    }
    let used = cpu();
    assert!(used > 0.001 && used < 30.0, "{used} s of CPU for one short response");
    // Resting: what is sampled now is dropped at once and counted, not queued.
    assert!(!scorer.offer(job(2)), "a resting scorer queues nothing");
    let text = metrics.encode();
    assert_eq!(metric(&text, "goodput_scoring_dropped_total", &[("reason", "cpu_budget")]), 1.0);
    assert_eq!(metric(&text, "goodput_scoring_queue_depth", &[]), 0.0);
    let deadline = Instant::now() + Duration::from_secs_f64(used / cores + 30.0);
    while !budget.available() {
        assert!(Instant::now() < deadline, "the rest never ends");
        std::thread::sleep(Duration::from_millis(5));
    }
    let rested = offered.elapsed().as_secs_f64();
    assert!(rested >= used / cores * 0.99, "rested {rested:.3} s after {used:.4} s of CPU at {cores} cores");
    // After the rest, work is taken again.
    assert!(scorer.offer(job(3)));
    assert!(matches!(rx.recv_timeout(SCORER_PATIENCE), Ok(QualityEvent::Perplexity(_))));
}
