//! A real Prometheus (Debian's package; `scripts/setup-test-deps.sh` installs it) for tests.

use super::*;
use std::process::{Child, Command, Stdio};

/// A running Prometheus, killed (and its data removed) on drop.
pub struct Prom(Child, std::path::PathBuf);

impl Drop for Prom {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let _ = std::fs::remove_dir_all(&self.1);
    }
}

/// Prometheus scraping `target` every second, evaluating `rule_files` every second, once it
/// reports ready: it listens before its storage is open and answers queries 503 until then,
/// which on a loaded machine can take seconds.
pub async fn start_prometheus(target: std::net::SocketAddr, rule_files: &[&std::path::Path]) -> (Prom, u16) {
    let bin = std::env::var("PROMETHEUS_BIN").unwrap_or_else(|_| "prometheus".into());
    let dir = temp_dir("prom");
    let cfg = dir.join("prometheus.yml");
    std::fs::write(
        &cfg,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: [{}]\nscrape_configs:\n  - job_name: goodput\n    static_configs:\n      - targets: ['{target}']\n",
            rule_files.iter().map(|p| format!("'{}'", p.display())).collect::<Vec<_>>().join(", ")
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
    let mut prom = Prom(child, dir);
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while probe(addr, "/-/ready").await != Some(200) {
        if let Ok(Some(status)) = prom.0.try_wait() {
            panic!("Prometheus exited while starting: {status}");
        }
        assert!(Instant::now() < deadline, "Prometheus was not ready within 60 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (prom, port)
}

pub async fn query(port: u16, q: &str) -> serde_json::Value {
    let path = format!("/api/v1/query?query={}", urlencode(q));
    let r = send(
        format!("127.0.0.1:{port}").parse().unwrap(),
        http::Request::get(path).body(Default::default()).unwrap(),
    )
    .await;
    r.json()
}

pub fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

pub fn scalar(v: &serde_json::Value) -> Option<f64> {
    v["data"]["result"].as_array()?.first()?["value"][1].as_str()?.parse().ok()
}
