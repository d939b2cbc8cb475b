//! A real Prometheus (Debian's package; `scripts/setup-test-deps.sh` installs it) scrapes a
//! running goodput under traffic, and a TTFT quantile is read back through its query API.

mod common;

use common::*;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Prom(Child, std::path::PathBuf);

impl Drop for Prom {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let _ = std::fs::remove_dir_all(&self.1);
    }
}

fn start_prometheus(target: std::net::SocketAddr) -> (Prom, u16) {
    let bin = std::env::var("PROMETHEUS_BIN").unwrap_or_else(|_| "prometheus".into());
    let dir = temp_dir("prom");
    let cfg = dir.join("prometheus.yml");
    std::fs::write(
        &cfg,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: goodput\n    static_configs:\n      - targets: ['{target}']\n"
        ),
    )
    .unwrap();
    let port = free_port();
    let child = Command::new(&bin)
        .arg(format!("--config.file={}", cfg.display()))
        .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot start `{bin}` ({e}): run scripts/setup-test-deps.sh to install Prometheus")
        });
    (Prom(child, dir), port)
}

async fn query(port: u16, q: &str) -> serde_json::Value {
    let path = format!("/api/v1/query?query={}", urlencode(q));
    let r = send(
        format!("127.0.0.1:{port}").parse().unwrap(),
        http::Request::get(path).body(Default::default()).unwrap(),
    )
    .await;
    r.json()
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn scalar(v: &serde_json::Value) -> Option<f64> {
    v["data"]["result"].as_array()?.first()?["value"][1].as_str()?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_ttft_and_goodput() {
    let (sim_addr, _sim) = spawn_sim(30.0, 2.0, 8).await;
    let gp = Goodput::start(&format!(
        "backends:\n  - name: sim\n    url: http://{sim_addr}\n    models: [sim-model]\nslo:\n  ttft_ms: 100\n"
    ));
    let (_prom, port) = start_prometheus(gp.admin);

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
