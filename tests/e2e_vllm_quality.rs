//! The hallucination rate on real traffic: two backends on the two vLLM replicas of the run
//! (`scripts/test.sh` starts them; SmolLM2-135M-Instruct), asked the factual questions of
//! `scripts/eval/facts.tsv`. `healthy` is asked at temperature 0.7; `gibberish` at 1.8, where
//! SmolLM2's answers fall apart. goodput checks every response with the consistency setup of
//! the reference config (`embedding` first, calibrated on `healthy` with the error rate the
//! labelled evaluation measured), and must report a rate well below one half for `healthy`, a
//! clearly higher one for `gibberish`, and effective TPS that puts `healthy` first; a class
//! bounded by the rate then routes away from `gibberish`.

use crate::common::vllm::*;
use crate::common::*;
use serde_json::Value;
use std::time::{Duration, Instant};

/// The stated error rate of SmolLM2 on these questions (README, "Hallucination rate"), as the
/// reference config states it.
const REFERENCE_RATE: f64 = 0.36;
/// The threshold is a quantile of these checks' scores, so their number sets how far the later
/// rate may wander from REFERENCE_RATE. With 12, one full run (2026-12-05) got a threshold
/// that sat low and a healthy rate of 10 in 15; with 20 the quantile's spread is a fifth
/// smaller, and a rate that high several times less likely.
const CALIBRATION_CHECKS: usize = 20;

fn facts() -> Vec<(String, String, Vec<String>)> {
    std::fs::read_to_string("scripts/eval/facts.tsv")
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            (f[0].to_string(), f[1].to_string(), f[2].split('|').map(str::to_string).collect())
        })
        .collect()
}

/// scripts/eval/hallucination.py's label: the answer names one of the accepted answers as a
/// whole word (case-insensitive but for chemical symbols).
fn correct(kind: &str, answer: &str, accepted: &[String]) -> bool {
    accepted.iter().any(|a| {
        let (hay, needle) = if kind == "symbol" {
            (answer.to_string(), a.clone())
        } else {
            (answer.to_lowercase(), a.to_lowercase())
        };
        hay.match_indices(&needle).any(|(i, m)| {
            let before = hay[..i].chars().next_back();
            let after = hay[i + m.len()..].chars().next();
            !before.is_some_and(|c| c.is_ascii_alphanumeric())
                && !after.is_some_and(|c| c.is_ascii_alphanumeric())
        })
    })
}

fn config(a: &Vllm, b: &Vllm, embed: &str, ort: &str) -> String {
    format!(
        r#"
backends:
  - {{name: healthy, url: "{}", models: [smollm2], price: {{input_per_1m: 0.2, output_per_1m: 0.2}}}}
  - {{name: gibberish, url: "{}", models: [smollm2], price: {{input_per_1m: 0.1, output_per_1m: 0.1}}}}
routes:
  - {{name: healthy, match: {{headers: {{x-traffic: healthy}}}}, backends: [healthy]}}
  - {{name: gibberish, match: {{headers: {{x-traffic: gibberish}}}}, backends: [gibberish]}}
  - {{name: either, match: {{headers: {{x-traffic: either}}}}, class: strict}}
classes:
  strict: {{max_hallucination_rate: 0.5, objective: cheapest}}
routing: {{exploration: 0.0, response_headers: true}}
metrics: {{window_secs: 900, recent_records: 1000}}
quality:
  max_cpu: 2
  consistency:
    sample_rate: 1.0
    samples: 3
    max_tokens: 40
    methods: [embedding, unigram]
    embedding_model_dir: {embed}
    onnxruntime: {ort}
    max_token_share: 100
    max_concurrent: 4
    queue_capacity: 256
    calibration: {{reference_backend: healthy, checks: {CALIBRATION_CHECKS}, reference_rate: {REFERENCE_RATE}}}
"#,
        a.url, b.url
    )
}

/// Ask `questions` through goodput, two at a time; whether each answer was right.
async fn ask(
    gp: &Goodput,
    traffic: &str,
    temperature: f64,
    questions: &[(String, String, Vec<String>)],
) -> Vec<bool> {
    let mut out = Vec::new();
    for pair in questions.chunks(2) {
        let tasks: Vec<_> = pair
            .iter()
            .map(|(_, q, _)| {
                let body = serde_json::json!({
                    "model": "smollm2", "temperature": temperature, "max_tokens": 40,
                    "messages": [
                        {"role": "system", "content": "You are a helpful assistant. Answer in one short sentence."},
                        {"role": "user", "content": q},
                    ],
                });
                let mut req = post_json("/v1/chat/completions", &body.to_string());
                req.headers_mut().insert("x-traffic", traffic.parse().unwrap());
                tokio::spawn(send(gp.proxy, req))
            })
            .collect();
        let mut replies = Vec::new();
        for t in tasks {
            replies.push(t.await.unwrap());
        }
        for ((kind, _, accepted), r) in pair.iter().zip(replies) {
            assert_eq!(r.status, 200, "{traffic}: {}", r.text());
            let text = r.json()["choices"][0]["message"]["content"].as_str().unwrap_or_default().to_string();
            out.push(correct(kind, &text, accepted));
        }
    }
    out
}

fn backend<'a>(b: &'a Value, name: &str) -> &'a Value {
    b["backends"].as_array().unwrap().iter().find(|x| x["name"] == name).unwrap()
}

/// Wait until every response sent has been checked (or its check counted as not run).
async fn checks_done(gp: &Goodput, want: usize) -> Value {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let text = gp.metrics().await;
        let done = metric(&text, "goodput_consistency_checked_total", &[])
            + metric(&text, "goodput_consistency_failed_total", &[])
            + metric(&text, "goodput_shadow_checks_skipped_total", &[]);
        if done >= want as f64 {
            assert_eq!(metric(&text, "goodput_consistency_checked_total", &[]), want as f64, "{text}");
            // Windows are published every 250 ms.
            tokio::time::sleep(Duration::from_millis(400)).await;
            return gp.admin_json("/admin/backends").await;
        }
        assert!(Instant::now() < deadline, "checks did not finish: {done} of {want}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthy_and_gibberish_traffic_get_rates_that_order_them() {
    let (_pair, a, b) = vllm_pool().await;
    let env = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} is not set: run scripts/test.sh"));
    let gp = Goodput::start(&config(&a, &b, &env("GOODPUT_EMBED_DIR"), &env("ORT_DYLIB_PATH")));
    let facts = facts();
    let (reference, rest) = facts.split_at(CALIBRATION_CHECKS);
    let later = &rest[..14];

    // The reference period: `healthy`'s first checks set the threshold.
    let mut healthy = ask(&gp, "healthy", 0.7, reference).await;
    let b0 = checks_done(&gp, reference.len()).await;
    let src = &backend(&b0, "healthy")["consistency_rate"];
    assert_eq!(
        (src["state"].as_str(), src["reference"].as_str(), src["method"].as_str()),
        (Some("calibrated"), Some("healthy"), Some("embedding")),
        "{src}"
    );

    // Then both kinds of traffic, side by side, judged against that threshold.
    let (h, g) = tokio::join!(ask(&gp, "healthy", 0.7, later), ask(&gp, "gibberish", 1.8, later));
    healthy.extend(h);
    let bk = checks_done(&gp, reference.len() + 2 * later.len()).await;
    let (hb, gb) = (backend(&bk, "healthy"), backend(&bk, "gibberish"));
    let rate = |x: &Value| x["window"]["quality"]["hallucination_rate"].as_f64();
    let eff = |x: &Value| x["window"]["goodput"]["effective_tps"].as_f64();
    let wrong = |v: &[bool]| v.iter().filter(|ok| !**ok).count() as f64 / v.len() as f64;
    println!(
        "healthy: rate {:?} over {} rated, {:.2} of its answers wrong, effective TPS {:?}\n\
         gibberish: rate {:?} over {} rated, {:.2} wrong, effective TPS {:?}",
        rate(hb),
        hb["window"]["quality"]["consistency_rated"],
        wrong(&healthy),
        eff(hb),
        rate(gb),
        gb["window"]["quality"]["consistency_rated"],
        wrong(&g),
        eff(gb),
    );
    assert_eq!(gb["consistency_rate"]["state"], "calibrated", "{}", gb["consistency_rate"]);
    let (hr, gr) = (rate(hb).expect("healthy has a rate"), rate(gb).expect("gibberish has a rate"));
    // The threshold's share of the reference is REFERENCE_RATE; later healthy answers land
    // near it (twenty checks set it, so not exactly), gibberish nearly all above.
    assert!(hr < 0.65, "healthy rate {hr}");
    assert!(gr > 0.85 && gr - hr > 0.3, "gibberish rate {gr} against healthy {hr}");
    assert!(wrong(&g) > 0.8, "temperature 1.8 did not give gibberish: {:.2} wrong", wrong(&g));
    let (he, ge) = (eff(hb).expect("healthy effective TPS"), eff(gb).expect("gibberish effective TPS"));
    assert!(he > ge, "effective TPS: healthy {he}, gibberish {ge}");
    // Both carry the interval of a calibration on twenty checks: wide, and around the rate.
    for (b, r) in [(hb, hr), (gb, gr)] {
        let ci = &b["window"]["quality"]["hallucination_rate_interval"];
        let (lo, hi) = (ci[0].as_f64().unwrap(), ci[1].as_f64().unwrap());
        assert!(lo <= r && r <= hi && lo < hi, "{r} not in {ci}");
        let e = &b["window"]["goodput"]["effective_tps_interval"];
        assert!(e[0].as_f64().unwrap() <= e[1].as_f64().unwrap(), "{e}");
    }

    // A class bounded at 0.5 routes by the interval: gibberish, the cheaper backend, is
    // confidently over the bound and out; healthy, whose interval reaches below it, is chosen.
    assert_eq!(ask(&gp, "either", 0.7, &rest[14..15]).await.len(), 1);
    let routes = gp.admin_json("/admin/routes").await;
    let e = routes["recent_decisions"][0]["explanation"].as_str().unwrap();
    println!("decision: {e}");
    assert!(
        e.starts_with("cheapest: healthy among compliant [healthy]; gibberish misses hallucination rate"),
        "{e}"
    );
    assert!(e.contains("(95% from ") && e.ends_with("> 0.50"), "{e}");
}
