//! Config validation from the command line, and hot reload of a running proxy.

use crate::common::*;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_applies_valid_configs_and_keeps_serving_through_invalid_ones() {
    let (sim_addr, _sim) = spawn_sim(1.0, 1.0, 4).await;
    let base = format!("backends:\n  - name: s\n    url: http://{sim_addr}\n    models: [sim-model]\n");
    let gp = Goodput::start(&format!("{base}slo:\n  ttft_ms: 1000\n"));
    let admin_slo = |v: serde_json::Value| v["slo"]["ttft_ms"].as_f64();
    assert_eq!(admin_slo(gp.admin_json("/admin/config").await), Some(1000.0));
    // At 0 before any reload, so that increase() sees the first invalid one (the alert's query).
    let m = gp.metrics().await;
    for result in ["success", "invalid", "unchanged"] {
        assert_eq!(series(&m, "goodput_config_reloads_total", &[("result", result)]), [0.0], "{result}");
    }

    // A valid change is picked up from the file system.
    std::fs::write(&gp.config, format!("{base}slo:\n  ttft_ms: 250\n")).unwrap();
    wait_metric(&gp, "goodput_config_reloads_total", &[("result", "success")], 1.0).await;
    assert_eq!(admin_slo(gp.admin_json("/admin/config").await), Some(250.0));

    // An invalid one is rejected, counted, and the old config keeps serving.
    std::fs::write(&gp.config, format!("{base}slo:\n  ttft_ms: fast\n")).unwrap();
    wait_metric(&gp, "goodput_config_reloads_total", &[("result", "invalid")], 1.0).await;
    assert_eq!(admin_slo(gp.admin_json("/admin/config").await), Some(250.0));
    let body = r#"{"model":"sim-model","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    assert_eq!(send(gp.proxy, post_json("/v1/chat/completions", body)).await.status, 200);

    // Kubernetes swaps a ConfigMap by renaming a new file into place.
    let tmp = gp.dir.join(".new.yaml");
    std::fs::write(&tmp, format!("{base}slo:\n  ttft_ms: 400\n")).unwrap();
    std::fs::rename(&tmp, &gp.config).unwrap();
    wait_metric(&gp, "goodput_config_reloads_total", &[("result", "success")], 2.0).await;
    assert_eq!(admin_slo(gp.admin_json("/admin/config").await), Some(400.0));

    // SIGHUP reloads too; an unchanged file is counted as such.
    let pid = gp.child.id().to_string();
    assert!(Command::new("kill").args(["-HUP", &pid]).status().unwrap().success());
    wait_metric(&gp, "goodput_config_reloads_total", &[("result", "unchanged")], 1.0).await;
    assert_eq!(send(gp.proxy, post_json("/v1/chat/completions", body)).await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_says_which_changed_settings_wait_for_a_restart() {
    let (sim_addr, _sim) = spawn_sim(1.0, 1.0, 4).await;
    let base = format!("backends:\n  - name: s\n    url: http://{sim_addr}\n    models: [sim-model]\n");
    let gp = Goodput::start_logged(&format!("{base}quality:\n  sample_rate: 0.1\n"), &[], &[]);
    // A live setting and one read at start-up: the reload applies, and names the latter.
    std::fs::write(&gp.config, format!("{base}quality:\n  sample_rate: 0.2\n  max_cpu: 3\n")).unwrap();
    wait_metric(&gp, "goodput_config_reloads_total", &[("result", "success")], 1.0).await;
    let q = &gp.admin_json("/admin/config").await["quality"];
    assert_eq!((q["sample_rate"].as_f64(), q["max_cpu"].as_f64()), (Some(0.2), Some(3.0)));
    let t = Instant::now();
    while !gp.log().contains("take effect on restart") {
        assert!(t.elapsed() < Duration::from_secs(10), "no restart warning:\n{}", gp.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log = gp.log();
    assert!(log.contains("quality.max_cpu") && !log.contains("sample_rate"), "{log}");
    // The next reload is compared with what runs (the start-up value), not with the last file.
    std::fs::write(&gp.config, format!("{base}quality:\n  sample_rate: 0.3\n  max_cpu: 3\n")).unwrap();
    wait_metric(&gp, "goodput_config_reloads_total", &[("result", "success")], 2.0).await;
    let t = Instant::now();
    while gp.log().matches("take effect on restart").count() < 2 {
        assert!(t.elapsed() < Duration::from_secs(10), "max_cpu still differs:\n{}", gp.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_does_not_drop_in_flight_streams() {
    let (sim_addr, sim) = spawn_sim(10.0, 10.0, 60).await;
    let base = format!("backends:\n  - name: s\n    url: http://{sim_addr}\n");
    let gp = Goodput::start(&base);
    let body = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let proxy = gp.proxy;
    let stream = tokio::spawn(async move { send(proxy, post_json("/v1/chat/completions", body)).await });
    tokio::time::sleep(Duration::from_millis(150)).await;
    std::fs::write(&gp.config, format!("{base}slo:\n  e2e_ms: 5000\n")).unwrap();
    wait_metric(&gp, "goodput_config_reloads_total", &[("result", "success")], 1.0).await;
    let r = stream.await.unwrap();
    assert!(r.error.is_none());
    assert!(r.text().ends_with("data: [DONE]\n\n"));
    assert_eq!(sim.completed(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_follows_a_kubernetes_configmap_symlink_swap() {
    use std::os::unix::fs::symlink;
    let (sim_addr, _sim) = spawn_sim(1.0, 1.0, 2).await;
    let yaml =
        |ttft: u32| format!("backends:\n  - name: s\n    url: http://{sim_addr}\nslo:\n  ttft_ms: {ttft}\n");
    // The layout the kubelet writes: goodput.yaml -> ..data/goodput.yaml, ..data -> ..<timestamp>
    let dir = temp_dir("configmap");
    std::fs::create_dir(dir.join("..v1")).unwrap();
    std::fs::write(dir.join("..v1/goodput.yaml"), yaml(111)).unwrap();
    symlink("..v1", dir.join("..data")).unwrap();
    symlink("..data/goodput.yaml", dir.join("goodput.yaml")).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_goodput"))
        .args(["serve", "--config"])
        .arg(dir.join("goodput.yaml"))
        .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line)
        .unwrap();
    let admin: std::net::SocketAddr =
        line.split_whitespace().find_map(|w| w.strip_prefix("admin=")).unwrap().parse().unwrap();
    let slo = || async move {
        let r = send(admin, http::Request::get("/admin/config").body(Default::default()).unwrap()).await;
        r.json()["slo"]["ttft_ms"].as_f64()
    };
    assert_eq!(slo().await, Some(111.0));
    // The swap: a new timestamped dir, a temporary link, renamed over ..data atomically.
    std::fs::create_dir(dir.join("..v2")).unwrap();
    std::fs::write(dir.join("..v2/goodput.yaml"), yaml(222)).unwrap();
    symlink("..v2", dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    std::fs::remove_dir_all(dir.join("..v1")).unwrap();
    let t = Instant::now();
    while slo().await != Some(222.0) {
        assert!(t.elapsed() < Duration::from_secs(10), "the ConfigMap swap was not picked up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_in_flight_streams_then_exits() {
    let (sim_addr, sim) = spawn_sim(10.0, 10.0, 50).await;
    let mut gp = Goodput::start(&format!("backends:\n  - name: s\n    url: http://{sim_addr}\n"));
    let proxy = gp.proxy;
    let body = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let stream = tokio::spawn(async move { send(proxy, post_json("/v1/chat/completions", body)).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let pid = gp.child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    // The stream in flight runs to its end (about 0.5 s) ...
    let r = stream.await.unwrap();
    assert!(r.error.is_none(), "the in-flight stream was cut: {:?}", r.error);
    assert!(r.text().ends_with("data: [DONE]\n\n"));
    assert_eq!(sim.completed(), 1);
    // ... no new connection is accepted, and the process exits by itself.
    let t = Instant::now();
    let status = loop {
        if let Some(s) = gp.child.try_wait().unwrap() {
            break s;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "goodput did not exit after SIGTERM");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "{status:?}");
    assert!(tokio::net::TcpStream::connect(proxy).await.is_err());
}
