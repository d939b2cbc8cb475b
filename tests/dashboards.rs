//! Every PromQL expression in every Grafana dashboard (grafana/dashboards/*.json), evaluated
//! against a real Prometheus that scrapes a running goodput under load, with perplexity
//! scoring (the real ONNX model), consistency checks and routing on, and goodput's recording
//! rules loaded: each must parse and return a finite value. No empty panel, and every
//! annotation (goodput started, config reloaded, config rejected) marks its event.

use crate::common::prom::*;
use crate::common::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

fn exprs() -> Vec<(String, String, String)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("grafana/dashboards");
    let mut out = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    for f in files {
        let d: serde_json::Value = serde_json::from_slice(&std::fs::read(&f).unwrap()).unwrap();
        let vars: Vec<&str> =
            d["templating"]["list"].as_array().unwrap().iter().map(|v| v["name"].as_str().unwrap()).collect();
        assert!(
            vars.contains(&"datasource") && vars.contains(&"backend") && vars.contains(&"model"),
            "{f:?}: {vars:?}"
        );
        for a in d["annotations"]["list"].as_array().unwrap() {
            if let Some(expr) = a["expr"].as_str() {
                assert_eq!(a["datasource"]["uid"], "${datasource}", "{f:?} {}", a["name"]);
                out.push((
                    f.file_name().unwrap().to_string_lossy().into_owned(),
                    format!("annotation {}", a["name"]),
                    expr.to_string(),
                ));
            }
        }
        for p in d["panels"].as_array().unwrap() {
            assert_eq!(p["datasource"]["uid"], "${datasource}", "{f:?} {}", p["title"]);
            for t in p["targets"].as_array().unwrap() {
                out.push((
                    f.file_name().unwrap().to_string_lossy().into_owned(),
                    p["title"].as_str().unwrap().to_string(),
                    t["expr"].as_str().unwrap().to_string(),
                ));
            }
        }
    }
    out
}

/// What Grafana substitutes: every backend and model, and a rate window of ten 1-s scrapes.
fn grafana(expr: &str) -> String {
    expr.replace("$__rate_interval", "10s").replace("$backend", ".*").replace("$model", ".*")
}

fn has_finite(v: &serde_json::Value) -> bool {
    v["status"] == "success"
        && v["data"]["result"].as_array().is_some_and(|r| {
            r.iter().any(|s| {
                s["value"][1].as_str().and_then(|x| x.parse::<f64>().ok()).is_some_and(f64::is_finite)
            })
        })
}

/// A test double of vLLM's /metrics only (the real one is read in tests/e2e_vllm.rs): the
/// server panels need a backend that reports a queue, a KV cache and prefix-cache lookups.
async fn vllm_metrics_double() -> std::net::SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let scrapes = Arc::new(std::sync::atomic::AtomicU64::new(0));
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let scrapes = scrapes.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |_req| {
                    let n = scrapes.fetch_add(1, Ordering::Relaxed) as f64;
                    let page = format!(
                        "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{engine=\"0\"}} {}\n\
                         # TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{engine=\"0\"}} 4.0\n\
                         # TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{{engine=\"0\"}} 0.6\n\
                         # TYPE vllm:prefix_cache_queries_total counter\nvllm:prefix_cache_queries_total{{engine=\"0\"}} {}\n\
                         # TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total{{engine=\"0\"}} {}\n\
                         # TYPE vllm:num_preemptions_total counter\nvllm:num_preemptions_total{{engine=\"0\"}} {}\n",
                        n % 5.0,
                        100.0 * n,
                        30.0 * n,
                        n
                    );
                    async move {
                        Ok::<_, std::convert::Infallible>(
                            http::Response::builder()
                                .header("content-type", "text/plain; version=0.0.4")
                                .body(http_body_util::Full::new(bytes::Bytes::from(page)))
                                .unwrap(),
                        )
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_expression_returns_data() {
    let (dir, ort) = reference_model();
    let vllm = vllm_metrics_double().await;
    let gp = Goodput::start(&format!(
        r#"
backends:
  - name: vllm
    url: http://{vllm}
    models: [m]
  - name: fast
    models: [m]
    sim: {{model: m, seed: 1, ttft_ms: 10, tpot_ms: 2, output_tokens: 16, quality: 1.0, error_rate: 0.03}}
    price: {{input_per_1m: 2.0, output_per_1m: 6.0}}
  - name: cheap
    models: [m]
    sim: {{model: m, seed: 2, ttft_ms: 120, tpot_ms: 2, output_tokens: 16, quality: 0.5}}
    price: {{input_per_1m: 0.5, output_per_1m: 1.5}}
  # A pool found in DNS whose name server never answers (nothing listens on port 9): the
  # lookup panel's errors. No route sends to it.
  - name: dns-pool
    models: [m]
    discovery: {{dns: vllm.goodput-test.invalid, port: 8000, refresh_secs: 1, nameserver: "127.0.0.1:9"}}
slo: {{ttft_ms: 100, tpot_ms: 20, e2e_ms: 2000}}
classes:
  interactive: {{ttft_p95_ms: 100, max_perplexity: 200, objective: cheapest}}
  batch: {{objective: best-value}}
routes:
  - {{name: chat, match: {{path_prefix: /v1/chat}}, class: interactive, backends: [fast, cheap]}}
  - {{name: legacy, match: {{path_prefix: /v1/completions}}, class: batch, backends: [fast, cheap]}}
routing: {{exploration: 0.1, min_samples: 5, min_quality_samples: 3}}
quality:
  sample_rate: 0.3
  max_cpu: 8
  perplexity: {{model_dir: "{dir}", onnxruntime: "{ort}"}}
  drift: {{min_samples: 5}}  # the drift panels have data after 5 scores a side, not 20
  consistency: {{sample_rate: 0.2, samples: 2, methods: [unigram], max_token_share: 1.0, max_concurrent: 2, calibration: {{checks: 10, reference_rate: 0.2}}}}
"#
    ));
    let rules =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("helm/goodput/files/goodput-rules.yaml");
    let (_prom, port) = start_prometheus(gp.admin, &[&rules]).await;

    // Steady mixed load: streaming and not, chat and legacy completions.
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..3)
        .map(|w| {
            let (proxy, stop) = (gp.proxy, stop.clone());
            tokio::spawn(async move {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let stream = i.is_multiple_of(2);
                    let req = if w == 2 {
                        post_json("/v1/completions", &format!(r#"{{"model":"m","stream":{stream},"prompt":"The city {i}"}}"#))
                    } else {
                        post_json(
                            "/v1/chat/completions",
                            &format!(r#"{{"model":"m","stream":{stream},"messages":[{{"role":"user","content":"Tell me about the river, {i}."}}]}}"#),
                        )
                    };
                    let _ = send(proxy, req).await;
                    tokio::time::sleep(Duration::from_millis(40)).await;
                }
            })
        })
        .collect();

    // The events the annotations mark: a reload, and an invalid config (the last good one
    // keeps serving). After Prometheus has seen the counters at 0: increase() needs a sample
    // before the event.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !has_finite(&query(port, "goodput_config_reloads_total").await) {
        assert!(Instant::now() < deadline, "Prometheus never scraped goodput");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let config = std::fs::read_to_string(&gp.config).unwrap();
    assert!(config.contains("exploration: 0.1,"), "{config}");
    std::fs::write(&gp.config, config.replace("exploration: 0.1,", "exploration: 0.12,")).unwrap();
    wait_metric(&gp, "goodput_config_reloads_total", &[("result", "success")], 1.0).await;
    std::fs::write(&gp.config, format!("{config}\nslo: [not, a, map]\n")).unwrap();
    wait_metric(&gp, "goodput_config_reloads_total", &[("result", "invalid")], 1.0).await;

    let all = exprs();
    assert!(all.len() >= 30, "{} expressions", all.len());
    assert_eq!(all.iter().filter(|(_, t, _)| t.starts_with("annotation")).count(), 9, "three on each board");
    tokio::time::sleep(Duration::from_secs(15)).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut missing = all.clone();
    while !missing.is_empty() && Instant::now() < deadline {
        let mut still = Vec::new();
        for (file, title, expr) in missing {
            let v = query(port, &grafana(&expr)).await;
            assert_ne!(v["status"], "error", "{file} / {title}: {expr} does not evaluate: {v}");
            if !has_finite(&v) {
                still.push((file, title, expr));
            }
        }
        missing = still;
        if !missing.is_empty() {
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }
    for (_, _, expr) in &missing {
        eprintln!("without data: {expr}: {}", query(port, &grafana(expr)).await);
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.unwrap();
    }
    assert!(missing.is_empty(), "panels without data: {missing:#?}");

    // The dashboards' variables: label_values(goodput_requests_total, backend / model).
    for label in ["backend", "gen_ai_request_model"] {
        let path = format!("/api/v1/label/{label}/values?match[]=goodput_requests_total");
        let r = send(
            format!("127.0.0.1:{port}").parse().unwrap(),
            http::Request::get(path).body(Default::default()).unwrap(),
        )
        .await
        .json();
        assert!(!r["data"].as_array().unwrap().is_empty(), "{label}: {r}");
    }
}
