//! The simulated backend, run as its own process (`goodput sim`) and in-process.

use crate::common::*;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

struct SimProc(std::process::Child, std::net::SocketAddr);

impl Drop for SimProc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn sim_proc(args: &[&str]) -> SimProc {
    let mut child = Command::new(env!("CARGO_BIN_EXE_goodput"))
        .args(["sim", "--listen", "127.0.0.1:0"])
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let addr = line.trim().rsplit("addr=").next().unwrap().parse().unwrap();
    SimProc(child, addr)
}

fn texts(sse: &str) -> String {
    sse_contents(sse).concat()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_cli_serves_deterministic_text_usage_and_n() {
    let sim = sim_proc(&["--seed", "7", "--ttft-ms", "5", "--tpot-ms", "1", "--output-tokens", "12"]);
    let greedy =
        r#"{"model":"x","temperature":0,"stream":true,"messages":[{"role":"user","content":"same prompt"}]}"#;
    let a = send(sim.1, post_json("/v1/chat/completions", greedy)).await.text();
    let b = send(sim.1, post_json("/v1/chat/completions", greedy)).await.text();
    assert_eq!(texts(&a), texts(&b), "temperature 0 and the same seed give the same text");
    assert_eq!(texts(&a).split_whitespace().count(), 12);
    assert!(!a.contains("\"usage\""), "no usage unless asked");

    let sampled =
        r#"{"model":"x","temperature":1,"stream":true,"messages":[{"role":"user","content":"same prompt"}]}"#;
    let c = send(sim.1, post_json("/v1/chat/completions", sampled)).await.text();
    let d = send(sim.1, post_json("/v1/chat/completions", sampled)).await.text();
    assert_ne!(texts(&c), texts(&d), "sampled requests differ");

    let with_usage = r#"{"model":"x","stream":true,"stream_options":{"include_usage":true},"n":2,"max_tokens":5,"messages":[{"role":"user","content":"one two three"}]}"#;
    let e = send(sim.1, post_json("/v1/chat/completions", with_usage)).await.text();
    let usage: serde_json::Value = e
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
        .find(|v| v["choices"].as_array().is_some_and(|c| c.is_empty()))
        .expect("usage-only chunk")["usage"]
        .clone();
    assert_eq!(usage["completion_tokens"], 10);
    assert_eq!(usage["prompt_tokens"], 3);
    assert!(e.contains("\"index\":1"));
    assert!(e.contains("\"finish_reason\":\"length\""));

    let m = send(sim.1, http::Request::get("/metrics").body(Default::default()).unwrap()).await.text();
    assert!(m.contains("sim_cancelled_requests_total 0"), "{m}");
    assert_eq!(metric(&m, "sim_requests_total", &[]), 5.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_injects_errors_and_resets() {
    let sim = sim_proc(&["--error-rate", "1"]);
    let r = send(sim.1, post_json("/v1/completions", r#"{"prompt":"x"}"#)).await;
    assert_eq!(r.status, 500);
    assert_eq!(r.json()["error"]["code"], 500);
    drop(sim);
    let sim = sim_proc(&["--reset-rate", "1", "--ttft-ms", "1", "--tpot-ms", "1"]);
    let r = send(sim.1, post_json("/v1/completions", r#"{"prompt":"x","stream":true}"#)).await;
    assert!(r.error.is_some(), "a reset stream does not end cleanly");
    assert!(!r.text().contains("[DONE]"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_config_serves_from_the_in_process_sims_and_routes() {
    let demo = std::fs::read_to_string("config/demo.yaml").unwrap();
    let gp = Goodput::start(&demo);
    let body = r#"{"model":"sim-model","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    // A first wave, sent before any backend has numbers: each backend takes one probe (in
    // price order: while a probe's sample is on its way its backend is held back for one that
    // has none in flight), then, all held back, the cheapest (budget) takes the rest.

    // Wall-clock ms of an Instant, to set the client's view beside the records' clock.
    let (inst0, wall0) = (std::time::Instant::now(), std::time::SystemTime::now());
    let wall_ms = |i: std::time::Instant| {
        (wall0.duration_since(std::time::UNIX_EPOCH).unwrap() + i.duration_since(inst0)).as_secs_f64()
            * 1000.0
    };
    let wave: Vec<_> = (0..12)
        .map(|_| {
            let proxy = gp.proxy;
            tokio::spawn(async move { send(proxy, post_json("/v1/chat/completions", body)).await })
        })
        .collect();
    let mut served = std::collections::BTreeMap::<(String, String), u32>::new();
    // (backend, reason, when its first bytes came): the decision was made before then.
    let mut decided_by = Vec::new();
    for r in wave {
        let r = r.await.unwrap();
        assert_eq!(r.status, 200);
        assert!(r.text().ends_with("data: [DONE]\n\n"));
        let h = |n: &str| r.headers[n].to_str().unwrap().to_string();
        let key = (h("x-goodput-backend"), h("x-goodput-reason"));
        decided_by.push((key.0.clone(), key.1.clone(), wall_ms(r.frames[0].0)));
        *served.entry(key).or_default() += 1;
    }
    let count = |f: &dyn Fn(&str, &str) -> bool| -> u32 {
        served.iter().filter(|((b, r), _)| f(b, r)).map(|(_, n)| n).sum()
    };
    let explored = count(&|_, r| r == "explore");
    let to_budget = count(&|b, _| b == "budget");
    let standard_cheapest = count(&|b, r| b == "standard" && r == "cheapest");
    assert!(explored <= 2, "{served:?}");
    let wave_records = gp.records(12).await;
    let mut probes_ended = f64::INFINITY;
    for b in ["standard", "premium"] {
        assert!(count(&|x, _| x == b) >= 1, "{b} probed: {served:?}");
        // b's first request (its probe) ends before its first sample can land; every other
        // `cheapest` pick of b decided before that end is a second probe.
        let first = wave_records
            .iter()
            .filter(|r| r["backend"] == b)
            .min_by(|x, y| {
                x["start_unix_ms"].as_f64().unwrap().total_cmp(&y["start_unix_ms"].as_f64().unwrap())
            })
            .unwrap();
        let first_end = first["start_unix_ms"].as_f64().unwrap() + first["e2e"].as_f64().unwrap() * 1000.0;
        probes_ended = probes_ended.min(first_end);
        // 2 ms: the records' start is truncated to the ms.
        let before = decided_by.iter().filter(|(x, r, t)| x == b && r == "cheapest" && t + 2.0 < first_end);
        assert!(before.count() <= 1, "one probe, not a burst: {first} {decided_by:?}");
    }
    // Until a probe's sample can land, budget takes all but the two probes and explorations (a
    // loaded machine may stretch the wave past that: what follows is then routed on numbers).
    let early: Vec<_> = decided_by.iter().filter(|(_, _, t)| t + 2.0 < probes_ended).collect();
    let elsewhere = early.iter().filter(|(b, r, _)| b != "budget" && r != "explore").count();
    assert!(elsewhere <= 2, "{decided_by:?}");
    assert!(to_budget >= 1, "{served:?}");
    // Now budget's TTFT p95 (~400 ms) is measured and misses the interactive class's 200 ms:
    // the next cheapest, standard, serves.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = send(gp.proxy, post_json("/v1/chat/completions", body)).await;
    assert_eq!(r.headers["x-goodput-backend"], "standard", "{:?}", r.headers);
    assert_eq!(r.headers["x-goodput-reason"], "cheapest");
    let recs = gp.records(13).await;
    let rec = latest(&recs);
    assert_eq!(rec["backend"], "standard");
    assert_eq!(rec["model"], "sim-model");
    assert!(rec["ttft"].as_f64().unwrap() > 0.03, "demo TTFT is around 80 ms");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let m = gp.metrics().await;
    assert_eq!(
        metric(&m, "gen_ai_server_time_to_first_token_seconds_count", &[("backend", "budget")]),
        to_budget as f64
    );
    assert_eq!(
        metric(&m, "goodput_route_decisions_total", &[("backend", "standard"), ("reason", "cheapest")]),
        standard_cheapest as f64 + 1.0
    );
}
