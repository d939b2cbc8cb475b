//! Regression tests for the HTTP defects a security review found (F1-F6) and for what nginx
//! refuses before routing (CONNECT, a missing or repeated Host). Each goes over real sockets:
//! a raw client writes exact bytes to goodput, and a raw upstream answers with exact bytes.

use crate::common::*;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn config_for(upstream: SocketAddr, extra: &str) -> String {
    format!("backends:\n  - name: up\n    url: http://{upstream}\n    models: [m1]\n{extra}")
}

const CHAT: &str = r#"{"model":"m1","messages":[{"role":"user","content":"hi"}]}"#;
const ANSWER: &str = r#"{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}"#;

fn chat_request() -> String {
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{CHAT}",
        CHAT.len()
    )
}

/// Write `req` on a new connection to goodput and read one whole answer (head and its
/// content-length body), or what came before the connection closed.
async fn exchange(addr: SocketAddr, req: &[u8]) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(req).await.unwrap();
    read_answer(&mut s).await
}

async fn read_answer(s: &mut TcpStream) -> (u16, String, String) {
    let mut got = Vec::new();
    let mut b = [0u8; 8192];
    loop {
        if let Some((end, status, len)) = head_of(&got)
            && got.len() >= end + 4 + len
        {
            let head = String::from_utf8_lossy(&got[..end]).into_owned();
            let body = String::from_utf8_lossy(&got[end + 4..end + 4 + len]).into_owned();
            return (status, head, body);
        }
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut b)).await.unwrap().unwrap_or(0);
        if n == 0 {
            return (0, String::from_utf8_lossy(&got).into_owned(), String::new());
        }
        got.extend_from_slice(&b[..n]);
    }
}

/// A raw upstream that answers each request with `answer(n, k)`: `n` counts the requests it
/// got, `k` those on the same connection; `None` closes the connection. goodput's readiness
/// probe (`GET /v1/models`) is answered and not counted. Also counts the connections that
/// carried a counted request.
async fn counting_upstream(
    answer: fn(usize, usize) -> Option<Vec<u8>>,
) -> (SocketAddr, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let conns = Arc::new(AtomicUsize::new(0));
    let requests = Arc::new(AtomicUsize::new(0));
    let (c, r) = (conns.clone(), requests.clone());
    let addr = raw_upstream(move |mut s| {
        let (c, r) = (c.clone(), r.clone());
        async move {
            let mut k = 0;
            while let Some(req) = read_request_bytes(&mut s).await {
                let bytes = if String::from_utf8_lossy(&req).contains("goodput-readiness") {
                    Some(ok_answer())
                } else {
                    if k == 0 {
                        c.fetch_add(1, Ordering::SeqCst);
                    }
                    let n = r.fetch_add(1, Ordering::SeqCst);
                    k += 1;
                    answer(n, k - 1)
                };
                let Some(bytes) = bytes else { return };
                if s.write_all(&bytes).await.is_err() {
                    return;
                }
            }
        }
    })
    .await;
    (addr, conns, requests)
}

fn ok_answer() -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{ANSWER}",
        ANSWER.len()
    )
    .into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f1_an_asterisk_target_is_refused_and_reaches_no_upstream() {
    let (up, _, requests) = counting_upstream(|_, _| Some(ok_answer())).await;
    // Where the concatenated URI used to send it: port 80 of the backend's host. Watched when
    // this test may bind it (as root, and nothing else has it).
    let port80 = tokio::net::TcpListener::bind("127.0.0.1:80").await.ok();
    let gp = Goodput::start(&config_for(up, ""));
    for req in [
        "GET * HTTP/1.1\r\nhost: x\r\n\r\n".to_string(),
        "OPTIONS * HTTP/1.1\r\nhost: x\r\n\r\n".to_string(),
        format!("POST * HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n{CHAT}", CHAT.len()),
    ] {
        let (status, _, body) = exchange(gp.proxy, req.as_bytes()).await;
        assert_eq!(status, 400, "{req:?}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["error"]["code"], "invalid_target", "{body}");
    }
    if let Some(l) = port80 {
        let accepted = tokio::time::timeout(Duration::from_millis(200), l.accept()).await;
        assert!(accepted.is_err(), "a request reached port 80");
    }
    assert_eq!(requests.load(Ordering::SeqCst), 0, "the backend got a request it must not");
    // An origin-form target still goes through.
    assert_eq!(exchange(gp.proxy, chat_request().as_bytes()).await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f2_an_interim_answer_and_the_final_one_in_one_read_are_delivered_at_once() {
    let (up, _, _) = counting_upstream(|_, _| {
        let mut b = b"HTTP/1.1 100 Continue\r\n\r\n".to_vec();
        b.extend_from_slice(&ok_answer());
        Some(b)
    })
    .await;
    let gp = Goodput::start(&config_for(up, "timeouts: {first_byte_ms: 5000}\n"));
    let t = Instant::now();
    let (status, _, body) = exchange(gp.proxy, chat_request().as_bytes()).await;
    assert_eq!(status, 200);
    assert_eq!(body, ANSWER);
    assert!(t.elapsed() < Duration::from_secs(2), "the 200 waited {:?}", t.elapsed());
    assert_eq!(gp.records(1).await[0]["outcome"], "ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f3_an_unasked_upgrade_is_a_502_and_its_connection_is_dropped() {
    // The first connection answers 101 and would then answer anything sent on it with a body
    // the client must never see; later connections answer normally.
    let (up, conns, _) = counting_upstream(|n, k| match (n, k) {
        (0, _) => Some(
            b"HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n".to_vec(),
        ),
        // A request on the connection that switched protocols.
        (_, 1..) => Some(b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\ndesync".to_vec()),
        _ => Some(ok_answer()),
    })
    .await;
    let gp = Goodput::start(&config_for(up, ""));
    gp.wait_ready().await;
    let (status, _, body) = exchange(gp.proxy, chat_request().as_bytes()).await;
    assert_eq!(status, 502, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["code"], "unexpected_upgrade");
    let (status, _, body) = exchange(gp.proxy, chat_request().as_bytes()).await;
    assert_eq!((status, body.as_str()), (200, ANSWER));
    assert_eq!(conns.load(Ordering::SeqCst), 2, "the upgraded connection was used again");
    let m = gp.metrics().await;
    let errors = [("backend", "up"), ("kind", "unexpected_upgrade")];
    assert_eq!(metric(&m, "goodput_upstream_errors_total", &errors), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f4_the_client_gets_the_length_goodput_parsed_never_the_upstreams_spelling() {
    let (up, _, _) = counting_upstream(|n, _| {
        let len = if n == 0 { "+2" } else { "0002" };
        Some(
            format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len}\r\n\r\nok")
                .into_bytes(),
        )
    })
    .await;
    let gp = Goodput::start(&config_for(up, ""));
    let (status, _, _) = exchange(gp.proxy, chat_request().as_bytes()).await;
    assert_eq!(status, 502, "a length that is not plain digits");
    let (status, head, body) = exchange(gp.proxy, chat_request().as_bytes()).await;
    assert_eq!((status, body.as_str()), (200, "ok"));
    let lengths: Vec<&str> = head
        .lines()
        .filter(|l| l.to_ascii_lowercase().starts_with("content-length:"))
        .map(|l| l[15..].trim())
        .collect();
    assert_eq!(lengths, ["2"], "{head}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f5_every_forwarded_for_line_is_kept_and_the_proto_is_goodputs() {
    let (up, seen) = spawn_canned(vec![("/v1/chat/completions", canned_json(ANSWER))]).await;
    let gp = Goodput::start(&config_for(up, ""));
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-forwarded-for: 10.1.1.1\r\n\
         x-forwarded-for: 10.2.2.2, 10.3.3.3\r\nx-forwarded-proto: https\r\ncontent-length: {}\r\n\r\n{CHAT}",
        CHAT.len()
    );
    assert_eq!(exchange(gp.proxy, req.as_bytes()).await.0, 200);
    let (_, h, _) = seen.requests.lock().unwrap()[0].clone();
    let xff: Vec<_> = h.get_all("x-forwarded-for").iter().collect();
    assert_eq!(xff, ["10.1.1.1, 10.2.2.2, 10.3.3.3, 127.0.0.1"]);
    let proto: Vec<_> = h.get_all("x-forwarded-proto").iter().collect();
    assert_eq!(proto, ["http"]);
    // The upstream is named in Host, as hyper's client would name it, not the client's `x`.
    let host: Vec<_> = h.get_all("host").iter().collect();
    assert_eq!(host, [up.to_string().as_str()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f6_a_post_the_upstream_read_is_never_sent_again() {
    // The first request is answered on a keep-alive connection; the second is read whole on
    // that pooled connection, which then closes without an answer.
    let (up, conns, requests) = counting_upstream(|n, _| (n != 1).then(ok_answer)).await;
    let gp = Goodput::start(&config_for(up, ""));
    gp.wait_ready().await;
    let mut s = TcpStream::connect(gp.proxy).await.unwrap();
    s.write_all(chat_request().as_bytes()).await.unwrap();
    assert_eq!(read_answer(&mut s).await.0, 200);
    s.write_all(chat_request().as_bytes()).await.unwrap();
    let (status, _, body) = read_answer(&mut s).await;
    assert_eq!(status, 502, "{body}");
    assert_eq!(requests.load(Ordering::SeqCst), 2, "the POST was sent again");
    assert_eq!(conns.load(Ordering::SeqCst), 1);
    let m = gp.metrics().await;
    let errors = [("backend", "up"), ("kind", "protocol")];
    assert_eq!(metric(&m, "goodput_upstream_errors_total", &errors), 1.0);
    let recs = gp.records(2).await;
    assert_eq!(latest(&recs)["outcome"], "upstream_reset");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_and_a_missing_or_repeated_host_are_refused_as_nginx_does() {
    let (up, _, requests) = counting_upstream(|_, _| Some(ok_answer())).await;
    let gp = Goodput::start(&config_for(up, ""));
    let cases = [
        ("CONNECT example.com:443 HTTP/1.1\r\nhost: example.com:443\r\n\r\n", 405, "method_not_allowed"),
        ("GET /v1/models HTTP/1.1\r\n\r\n", 400, "invalid_host"),
        ("GET /v1/models HTTP/1.1\r\nhost: a\r\nhost: b\r\n\r\n", 400, "invalid_host"),
    ];
    for (req, want, code) in cases {
        let (status, _, body) = exchange(gp.proxy, req.as_bytes()).await;
        assert_eq!(status, want, "{req:?}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["error"]["code"], code, "{req:?}");
    }
    assert_eq!(requests.load(Ordering::SeqCst), 0);
    // HTTP/1.0 needs no Host.
    assert_eq!(exchange(gp.proxy, b"GET /v1/models HTTP/1.0\r\n\r\n").await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_connections_are_kept_alive_and_one_the_server_closed_is_replaced() {
    // Keep-alive: five requests one after another share one upstream connection.
    let (up, conns, requests) = counting_upstream(|_, _| Some(ok_answer())).await;
    let gp = Goodput::start(&config_for(up, ""));
    gp.wait_ready().await;
    for _ in 0..5 {
        assert_eq!(exchange(gp.proxy, chat_request().as_bytes()).await.0, 200);
    }
    assert_eq!((requests.load(Ordering::SeqCst), conns.load(Ordering::SeqCst)), (5, 1));

    // A server that closes each connection soon after answering (an idle timeout): the next
    // request finds its pooled connection closed and goes on a new one, never failing.
    let conns = Arc::new(AtomicUsize::new(0));
    let c = conns.clone();
    let up = raw_upstream(move |mut s| {
        c.fetch_add(1, Ordering::SeqCst);
        async move {
            while let Some(req) = read_request_bytes(&mut s).await {
                let readiness = String::from_utf8_lossy(&req).contains("goodput-readiness");
                if s.write_all(&ok_answer()).await.is_err() || !readiness {
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let gp = Goodput::start(&config_for(up, ""));
    for _ in 0..4 {
        let (status, _, body) = exchange(gp.proxy, chat_request().as_bytes()).await;
        assert_eq!(status, 200, "{body}");
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert!(conns.load(Ordering::SeqCst) >= 4, "a closed connection was used again");
    let m = gp.metrics().await;
    assert_eq!(metric(&m, "goodput_upstream_errors_total", &[]), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bare_lf_ending_chunked_trailers_is_refused_and_smuggles_no_request() {
    // A front proxy that ends trailers only at CRLF reads `GET /smuggled` as a trailer line of
    // this one request; a server that took the bare LF as their end would read a second request.
    let routes = vec![("/v1/chat/completions", canned_json(ANSWER)), ("/v1/embeddings", canned_json(ANSWER))];
    let (up, seen) = spawn_canned(routes).await;
    let gp = Goodput::start(&config_for(up, ""));
    gp.wait_ready().await;
    let trailers = ["\n", "x-t: 1\n\n", "x-t: 1\r\n\n"];
    let paths = ["/v1/chat/completions", "/v1/embeddings"];
    for (path, trailer) in paths.iter().flat_map(|p| trailers.iter().map(move |t| (p, t))) {
        let req = format!(
            "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n\
             {:x}\r\n{CHAT}\r\n0\r\n{trailer}GET /smuggled HTTP/1.1\r\nhost: x\r\n\r\n",
            CHAT.len()
        );
        let mut s = TcpStream::connect(gp.proxy).await.unwrap();
        s.write_all(req.as_bytes()).await.unwrap();
        // Everything goodput answers on this connection, until it closes or falls silent.
        let mut got = Vec::new();
        let mut b = [0u8; 8192];
        while let Ok(Ok(n @ 1..)) = tokio::time::timeout(Duration::from_secs(2), s.read(&mut b)).await {
            got.extend_from_slice(&b[..n]);
        }
        let got = String::from_utf8_lossy(&got);
        assert_eq!(got.matches("HTTP/1.1 ").count(), 1, "{path} {trailer:?}: a second answer: {got}");
        assert!(got.starts_with("HTTP/1.1 400 "), "{path} {trailer:?}: {got}");
        assert!(got.contains(r#""code":"body_read_failed""#), "{path} {trailer:?}: {got}");
    }
    let paths: Vec<String> = seen.requests.lock().unwrap().iter().map(|(p, _, _)| p.clone()).collect();
    assert!(!paths.iter().any(|p| p == "/smuggled"), "a smuggled request reached the upstream: {paths:?}");
    // The client's broken body, even one already streaming upstream, is not the backend's
    // failure: no upstream error is counted and the breaker hears nothing.
    let m = gp.metrics().await;
    assert_eq!(metric(&m, "goodput_upstream_errors_total", &[]), 0.0);
    assert_eq!(exchange(gp.proxy, chat_request().as_bytes()).await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_resets_while_its_body_streams_upstream_is_not_the_backends_failure() {
    // The upstream reads what goodput streams to it; `got` says the first chunk arrived, and
    // `closed` that goodput then dropped the connection that carried it (and no other).
    let (got, closed) = (Arc::new(tokio::sync::Notify::new()), Arc::new(tokio::sync::Notify::new()));
    let (g, c) = (got.clone(), closed.clone());
    let up = raw_upstream(move |mut s| {
        let (g, c) = (g.clone(), c.clone());
        async move {
            let (mut seen, mut carried) = (Vec::new(), false);
            let mut b = [0u8; 4096];
            while let Ok(n @ 1..) = s.read(&mut b).await {
                seen.extend_from_slice(&b[..n]);
                if String::from_utf8_lossy(&seen).contains("goodput-readiness") {
                    let _ = s.write_all(&ok_answer()).await;
                    seen.clear();
                } else if !carried && seen.windows(5).any(|w| w == b"hello") {
                    carried = true;
                    g.notify_one();
                }
            }
            if carried {
                c.notify_one();
            }
        }
    })
    .await;
    let gp = Goodput::start(&config_for(up, ""));
    gp.wait_ready().await;
    let mut s = TcpStream::connect(gp.proxy).await.unwrap();
    let head = "POST /v1/embeddings HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n";
    s.write_all(head.as_bytes()).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), got.notified())
        .await
        .expect("the body never reached the upstream");
    crate::faults::reset(s);
    tokio::time::timeout(Duration::from_secs(10), closed.notified())
        .await
        .expect("the upstream request was not aborted");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let m = gp.metrics().await;
    assert_eq!(metric(&m, "goodput_upstream_errors_total", &[]), 0.0);
}
