//! The admin status page in a real browser: headless Chromium (Debian's `chromium`, installed
//! by scripts/setup-test-deps.sh) loads it from goodput's admin port, runs its script against
//! the live JSON endpoints, and the test checks the DOM it rendered and takes a screenshot.

use crate::common::*;
use std::process::Command;
use std::time::Duration;

fn chromium(args: &[&str]) -> std::process::Output {
    let bin = std::env::var("CHROMIUM_BIN").unwrap_or_else(|_| "chromium".into());
    let profile = temp_dir("chromium");
    let out = Command::new(&bin)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--no-first-run",
            "--virtual-time-budget=7000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run `{bin}` ({e}): run scripts/setup-test-deps.sh to install Chromium")
        });
    let _ = std::fs::remove_dir_all(&profile);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_page_renders_backends_compliance_goodput_and_decisions() {
    let gp = Goodput::start(
        r#"
backends:
  - name: fast
    sim: {model: m, ttft_ms: 5, tpot_ms: 1, output_tokens: 8}
    price: {input_per_1m: 3.0, output_per_1m: 3.0}
  - name: slow
    sim: {model: m, ttft_ms: 300, tpot_ms: 1, output_tokens: 8}
    price: {input_per_1m: 1.0, output_per_1m: 1.0}
  - name: new
    sim: {model: m, ttft_ms: 300, tpot_ms: 1, output_tokens: 8}
    price: {input_per_1m: 0.5, output_per_1m: 0.5}
classes:
  interactive: {ttft_p95_ms: 100, objective: cheapest}
routes:
  - {name: pinned-slow, match: {headers: {x-pin: slow}}, backends: [slow]}
  - {name: pinned-new, match: {headers: {x-pin: new}}, backends: [new]}
routing: {default_class: interactive, min_samples: 3, exploration: 0.0}
"#,
    );
    let body = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    // Samples for the two slow backends through routes pinned to them: enough for slow to be
    // judged (3), one for new, whose one sample holds it back without disqualifying it.
    for pin in ["slow", "slow", "slow", "new"] {
        let mut req = post_json("/v1/chat/completions", body);
        req.headers_mut().insert("x-pin", pin.parse().unwrap());
        assert_eq!(send(gp.proxy, req).await.status, 200);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for _ in 0..12 {
        assert_eq!(send(gp.proxy, post_json("/v1/chat/completions", body)).await.status, 200);
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    let url = format!("http://{}/status", gp.admin);
    let out = chromium(&["--dump-dom", &url]);
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(
        dom.contains(r#"data-ready="1""#),
        "the script ran and read the API: {dom}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for b in ["fast", "slow", "new"] {
        assert!(dom.contains(&format!(r#"<tr data-backend="{b}">"#)), "row for {b}: {dom}");
    }
    // Compliance: slow misses the class's TTFT bound, fast meets it.
    assert!(dom.contains(r#"slow: <span class="warn">misses</span> <span class="why">ttft p95"#), "{dom}");
    assert!(dom.contains(r#"fast: <span class="ok">compliant</span>"#), "{dom}");
    assert!(
        dom.contains(r#"new: <span class="ok">compliant</span> <span class="why" data-provisional="">its few samples miss ttft p95"#),
        "{dom}"
    );
    // Recent decisions with their reasons, and live charts drawn from several refreshes.
    assert!(dom.contains("<td>cheapest</td>") || dom.contains("<td>sla_unmet</td>"), "{dom}");
    let charts = dom.matches(r#"<svg class="spark" viewBox="0 0 120 28"><path d="M"#).count();
    assert!(charts >= 2, "sparklines with data: {charts}");
    assert!(dom.contains(r#"<span id="error" class="err"></span>"#), "no error shown: {dom}");

    let png = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("status-page.png");
    let _ = std::fs::remove_file(&png);
    let out = chromium(&["--window-size=1400,900", &format!("--screenshot={}", png.display()), &url]);
    let bytes = std::fs::read(&png)
        .unwrap_or_else(|e| panic!("no screenshot ({e}): {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    let (w, h) = (
        u32::from_be_bytes(bytes[16..20].try_into().unwrap()),
        u32::from_be_bytes(bytes[20..24].try_into().unwrap()),
    );
    assert_eq!((w, h), (1400, 900));
    // A rendered page with tables and text compresses far less than a blank one (~5 KB).
    assert!(bytes.len() > 20_000, "screenshot of {} bytes", bytes.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_page_says_when_a_pools_dns_lookup_fails() {
    // Nothing listens on port 9: every lookup of the pool's name fails.
    let gp = Goodput::start(
        r#"
backends:
  - name: fast
    sim: {model: m, ttft_ms: 5, tpot_ms: 1, output_tokens: 8}
  - name: pool
    models: [m]
    discovery: {dns: vllm.goodput-test.invalid, port: 8000, refresh_secs: 1, nameserver: "127.0.0.1:9"}
"#,
    );
    wait_metric(&gp, "goodput_discovery_refreshes_total", &[("backend", "pool"), ("result", "error")], 1.0)
        .await;
    let out = chromium(&["--dump-dom", &format!("http://{}/status", gp.admin)]);
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(dom.contains(r#"data-ready="1""#), "the script ran: {dom}");
    let row = dom.split(r#"<tr data-backend="pool">"#).nth(1).unwrap_or_else(|| panic!("no pool row: {dom}"));
    let row = &row[..row.find("</tr>").unwrap()];
    assert!(
        row.contains(r#"<div class="bad" data-discovery="error">DNS lookup failed, keeping 0 endpoints: "#)
            && row.contains("vllm.goodput-test.invalid"),
        "{row}"
    );
    // A backend with a fixed address has no DNS line.
    let fast = dom.split(r#"<tr data-backend="fast">"#).nth(1).unwrap();
    assert!(!fast[..fast.find("</tr>").unwrap()].contains("data-discovery"), "{fast}");
}
