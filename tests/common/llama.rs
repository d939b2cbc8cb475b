//! The real upstream: llama.cpp's OpenAI-compatible server (PyPI llama-cpp-python[server])
//! serving SmolLM2-135M. `scripts/setup-llm.sh` installs it (cached); `scripts/test.sh` exports
//! where it is.

use super::{free_port, probe, temp_dir};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Llm {
    pub venv: PathBuf,
    pub gguf: PathBuf,
    pub tokdir: PathBuf,
}

pub fn llm_env() -> Llm {
    let get = |k: &str| {
        std::env::var_os(k).map(PathBuf::from).unwrap_or_else(|| {
            panic!("{k} is not set: run the suite with scripts/test.sh (it runs scripts/setup-llm.sh)")
        })
    };
    Llm { venv: get("GOODPUT_LLM_VENV"), gguf: get("GOODPUT_LLM_GGUF"), tokdir: get("GOODPUT_LLM_TOKDIR") }
}

pub struct Llama {
    pub child: Child,
    pub port: u16,
    pub log: PathBuf,
}

impl Drop for Llama {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub async fn start_llama(llm: &Llm) -> Llama {
    let port = free_port();
    let log = temp_dir("llama").join("server.log");
    let out = std::fs::File::create(&log).unwrap();
    // At lower CPU priority: when the server's generation thread and the client want the same
    // core, the client (whose clock the TTFT comparison reads) and goodput go first.
    let child = Command::new("nice")
        .args(["-n", "10"])
        .arg(llm.venv.join("bin/python"))
        .args(["-u", "-m", "llama_cpp.server", "--model"])
        .arg(&llm.gguf)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        // One generation thread: the other core stays free for the client and goodput, so that
        // the client's own TTFT measurement is not delayed by a starved Python process.
        .args(["--n_threads", "1", "--n_ctx", "2048", "--interrupt_requests", "False"])
        .stdout(Stdio::from(out.try_clone().unwrap()))
        .stderr(Stdio::from(out))
        .spawn()
        .expect("start llama.cpp server");
    let llama = Llama { child, port, log };
    let t = Instant::now();
    loop {
        if probe(format!("127.0.0.1:{port}").parse().unwrap(), "/v1/models").await == Some(200) {
            return llama;
        }
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "llama.cpp server did not start: see {}",
            llama.log.display()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
