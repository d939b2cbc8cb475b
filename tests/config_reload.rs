//! Config validation from the command line, and hot reload of a running proxy.

mod common;

use common::*;
use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn check_config_prints_the_path_of_each_bad_field() {
    let dir = temp_dir("check");
    let bad = dir.join("bad.yaml");
    std::fs::write(&bad, "backends:\n  - name: a\n    url: ftp://x\nslo:\n  ttft_ms: -5\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_goodput")).arg("check-config").arg(&bad).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("backends[0].url: scheme `ftp` is not supported"), "{err}");
    assert!(err.contains("slo.ttft_ms: must be a positive number"), "{err}");

    std::fs::write(&bad, "backends:\n  - name: a\n    url: http://x:1\n    timeout: 5\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_goodput")).arg("check-config").arg(&bad).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("backends[0].timeout: unknown field `timeout`"), "{err}");

    for good in ["config/goodput.yaml", "config/demo.yaml"] {
        let out = Command::new(env!("CARGO_BIN_EXE_goodput")).arg("check-config").arg(good).output().unwrap();
        assert!(out.status.success(), "{good}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let _ = std::fs::remove_dir_all(dir);
}

async fn wait_for_reloads(gp: &Goodput, result: &str, n: f64) {
    let t = Instant::now();
    loop {
        let m = gp.metrics().await;
        if metric(&m, "goodput_config_reloads_total", &[("result", result)]) >= n {
            return;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "no {result} reload counted:\n{m}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_applies_valid_configs_and_keeps_serving_through_invalid_ones() {
    let cfg = goodput::sim::SimConfig { ttft_ms: 1.0, tpot_ms: 1.0, output_tokens: 4, ..Default::default() };
    let (sim_addr, _sim) = goodput::sim::spawn(cfg, "127.0.0.1:0").await.unwrap();
    let base = format!("backends:\n  - name: s\n    url: http://{sim_addr}\n    models: [sim-model]\n");
    let gp = Goodput::start(&format!("{base}slo:\n  ttft_ms: 1000\n"));
    let admin_slo = |v: serde_json::Value| v["slo"]["ttft_ms"].as_f64();
    assert_eq!(admin_slo(gp.admin_json("/admin/config").await), Some(1000.0));

    // A valid change is picked up from the file system.
    std::fs::write(&gp.config, format!("{base}slo:\n  ttft_ms: 250\n")).unwrap();
    wait_for_reloads(&gp, "success", 1.0).await;
    assert_eq!(admin_slo(gp.admin_json("/admin/config").await), Some(250.0));

    // An invalid one is rejected, counted, and the old config keeps serving.
    std::fs::write(&gp.config, format!("{base}slo:\n  ttft_ms: fast\n")).unwrap();
    wait_for_reloads(&gp, "invalid", 1.0).await;
    assert_eq!(admin_slo(gp.admin_json("/admin/config").await), Some(250.0));
    let body = r#"{"model":"sim-model","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    assert_eq!(send(gp.proxy, post_json("/v1/chat/completions", body)).await.status, 200);

    // Kubernetes swaps a ConfigMap by renaming a new file into place.
    let tmp = gp.dir.join(".new.yaml");
    std::fs::write(&tmp, format!("{base}slo:\n  ttft_ms: 400\n")).unwrap();
    std::fs::rename(&tmp, &gp.config).unwrap();
    wait_for_reloads(&gp, "success", 2.0).await;
    assert_eq!(admin_slo(gp.admin_json("/admin/config").await), Some(400.0));

    // SIGHUP reloads too; an unchanged file is counted as such.
    let pid = gp.child.id().to_string();
    assert!(Command::new("kill").args(["-HUP", &pid]).status().unwrap().success());
    wait_for_reloads(&gp, "unchanged", 1.0).await;
    assert_eq!(send(gp.proxy, post_json("/v1/chat/completions", body)).await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_does_not_drop_in_flight_streams() {
    let cfg =
        goodput::sim::SimConfig { ttft_ms: 10.0, tpot_ms: 10.0, output_tokens: 60, ..Default::default() };
    let (sim_addr, sim) = goodput::sim::spawn(cfg, "127.0.0.1:0").await.unwrap();
    let base = format!("backends:\n  - name: s\n    url: http://{sim_addr}\n");
    let gp = Goodput::start(&base);
    let body = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let proxy = gp.proxy;
    let stream = tokio::spawn(async move { send(proxy, post_json("/v1/chat/completions", body)).await });
    tokio::time::sleep(Duration::from_millis(150)).await;
    std::fs::write(&gp.config, format!("{base}slo:\n  e2e_ms: 5000\n")).unwrap();
    wait_for_reloads(&gp, "success", 1.0).await;
    let r = stream.await.unwrap();
    assert!(r.error.is_none());
    assert!(r.text().ends_with("data: [DONE]\n\n"));
    assert_eq!(sim.completed(), 1);
}
