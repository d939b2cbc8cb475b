//! The hallucination rate on real traffic: two backends on the two vLLM replicas of the run
//! (`scripts/test.sh` starts them; SmolLM2-135M-Instruct), asked the factual questions of
//! `scripts/eval/facts.tsv`. `healthy` is asked at temperature 0.7; `gibberish` at 1.8, where
//! SmolLM2's answers fall apart. goodput checks every response with the consistency setup of
//! the reference config (`embedding` first, calibrated on `healthy` with the error rate the
//! labelled evaluation measured). Every answer is labelled as the evaluation labels it, so the
//! test knows the error rate goodput should report. goodput must report a rate for `healthy`
//! near the stated one, whose interval meets the observed error rate's; a clearly higher one
//! for `gibberish`; and effective TPS that puts `healthy` first. A class bounded by the rate
//! then routes away from `gibberish`.

use crate::common::vllm::*;
use crate::common::*;
use serde_json::Value;
use std::time::{Duration, Instant};

/// The stated error rate of SmolLM2 on these questions and how many labelled answers it was
/// measured on (README, "Hallucination rate"), as the reference config states them.
const REFERENCE_RATE: f64 = 0.34;
const REFERENCE_LABELLED: usize = 90;
/// The threshold is a quantile of these checks' scores, so their number sets how far the later
/// rate may wander from REFERENCE_RATE: about √(0.34 · 0.66 / 40) ≈ 0.075 with 40. With 12, one
/// full run (2026-12-05) got a threshold that sat low and a healthy rate of 10 in 15.
const CALIBRATION_CHECKS: usize = 40;

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
    calibration: {{reference_backend: healthy, checks: {CALIBRATION_CHECKS}, reference_rate: {REFERENCE_RATE}, reference_labelled: {REFERENCE_LABELLED}}}
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
    // Healthy traffic is traffic like the reference period's, so later traffic asks the same
    // questions again (each answer sampled anew). How a threshold carries over to questions it
    // never saw is the labelled evaluation's part (scripts/eval-hallucination.sh; README): on
    // so few questions, the mix of the two sets moves the rate more than the model does. Here
    // a threshold set on facts.tsv's first 50 questions (capitals and symbols) read the years
    // after them as 0.58 and 0.65 where 0.45 and 0.40 of the answers were wrong, and one set on
    // every other question read the rest as 0.51 and 0.61 against 0.35 and 0.39.
    // Every other question: each kind in facts.tsv (capitals, symbols, years, general) is in.
    let reference: Vec<_> = facts.iter().step_by(2).take(CALIBRATION_CHECKS).cloned().collect();
    // Twice each, so that the later answers' own sampling adds little to the threshold's
    // spread (below).
    let later: Vec<_> = reference.iter().chain(&reference).cloned().collect();
    // Gibberish is plain from a few answers.
    let later_gibberish = &reference[..20];

    // The reference period: `healthy`'s first checks set the threshold.
    let mut healthy = ask(&gp, "healthy", 0.7, &reference).await;
    let b0 = checks_done(&gp, reference.len()).await;
    let src = &backend(&b0, "healthy")["consistency_rate"];
    assert_eq!(
        (src["state"].as_str(), src["reference"].as_str(), src["method"].as_str()),
        (Some("calibrated"), Some("healthy"), Some("embedding")),
        "{src}"
    );

    // Then both kinds of traffic, side by side, judged against that threshold.
    let (h, g) = tokio::join!(ask(&gp, "healthy", 0.7, &later), ask(&gp, "gibberish", 1.8, later_gibberish));
    healthy.extend(h);
    let bk = checks_done(&gp, reference.len() + later.len() + later_gibberish.len()).await;
    let (hb, gb) = (backend(&bk, "healthy"), backend(&bk, "gibberish"));
    let rate = |x: &Value| x["window"]["quality"]["hallucination_rate"].as_f64();
    let eff = |x: &Value| x["window"]["goodput"]["effective_tps"].as_f64();
    let interval = |x: &Value| {
        let ci = &x["window"]["quality"]["hallucination_rate_interval"];
        (ci[0].as_f64().unwrap(), ci[1].as_f64().unwrap())
    };
    let wrong_count = |v: &[bool]| v.iter().filter(|ok| !**ok).count();
    let wrong = |v: &[bool]| wrong_count(v) as f64 / v.len() as f64;
    println!(
        "healthy: rate {:?} {:?} over {} rated, {:.2} of its answers wrong, effective TPS {:?}\n\
         gibberish: rate {:?} {:?} over {} rated, {:.2} wrong, effective TPS {:?}",
        rate(hb),
        interval(hb),
        hb["window"]["quality"]["consistency_rated"],
        wrong(&healthy),
        eff(hb),
        rate(gb),
        interval(gb),
        gb["window"]["quality"]["consistency_rated"],
        wrong(&g),
        eff(gb),
    );
    assert_eq!(gb["consistency_rate"]["state"], "calibrated", "{}", gb["consistency_rate"]);
    let (hr, gr) = (rate(hb).expect("healthy has a rate"), rate(gb).expect("gibberish has a rate"));
    // The threshold's share of the reference is REFERENCE_RATE, and later healthy answers
    // land near it, gibberish nearly all above. Near, not on: forty checks set the threshold,
    // so one run's rate spreads about 0.1 around it. It read below one half in the 25 runs
    // measured and 0.63 in one CI run (BENCHMARKS.md); the bound leaves room for that spread,
    // so that the test fails for a broken calibration, not for an unlucky one.
    assert!(hr < 0.6, "healthy rate {hr}");
    assert!(gr > 0.85 && gr - hr > 0.3, "gibberish rate {gr} against healthy {hr}");
    assert!(wrong(&g) > 0.8, "temperature 1.8 did not give gibberish: {:.2} wrong", wrong(&g));
    // The rate matches the labels: each backend's 95% interval (which carries the calibration's
    // own uncertainty) meets the 95% interval of the share of its answers that were wrong.
    // The healthy share is over every healthy answer, the reference period's too: the same
    // traffic, and more of it than the rated answers alone. Per answer, a 135M judge is weak
    // (README), so the rate itself can sit a tenth from the share. A point would not do for
    // gibberish either: one run read 19 of 20 where all 20 were wrong, and the interval of 19
    // in 20 ends at 0.99.
    for (name, b, answers) in [("healthy", hb, &healthy), ("gibberish", gb, &g)] {
        let (lo, hi) = interval(b);
        let k = wrong_count(answers) as u64;
        let (wlo, whi) = goodput::goodput::wilson(k, answers.len() as u64, 1.96).unwrap();
        assert!(
            lo <= whi && wlo <= hi,
            "{name}: {k} of {} answers wrong ({wlo:.2}–{whi:.2}), apart from the rate's interval \
             [{lo:.2}, {hi:.2}]",
            answers.len()
        );
    }
    let (he, ge) = (eff(hb).expect("healthy effective TPS"), eff(gb).expect("gibberish effective TPS"));
    assert!(he > ge, "effective TPS: healthy {he}, gibberish {ge}");
    // Both intervals lie around their rates.
    for (b, r) in [(hb, hr), (gb, gr)] {
        let (lo, hi) = interval(b);
        assert!(lo <= r && r <= hi && lo < hi, "{r} not in [{lo}, {hi}]");
        let e = &b["window"]["goodput"]["effective_tps_interval"];
        assert!(e[0].as_f64().unwrap() <= e[1].as_f64().unwrap(), "{e}");
    }

    // A class bounded at 0.5 routes by the interval: gibberish, the cheaper backend, is
    // confidently over the bound and out; healthy, whose interval reaches below it, is chosen.
    assert_eq!(ask(&gp, "either", 0.7, &facts[1..2]).await.len(), 1);
    let routes = gp.admin_json("/admin/routes").await;
    let e = routes["recent_decisions"][0]["explanation"].as_str().unwrap();
    println!("decision: {e}");
    assert!(
        e.starts_with("cheapest: healthy among compliant [healthy]; gibberish misses hallucination rate"),
        "{e}"
    );
    assert!(e.contains("(95% from ") && e.ends_with("> 0.50"), "{e}");
}
