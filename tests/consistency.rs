//! Consistency checks (SelfCheckGPT) behind the proxy: shadow re-sampling of the same prompt from
//! the same backend, its budget and metrics, the unigram and prompt methods, and cancellation at
//! shutdown. The upstream is the simulator (deterministic per seed, prompt and temperature).

use crate::common::*;
use std::time::{Duration, Instant};

fn consistency_yaml(sim: &std::net::SocketAddr, extra: &str) -> String {
    format!(
        "backends:\n  - name: sim\n    url: http://{sim}\n    models: [sim-model]\n\
         quality:\n  consistency:\n    sample_rate: 1.0\n    samples: 3\n    max_token_share: 100.0\n{extra}"
    )
}

fn chat(max_tokens: u32, stream: bool) -> String {
    serde_json::json!({
        "model": "sim-model", "stream": stream, "max_tokens": max_tokens, "temperature": 0,
        "messages": [{"role": "user", "content": "Tell me about the tower."}]
    })
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_resamples_are_scored_and_not_user_traffic() {
    let (sim_addr, sim) = spawn_sim(0.0, 0.0, 24).await;
    let gp = Goodput::start(&consistency_yaml(
        &sim_addr,
        "    methods: [prompt, unigram]\n    max_sentences: 2\n",
    ));
    // Malformed JSON, even with the forcing header, is forwarded and never re-sampled.
    let mut bad = post_json("/v1/chat/completions", "{\"model\": \"sim-model\", \"messages\": [");
    bad.headers_mut().insert("x-goodput-score", "1".parse().unwrap());
    let r = send(gp.proxy, bad).await;
    assert_eq!(r.status, 400, "the upstream's answer reaches the client");
    let r = send(gp.proxy, post_json("/v1/chat/completions", &chat(24, true))).await;
    assert_eq!(r.status, 200);
    let text = wait_metric(&gp, "goodput_consistency_checked_total", &[("backend", "sim")], 1.0).await;

    // K = 3 re-samples in one request with n = 3 (the simulator honours `n`) and, for
    // `prompt`, one judge call per (sentence, sample).
    let shadow =
        |kind: &str| metric(&text, "goodput_shadow_requests_total", &[("kind", kind), ("outcome", "ok")]);
    let judged = shadow("judge");
    assert_eq!((shadow("samples_n"), shadow("sample")), (1.0, 0.0));
    assert!((3.0..=6.0).contains(&judged) && judged % 3.0 == 0.0, "judge calls {judged}");
    // The upstream saw all of them; goodput's user-traffic metrics saw one request.
    // (The simulator counts requests: the malformed one was refused before it counted.)
    assert_eq!(sim.requests() as f64, 1.0 + 1.0 + judged);
    assert_eq!(metric(&text, "goodput_requests_total", &[]), 2.0);
    assert!(metric(&text, "goodput_shadow_tokens_total", &[("kind", "samples_n"), ("type", "output")]) > 0.0);

    // The simulator's judge answers are neither Yes nor No: SelfCheck-Prompt maps them to 0.5.
    // The checker counts the check before the recorder, on its next drain, files the score
    // with the request's record.
    let recs = gp.records_when(2, "with a score", |r| !latest(r)["hallucination_score"].is_null()).await;
    let rec = latest(&recs);
    assert_eq!(rec["hallucination_score"], 0.5, "{rec}");
    assert_eq!(rec["consistency_scores"]["prompt"], 0.5, "{rec}");
    assert!(rec["consistency_scores"]["unigram"].as_f64().is_some(), "{rec}");
    assert_eq!(rec["hallucinated"], false, "prompt's 0.5 is not above the 0.5 threshold: {rec}");
    let sentences = rec["sentence_scores"].as_array().unwrap();
    assert!(!sentences.is_empty() && sentences.iter().all(|s| s == 0.5));
    assert_eq!(metric(&text, "goodput_consistency_score_count", &[("method", "prompt")]), 1.0);
    assert_eq!(metric(&text, "goodput_consistency_score_count", &[("method", "unigram")]), 1.0);
    // Re-samples at temperature 1 differ from the response: the unigram score is in (0, 1).
    let uni = metric(&text, "goodput_consistency_score_sum", &[("method", "unigram")]);
    assert!(uni > 0.0 && uni < 1.0, "{uni}");
    // The router's view: the windowed hallucination rate with its sample count (published
    // every 250 ms).
    let deadline = Instant::now() + Duration::from_secs(5);
    let b = loop {
        let b = gp.admin_json("/admin/backends").await;
        if b["backends"][0]["window"]["quality"]["consistency_checked"] == 1 || Instant::now() > deadline {
            break b;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let q = &b["backends"][0]["window"]["quality"];
    assert_eq!(q["consistency_checked"], 1);
    assert_eq!(q["hallucination_rate"], 0.0, "0.5 does not exceed the 0.5 threshold: {q}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_budget_skips_checks_and_counts_them() {
    let (sim_addr, sim) = spawn_sim(0.0, 0.0, 16).await;
    let gp = Goodput::start(&format!(
        "backends:\n  - name: sim\n    url: http://{sim_addr}\n\
         quality:\n  consistency:\n    sample_rate: 1.0\n    max_token_share: 0.5\n    resample: separate\n"
    ));
    // A check is estimated at 3 x (prompt + max_tokens), about 3x the request's own tokens:
    // with half the user tokens as budget the first requests cannot afford one, a later one
    // can, and the share stays under 0.5.
    for _ in 0..8 {
        let r = send(gp.proxy, post_json("/v1/chat/completions", &chat(16, false))).await;
        assert_eq!(r.status, 200);
    }
    let text =
        wait_metric(&gp, "goodput_shadow_checks_skipped_total", &[("reason", "token_budget")], 1.0).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let text2 = gp.metrics().await;
    let shadow = metric(&text2, "goodput_shadow_tokens_total", &[]);
    let user = metric(&text2, "goodput_tokens_total", &[]);
    assert!(shadow <= 0.5 * user, "shadow {shadow} tokens vs user {user}");
    let skipped = metric(&text, "goodput_shadow_checks_skipped_total", &[("reason", "token_budget")]);
    assert!(skipped >= 1.0);
    let checked = metric(&text2, "goodput_consistency_checked_total", &[]);
    assert_eq!(sim.requests() as f64, 8.0 + 3.0 * checked, "every check that ran cost 3 re-samples");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_cancels_shadow_requests_upstream() {
    // Slow generations (10 ms a token, 300 tokens: 3 s): the re-samples are still running when
    // goodput is told to stop. The user's request sets no max_tokens, so neither do they.
    let (sim_addr, sim) = spawn_sim(0.0, 10.0, 300).await;
    let mut gp = Goodput::start(&consistency_yaml(&sim_addr, "    max_tokens: 300\n"));
    let body = serde_json::json!({"model": "sim-model", "stream": true,
        "messages": [{"role": "user", "content": "hi"}]})
    .to_string();
    let r = send(gp.proxy, post_json("/v1/chat/completions", &body)).await;
    assert_eq!(r.status, 200);
    let deadline = Instant::now() + Duration::from_secs(10);
    while sim.requests() < 2 {
        assert!(Instant::now() < deadline, "no shadow request reached the upstream");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let t = Instant::now();
    unsafe { libc::kill(gp.child.id() as i32, libc::SIGTERM) };
    let status = gp.child.wait().unwrap();
    assert!(status.success());
    assert!(t.elapsed() < Duration::from_secs(2), "shutdown waited for the shadow requests");
    let deadline = Instant::now() + Duration::from_secs(2);
    while sim.cancelled() < 1 {
        assert!(Instant::now() < deadline, "the upstream never saw the shadow requests go away");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A ranking method's scores are not a rate: none is reported until a threshold is calibrated
/// on the stated reference; then the reference's stated share lies above it, the threshold is
/// shown and exported, and a calibration on command starts over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ranking_method_reports_a_rate_only_once_calibrated() {
    let (sim_addr, _sim) = spawn_sim(0.0, 0.0, 24).await;
    let gp = Goodput::start(&consistency_yaml(
        &sim_addr,
        "    methods: [unigram]\n    calibration: {reference_backend: sim, checks: 10, reference_rate: 0.2, reference_labelled: 20}\n",
    ));
    let ask = |i: usize| {
        let body = serde_json::json!({
            "model": "sim-model", "max_tokens": 24, "temperature": 0,
            "messages": [{"role": "user", "content": format!("Tell me about tower number {i}.")}],
        });
        send(gp.proxy, post_json("/v1/chat/completions", &body.to_string()))
    };
    let rate_source = || async {
        // Published every 250 ms.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let b = gp.admin_json("/admin/backends").await;
        (b["backends"][0]["consistency_rate"].clone(), b["backends"][0]["window"]["quality"].clone())
    };
    assert_eq!(ask(0).await.status, 200);
    wait_metric(&gp, "goodput_consistency_checked_total", &[], 1.0).await;
    let (src, q) = rate_source().await;
    assert_eq!(
        (src["state"].as_str(), src["have"].as_u64(), src["need"].as_u64()),
        (Some("calibrating"), Some(1), Some(10)),
        "{src}"
    );
    assert_eq!(
        (q["consistency_checked"].as_u64(), q["consistency_rated"].as_u64()),
        (Some(1), Some(0)),
        "{q}"
    );
    assert!(q["hallucination_rate"].is_null(), "no rate before calibration: {q}");

    for i in 1..14 {
        assert_eq!(ask(i).await.status, 200);
    }
    wait_metric(&gp, "goodput_consistency_checked_total", &[], 14.0).await;
    let text = wait_metric(&gp, "goodput_consistency_rated_total", &[], 5.0).await;
    let (src, q) = rate_source().await;
    assert_eq!(
        (src["state"].as_str(), src["reference"].as_str(), src["checks"].as_u64()),
        (Some("calibrated"), Some("sim"), Some(10)),
        "{src}"
    );
    let threshold = src["threshold"].as_f64().unwrap();
    assert!(threshold > 0.0 && threshold < 1.0, "{src}");
    // The tenth check set the threshold and was the first with a verdict.
    assert_eq!(
        (q["consistency_checked"].as_u64(), q["consistency_rated"].as_u64()),
        (Some(14), Some(5)),
        "{q}"
    );
    let rate = q["hallucination_rate"].as_f64().expect("a calibrated rate");
    assert!((0.0..=1.0).contains(&rate));
    // The stated rate's interval over 10 checks and 20 labelled answers (an effective 6.7, Wilson
    // 0.044-0.575), and the thresholds at its ends around the threshold.
    let f = |v: &serde_json::Value, i: usize| v[i].as_f64().unwrap();
    let ri = &src["reference_rate_interval"];
    assert!((f(ri, 0) - 0.0441).abs() < 1e-3 && (f(ri, 1) - 0.5752).abs() < 1e-3, "{src}");
    let band = &src["band"];
    assert!(f(band, 0) <= threshold && threshold <= f(band, 1), "{src}");
    // The rate's interval holds the rate; Prometheus has the same three figures.
    let ci = &q["hallucination_rate_interval"];
    assert!(f(ci, 0) <= rate && rate <= f(ci, 1) && f(ci, 1) - f(ci, 0) > 0.2, "{q}");
    let now = gp.metrics().await;
    let bound = |b: &str| {
        metric(
            &now,
            "goodput_window_hallucination_rate",
            &[("scope", "backend"), ("name", "sim"), ("bound", b)],
        )
    };
    for (b, want) in [("lower", f(ci, 0)), ("estimate", rate), ("upper", f(ci, 1))] {
        assert!((bound(b) - want).abs() < 1e-12, "{b}: {} against {q}", bound(b));
    }
    // The band's counters are what a router replica reads through Prometheus: their Wilson
    // intervals over the rated count give the same bounds.
    let band_count =
        |end: &str| metric(&now, "goodput_consistency_hallucinated_band_total", &[("end", end)]) as u64;
    let rated = q["consistency_rated"].as_u64().unwrap();
    let wilson = |k: u64| goodput::goodput::wilson(k, rated, 1.96).unwrap();
    assert!((wilson(band_count("lower")).0 - f(ci, 0)).abs() < 1e-12, "{now}");
    assert!((wilson(band_count("upper")).1 - f(ci, 1)).abs() < 1e-12, "{now}");
    assert_eq!(metric(&text, "goodput_consistency_rated_total", &[]), 5.0);
    let text = gp.metrics().await;
    // The exposition format and JSON may print the same f64 with different digits.
    let exported = metric(
        &text,
        "goodput_consistency_threshold",
        &[("backend", "sim"), ("method", "unigram"), ("source", "calibrated")],
    );
    assert!((exported - threshold).abs() < 1e-12, "exported {exported}, admin {threshold}");

    // Calibrate again: the threshold goes, and the next checks collect anew.
    let r = send(gp.admin, http::Request::post("/admin/calibrate").body(Default::default()).unwrap()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let (src, _) = rate_source().await;
    assert_eq!((src["state"].as_str(), src["have"].as_u64()), (Some("calibrating"), Some(0)), "{src}");
    assert!(!gp.metrics().await.contains("goodput_consistency_threshold{"), "no threshold while calibrating");
}

/// Without calibration a ranking method still exports its scores, and the rate is null: never
/// the ~100% that a fixed threshold on unigram surprise reports for healthy text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncalibrated_ranking_method_reports_scores_and_no_rate() {
    let (sim_addr, _sim) = spawn_sim(0.0, 0.0, 24).await;
    let gp = Goodput::start_logged(&consistency_yaml(&sim_addr, ""), &[], &[]);
    assert_eq!(send(gp.proxy, post_json("/v1/chat/completions", &chat(24, false))).await.status, 200);
    let text = wait_metric(&gp, "goodput_consistency_score_count", &[("method", "unigram")], 1.0).await;
    assert_eq!(metric(&text, "goodput_consistency_rated_total", &[]), 0.0);
    assert_eq!(metric(&text, "goodput_consistency_hallucinated_total", &[]), 0.0);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let b = gp.admin_json("/admin/backends").await;
    let (src, q) = (&b["backends"][0]["consistency_rate"], &b["backends"][0]["window"]["quality"]);
    assert_eq!(src["state"], "uncalibrated", "{src}");
    assert!(q["hallucination_rate"].is_null() && q["consistency_checked"] == 1, "{q}");
    assert!(b["backends"][0]["router_stats"]["hallucination_rate"].is_null());
    // The config's warning says why, at load.
    assert!(gp.log().contains("no hallucination rate is reported"), "{}", gp.log());
    let r = send(gp.admin, http::Request::post("/admin/calibrate").body(Default::default()).unwrap()).await;
    assert_eq!(r.status, 409, "nothing to calibrate: {}", r.text());
}

/// A backend that refuses `n` with a client error while single requests succeed: that check's
/// re-samples are retaken one by one, and every later check goes that way from the start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_refuses_n_gets_separate_resamples() {
    let refused = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let r2 = refused.clone();
    let upstream = raw_upstream(move |mut s| {
        let refused = r2.clone();
        async move {
            use tokio::io::AsyncWriteExt;
            while let Some(req) = read_request_bytes(&mut s).await {
                let asks_n = String::from_utf8_lossy(&req).contains("\"n\":3");
                let (status, body) = if asks_n {
                    refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    ("400 Bad Request", r#"{"error":{"message":"n must be 1","type":"invalid_request_error"}}"#)
                } else {
                    ("200 OK", r#"{"id":"x","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"The river is long. It flows north."},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":8,"total_tokens":13}}"#)
                };
                let head = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                    body.len()
                );
                if s.write_all(head.as_bytes()).await.is_err() || s.write_all(body.as_bytes()).await.is_err() {
                    return;
                }
            }
        }
    })
    .await;
    let gp = Goodput::start(&consistency_yaml(&upstream, "    methods: [unigram]\n"));
    for i in 1..=2 {
        let r = send(gp.proxy, post_json("/v1/chat/completions", &chat(8, false))).await;
        assert_eq!(r.status, 200);
        wait_metric(&gp, "goodput_consistency_checked_total", &[], i as f64).await;
    }
    let text = gp.metrics().await;
    let shadow = |kind: &str, outcome: &str| {
        metric(&text, "goodput_shadow_requests_total", &[("kind", kind), ("outcome", outcome)])
    };
    assert_eq!(
        (shadow("samples_n", "error"), shadow("samples_n", "ok"), shadow("sample", "ok")),
        (1.0, 0.0, 6.0),
        "{text}"
    );
    assert_eq!(refused.load(std::sync::atomic::Ordering::Relaxed), 1);
    assert_eq!(metric(&text, "goodput_consistency_failed_total", &[]), 0.0);
}
