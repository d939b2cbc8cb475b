//! A real Prometheus (Debian's package; `scripts/setup-test-deps.sh` installs it) scrapes a
//! running goodput under traffic, and a TTFT quantile is read back through its query API.

use crate::common::prom::*;
use crate::common::*;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_ttft_and_goodput() {
    let (sim_addr, _sim) = spawn_sim(30.0, 2.0, 8).await;
    let gp = Goodput::start(&format!(
        "backends:\n  - name: sim\n    url: http://{sim_addr}\n    models: [sim-model]\nslo:\n  ttft_ms: 100\n"
    ));
    let (_prom, port) = start_prometheus(gp.admin, &[]).await;

    // Traffic for a few scrape intervals.
    let body = r#"{"model":"sim-model","stream":true,"messages":[{"role":"user","content":"hello"}]}"#;
    let deadline = Instant::now() + Duration::from_secs(60);
    let q = "histogram_quantile(0.5, sum by (le) (rate(gen_ai_server_time_to_first_token_seconds_bucket{backend=\"sim\"}[30s])))";
    let p50 = loop {
        for _ in 0..5 {
            assert_eq!(send(gp.proxy, post_json("/v1/chat/completions", body)).await.status, 200);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        if let Ok(v) = tokio::time::timeout(Duration::from_secs(2), query(port, q)).await
            && let Some(x) = scalar(&v)
            && x.is_finite()
        {
            break x;
        }
        assert!(Instant::now() < deadline, "Prometheus never returned a TTFT quantile");
    };
    // The sim's TTFT is 30 ms; the quantile interpolates within the (0.02, 0.04] bucket.
    assert!((0.02..=0.04).contains(&p50), "TTFT p50 from Prometheus = {p50}");

    // Latency goodput ratio: every request met the 100 ms TTFT SLO.
    let ratio = scalar(
        &query(
            port,
            "sum(rate(goodput_slo_met_requests_total[30s])) / sum(rate(goodput_slo_judged_requests_total[30s]))",
        )
        .await,
    )
    .expect("goodput ratio");
    assert!((ratio - 1.0).abs() < 1e-9, "SLO attainment {ratio}");
    let up = scalar(&query(port, "up{job=\"goodput\"}").await);
    assert_eq!(up, Some(1.0));
}

/// Several router replicas share one view: router B reads per-backend statistics from
/// Prometheus, which scrapes goodput A (where the traffic was measured), and decides on them,
/// even against what its own windows say.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_reads_backend_statistics_from_prometheus() {
    let a = Goodput::start(
        r#"
backends:
  - name: quick
    sim: {model: m, ttft_ms: 10, tpot_ms: 1, output_tokens: 4}
  - name: sluggish
    sim: {model: m, ttft_ms: 300, tpot_ms: 1, output_tokens: 4}
routes:
  - {name: to-quick, match: {headers: {x-to: quick}}, backends: [quick]}
  - {name: to-sluggish, match: {headers: {x-to: sluggish}}, backends: [sluggish]}
"#,
    );
    let (_prom, port) = start_prometheus(a.admin, &[]).await;
    let body = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    // Steady traffic through A while B reads (rate() and increase() need it ongoing).
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let traffic = |to: &'static str| {
        let (proxy, stop) = (a.proxy, stop.clone());
        tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let mut r = post_json("/v1/chat/completions", body);
                r.headers_mut().insert("x-to", to.parse().unwrap());
                assert_eq!(send(proxy, r).await.status, 200);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let (q, s) = (traffic("quick"), traffic("sluggish"));

    // B's own simulators are the other way round: its local windows would favour sluggish.
    let b = Goodput::start(&format!(
        r#"
backends:
  - name: quick
    sim: {{model: m, ttft_ms: 300, tpot_ms: 1, output_tokens: 4}}
  - name: sluggish
    sim: {{model: m, ttft_ms: 10, tpot_ms: 1, output_tokens: 4}}
classes:
  snappy: {{objective: fastest}}
routing:
  default_class: snappy
  exploration: 0.0
  min_samples: 5
  response_headers: true
  stats: {{source: prometheus, prometheus_url: "http://127.0.0.1:{port}", refresh_secs: 1, range: 1m}}
"#
    ));
    let row = |v: &serde_json::Value, n: &str| {
        v["backends"].as_array().unwrap().iter().find(|x| x["name"] == n).unwrap()["router_stats"].clone()
    };
    let v = router_stats_from_prometheus(&b, |v| {
        row(v, "sluggish")["samples"].as_u64().unwrap_or(0) >= 5 && row(v, "quick")["ttft_p95_ms"].is_number()
    })
    .await;
    let stats = (row(&v, "quick"), row(&v, "sluggish"));
    let ttft = |v: &serde_json::Value| v["ttft_p95_ms"].as_f64().unwrap();
    assert!(ttft(&stats.0) < 100.0 && ttft(&stats.1) > 250.0, "{stats:?}");
    for _ in 0..8 {
        let r = send(b.proxy, post_json("/v1/chat/completions", body)).await;
        assert_eq!(r.headers["x-goodput-backend"], "quick", "decided on Prometheus's view");
        assert_eq!(r.headers["x-goodput-reason"], "fastest");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    q.await.unwrap();
    s.await.unwrap();
    let m = b.metrics().await;
    assert!(metric(&m, "goodput_route_stats_reads_total", &[("result", "success")]) >= 1.0);
}

/// The hallucination rate's lower bound reaches a router replica through Prometheus from the
/// band's counter, not from the verdicts alone. With a stated rate of 0.5 from 10 labelled
/// answers, the band's lower end is a threshold well above the calibrated one, so it flags far
/// fewer responses, and the two readings are told apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hallucination_rate_interval_reaches_the_router_through_prometheus() {
    let (sim_addr, _sim) = spawn_sim(0.0, 0.0, 24).await;
    let a = Goodput::start(&format!(
        "backends:\n  - name: sim\n    url: http://{sim_addr}\n    models: [sim-model]\n\
         quality:\n  consistency:\n    sample_rate: 1.0\n    samples: 3\n    max_token_share: 100.0\n\
         \x20   queue_capacity: 200\n    methods: [unigram]\n\
         \x20   calibration: {{reference_backend: sim, checks: 10, reference_rate: 0.5, reference_labelled: 10}}\n"
    ));
    let ask = |i: usize| {
        let body = serde_json::json!({
            "model": "sim-model", "max_tokens": 24, "temperature": 0,
            "messages": [{"role": "user", "content": format!("Tell me about tower number {i}.")}],
        });
        let a = &a;
        async move {
            assert_eq!(send(a.proxy, post_json("/v1/chat/completions", &body.to_string())).await.status, 200);
            // One request at a time, each checked before the next: the simulator's re-samples
            // are seeded by its request count, so the scores, and the margin asserted below,
            // are the same in every run instead of depending on how requests and re-samples
            // interleave on a busy machine.
            wait_metric(a, "goodput_consistency_checked_total", &[], (i + 1) as f64).await;
        }
    };
    let (_prom, port) = start_prometheus(a.admin, &[]).await;
    for i in 0..10 {
        ask(i).await;
    }
    // Prometheus has seen the counters before they grow (increase() ignores a series' first
    // value).
    let deadline = Instant::now() + Duration::from_secs(20);
    while scalar(&query(port, "sum(goodput_consistency_hallucinated_band_total{end=\"lower\"})").await)
        .is_none()
    {
        assert!(Instant::now() < deadline, "Prometheus never scraped the band's counter");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_millis(1200)).await;
    for i in 10..60 {
        ask(i).await;
    }
    // Router B starts only once Prometheus holds A's final counts, so that none of its reads
    // sees part of the traffic (the shares compared below would then differ).
    let counters = [
        "goodput_consistency_rated_total",
        "goodput_consistency_hallucinated_total",
        "goodput_consistency_hallucinated_band_total",
    ];
    // A's recorder files a check's verdict up to 250 ms after the check is counted, so its
    // counts are final once two reads 300 ms apart agree.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = Vec::new();
    loop {
        let text = a.metrics().await;
        let now: Vec<f64> = counters.iter().map(|m| metric(&text, m, &[])).collect();
        let mut scraped = true;
        for (m, v) in counters.iter().zip(&now) {
            scraped &= scalar(&query(port, &format!("sum({m})")).await) == Some(*v);
        }
        if scraped && now == last {
            break;
        }
        assert!(Instant::now() < deadline, "Prometheus never scraped A's final counts: {now:?}");
        last = now;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    let b = Goodput::start(&format!(
        "backends:\n  - name: sim\n    url: http://{sim_addr}\n    models: [sim-model]\n\
         routing:\n  stats: {{source: prometheus, prometheus_url: \"http://127.0.0.1:{port}\", refresh_secs: 1, range: 1m}}\n"
    ));
    let stats = router_stats_from_prometheus(&b, |v| {
        v["backends"][0]["router_stats"]["rated"].as_u64().unwrap_or(0) >= 45
    })
    .await["backends"][0]["router_stats"]
        .clone();
    // increase() extrapolates by the range, so counts read a moment apart differ; shares of the
    // rated count do not (the three series start and end together).
    let increase = |m: &'static str| async move {
        scalar(&query(port, &format!("sum(increase({m}[600s]))")).await).expect(m)
    };
    let share = |m: &'static str| async move {
        increase(m).await / increase("goodput_consistency_rated_total").await
    };
    let rated = stats["rated"].as_u64().unwrap();
    let count = |share: f64| (share * rated as f64).round() as u64;
    let hallucinated = count(share("goodput_consistency_hallucinated_total").await);
    let band_lower = count(share("goodput_consistency_hallucinated_band_total{end=\"lower\"}").await);
    eprintln!("rated {rated}, hallucinated {hallucinated}, at the band's lower end {band_lower}");
    assert!(
        band_lower + 5 <= hallucinated,
        "the band's lower end flags fewer: {band_lower} of {hallucinated}"
    );
    let wilson_lower = |k: u64| goodput::goodput::wilson(k, rated, 1.96).unwrap().0;
    let got = stats["hallucination_rate_lower"].as_f64().expect("a lower bound");
    assert!(
        (got - wilson_lower(band_lower)).abs() <= wilson_lower(band_lower + 1) - wilson_lower(band_lower),
        "{got} against {} from {band_lower} of {rated}: {stats}",
        wilson_lower(band_lower)
    );
    assert!(got + 0.05 < wilson_lower(hallucinated), "not the verdicts' own interval: {stats}");
    assert!(got <= stats["hallucination_rate"].as_f64().unwrap(), "{stats}");
}

/// `/admin/backends` of a router replica once its statistics come from Prometheus and `ready`
/// holds for them (40 s at most).
async fn router_stats_from_prometheus(
    gp: &Goodput,
    ready: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let v = gp.admin_json("/admin/backends").await;
        if v["stats_source"] == "prometheus" && ready(&v) {
            return v;
        }
        assert!(Instant::now() < deadline, "no statistics from Prometheus: {v}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
