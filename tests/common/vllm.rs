//! The real upstream goodput exists for: vLLM's CPU build serving SmolLM2-135M-Instruct as
//! `smollm2`. `scripts/test.sh` starts it once for the whole run (`scripts/run-vllm.sh`; it
//! takes minutes) and exports where it listens; the tests share it one at a time.

use super::{probe, send};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

pub struct Vllm {
    pub url: String,
    pub addr: SocketAddr,
    /// The venv's python: the openai SDK and prometheus_client come with vLLM.
    pub python: PathBuf,
    pub log: Option<PathBuf>,
}

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// vLLM, once it answers, held for this test alone: its counters are read as deltas.
pub async fn vllm() -> (tokio::sync::MutexGuard<'static, ()>, Vllm) {
    let guard = ONE_AT_A_TIME.lock().await;
    (guard, ready("GOODPUT_VLLM").await)
}

/// Two replicas of the same vLLM (the second started beside the first by scripts/test.sh), held
/// for this test alone.
pub async fn vllm_pool() -> (tokio::sync::MutexGuard<'static, ()>, Vllm, Vllm) {
    let guard = ONE_AT_A_TIME.lock().await;
    (guard, ready("GOODPUT_VLLM").await, ready("GOODPUT_VLLM2").await)
}

/// The replica `scripts/test.sh` exported as PREFIX_URL, PREFIX_PID and PREFIX_LOG, once it
/// answers.
async fn ready(prefix: &str) -> Vllm {
    let get = |k: &str| {
        std::env::var(k)
            .unwrap_or_else(|_| panic!("{k} is not set: run the suite with scripts/test.sh (it starts vLLM)"))
    };
    let url = get(&format!("{prefix}_URL"));
    let addr: SocketAddr = url.trim_start_matches("http://").parse().expect("the vLLM URL is http://IP:PORT");
    let python = PathBuf::from(get("GOODPUT_VLLM_VENV")).join("bin/python");
    let log = std::env::var_os(format!("{prefix}_LOG")).map(PathBuf::from);
    let pid = std::env::var(format!("{prefix}_PID")).ok();
    let v = Vllm { url, addr, python, log };
    // Started at the beginning of the run, it compiles while the suite builds: wait for it,
    // unless it died (then every test here fails at once, not after the timeout).
    // Replicas that did not start: each test that needs one fails at once.
    static GAVE_UP: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let give_up = || GAVE_UP.lock().unwrap().push(prefix.to_string());
    assert!(
        !GAVE_UP.lock().unwrap().iter().any(|p| p == prefix),
        "vLLM ({prefix}) did not start (see the first test)"
    );
    let t = Instant::now();
    loop {
        if let Some(pid) = &pid
            && !std::path::Path::new(&format!("/proc/{pid}")).exists()
        {
            give_up();
            panic!("vLLM exited:\n{}", v.tail());
        }
        if probe(addr, "/v1/models").await == Some(200) {
            return v;
        }
        if t.elapsed() > Duration::from_secs(900) {
            give_up();
            panic!("vLLM did not start in 15 minutes:\n{}", v.tail());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

impl Vllm {
    pub fn tail(&self) -> String {
        let Some(p) = &self.log else { return "(no log)".into() };
        let s = std::fs::read_to_string(p).unwrap_or_default();
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Run tests/e2e/vllm_client.py in `mode` against vLLM and `proxy`; its JSON.
    pub async fn client(&self, mode: &str, proxy: SocketAddr) -> serde_json::Value {
        let (py, url, mode) = (self.python.clone(), self.url.clone(), mode.to_string());
        let out = tokio::task::spawn_blocking(move || {
            Command::new(py)
                .arg("tests/e2e/vllm_client.py")
                .args([&mode, &url, &format!("http://{proxy}")])
                .output()
                .unwrap()
        })
        .await
        .unwrap();
        assert!(
            out.status.success(),
            "client failed:\n{}\nvLLM:\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.tail()
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// How many tokens vLLM's own tokenizer makes of `text` (its /tokenize, no special tokens).
    pub async fn tokens(&self, text: &str) -> u64 {
        let body = serde_json::json!({"model": "smollm2", "prompt": text, "add_special_tokens": false});
        let r = send(self.addr, super::post_json("/tokenize", &body.to_string())).await;
        assert_eq!(r.status, 200, "vLLM's /tokenize: {}", r.text());
        r.json()["count"].as_u64().expect("/tokenize answers a count")
    }

    /// vLLM's samples as (name, labels, value), parsed by the library goodput reads them with.
    /// Only vLLM's own families go to the parser (the page also holds the Python process's).
    async fn samples(&self) -> Vec<(String, Vec<(String, String)>, f64)> {
        let r = send(self.addr, http::Request::get("/metrics").body(Default::default()).unwrap()).await;
        let page = String::from_utf8_lossy(&r.body);
        let mut text = String::new();
        for l in page.lines().filter(|l| l.starts_with("vllm:") || l.starts_with("# TYPE vllm:")) {
            text.push_str(l);
            text.push('\n');
        }
        let (_, families) = nom_openmetrics::parser::prometheus(&text).expect("vLLM's /metrics parses");
        families
            .iter()
            .flat_map(|f| &f.samples)
            .map(|s| {
                let labels = s.labels().iter().map(|l| (l.name.to_string(), l.value.clone())).collect();
                (s.name().to_string(), labels, s.number())
            })
            .collect()
    }

    /// vLLM's own /metrics, one value per name (label sets summed; bucket series skipped).
    pub async fn metrics(&self) -> std::collections::HashMap<String, f64> {
        let mut out = std::collections::HashMap::new();
        for (name, labels, v) in self.samples().await {
            if !labels.iter().any(|(k, _)| k == "le") {
                *out.entry(name).or_insert(0.0) += v;
            }
        }
        out
    }

    /// vLLM's histogram `name` as (upper bound, cumulative count) pairs, label sets summed.
    pub async fn buckets(&self, name: &str) -> Vec<(f64, f64)> {
        let mut by_le: Vec<(f64, f64)> = Vec::new();
        for (n, labels, v) in self.samples().await {
            if n != format!("{name}_bucket") {
                continue;
            }
            let le = &labels.iter().find(|(k, _)| k == "le").expect("a bucket has le").1;
            let le = if le == "+Inf" { f64::INFINITY } else { le.parse().unwrap() };
            match by_le.iter_mut().find(|(l, _)| *l == le) {
                Some(e) => e.1 += v,
                None => by_le.push((le, v)),
            }
        }
        by_le.sort_by(|a, b| a.0.total_cmp(&b.0));
        by_le
    }
}
