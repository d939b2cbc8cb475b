//! A silently degraded replica, caught on real vLLM. `scripts/test.sh` starts the run's second
//! replica as `scripts/degrade.sh sampling` makes one: `--override-generation-config
//! '{"temperature": 1.8}'`, a bad deploy's default sampling. A request that sets its own
//! temperature is served as the first replica serves it; one that does not gets fast gibberish,
//! and every latency metric stays green.
//!
//! Both replicas form one pool behind goodput, which scores every response's bits per byte under
//! the reference model, and a real Prometheus scrapes goodput with the shipped alert rules.
//! - The chat mix at temperature 0.7 (two healthy replicas, as far as that traffic can tell):
//!   no confident drift, no alert, nothing drained.
//! - The same mix at the servers' default sampling: the second replica's drift against its peer
//!   becomes confident, the `GoodputQualityDrift` rule fires on the scraped metrics, and the
//!   router drains that replica but for the probe share.

use crate::common::prom::*;
use crate::common::vllm::*;
use crate::common::*;
use serde_json::Value;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Scores each replica needs before drift is stated (the reference config says 20; fewer here
/// to keep the test short, and the interval accounts for how few).
const MIN_SAMPLES: u64 = 10;

fn config(a: &Vllm, b: &Vllm) -> String {
    let (model, ort) = reference_model();
    format!(
        r#"
backends:
  - name: pool
    endpoints: ["{}", "{}"]
    models: [smollm2]
routing: {{exploration: 0.0, response_headers: true}}
metrics: {{window_secs: 900}}
quality:
  sample_rate: 1.0
  window_secs: 900
  max_cpu: 2
  queue_capacity: 256
  perplexity: {{model_dir: {model}, onnxruntime: {ort}, max_response_tokens: 128}}
  drift: {{min_samples: {MIN_SAMPLES}}}
"#,
        a.url, b.url
    )
}

/// The shipped rules, with the drift alert's 15 minutes of `for` cut to seconds: the expression
/// and its labels are what is tested on real scrapes (promtool tests the `for`).
fn rules(dir: &std::path::Path) -> std::path::PathBuf {
    let text = std::fs::read_to_string("helm/goodput/files/goodput-rules.yaml").unwrap();
    let from = "expr: goodput_quality_drift_confident == 1\n        for: 15m";
    assert!(text.contains(from), "the drift alert changed: update this test");
    let path = dir.join("rules.yaml");
    std::fs::write(&path, text.replace(from, "expr: goodput_quality_drift_confident == 1\n        for: 3s"))
        .unwrap();
    path
}

fn prompts() -> Vec<Value> {
    std::fs::read_to_string("scripts/eval/chat-prompts.jsonl")
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["messages"].clone())
        .collect()
}

/// `n` requests of the chat mix from `from` on, four at a time; which endpoint served each.
async fn traffic(gp: &Goodput, temperature: Option<f64>, from: usize, n: usize) -> HashMap<String, u64> {
    let mix = prompts();
    let mut served = HashMap::new();
    for chunk in (from..from + n).collect::<Vec<_>>().chunks(4) {
        let tasks: Vec<_> = chunk
            .iter()
            .map(|&i| {
                let mut body = serde_json::json!({"model": "smollm2", "max_tokens": 48,
                    "messages": mix[i % mix.len()]});
                if let Some(t) = temperature {
                    body["temperature"] = t.into();
                }
                tokio::spawn(send(gp.proxy, post_json("/v1/chat/completions", &body.to_string())))
            })
            .collect();
        for t in tasks {
            let r = t.await.unwrap();
            assert_eq!(r.status, 200, "{}", r.text());
            let e = r.headers.get("x-goodput-endpoint").unwrap().to_str().unwrap().to_string();
            *served.entry(e).or_default() += 1;
        }
    }
    served
}

/// Scored responses per endpoint, once every response sent has been scored (or counted as not).
async fn scored(gp: &Goodput, sent: u64) -> (Value, HashMap<String, u64>) {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let m = gp.metrics().await;
        let done = metric(&m, "goodput_scored_responses_total", &[])
            + metric(&m, "goodput_scoring_dropped_total", &[])
            + metric(&m, "goodput_scoring_failed_total", &[]);
        if done >= sent as f64 {
            // Drift is published with the windows, every 250 ms.
            tokio::time::sleep(Duration::from_millis(400)).await;
            let bk = gp.admin_json("/admin/backends").await;
            let eps = bk["backends"][0]["endpoints"].as_array().cloned().unwrap_or_default();
            let by = eps
                .iter()
                .map(|e| {
                    let n = e["window"]["quality"]["scored"].as_u64().unwrap_or(0);
                    (e["endpoint"].as_str().unwrap().to_string(), n)
                })
                .collect();
            return (bk, by);
        }
        assert!(Instant::now() < deadline, "scoring did not finish: {done} of {sent}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn bits_per_byte_drift(bk: &Value, endpoint: &str) -> Option<Value> {
    let e = bk["backends"][0]["endpoints"].as_array()?.iter().find(|e| e["endpoint"] == endpoint)?;
    e["drift"].as_array()?.iter().find(|d| d["signal"] == "bits_per_byte").cloned()
}

async fn alerts(port: u16, state: &str) -> Vec<Value> {
    let q = format!("ALERTS{{alertname=\"GoodputQualityDrift\",alertstate=\"{state}\"}}");
    query(port, &q).await["data"]["result"].as_array().cloned().unwrap_or_default()
}

fn decided(m: &str, endpoint: &str, reason: &str) -> f64 {
    metric(
        m,
        "goodput_endpoint_decisions_total",
        &[("backend", "pool"), ("endpoint", endpoint), ("reason", reason)],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_degraded_replica_is_detected_alerted_and_drained_and_a_healthy_pair_is_not() {
    let (_pool, a, b) = vllm_pool().await;
    let (ea, eb) =
        (a.url.trim_start_matches("http://").to_string(), b.url.trim_start_matches("http://").to_string());

    // Two healthy replicas: traffic that sets its own temperature.
    {
        let gp = Goodput::start(&config(&a, &b));
        let rules = rules(&gp.dir);
        let (_prom, port) = start_prometheus(gp.admin, &[&rules]).await;
        let mut sent = 0;
        let bk = loop {
            let got = traffic(&gp, Some(0.7), sent, 8).await;
            sent += 8;
            let (bk, by) = scored(&gp, sent as u64).await;
            if by.values().all(|&n| n >= MIN_SAMPLES + 6) && by.len() == 2 {
                break bk;
            }
            assert!(sent < 96, "both replicas get scored traffic: {by:?} (last round {got:?})");
        };
        for e in [&ea, &eb] {
            let d = bits_per_byte_drift(&bk, e).unwrap_or_else(|| panic!("{e} has a drift reading: {bk}"));
            println!("healthy pair, {e}: {d}");
            assert_eq!(d["confident"], false, "a false alarm: {d}");
            assert_eq!(d["reference"]["kind"], "peers", "{d}");
        }
        let m = gp.metrics().await;
        for e in [&ea, &eb] {
            let labels = [
                ("scope", "endpoint"),
                ("name", e.as_str()),
                ("backend", "pool"),
                ("signal", "bits_per_byte"),
            ];
            assert_eq!(metric(&m, "goodput_quality_drift_confident", &labels), 0.0, "{m}");
            assert_eq!(decided(&m, e, "quality_degraded") + decided(&m, e, "quality_probe"), 0.0, "{m}");
        }
        // Prometheus has scraped both readings, with the rule evaluated since: quiet.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let v = query(port, "goodput_quality_drift_confident{signal=\"bits_per_byte\"}").await;
            if v["data"]["result"].as_array().is_some_and(|r| r.len() == 2) {
                break;
            }
            assert!(Instant::now() < deadline, "Prometheus never scraped the drift: {v}");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
        let (p, f) = (alerts(port, "pending").await, alerts(port, "firing").await);
        assert!(p.is_empty() && f.is_empty(), "no alert for a healthy pair: {p:?} {f:?}");
    }

    // The servers' default sampling: the second replica's is broken.
    let gp = Goodput::start(&config(&a, &b));
    let rules = rules(&gp.dir);
    let (_prom, port) = start_prometheus(gp.admin, &[&rules]).await;
    let t0 = Instant::now();
    let mut sent = 0;
    let bk = loop {
        let got = traffic(&gp, None, sent, 8).await;
        sent += 8;
        let (bk, by) = scored(&gp, sent as u64).await;
        if bits_per_byte_drift(&bk, &eb).is_some_and(|d| d["confident"] == true) {
            println!(
                "detected after {sent} responses ({by:?} scored) and {:.0} s",
                t0.elapsed().as_secs_f64()
            );
            break bk;
        }
        assert!(sent < 96, "the degraded replica was not detected: {bk} (last round {got:?})");
    };
    let (da, db) = (bits_per_byte_drift(&bk, &ea).unwrap(), bits_per_byte_drift(&bk, &eb).unwrap());
    println!("degraded: {eb}: {db}\nhealthy: {ea}: {da}");
    assert_eq!(db["reference"]["names"], serde_json::json!([ea.clone()]), "{db}");
    assert!(db["lower"].as_f64().unwrap() > 0.1, "{db}");
    assert_eq!(da["confident"], false, "only the degraded replica: {da}");

    // The alert fires on what Prometheus scraped, naming the replica.
    let deadline = Instant::now() + Duration::from_secs(60);
    let fired = loop {
        let f = alerts(port, "firing").await;
        if !f.is_empty() {
            break f;
        }
        assert!(Instant::now() < deadline, "GoodputQualityDrift did not fire");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(fired.len(), 1, "{fired:?}");
    let l = &fired[0]["metric"];
    assert_eq!((l["scope"].as_str(), l["name"].as_str()), (Some("endpoint"), Some(eb.as_str())), "{l}");

    // Routing drains it but for the probe share (5%), and says why.
    let m0 = gp.metrics().await;
    let after = traffic(&gp, None, sent, 32).await;
    let (to_a, to_b) = (after.get(&ea).copied().unwrap_or(0), after.get(&eb).copied().unwrap_or(0));
    println!("after detection: {to_a} to the healthy replica, {to_b} to the degraded one");
    assert!(to_b <= 5, "drained: {after:?}");
    let m = gp.metrics().await;
    let delta = |e: &str, reason: &str| decided(&m, e, reason) - decided(&m0, e, reason);
    assert_eq!(
        (delta(&ea, "quality_degraded"), delta(&eb, "quality_probe")),
        (to_a as f64, to_b as f64),
        "{m}"
    );
    let routes = gp.admin_json("/admin/routes").await.to_string();
    assert!(routes.contains(&format!("{eb} drained (bits_per_byte +")), "{routes}");
}
