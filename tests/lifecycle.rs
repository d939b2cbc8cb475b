//! Limits (connections, header size, per-backend concurrency), graceful shutdown on SIGTERM,
//! and the security rules (admin token, secrets and user text kept out of logs, metrics and
//! /admin, shadow requests with the config's credentials, bounded label values).

use crate::common::*;
use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn chat(stream: bool, max_tokens: u32) -> Request<Full<Bytes>> {
    let body = serde_json::json!({
        "model": "m", "stream": stream, "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "hello"}]
    });
    post_json("/v1/chat/completions", &body.to_string())
}

/// One request on an open raw connection; returns the raw answer (head and body).
async fn raw_exchange(s: &mut TcpStream, req: &str) -> String {
    s.write_all(req.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut b = [0u8; 4096];
    loop {
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut b)).await.unwrap().unwrap_or(0);
        got.extend_from_slice(&b[..n]);
        let text = String::from_utf8_lossy(&got).into_owned();
        if n == 0 || (text.contains("\r\n\r\n") && text.ends_with('}')) {
            return text;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_answer_503_with_retry_after_and_431() {
    let (sim_addr, _sim) = spawn_sim(0.0, 20.0, 50).await;
    let gp = Goodput::start(&format!(
        "limits: {{max_connections: 3, max_header_bytes: 8192, retry_after_secs: 2}}\n\
         backends:\n  - name: sim\n    url: http://{sim_addr}\n    max_concurrency: 2\n"
    ));
    let get = "GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n";

    // Three keep-alive connections are the limit; the fourth is refused, not left hanging.
    let mut open = Vec::new();
    for _ in 0..3 {
        let mut s = TcpStream::connect(gp.proxy).await.unwrap();
        assert!(raw_exchange(&mut s, get).await.starts_with("HTTP/1.1 200"));
        open.push(s);
    }
    let mut s = TcpStream::connect(gp.proxy).await.unwrap();
    let refused = raw_exchange(&mut s, get).await;
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(refused.contains("retry-after: 2"), "{refused}");
    assert!(refused.contains(r#""code":"max_connections""#), "{refused}");
    // An h2 client (prior knowledge) is answered in h2: a 503 on its stream, not HTTP/1.1
    // text that it can only read as a broken connection.
    let io = hyper_util::rt::TokioIo::new(TcpStream::connect(gp.proxy).await.unwrap());
    let (mut h2, conn) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io).await.unwrap();
    let conn = tokio::spawn(conn);
    let req = Request::get(format!("http://{}/v1/models", gp.proxy)).body(Full::<Bytes>::default()).unwrap();
    let r = h2.send_request(req).await.expect("an h2 answer");
    assert_eq!(r.status(), 503);
    // Then a GOAWAY and a clean close: not a connection the client sees break (which it did
    // at 500 ms, a broken pipe, before goodput sent one).
    let ended = tokio::time::timeout(Duration::from_secs(5), conn)
        .await
        .expect("the refused h2 connection stayed open");
    assert!(ended.unwrap().is_ok(), "the refused h2 connection was not closed with a GOAWAY");
    assert_eq!(r.headers()["retry-after"], "2");
    let body = http_body_util::BodyExt::collect(r.into_body()).await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&body).contains(r#""code":"max_connections""#), "{body:?}");
    drop(h2);
    drop(open.pop());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut s = TcpStream::connect(gp.proxy).await.unwrap();
    assert!(raw_exchange(&mut s, get).await.starts_with("HTTP/1.1 200"), "a freed slot is usable again");
    drop(s);
    drop(open);
    tokio::time::sleep(Duration::from_millis(100)).await;

    // A request head over max_header_bytes: 431.
    let big = "a".repeat(20_000);
    let mut s = TcpStream::connect(gp.proxy).await.unwrap();
    let r =
        raw_exchange(&mut s, &format!("GET /v1/models HTTP/1.1\r\nhost: x\r\nx-big: {big}\r\n\r\n")).await;
    assert!(r.starts_with("HTTP/1.1 431"), "{r}");
    drop(s);

    // max_concurrency 2: a third concurrent stream is refused with 503 + Retry-After.
    let p = gp.proxy;
    let a = tokio::spawn(async move { send(p, chat(true, 50)).await });
    let b = tokio::spawn(async move { send(p, chat(true, 50)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let c = send(gp.proxy, chat(false, 5)).await;
    assert_eq!(c.status, 503, "{}", c.text());
    assert_eq!(c.headers["retry-after"], "2");
    assert_eq!(c.json()["error"]["code"], "backend_at_capacity");
    for h in [a, b] {
        let r = h.await.unwrap();
        assert_eq!((r.status.as_u16(), r.error), (200, None));
    }
    assert_eq!(send(gp.proxy, chat(false, 5)).await.status, 200, "capacity comes back");

    let m = gp.metrics().await;
    assert_eq!(metric(&m, "goodput_rejected_total", &[("reason", "max_connections")]), 2.0);
    assert_eq!(metric(&m, "goodput_rejected_total", &[("reason", "backend_at_capacity")]), 1.0);
    let records = gp.records(4).await;
    assert_eq!(records.iter().filter(|r| r["outcome"] == "rejected" && r["status"] == 503).count(), 1);
}

/// goodput raises its soft open-file limit to the hard one (a service often starts with 1024,
/// which a few hundred streams use up). Where even the hard limit runs out, the requests that
/// find no descriptor for their upstream connection get 503 with Retry-After, counted as
/// refusals: goodput's own limit, which neither the backend's breaker nor its error count
/// hears of, and the streams already running finish whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_open_file_limit_is_raised_and_running_out_blames_no_backend() {
    let (sim_addr, _sim) = spawn_sim(200.0, 5.0, 20).await;
    let yaml = format!("backends:\n  - name: b\n    url: http://{sim_addr}\n    models: [m]\n");
    let mut hard = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes only the struct it is given.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut hard) }, 0);
    let hard = hard.rlim_max.min(1 << 20);
    assert!(hard > 256, "this test needs a hard limit above 256, have {hard}");
    let gp = Goodput::start_with_nofile(&yaml, 256, hard);
    assert_eq!(metric(&gp.metrics().await, "process_max_fds", &[]), hard as f64);
    assert!(gp.log().contains("raised the open-file limit"), "{}", gp.log());
    drop(gp);

    let gp = Goodput::start_with_nofile(&yaml, 64, 64);
    gp.wait_ready().await;
    assert!(gp.log().contains("open-file limit is below what limits.max_connections needs"), "{}", gp.log());
    let t0 = Instant::now();
    let replies = join_all((0..80).map(|_| send(gp.proxy, chat(true, 20)))).await;
    let (mut ok, mut refused) = (0, 0);
    for r in &replies {
        match r.status.as_u16() {
            200 => {
                assert!(r.body.ends_with(b"data: [DONE]\n\n"), "a stream cut short: {:?}", r.body);
                ok += 1;
            }
            503 => {
                assert_eq!(r.json()["error"]["code"], "out_of_descriptors", "{:?}", r.body);
                assert_eq!(r.headers["retry-after"], "1");
                refused += 1;
            }
            s => panic!("{s}: {:?}", r.body),
        }
    }
    assert!(refused > 0 && ok > 0, "{ok} streams, {refused} refused: 64 descriptors cannot carry 80 streams");
    let m = gp.metrics().await;
    assert_eq!(metric(&m, "goodput_rejected_total", &[("reason", "out_of_descriptors")]), refused as f64);
    assert_eq!(metric(&m, "goodput_upstream_errors_total", &[]), 0.0, "the backend is blamed");
    // The breaker as it stands (its gauge is exported a quarter second later).
    let b = gp.admin_json("/admin/backends").await;
    assert_eq!(b["backends"][0]["circuit"], "closed", "{b}");
    // Said once a second, with the count left out, not once per request.
    let log = gp.log();
    let lines = log.lines().filter(|l| l.contains("goodput is out of file descriptors")).count();
    assert!(
        lines >= 1 && lines <= 1 + t0.elapsed().as_secs() as usize,
        "{lines} lines for {refused} refusals: {log}"
    );
    // Once the streams are over, the descriptors are back.
    assert_eq!(send(gp.proxy, chat(true, 20)).await.status, 200);
}

/// The process's exit status, which must come within `limit` of `since`.
async fn exit_within(
    gp: &mut Goodput,
    since: Instant,
    limit: Duration,
    what: &str,
) -> std::process::ExitStatus {
    loop {
        if let Some(s) = gp.child.try_wait().unwrap() {
            return s;
        }
        assert!(since.elapsed() < limit, "goodput did not exit {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn sigterm(gp: &Goodput) {
    // SAFETY: kill has no memory-safety preconditions.
    assert_eq!(unsafe { libc::kill(gp.child.id() as i32, libc::SIGTERM) }, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_in_flight_streams_then_exits() {
    drains_in_flight_streams_then_exits(&[]).await;
}

/// One worker is a current-thread runtime (src/main.rs): the same path, signals and drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_in_flight_streams_then_exits_on_one_worker() {
    drains_in_flight_streams_then_exits(&["--workers", "1"]).await;
}

async fn drains_in_flight_streams_then_exits(args: &[&str]) {
    let (sim_addr, sim) = spawn_sim(0.0, 20.0, 60).await;
    let mut gp = Goodput::start_logged(
        &format!("backends:\n  - name: sim\n    url: http://{sim_addr}\n"),
        &[&["--shutdown-grace-secs", "10"], args].concat(),
        &[("RUST_LOG", "info")],
    );
    assert_eq!(send(gp.proxy, chat(false, 3)).await.status, 200);
    let p = gp.proxy;
    let stream = tokio::spawn(async move { send(p, chat(true, 60)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    sigterm(&gp);
    tokio::time::sleep(Duration::from_millis(200)).await;

    // No new connections; the admin listener says not ready while the stream finishes.
    assert!(TcpStream::connect(gp.proxy).await.is_err(), "still accepting after SIGTERM");
    let ready = send(gp.admin, Request::get("/readyz").body(Full::default()).unwrap()).await;
    assert_eq!(ready.status, 503);
    let r = stream.await.unwrap();
    assert_eq!((r.status.as_u16(), &r.error), (200, &None));
    assert!(r.text().matches("\"content\"").count() >= 60, "the in-flight stream was cut");
    assert!(r.text().ends_with("data: [DONE]\n\n"));
    assert_eq!(sim.cancelled(), 0);

    let status = exit_within(&mut gp, Instant::now(), Duration::from_secs(5), "after draining").await;
    assert!(status.success(), "{status}");
    // Both requests reached the metrics before the process ended.
    let log = gp.log();
    let last = log.lines().rev().find(|l| l.contains("shut down")).unwrap_or_else(|| panic!("{log}"));
    assert!(last.contains("flushed=true") && last.contains("\"ok\": 2"), "{last}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_nothing_in_flight_exits_at_once() {
    let (sim_addr, _sim) = spawn_sim(0.0, 1.0, 4).await;
    let mut gp = Goodput::start_with(
        &format!("backends:\n  - name: sim\n    url: http://{sim_addr}\n"),
        &["--shutdown-grace-secs", "30"],
    );
    // An idle keep-alive connection (a request answered, the client still connected) is not
    // in flight: it does not hold the exit for the grace period.
    let mut idle = TcpStream::connect(gp.proxy).await.unwrap();
    let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    assert!(raw_exchange(&mut idle, &req).await.starts_with("HTTP/1.1 200"));
    let t = Instant::now();
    sigterm(&gp);
    // Well under the 30 s grace period, with room for a loaded CI machine (500 ms was not).
    let status = exit_within(&mut gp, t, Duration::from_secs(10), "at once with nothing in flight").await;
    assert!(status.success(), "{status}");
    drop(idle);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_grace_period_bounds_the_drain() {
    let (sim_addr, sim) = spawn_sim(0.0, 50.0, 400).await;
    let mut gp = Goodput::start_with(
        &format!("backends:\n  - name: sim\n    url: http://{sim_addr}\n"),
        &["--shutdown-grace-secs", "1"],
    );
    let p = gp.proxy;
    let stream = tokio::spawn(async move { send(p, chat(true, 400)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t = Instant::now();
    sigterm(&gp);
    let r = stream.await.unwrap();
    assert!(r.error.is_some() || !r.text().ends_with("data: [DONE]\n\n"), "a 20 s stream finished in 1 s?");
    // The 1 s grace, with room for a loaded machine, and well under the stream's 20 s.
    exit_within(&mut gp, t, Duration::from_secs(8), "within the grace period").await;
    let deadline = Instant::now() + Duration::from_secs(2);
    while sim.cancelled() == 0 {
        assert!(Instant::now() < deadline, "the cut stream's generation was not cancelled upstream");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_and_user_text_stay_out_of_logs_metrics_and_admin() {
    const CLIENT_KEY: &str = "client-secret-4f9a";
    const BACKEND_KEY: &str = "backend-secret-77c1";
    const ADMIN_TOKEN: &str = "admin-secret-0b3e";
    const PROMPT: &str = "prompt-secret-e21d";
    const ANSWER: &str = "answer-secret-9c54";
    let answer = serde_json::json!({
        "id": "x", "object": "chat.completion", "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": format!("The {ANSWER}. It is so.")}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11}
    });
    let (up, seen) = spawn_canned(vec![("/v1/chat/completions", canned_json(&answer.to_string()))]).await;
    let gp = Goodput::start_logged(
        &format!(
            "backends:\n  - name: b\n    url: http://{up}\n    models: [m]\n    headers: {{authorization: Bearer {BACKEND_KEY}}}\n\
             quality:\n  consistency:\n    sample_rate: 1.0\n    samples: 2\n    max_token_share: 100.0\n"
        ),
        &[],
        &[("RUST_LOG", "debug"), ("GOODPUT_ADMIN_TOKEN", ADMIN_TOKEN)],
    );
    let models = ["m", "gpt-x-1", "gpt-x-2", "gpt-x-3", "gpt-x-4", "evil\"label", "gpt-x-5"];
    for model in models {
        let body = serde_json::json!({"model": model, "messages": [{"role": "user", "content": PROMPT}]});
        let mut req = post_json("/v1/chat/completions", &body.to_string());
        req.headers_mut().insert("authorization", format!("Bearer {CLIENT_KEY}").parse().unwrap());
        assert_eq!(send(gp.proxy, req).await.status, 200);
    }
    // The shadow re-samples of the first request (the only one for a model the backend serves).
    let deadline = Instant::now() + Duration::from_secs(10);
    while seen.requests.lock().unwrap().iter().filter(|(_, h, _)| h.contains_key("x-goodput-shadow")).count()
        < 2
    {
        assert!(Instant::now() < deadline, "no shadow requests");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for (_, h, _) in seen.requests.lock().unwrap().iter() {
        let auth = h.get("authorization").map(|v| v.to_str().unwrap().to_string());
        assert_eq!(auth.as_deref(), Some(&*format!("Bearer {BACKEND_KEY}")), "upstream saw {auth:?}");
    }

    // Admin: the token is required for /admin/*, not for /metrics or the probes.
    let get = |path: &str, token: Option<&str>| {
        let mut r = Request::get(path);
        if let Some(t) = token {
            r = r.header("authorization", format!("Bearer {t}"));
        }
        r.body(Full::default()).unwrap()
    };
    for path in ["/admin/config", "/admin/records", "/admin/backends", "/admin/routes"] {
        assert_eq!(send(gp.admin, get(path, None)).await.status, 401, "{path}");
        assert_eq!(send(gp.admin, get(path, Some("wrong-token-0000000"))).await.status, 401, "{path}");
    }
    let mut seen_text = String::new();
    for path in ["/admin/config", "/admin/records?limit=100", "/admin/backends", "/admin/routes"] {
        let r = send(gp.admin, get(path, Some(ADMIN_TOKEN))).await;
        assert_eq!(r.status, 200, "{path}");
        seen_text += &r.text();
    }
    // Records are filed off the hot path: wait until the six unlisted models are counted.
    wait_metric(&gp, "goodput_requests_total", &[("gen_ai_request_model", "other")], 6.0).await;
    let metrics = send(gp.admin, get("/metrics", None)).await;
    assert_eq!(metrics.status, 200);
    seen_text += &metrics.text();
    assert_eq!(send(gp.admin, get("/healthz", None)).await.status, 200);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let log = gp.log();
    assert!(log.contains("DEBUG"), "debug logging was not on: {log}");
    seen_text += &log;
    for secret in [CLIENT_KEY, BACKEND_KEY, ADMIN_TOKEN, PROMPT, ANSWER] {
        assert!(!seen_text.contains(secret), "{secret} leaked into logs, metrics or /admin");
    }

    // Labels: model names the config does not list are `other`, whatever clients send.
    let m = metrics.text();
    let mut labels: Vec<&str> = m
        .lines()
        .filter(|l| l.starts_with("goodput_requests_total{"))
        .filter_map(|l| l.split("gen_ai_request_model=\"").nth(1)?.split('"').next())
        .collect();
    labels.sort();
    labels.dedup();
    assert_eq!(labels, ["m", "other"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_are_one_json_object_per_line_when_asked() {
    // A backend nothing listens on: the request fails, and goodput logs why.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let gp = Goodput::start_logged(
        &format!("backends:\n  - name: b\n    url: http://{dead}\n    models: [m]\n"),
        &[],
        &[("GOODPUT_LOG_FORMAT", "json"), ("RUST_LOG", "info")],
    );
    let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
    assert_eq!(send(gp.proxy, post_json("/v1/chat/completions", body)).await.status, 502);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let log = gp.log();
    let events: Vec<serde_json::Value> = log
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON object ({e}): {l}")))
        .collect();
    let find = |message: &str| {
        events
            .iter()
            .find(|e| e["message"] == message)
            .unwrap_or_else(|| panic!("no {message:?} event in {log}"))
    };
    let serving = find("goodput serving");
    assert_eq!(serving["level"], "INFO");
    assert_eq!(serving["proxy_addr"], gp.proxy.to_string(), "{serving}");
    assert!(serving["timestamp"].as_str().is_some_and(|t| t.ends_with('Z')), "{serving}");
    let failure = find("upstream failure");
    assert_eq!((&failure["level"], &failure["kind"]), (&"WARN".into(), &"connect".into()), "{failure}");
    assert_eq!(failure["target"], "goodput::proxy", "{failure}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_log_writes_one_json_line_per_metered_request_and_no_text() {
    const PROMPT: &str = "prompt-secret-5d1e";
    const ANSWER: &str = "answer-secret-a07c";
    let answer = serde_json::json!({
        "id": "x", "object": "chat.completion", "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": ANSWER}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
    });
    let (up, _) = spawn_canned(vec![
        ("/v1/chat/completions", canned_json(&answer.to_string())),
        ("/v1/models", canned_json(r#"{"object":"list","data":[{"id":"m"}]}"#)),
    ])
    .await;
    // To stdout, after the line that says where goodput listens.
    let mut gp = Goodput::start_with(
        &format!("backends:\n  - name: b\n    url: http://{up}\n    models: [m]\n"),
        &["--request-log", "-"],
    );
    let (proxy, mut out) = (gp.proxy, gp.stdout.take().unwrap());
    let body =
        serde_json::json!({"model": "m", "messages": [{"role": "user", "content": PROMPT}]}).to_string();
    for _ in 0..2 {
        assert_eq!(send(proxy, post_json("/v1/chat/completions", &body)).await.status, 200);
    }
    // Not metered, so not a record.
    let models = Request::get("/v1/models").body(Full::default()).unwrap();
    assert_eq!(send(proxy, models).await.status, 200);
    let lines = tokio::task::spawn_blocking(move || {
        let mut lines = Vec::new();
        for _ in 0..2 {
            let mut l = String::new();
            std::io::BufRead::read_line(&mut out, &mut l).unwrap();
            lines.push(l);
        }
        lines
    });
    let lines = match tokio::time::timeout(Duration::from_secs(10), lines).await {
        Ok(lines) => lines.unwrap(),
        Err(_) => {
            // Killing it ends the blocked read (EOF), so the test fails instead of hanging.
            let _ = gp.child.kill();
            panic!("no two request-log lines within 10 s");
        }
    };
    let recs: Vec<serde_json::Value> = lines.iter().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_ne!(recs[0]["id"], recs[1]["id"]);
    for (l, r) in lines.iter().zip(&recs) {
        assert!(l.ends_with('\n') && !l.contains(PROMPT) && !l.contains(ANSWER), "{l}");
        assert_eq!((r["status"].as_u64(), r["outcome"].as_str()), (Some(200), Some("ok")), "{r}");
        assert_eq!((r["backend"].as_str(), r["model"].as_str()), (Some("b"), Some("m")), "{r}");
        assert_eq!((r["prompt_tokens"].as_u64(), r["completion_tokens"].as_u64()), (Some(5), Some(3)), "{r}");
        assert!(r["e2e"].as_f64().is_some_and(|s| s > 0.0), "{r}");
    }

    // A log that cannot be opened stops goodput before it serves, and says which.
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_goodput"))
        .args(["serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .args(["--upstream", "http://127.0.0.1:9", "--request-log", "/nonexistent-dir/requests.jsonl"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && err.contains("--request-log /nonexistent-dir/requests.jsonl"), "{err}");
    assert!(bad.stdout.is_empty(), "it must not say it listens: {:?}", String::from_utf8_lossy(&bad.stdout));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_log_file_holds_every_record_after_sigterm() {
    let (sim_addr, _sim) = spawn_sim(0.0, 0.0, 4).await;
    let dir = temp_dir("reqlog-file");
    let path = dir.join("requests.jsonl");
    let mut gp = Goodput::start_with(
        &format!("backends:\n  - name: sim\n    url: http://{sim_addr}\n    models: [sim-model]\n"),
        &["--request-log", path.to_str().unwrap()],
    );
    let body = r#"{"model":"sim-model","messages":[{"role":"user","content":"hi"}]}"#;
    for _ in 0..5 {
        assert_eq!(send(gp.proxy, post_json("/v1/chat/completions", body)).await.status, 200);
    }
    // At once: the last records may still be queued; shutdown waits for them, log included.
    sigterm(&gp);
    let status = exit_within(&mut gp, Instant::now(), Duration::from_secs(10), "after SIGTERM").await;
    assert!(status.success(), "{status:?}");
    let text = std::fs::read_to_string(&path).unwrap();
    let ids: Vec<u64> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["id"].as_u64().unwrap())
        .collect();
    assert_eq!(ids.len(), 5, "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}
