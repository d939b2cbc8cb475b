//! Black-box tests of the proxy over real sockets: the `goodput` binary between a client and
//! an upstream test double.

use crate::common::*;
use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use std::time::{Duration, Instant};

const CHAT_STREAM: &[&str] = &[
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"},\"finish_reason\":null}]}\n\n",
    // One event split across two frames, as TCP may deliver it.
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" world\"},",
    "\"finish_reason\":null}]}\n\ndata: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\". Foo bar\"},\"finish_reason\":\"stop\"}]}\n\n",
];
const USAGE_EVENT: &str = "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":3,\"total_tokens\":8}}\n\n";
const DONE: &str = "data: [DONE]\n\n";
/// A streaming chat request whose client asked for usage (nothing is injected or stripped).
const STREAM_WITH_USAGE: &str =
    r#"{"model":"m1","stream":true,"stream_options":{"include_usage":true},"messages":[]}"#;

fn chat_stream_with_usage() -> Vec<&'static str> {
    let mut v = CHAT_STREAM.to_vec();
    v.push(USAGE_EVENT);
    v.push(DONE);
    v
}

fn config_for(upstream: std::net::SocketAddr, extra: &str) -> String {
    format!("backends:\n  - name: up\n    url: http://{upstream}\n    models: [m1]\n{extra}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn byte_transparent_for_every_path() {
    let completion_stream: Vec<&str> = vec![
        "data: {\"id\":\"x\",\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\"a\",\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"x\",\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\" b\",\"finish_reason\":\"length\"}]}\n\n",
        "data: {\"id\":\"x\",\"object\":\"text_completion\",\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2,\"total_tokens\":3}}\n\n",
        DONE,
    ];
    let chat_json = r#"{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":4,"completion_tokens":1,"total_tokens":5}}"#;
    let completion_json = r#"{"id":"d","object":"text_completion","choices":[{"index":0,"text":"x y z","finish_reason":"length"}],"usage":{"prompt_tokens":2,"completion_tokens":3,"total_tokens":5}}"#;
    let cases: Vec<(&str, &str, Canned, &str)> = vec![
        (
            "/v1/chat/completions",
            "POST",
            canned_sse(&chat_stream_with_usage(), Duration::from_millis(5)),
            r#"{"model":"m1","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}"#,
        ),
        (
            "/v1/chat/completions",
            "POST",
            canned_json(chat_json),
            r#"{"model":"m1","messages":[{"role":"user","content":"hi"}]}"#,
        ),
        (
            "/v1/completions",
            "POST",
            canned_sse(&completion_stream, Duration::from_millis(5)),
            r#"{"model":"m1","prompt":"p","stream":true,"stream_options":{"include_usage":true}}"#,
        ),
        (
            "/v1/completions",
            "POST",
            canned_json(completion_json),
            r#"{"model":"m1","prompt":"p","max_tokens":3}"#,
        ),
        ("/v1/models", "GET", canned_json(r#"{"object":"list","data":[{"id":"m1","object":"model"}]}"#), ""),
        (
            "/v1/embeddings",
            "POST",
            canned_json(
                r#"{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1,-0.2]}]}"#,
            ),
            r#"{"model":"e","input":"x"}"#,
        ),
        // Malformed JSON: forwarded unchanged; the upstream decides.
        (
            "/v1/chat/completions",
            "POST",
            Canned {
                status: 400,
                ..canned_json(r#"{"error":{"message":"bad json","type":"invalid_request_error","code":400}}"#)
            },
            r#"{"model": "m1", "messages": [oops"#,
        ),
    ];
    // A burst: every event at once, so several upstream chunks arrive in one read.
    let mut burst = canned_sse(&chat_stream_with_usage(), Duration::ZERO);
    burst.gap = Duration::ZERO;
    let mut cases = cases;
    cases.push(("/v1/chat/completions", "POST", burst, STREAM_WITH_USAGE));
    // A large answer in pieces of many sizes.
    let mut large = canned_json("");
    large.frames = [1usize, 16 * 1024, 100, 70 * 1024, 16 * 1024 - 1, 200 * 1024]
        .iter()
        .enumerate()
        .map(|(i, &n)| Bytes::from(vec![b'a' + i as u8; n]))
        .collect();
    cases.push(("/v1/chat/completions", "POST", large, r#"{"model":"m1","messages":[]}"#));
    for (path, method, canned, body) in cases {
        let expected: Vec<u8> = canned.frames.iter().flat_map(|f| f.to_vec()).collect();
        let (up, seen) = spawn_canned(vec![(path, canned)]).await;
        let gp = Goodput::start(&config_for(up, ""));
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", "application/json")
            .header("authorization", "Bearer sk-test")
            .header("connection", "x-hop")
            .header("x-hop", "must-not-pass")
            .header("x-custom", "kept")
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        let r = send(gp.proxy, req).await;
        assert_eq!(r.body.as_ref(), expected.as_slice(), "{method} {path}: body differs");
        assert!(r.error.is_none(), "{path}: {:?}", r.error);
        assert_eq!(r.headers["x-upstream"], "canned");
        let (p, h, b) = seen.requests.lock().unwrap()[0].clone();
        assert_eq!(p, path);
        assert_eq!(b.as_ref(), body.as_bytes(), "{path}: request body changed");
        assert_eq!(h["x-forwarded-for"], "127.0.0.1");
        assert_eq!(h["x-forwarded-proto"], "http");
        assert_eq!(h["authorization"], "Bearer sk-test");
        assert_eq!(h["x-custom"], "kept");
        assert!(!h.contains_key("x-hop"), "hop-by-hop header named in Connection was forwarded");
        if method == "POST" && path != "/v1/embeddings" {
            let recs = gp.records(1).await;
            let model = if body.contains("oops") { "unknown" } else { "m1" };
            assert_eq!(recs[0]["model"], model);
            // Filed as what it was once the last byte went out.
            let outcome = if body.contains("oops") { "client_error" } else { "ok" };
            assert_eq!(recs[0]["outcome"], outcome, "{path}");
            if String::from_utf8_lossy(&expected).contains("\"usage\":{") {
                assert_eq!(recs[0]["completion_source"], "usage", "{path}: {}", recs[0]);
            }
        }
    }
}

/// An upstream that answers every request on a connection with an empty `200`
/// (`content-length: 0`), keep-alive.
async fn empty_200_upstream() -> std::net::SocketAddr {
    use tokio::io::AsyncWriteExt;
    raw_upstream(|mut s| async move {
        let answer = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 0\r\n\r\n";
        while read_request(&mut s).await {
            if s.write_all(answer).await.is_err() {
                return;
            }
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_answer_is_recorded_as_answered_not_cancelled() {
    // A response body of length zero is never polled by hyper's server: the record must still
    // be filed as what it was, not as a client that went away.
    let up = empty_200_upstream().await;
    {
        let gp = Goodput::start(&config_for(up, ""));
        let what = "an empty answer";
        for body in [r#"{"model":"m1","messages":[]}"#, r#"{"model":"m1","stream":true,"messages":[]}"#] {
            let r = send(gp.proxy, post_json("/v1/chat/completions", body)).await;
            assert_eq!(r.status, 200, "{what}");
            assert!(r.body.is_empty() && r.error.is_none(), "{what}: {:?}", r.error);
        }
        let recs = gp.records(2).await;
        for rec in &recs {
            assert_eq!(rec["outcome"], "ok", "{what}: {rec}");
            assert_eq!(rec["status"], 200, "{what}: {rec}");
        }
        let m = gp.metrics().await;
        assert_eq!(metric(&m, "goodput_in_flight_requests", &[]), 0.0, "{what}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clients_request_id_finds_its_record_and_reaches_the_server_unchanged() {
    let (up, seen) = spawn_canned(vec![("/v1/chat/completions", canned_json(r#"{"choices":[]}"#))]).await;
    let gp = Goodput::start(&config_for(up, ""));
    let body = r#"{"model":"m1","messages":[{"role":"user","content":"hi"}]}"#;
    let long = "x".repeat(129);
    for id in [Some("trace/7+a=b"), None, Some(long.as_str()), Some("two words"), Some("trace-8")] {
        let mut req = post_json("/v1/chat/completions", body);
        if let Some(id) = id {
            req.headers_mut().insert("x-request-id", id.parse().unwrap());
        }
        assert_eq!(send(gp.proxy, req).await.status, 200);
    }
    let recs = gp.records(5).await;
    let ids: Vec<_> = recs.iter().map(|r| r.get("request_id").and_then(|v| v.as_str())).collect();
    // Newest first; none kept for a request without one, or one too long or not a token.
    assert_eq!(ids, [Some("trace-8"), None, None, None, Some("trace/7+a=b")]);
    // Found by its id, percent-encoded in the query as any client would send it.
    let found = gp.admin_json("/admin/records?request_id=trace%2F7%2Ba%3Db").await;
    let found = found.as_array().unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0]["id"], recs[4]["id"]);
    assert!(gp.admin_json("/admin/records?request_id=nothing").await.as_array().unwrap().is_empty());
    // The server sees the client's header as sent (vLLM names its request after it), and
    // none is invented for a request that had none.
    let sent = seen.requests.lock().unwrap();
    let upstream_ids: Vec<_> =
        sent.iter().map(|r| r.1.get("x-request-id").map(|v| v.to_str().unwrap().to_string())).collect();
    assert_eq!(upstream_ids[0].as_deref(), Some("trace/7+a=b"));
    assert_eq!(upstream_ids[1], None);
    assert_eq!(upstream_ids[2].as_deref(), Some(long.as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_usage_is_removed_and_counted() {
    let (up, seen) = spawn_canned(vec![(
        "/v1/chat/completions",
        canned_sse(&chat_stream_with_usage(), Duration::from_millis(2)),
    )])
    .await;
    let gp = Goodput::start(&config_for(up, ""));
    let body = r#"{"model":"m1","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let r = send(gp.proxy, post_json("/v1/chat/completions", body)).await;
    let mut want = CHAT_STREAM.concat();
    want.push_str(DONE);
    assert_eq!(r.text(), want, "the client must see every byte but the usage chunk it did not ask for");
    let sent = seen.requests.lock().unwrap()[0].2.clone();
    let v: serde_json::Value = serde_json::from_slice(&sent).unwrap();
    assert_eq!(v["stream_options"]["include_usage"], true);
    assert_eq!(v["messages"][0]["content"], "hi");
    let rec = &gp.records(1).await[0];
    assert_eq!(rec["completion_tokens"], 3);
    assert_eq!(rec["completion_source"], "usage");
    assert_eq!(rec["prompt_tokens"], 5);
    assert_eq!(rec["outcome"], "ok");
    assert_eq!(rec["finish_reason"], "stop");
    let m = gp.metrics().await;
    assert_eq!(metric(&m, "goodput_usage_chunks_removed_total", &[]), 1.0);
    assert_eq!(metric(&m, "goodput_tokens_total", &[("type", "output"), ("source", "usage")]), 3.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_injection_can_be_disabled_then_chunks_or_tokenizer_count() {
    let mut events = CHAT_STREAM.to_vec();
    events.push(DONE);
    let (up, seen) =
        spawn_canned(vec![("/v1/chat/completions", canned_sse(&events, Duration::from_millis(2)))]).await;
    let body = r#"{"model":"m1","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;

    let gp = Goodput::start(&config_for(up, "usage:\n  inject_stream_usage: false\n"));
    let r = send(gp.proxy, post_json("/v1/chat/completions", body)).await;
    assert_eq!(r.body.as_ref(), events.concat().as_bytes());
    assert_eq!(seen.requests.lock().unwrap()[0].2.as_ref(), body.as_bytes(), "request must be untouched");
    let rec = &gp.records(1).await[0];
    assert_eq!(rec["completion_source"], "chunks");
    assert_eq!(rec["completion_tokens"], 3, "three content-bearing chunks");
    drop(gp);

    // With the served model's tokenizer.json the count is by tokens, not chunks.
    let dir = temp_dir("tok");
    let tok = dir.join("tokenizer.json");
    std::fs::write(
        &tok,
        r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,
            "pre_tokenizer":{"type":"Whitespace"},"post_processor":null,"decoder":null,
            "model":{"type":"WordLevel","vocab":{"[UNK]":0,"Hello":1,"world":2,".":3},"unk_token":"[UNK]"}}"#,
    )
    .unwrap();
    let gp = Goodput::start(&config_for(up, &format!("    tokenizer: {}\n", tok.display())));
    let r = send(gp.proxy, post_json("/v1/chat/completions", body)).await;
    assert_eq!(r.status, 200);
    let rec = &gp.records(1).await[0];
    assert_eq!(rec["completion_source"], "tokenizer");
    // "Hello world. Foo bar" -> Hello, world, ".", Foo, bar
    assert_eq!(rec["completion_tokens"], 5);
    let m = gp.metrics().await;
    assert_eq!(metric(&m, "goodput_tokens_total", &[("type", "output"), ("source", "tokenizer")]), 5.0);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_disconnect_cancels_upstream_within_100ms() {
    let (sim_addr, sim) = spawn_sim(5.0, 20.0, 500).await;
    let gp = Goodput::start_with("", &["--upstream", &format!("http://{sim_addr}")]);
    let stream = tokio::net::TcpStream::connect(gp.proxy).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.unwrap();
    let conn_task = tokio::spawn(conn);
    let mut req = post_json(
        "/v1/chat/completions",
        r#"{"model":"sim-model","stream":true,"messages":[{"role":"user","content":"tell me a long story"}]}"#,
    );
    req.headers_mut().insert("host", "x".parse().unwrap());
    let resp = sender.send_request(req).await.unwrap();
    let mut body = resp.into_body();
    use http_body_util::BodyExt;
    let mut frames = 0;
    while frames < 4 {
        body.frame().await.unwrap().unwrap();
        frames += 1;
    }
    assert_eq!(sim.cancelled(), 0);
    // The client goes away mid-stream.
    drop(body);
    drop(sender);
    conn_task.abort();
    let t = Instant::now();
    while sim.cancelled() == 0 && t.elapsed() < Duration::from_secs(2) {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let took = t.elapsed();
    assert_eq!(sim.cancelled(), 1, "the upstream never saw the cancellation");
    assert!(took < Duration::from_millis(100), "cancellation reached the upstream after {took:?}");
    let rec = &gp.records(1).await[0];
    assert_eq!(rec["outcome"], "cancelled");
    assert!(rec["slo_met"].is_null(), "cancellations are not judged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_refused_is_502_with_openai_error() {
    let (_refusing, port) = refusing_port();
    let gp = Goodput::start_logged("", &["--upstream", &format!("http://127.0.0.1:{port}")], &[]);
    let mut req = post_json("/v1/chat/completions", r#"{"model":"m","messages":[]}"#);
    req.headers_mut().insert("x-request-id", "trace-502".parse().unwrap());
    let r = send(gp.proxy, req).await;
    assert_eq!(r.status, 502);
    let v = r.json();
    assert_eq!(v["error"]["code"], "connect");
    assert!(v["error"]["message"].as_str().unwrap().contains("connect"));
    assert!(v["error"]["type"].is_string());
    let rec = &gp.records(1).await[0];
    assert_eq!(rec["outcome"], "connect_error");
    assert_eq!(rec["slo_met"], false);
    // The log line names the request (goodput's id and the client's) and the server.
    let line = gp.log().lines().find(|l| l.contains("upstream failure")).map(str::to_owned);
    let line = line.unwrap_or_else(|| panic!("no upstream failure logged: {}", gp.log()));
    // The failed requests alone: by outcome.
    let failed = gp.admin_json("/admin/records?outcome=connect_error").await;
    assert_eq!(failed.as_array().map(Vec::len), Some(1), "{failed}");
    assert!(gp.admin_json("/admin/records?outcome=ok").await.as_array().unwrap().is_empty());
    for field in [
        format!("id={}", rec["id"]),
        "request_id=\"trace-502\"".to_string(),
        "backend=\"127.0.0.1\"".to_string(),
        format!("endpoint=\"127.0.0.1:{port}\""),
    ] {
        assert!(line.contains(&field), "{field} missing: {line}");
    }
    let m = gp.metrics().await;
    assert_eq!(metric(&m, "goodput_upstream_errors_total", &[("kind", "connect")]), 1.0);
    // Unmetered paths fail the same way.
    let r = send(gp.proxy, Request::get("/v1/models").body(Full::default()).unwrap()).await;
    assert_eq!(r.status, 502);
    let ready = send(gp.admin, Request::get("/readyz").body(Full::default()).unwrap()).await;
    assert_eq!(ready.status, 503, "not ready while the upstream has never answered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_byte_timeout_is_504() {
    let slow = Canned { delay_headers: Duration::from_secs(5), ..canned_json("{}") };
    let (up, _) = spawn_canned(vec![("/v1/chat/completions", slow)]).await;
    let gp = Goodput::start(&config_for(up, "timeouts:\n  first_byte_ms: 300\n"));
    let t = Instant::now();
    let r = send(gp.proxy, post_json("/v1/chat/completions", r#"{"model":"m1","messages":[]}"#)).await;
    assert_eq!(r.status, 504);
    assert!(t.elapsed() < Duration::from_secs(3));
    assert_eq!(r.json()["error"]["code"], "timeout_first_byte");
    assert_eq!(gp.records(1).await[0]["outcome"], "timeout");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_timeout_and_reset_end_stream_without_invented_bytes() {
    for (then, outcome, extra) in
        [(Then::Stall, "timeout", "timeouts:\n  idle_ms: 300\n"), (Then::Reset, "upstream_reset", "")]
    {
        let canned = Canned { then, ..canned_sse(&CHAT_STREAM[..2], Duration::from_millis(5)) };
        let (up, _) = spawn_canned(vec![("/v1/chat/completions", canned)]).await;
        let gp = Goodput::start(&config_for(up, extra));
        let r = send(gp.proxy, post_json("/v1/chat/completions", STREAM_WITH_USAGE)).await;
        assert_eq!(r.status, 200);
        assert_eq!(
            r.text(),
            CHAT_STREAM[..2].concat(),
            "{outcome}: the client must get exactly what was sent"
        );
        assert!(r.error.is_some(), "{outcome}: the stream must end as an error, not as a clean end");
        let rec = &gp.records(1).await[0];
        assert_eq!(rec["outcome"], outcome);
        assert_eq!(rec["slo_met"], false);
    }
}

/// The idle timeout counts from the last data, not from the start of the stream: a stream
/// whose events keep coming runs past it, and one that stalls is cut `idle_ms` after its last
/// event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_timeout_counts_from_the_last_event() {
    let events: Vec<String> = (0..8)
        .map(|i| format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"t{i}\"}}}}]}}\n\n"))
        .collect();
    let events: Vec<&str> = events.iter().map(String::as_str).collect();
    for then in [Then::End, Then::Stall] {
        // 8 events 100 ms apart: 700 ms of data, more than twice the idle timeout.
        let canned = Canned { then, ..canned_sse(&events, Duration::from_millis(100)) };
        let (up, _) = spawn_canned(vec![("/v1/chat/completions", canned)]).await;
        let gp = Goodput::start(&config_for(up, "timeouts:\n  idle_ms: 300\n"));
        let r = send(gp.proxy, post_json("/v1/chat/completions", STREAM_WITH_USAGE)).await;
        let ended = Instant::now();
        assert_eq!(r.text(), events.concat(), "every event arrives");
        let last = r.frames.last().map(|(t, _)| *t).expect("frames");
        let rec = &gp.records(1).await[0];
        if then == Then::End {
            assert!(r.error.is_none(), "a stream with steady events must not time out: {:?}", r.error);
            assert_eq!(rec["outcome"], "ok");
        } else {
            assert!(r.error.is_some(), "a stalled stream must end as an error");
            assert_eq!(rec["outcome"], "timeout");
            let silent = ended - last;
            assert!(
                silent >= Duration::from_millis(250) && silent < Duration::from_millis(1500),
                "cut {silent:?} after the last event (idle_ms 300)"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_5xx_with_non_json_body_is_forwarded_and_marked() {
    let c = Canned { status: 503, content_type: "text/html", ..canned_json("<html>overloaded</html>") };
    let (up, _) = spawn_canned(vec![("/v1/chat/completions", c)]).await;
    let gp = Goodput::start(&config_for(up, ""));
    let r = send(gp.proxy, post_json("/v1/chat/completions", r#"{"model":"m1","messages":[]}"#)).await;
    assert_eq!(r.status, 503);
    assert_eq!(r.text(), "<html>overloaded</html>");
    let rec = &gp.records(1).await[0];
    assert_eq!(rec["outcome"], "upstream_error");
    assert_eq!(rec["status"], 503);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_body_is_413_with_and_without_content_length() {
    let (up, seen) = spawn_canned(vec![
        ("/v1/chat/completions", canned_json("{}")),
        ("/v1/embeddings", canned_json("{}")),
    ])
    .await;
    let gp = Goodput::start(&config_for(up, "limits:\n  max_body_bytes: 1024\n"));
    let big = format!(r#"{{"model":"m1","messages":[{{"role":"user","content":"{}"}}]}}"#, "x".repeat(4096));
    let r = send(gp.proxy, post_json("/v1/chat/completions", &big)).await;
    assert_eq!(r.status, 413);
    assert_eq!(r.json()["error"]["code"], "request_too_large");
    // Chunked (no Content-Length): the limit applies while reading.
    for path in ["/v1/chat/completions", "/v1/embeddings"] {
        let stream = tokio::net::TcpStream::connect(gp.proxy).await.unwrap();
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.unwrap();
        tokio::spawn(conn);
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let req = Request::post(path).header("host", "x").body(goodput::sim::ChannelBody::new(rx)).unwrap();
        let big = big.clone();
        tokio::spawn(async move {
            for c in big.as_bytes().chunks(512) {
                if tx.send(Ok(Bytes::copy_from_slice(c))).await.is_err() {
                    return;
                }
            }
        });
        let resp = sender.send_request(req).await;
        match resp {
            Ok(resp) => assert_eq!(resp.status(), 413, "{path}"),
            // For a streamed path the proxy may have to cut the upload short instead.
            Err(e) => assert_eq!(path, "/v1/embeddings", "{e}"),
        }
    }
    assert!(seen.requests.lock().unwrap().iter().all(|(p, _, _)| p != "/v1/chat/completions"));
    let m = gp.metrics().await;
    assert!(metric(&m, "goodput_request_body_too_large_total", &[]) >= 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_clients_are_served_and_metered() {
    let (sim_addr, _sim) = spawn_sim(1.0, 1.0, 5).await;
    let gp = Goodput::start_with("", &["--upstream", &format!("http://{sim_addr}")]);
    let stream = tokio::net::TcpStream::connect(gp.proxy).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let req = Request::post(format!("http://{}/v1/chat/completions", gp.proxy))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(
            br#"{"model":"sim-model","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
        )))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.version(), http::Version::HTTP_2);
    let r = read_reply(resp, Instant::now()).await;
    assert!(r.text().ends_with("data: [DONE]\n\n"));
    assert!(!r.text().contains("\"usage\""));
    let rec = &gp.records(1).await[0];
    assert_eq!(rec["completion_tokens"], 5);
    assert_eq!(rec["completion_source"], "usage");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_with_n_choices_count_every_choice() {
    let (sim_addr, _sim) = spawn_sim(1.0, 1.0, 6).await;
    let gp = Goodput::start_with("", &["--upstream", &format!("http://{sim_addr}")]);
    for (stream, usage) in [(true, false), (false, true)] {
        let body = format!(r#"{{"model":"sim-model","n":3,"stream":{stream},"prompt":"a b c"}}"#);
        let r = send(gp.proxy, post_json("/v1/completions", &body)).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.text().contains("\"usage\""), usage);
    }
    let recs = gp.records(2).await;
    for rec in &recs {
        assert_eq!(rec["completion_tokens"], 18);
        assert_eq!(rec["prompt_tokens"], 3);
        assert_eq!(rec["n"], 3);
    }
    let streamed = recs.iter().find(|r| r["stream"] == true).unwrap();
    assert!(streamed["tpot"].as_f64().unwrap() > 0.0, "TPOT is per choice for n > 1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_latency_goodput_and_label_bounds() {
    let cfg =
        goodput::sim::SimConfig { ttft_ms: 20.0, tpot_ms: 2.0, output_tokens: 10, ..Default::default() };
    let (sim_addr, sim) = goodput::sim::spawn(cfg.clone(), "127.0.0.1:0").await.unwrap();
    // The SLO sits between the fast requests (20 ms upstream, 40-60 ms seen on a loaded CI) and
    // the slow ones (150 ms).
    let yaml = format!(
        "backends:\n  - name: s\n    url: http://{sim_addr}\n    models: [sim-model]\nslo:\n  ttft_ms: 100\n  tpot_ms: 20\n"
    );
    let gp = Goodput::start(&yaml);
    let stream_req = |model: &str| {
        post_json(
            "/v1/chat/completions",
            &format!(r#"{{"model":"{model}","stream":true,"messages":[{{"role":"user","content":"hi"}}]}}"#),
        )
    };
    for _ in 0..3 {
        assert_eq!(send(gp.proxy, stream_req("sim-model")).await.status, 200);
    }
    sim.set_config(goodput::sim::SimConfig { ttft_ms: 150.0, ..cfg });
    assert_eq!(send(gp.proxy, stream_req("sim-model")).await.status, 200);
    // A model the config does not name must not become a label value.
    assert_eq!(send(gp.proxy, stream_req("attacker-controlled-123")).await.status, 200);
    // The client's own error (the upstream refuses malformed JSON) is not judged.
    let bad = send(gp.proxy, post_json("/v1/chat/completions", r#"{"model":"sim-model","#)).await;
    assert_eq!(bad.status, 400);
    gp.records(6).await;
    let m = gp.metrics().await;
    let unknown = [("gen_ai_request_model", "unknown"), ("backend", "s")];
    let bad = [unknown[0], unknown[1], ("outcome", "client_error"), ("status", "400")];
    assert_eq!(metric(&m, "goodput_requests_total", &bad), 1.0);
    assert_eq!(series(&m, "goodput_slo_judged_requests_total", &unknown), [] as [f64; 0]);
    // The slow request of a model no request met the SLO for: its met series exist, at 0.
    let other = [("gen_ai_request_model", "other"), ("backend", "s")];
    assert_eq!(series(&m, "goodput_slo_judged_requests_total", &other), [1.0]);
    assert_eq!(series(&m, "goodput_slo_met_requests_total", &other), [0.0]);
    assert_eq!(series(&m, "goodput_slo_met_output_tokens_total", &other), [0.0]);
    let l = [("gen_ai_request_model", "sim-model"), ("backend", "s")];
    assert_eq!(metric(&m, "gen_ai_server_time_to_first_token_seconds_count", &l), 4.0);
    assert_eq!(metric(&m, "goodput_slo_judged_requests_total", &l), 4.0);
    assert_eq!(metric(&m, "goodput_slo_met_requests_total", &l), 3.0);
    assert_eq!(metric(&m, "goodput_slo_met_output_tokens_total", &l), 30.0);
    assert_eq!(metric(&m, "goodput_slo_judged_output_tokens_total", &l), 40.0);
    assert_eq!(metric(&m, "gen_ai_server_time_per_output_token_seconds_count", &l), 4.0);
    assert!(metric(&m, "goodput_inter_token_latency_seconds_count", &l) >= 4.0 * 9.0);
    assert_eq!(metric(&m, "gen_ai_client_token_usage_count", &[("gen_ai_token_type", "output")]), 5.0);
    assert_eq!(metric(&m, "goodput_requests_total", &[("gen_ai_request_model", "other")]), 1.0);
    assert!(!m.contains("attacker-controlled"));
    assert!(metric(&m, "goodput_proxy_overhead_seconds_count", &[]) >= 5.0);
    // The TTFT buckets place the three fast requests (20 ms upstream) below the slow one
    // (150 ms): 100 ms leaves room for a loaded machine, which once took 40-60 ms for a fast one.
    let l_100ms = [l[0], l[1], ("le", "0.1")];
    assert_eq!(metric(&m, "gen_ai_server_time_to_first_token_seconds_bucket", &l_100ms), 3.0, "{m}");
    // Windows for the router.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let b = gp.admin_json("/admin/backends").await;
    let w = &b["backends"][0]["window"];
    assert_eq!(w["counts"]["requests"], 6);
    assert_eq!(w["counts"]["slo_judged"], 5, "the client's own error is not judged");
    assert_eq!((&w["counts"]["client_errors"], &w["counts"]["errors"]), (&1.into(), &0.into()), "{w}");
    assert_eq!(w["error_rate"], 0.0, "a client's 400 is not the backend's failure");
    // The window's median is a fast request's (20 ms upstream), below the slow one's 150 ms,
    // with the same room for a loaded machine as the buckets above (CI once read 44 ms).
    let p50 = w["ttft"]["p50"].as_f64().unwrap();
    assert!((0.019..0.1).contains(&p50), "windowed TTFT p50 {p50}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_the_upstream() {
    // Held to the end: the simulator listens on the port while it is still reserved.
    let (_refusing, port) = refusing_port();
    let gp = Goodput::start_with("", &["--upstream", &format!("http://127.0.0.1:{port}")]);
    let get = |p: &'static str| Request::get(p).body(Full::default()).unwrap();
    assert_eq!(send(gp.admin, get("/healthz")).await.status, 200);
    assert_eq!(send(gp.admin, get("/readyz")).await.status, 503);
    tokio::spawn(goodput::sim::serve(
        listen_on_refusing_port(port),
        goodput::sim::Sim::new(Default::default()),
    ));
    let t = Instant::now();
    while send(gp.admin, get("/readyz")).await.status != 200 {
        assert!(t.elapsed() < Duration::from_secs(5), "never became ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_timeout_is_504() {
    // A loopback listener that never accepts, with its accept queue already full: Linux then
    // drops new SYNs, so a connect hangs until the proxy's connect timeout.
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = sock.listen(1).unwrap();
    let addr = listener.local_addr().unwrap();
    let mut fillers = Vec::new();
    for _ in 0..8 {
        match tokio::time::timeout(Duration::from_millis(200), tokio::net::TcpStream::connect(addr)).await {
            Ok(Ok(s)) => fillers.push(s),
            _ => break,
        }
    }
    let gp = Goodput::start(&format!(
        "backends:\n  - name: up\n    url: http://{addr}\ntimeouts:\n  connect_ms: 300\n"
    ));
    let t = Instant::now();
    let r = send(gp.proxy, post_json("/v1/chat/completions", r#"{"model":"m","messages":[]}"#)).await;
    assert_eq!(r.status, 504, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "timeout_connect");
    assert!(t.elapsed() < Duration::from_secs(3));
    assert_eq!(gp.records(1).await[0]["outcome"], "timeout");
    drop(listener);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_closing_after_done_is_a_complete_request_not_a_cancellation() {
    // The openai SDK stops reading at `data: [DONE]` and may close the connection before the
    // chunked body's terminating bytes arrive. That request was complete.
    let mut events = CHAT_STREAM.to_vec();
    events.push(DONE);
    let canned = Canned { then: Then::Stall, ..canned_sse(&events, Duration::from_millis(2)) };
    let (up, _) = spawn_canned(vec![("/v1/chat/completions", canned)]).await;
    let gp = Goodput::start(&config_for(up, ""));
    let stream = tokio::net::TcpStream::connect(gp.proxy).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.unwrap();
    let conn_task = tokio::spawn(conn);
    let mut req = post_json("/v1/chat/completions", r#"{"model":"m1","stream":true,"messages":[]}"#);
    req.headers_mut().insert("host", "x".parse().unwrap());
    let mut body = sender.send_request(req).await.unwrap().into_body();
    use http_body_util::BodyExt;
    let mut seen = Vec::new();
    while !seen.ends_with(DONE.as_bytes()) {
        let f = body.frame().await.unwrap().unwrap();
        seen.extend_from_slice(f.data_ref().unwrap());
    }
    drop(body);
    drop(sender);
    conn_task.abort();
    let rec = &gp.records(1).await[0];
    assert_eq!(rec["outcome"], "ok");
    assert_eq!(rec["finish_reason"], "stop");
    assert_eq!(rec["slo_met"], true);
}

/// Read one HTTP/1.1 answer (Content-Length or chunked) from a raw connection: (head, body).
async fn raw_answer(s: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) -> (String, Vec<u8>) {
    use tokio::io::AsyncReadExt;
    let mut b = [0u8; 65536];
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end + 4]).to_lowercase();
            let rest = &buf[end + 4..];
            let body = if let Some(l) = head.split("content-length: ").nth(1) {
                let l: usize = l.split("\r\n").next().unwrap().parse().unwrap();
                (rest.len() >= l).then(|| (rest[..l].to_vec(), end + 4 + l))
            } else if head.starts_with("http/1.1 100") {
                Some((Vec::new(), end + 4))
            } else {
                // Chunked: complete once the terminator is in.
                let mut body = Vec::new();
                let mut at = 0;
                let mut done = None;
                while let Some(nl) = rest[at..].windows(2).position(|w| w == b"\r\n") {
                    let n =
                        usize::from_str_radix(std::str::from_utf8(&rest[at..at + nl]).unwrap(), 16).unwrap();
                    if rest.len() < at + nl + 2 + n + 2 {
                        break;
                    }
                    body.extend_from_slice(&rest[at + nl + 2..at + nl + 2 + n]);
                    at += nl + 2 + n + 2;
                    if n == 0 {
                        done = Some(end + 4 + at);
                        break;
                    }
                }
                done.map(|d| (body, d))
            };
            if let Some((body, used)) = body {
                buf.drain(..used);
                return (head, body);
            }
        }
        assert!(Instant::now() < deadline, "no whole answer in {:?}", String::from_utf8_lossy(buf));
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut b)).await.unwrap().unwrap();
        assert!(n > 0, "closed inside an answer: {:?}", String::from_utf8_lossy(buf));
        buf.extend_from_slice(&b[..n]);
    }
}

async fn answered_200(s: &mut tokio::net::TcpStream, buf: &mut Vec<u8>, want: &[u8]) {
    let (head, body) = raw_answer(s, buf).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert_eq!(body, want, "{head}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_pipelining_expect_close_and_a_stalled_head() {
    use tokio::io::AsyncWriteExt;
    let chat_json = r#"{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":4,"completion_tokens":1,"total_tokens":5}}"#;
    let (up, _seen) = spawn_canned(vec![
        ("/v1/chat/completions", canned_json(chat_json)),
        ("/v1/completions", canned_sse(&chat_stream_with_usage(), Duration::from_millis(2))),
        ("/v1/models", canned_json(r#"{"object":"list","data":[]}"#)),
    ])
    .await;
    let gp = Goodput::start(&config_for(up, ""));
    let post = |path: &str, body: &str, extra: &str| {
        format!(
            "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n{extra}content-length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let chat = post("/v1/chat/completions", r#"{"model":"m1","messages":[]}"#, "");
    let stream = post("/v1/completions", STREAM_WITH_USAGE, "");
    let sse: String = chat_stream_with_usage().concat();

    // Keep-alive: answers in order on one connection.
    let mut s = tokio::net::TcpStream::connect(gp.proxy).await.unwrap();
    let mut buf = Vec::new();
    for req in [&chat, &stream, &chat] {
        s.write_all(req.as_bytes()).await.unwrap();
        let (head, body) = raw_answer(&mut s, &mut buf).await;
        assert!(head.starts_with("http/1.1 200 ok\r\n"), "{head}");
        assert!(head.contains("\r\ndate: "), "{head}");
        let want = if req == &chat { chat_json } else { sse.as_str() };
        assert_eq!(String::from_utf8(body).unwrap(), want);
        if req == &stream {
            assert!(head.contains("transfer-encoding: chunked"), "{head}");
        }
    }
    gp.records(3).await;
    let m = gp.metrics().await;
    assert_eq!(metric(&m, "goodput_requests_total", &[]), 3.0);
    // Pipelined: an unmetered request and a metered one in one write, answered in order.
    s.write_all(format!("GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n{chat}").as_bytes()).await.unwrap();
    answered_200(&mut s, &mut buf, br#"{"object":"list","data":[]}"#).await;
    answered_200(&mut s, &mut buf, chat_json.as_bytes()).await;
    drop(s);

    // Expect: 100-continue is answered before the body is sent.
    let mut s = tokio::net::TcpStream::connect(gp.proxy).await.unwrap();
    let body = r#"{"model":"m1","messages":[]}"#;
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let (interim, _) = raw_answer(&mut s, &mut buf).await;
    assert!(interim.starts_with("http/1.1 100 continue"), "{interim}");
    s.write_all(body.as_bytes()).await.unwrap();
    answered_200(&mut s, &mut buf, chat_json.as_bytes()).await;
    drop(s);

    // Connection: close is honoured: the answer says so and the connection ends.
    let mut s = tokio::net::TcpStream::connect(gp.proxy).await.unwrap();
    s.write_all(post("/v1/chat/completions", body, "connection: close\r\n").as_bytes()).await.unwrap();
    let (head, got) = raw_answer(&mut s, &mut buf).await;
    assert!(head.contains("\r\nconnection: close\r\n"), "{head}");
    assert_eq!(got, chat_json.as_bytes());
    let mut rest = Vec::new();
    use tokio::io::AsyncReadExt;
    let n = tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut rest)).await.unwrap().unwrap();
    assert_eq!(n, 0, "bytes after a closing answer");

    // A head that stalls part-way: the connection ends at limits.header_read_timeout_ms
    // (hyper closes it without an answer, as nginx does on client_header_timeout).
    let gp2 = Goodput::start(&config_for(up, "limits: {header_read_timeout_ms: 300}\n"));
    let mut s = tokio::net::TcpStream::connect(gp2.proxy).await.unwrap();
    s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n").await.unwrap();
    let t = Instant::now();
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(3), s.read_to_end(&mut got)).await.unwrap().unwrap();
    assert!(t.elapsed() >= Duration::from_millis(250), "cut after {:?}", t.elapsed());
    let got = String::from_utf8_lossy(&got);
    assert!(got.is_empty() || got.starts_with("HTTP/1.1 408"), "{got:?}");
}

/// An idle upstream connection is reused within `timeouts.pool_idle_ms` and closed by goodput
/// after it, so that it is never reused after the upstream's own keep-alive timeout (5 s in
/// vLLM and llama.cpp's server), when a request written to it may be read and then dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_upstream_connection_is_reused_only_within_pool_idle_ms() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::AsyncWriteExt;
    let (opened, closed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (o, c) = (opened.clone(), closed.clone());
    let up = raw_upstream(move |mut s| {
        let (o, c) = (o.clone(), c.clone());
        async move {
            o.fetch_add(1, Ordering::SeqCst);
            while read_request(&mut s).await {
                let body = r#"{"object":"list","data":[]}"#;
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                    body.len()
                );
                if s.write_all(format!("{head}{body}").as_bytes()).await.is_err() {
                    break;
                }
            }
            c.fetch_add(1, Ordering::SeqCst);
        }
    })
    .await;
    let gp = Goodput::start(&format!(
        "timeouts: {{pool_idle_ms: 1000}}\nbackends:\n  - name: up\n    url: http://{up}\n    models: [m]\n"
    ));
    let count = || (opened.load(Ordering::SeqCst), closed.load(Ordering::SeqCst));
    // Every idle connection is closed in time: the readiness probe's first, and each after.
    let all_closed = || async {
        let deadline = Instant::now() + Duration::from_secs(5);
        while count().0 != count().1 {
            assert!(Instant::now() < deadline, "goodput kept an idle upstream connection past pool_idle_ms");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    gp.wait_ready().await;
    all_closed().await;
    let (before, _) = count();
    let get =
        || async { send(gp.proxy, Request::get("/v1/files").body(Full::<Bytes>::default()).unwrap()).await };
    assert_eq!(get().await.status, 200);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(get().await.status, 200);
    let idle_since = Instant::now();
    assert_eq!(count(), (before + 1, before), "not reused within 1 s");
    // Expired at 1 s; hyper's pool closes it at its next check, at most another second later.
    all_closed().await;
    assert!(idle_since.elapsed() >= Duration::from_millis(900), "closed before pool_idle_ms");
    assert_eq!(get().await.status, 200);
    assert_eq!(count().0, before + 2, "a new connection after the idle one was closed");
}

/// Why `pool_idle_ms` defaults below 5 s: an upstream that closes connections idle for 5 s
/// (uvicorn's keep-alive, vLLM's and llama.cpp's server's) and whose close crosses goodput's
/// next request on the wire reads that request and never answers it. goodput cannot send it
/// again (the server may be generating for it), so it is a 502; with the default, a connection
/// idle that long is never used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_pool_idle_never_reuses_a_connection_past_the_servers_keep_alive() {
    use tokio::io::AsyncWriteExt;
    // Answers until the connection has been idle 5 s; the request after that is read and
    // dropped with the connection, as if the keep-alive timer fired while it was in flight.
    let upstream = || {
        raw_upstream(|mut s| async move {
            let mut idle_since = Instant::now();
            while read_request(&mut s).await {
                if idle_since.elapsed() >= Duration::from_secs(5) {
                    return;
                }
                let body = r#"{"object":"list","data":[]}"#;
                let r = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}", body.len());
                if s.write_all(r.as_bytes()).await.is_err() {
                    return;
                }
                idle_since = Instant::now();
            }
        })
    };
    let yaml = |up: std::net::SocketAddr, timeouts: &str| {
        format!("{timeouts}backends:\n  - name: up\n    url: http://{up}\n    models: [m]\n")
    };
    let default = Goodput::start(&yaml(upstream().await, ""));
    let long = Goodput::start(&yaml(upstream().await, "timeouts: {pool_idle_ms: 60000}\n"));
    let get = |gp: &Goodput| {
        let addr = gp.proxy;
        async move {
            send(addr, Request::get("/v1/files").body(Full::<Bytes>::default()).unwrap())
                .await
                .status
                .as_u16()
        }
    };
    default.wait_ready().await;
    long.wait_ready().await;
    assert_eq!((get(&default).await, get(&long).await), (200, 200));
    tokio::time::sleep(Duration::from_millis(5500)).await;
    assert_eq!(get(&default).await, 200, "the default reused a connection past the server's keep-alive");
    // The hazard the default avoids: the reused connection is cut after the request was written.
    assert_eq!(get(&long).await, 502);
    let m = long.metrics().await;
    assert_eq!(metric(&m, "goodput_upstream_errors_total", &[("backend", "up"), ("kind", "protocol")]), 1.0);
}

/// `GET /v1/models` on a route with several backends lists every backend's models once, in
/// the config's order of backends, each entry as its backend sent it; a backend that is down or answers
/// with no list is left out, the one that is down counted as its upstream error. On a route
/// with one backend the list is forwarded as any other path. When no backend lists, the client
/// gets the first backend's answer: its 401, or goodput's 502 for one that is down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_list_is_every_backends_once() {
    const LOCKED: &str = r#"{"error":{"message":"a key is needed","type":"invalid_request_error"}}"#;
    let locked = raw_upstream(|mut s| async move {
        use tokio::io::AsyncWriteExt;
        while read_request(&mut s).await {
            let head = format!(
                "HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                LOCKED.len()
            );
            let _ = s.write_all(format!("{head}{LOCKED}").as_bytes()).await;
        }
    })
    .await;
    // Closed when the listener drops: nothing listens there.
    let closed = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let (down, gone) = (closed(), closed());
    let yaml = format!(
        "routing: {{response_headers: true}}\n\
         backends:\n\
         \x20 - {{name: a, models: [llama], sim: {{model: llama}}}}\n\
         \x20 - {{name: b, models: [qwen], sim: {{model: qwen}}}}\n\
         \x20 - {{name: a2, models: [llama], sim: {{model: llama}}}}\n\
         \x20 - {{name: locked, url: \"http://{locked}\"}}\n\
         \x20 - {{name: down, url: \"http://{down}\"}}\n\
         \x20 - {{name: gone, url: \"http://{gone}\"}}\n\
         routes:\n\
         \x20 - {{name: one, match: {{headers: {{x-only: b}}}}, backends: [b]}}\n\
         \x20 - {{name: locked-first, match: {{headers: {{x-only: locked}}}}, backends: [locked, down]}}\n\
         \x20 - {{name: all-down, match: {{headers: {{x-only: down}}}}, backends: [down, gone]}}\n"
    );
    let gp = Goodput::start(&yaml);
    let get = |only: Option<&str>| {
        let mut r = Request::get("/v1/models");
        if let Some(o) = only {
            r = r.header("x-only", o);
        }
        r.body(Full::new(Bytes::new())).unwrap()
    };
    let ids = |r: &Reply| -> Vec<String> {
        r.json()["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap().to_string()).collect()
    };

    // The default route: every backend.
    let r = send(gp.proxy, get(None)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.headers["content-type"], "application/json");
    assert_eq!(r.json()["object"], "list");
    assert_eq!(ids(&r), ["llama", "qwen"], "{}", r.text());
    assert_eq!(r.json()["data"][1]["owned_by"], "goodput-sim", "entries as the backend sent them");
    assert_eq!(r.headers["x-goodput-backend"], "a,b,a2", "the backends whose lists were merged");
    let m = gp.metrics().await;
    let connect = metric(&m, "goodput_upstream_errors_total", &[("backend", "down"), ("kind", "connect")]);
    assert_eq!(connect, 1.0);
    assert_eq!(metric(&m, "goodput_upstream_errors_total", &[("backend", "locked")]), 0.0);

    // One backend: forwarded, routed as any request is.
    let r = send(gp.proxy, get(Some("b"))).await;
    assert_eq!((r.status.as_u16(), ids(&r)), (200, vec!["qwen".to_string()]));
    assert_eq!(r.headers["x-goodput-backend"], "b");
    assert!(r.headers.contains_key("x-goodput-reason"), "a forwarded answer: {:?}", r.headers);

    // No backend lists: the first one's answer.
    let r = send(gp.proxy, get(Some("locked"))).await;
    assert_eq!((r.status.as_u16(), r.text()), (401, LOCKED.to_string()));
    let r = send(gp.proxy, get(Some("down"))).await;
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "connect");
}
