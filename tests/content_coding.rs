//! Compressed answers. The SDKs send `Accept-Encoding: gzip, …` by default, and a server that
//! compresses (a hosted API, a vLLM behind an nginx with `gzip on`) then answers in gzip, which
//! the meter cannot read. goodput asks for identity on the metered paths, so the tokens are
//! counted; an answer compressed all the same is forwarded as it came and counted as unread.

use crate::common::*;
use bytes::Bytes;
use flate2::Compression;
use flate2::write::GzEncoder;
use http::{Request, Response, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

const ANSWER: &str = r#"{"id":"x","object":"chat.completion","model":"m1","choices":[{"index":0,"message":{"role":"assistant","content":"in gzip"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}"#;
const STREAM: &[&str] = &[
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"in\"},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" gzip\"},\"finish_reason\":\"stop\"}]}\n\n",
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2,\"total_tokens\":5}}\n\n",
    "data: [DONE]\n\n",
];
const MODELS: &str = r#"{"object":"list","data":[{"id":"m1","object":"model"}]}"#;

fn gzip(b: &[u8]) -> Vec<u8> {
    let mut e = GzEncoder::new(Vec::new(), Compression::default());
    e.write_all(b).unwrap();
    e.finish().unwrap()
}

/// The Accept-Encoding of each request the test sent (goodput's own probes left out).
type AcceptEncodings = Arc<Mutex<Vec<(String, Option<String>)>>>;

/// An OpenAI-style upstream that compresses as a web server does: the whole answer in gzip when
/// the request's Accept-Encoding names gzip, or, with `always`, whatever it names.
async fn compressing_upstream(always: bool) -> (SocketAddr, AcceptEncodings) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let seen = AcceptEncodings::default();
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let log = log.clone();
            let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                let log = log.clone();
                async move {
                    let ae =
                        req.headers().get(header::ACCEPT_ENCODING).map(|v| v.to_str().unwrap().to_owned());
                    let ua = req.headers().get(header::USER_AGENT).map(|v| v.as_bytes().to_vec());
                    let path = req.uri().path().to_owned();
                    let body = req.into_body().collect().await.unwrap().to_bytes();
                    if !ua.is_some_and(|u| u.starts_with(b"goodput-")) {
                        log.lock().unwrap().push((path.clone(), ae.clone()));
                    }
                    let (ty, text) = match path.as_str() {
                        "/v1/models" => ("application/json", MODELS.to_owned()),
                        _ if body.windows(13).any(|w| w == b"\"stream\":true") => {
                            ("text/event-stream", STREAM.concat())
                        }
                        _ => ("application/json", ANSWER.to_owned()),
                    };
                    let mut resp = Response::builder().header(header::CONTENT_TYPE, ty);
                    let body = if always || ae.is_some_and(|a| a.contains("gzip")) {
                        resp = resp.header(header::CONTENT_ENCODING, "gzip");
                        gzip(text.as_bytes())
                    } else {
                        text.into_bytes()
                    };
                    Ok::<_, std::convert::Infallible>(resp.body(Full::new(Bytes::from(body))).unwrap())
                }
            });
            tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(s), svc));
        }
    });
    (addr, seen)
}

fn config_for(upstream: SocketAddr) -> String {
    format!("backends:\n  - name: up\n    url: http://{upstream}\n    models: [m1]\n")
}

/// A request as the openai SDK sends it: asking for compressed answers.
fn sdk_request(path: &str, body: Option<&str>) -> Request<Full<Bytes>> {
    let b = Request::builder().uri(path).header(header::ACCEPT_ENCODING, "gzip, deflate, br, zstd");
    match body {
        Some(body) => b
            .method("POST")
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body.to_owned()))),
        None => b.method("GET").body(Full::default()),
    }
    .unwrap()
}

const CHAT: &str = r#"{"model":"m1","messages":[{"role":"user","content":"hi"}]}"#;
const CHAT_STREAM: &str = r#"{"model":"m1","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metered_requests_ask_for_identity_so_a_compressing_server_is_still_counted() {
    let (up, seen) = compressing_upstream(false).await;
    let gp = Goodput::start(&config_for(up));

    let r = send(gp.proxy, sdk_request("/v1/chat/completions", Some(CHAT))).await;
    assert_eq!((r.status.as_u16(), r.headers.get(header::CONTENT_ENCODING)), (200, None));
    assert_eq!(r.text(), ANSWER);
    let rec = &gp.records(1).await[0];
    assert_eq!(
        (rec["completion_tokens"].as_u64(), rec["completion_source"].as_str()),
        (Some(2), Some("usage"))
    );

    // A stream whose usage goodput asked for: counted from it, and the chunk taken out again.
    let r = send(gp.proxy, sdk_request("/v1/chat/completions", Some(CHAT_STREAM))).await;
    assert_eq!(r.text(), [STREAM[0], STREAM[1], STREAM[3]].concat());
    let recs = gp.records(2).await;
    assert_eq!(recs[0]["stream"], true, "{}", recs[0]);
    assert_eq!(
        (recs[0]["completion_tokens"].as_u64(), recs[0]["completion_source"].as_str()),
        (Some(2), Some("usage"))
    );
    assert!(recs[0]["ttft"].as_f64().is_some(), "{}", recs[0]);

    // Paths goodput only forwards keep the client's Accept-Encoding, and their answer's coding.
    let r = send(gp.proxy, sdk_request("/v1/models", None)).await;
    assert_eq!(r.headers.get(header::CONTENT_ENCODING).map(|v| v.as_bytes()), Some(&b"gzip"[..]));
    assert_eq!(&r.body[..], gzip(MODELS.as_bytes()));

    let seen = seen.lock().unwrap().clone();
    let want = [
        ("/v1/chat/completions", "identity"),
        ("/v1/chat/completions", "identity"),
        ("/v1/models", "gzip, deflate, br, zstd"),
    ];
    let got: Vec<_> = seen.iter().map(|(p, ae)| (p.as_str(), ae.as_deref().unwrap_or("-"))).collect();
    assert_eq!(got, want);
    let m = gp.metrics().await;
    assert_eq!(metric(&m, "goodput_encoded_responses_total", &[("backend", "up")]), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_compressed_all_the_same_is_forwarded_unread_and_counted() {
    let (up, _) = compressing_upstream(true).await;
    let gp = Goodput::start(&config_for(up));

    let r = send(gp.proxy, sdk_request("/v1/chat/completions", Some(CHAT))).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers.get(header::CONTENT_ENCODING).map(|v| v.as_bytes()), Some(&b"gzip"[..]));
    let want = gzip(ANSWER.as_bytes());
    assert_eq!(&r.body[..], want, "the bytes as the upstream sent them");
    assert_eq!(
        r.headers.get(header::CONTENT_LENGTH).map(|v| v.to_str().unwrap().to_owned()),
        Some(want.len().to_string())
    );
    let rec = &gp.records(1).await[0];
    assert_eq!(rec["outcome"], "ok", "{rec}");
    assert!(
        rec["completion_tokens"].is_null() && rec["completion_source"] == "none",
        "never a wrong count: {rec}"
    );

    // goodput asked for usage; in gzip it cannot take the chunk out, so it changes nothing.
    let r = send(gp.proxy, sdk_request("/v1/chat/completions", Some(CHAT_STREAM))).await;
    assert_eq!(&r.body[..], gzip(STREAM.concat().as_bytes()), "the stream as the upstream sent it");
    let recs = gp.records(2).await;
    assert_eq!(recs[0]["outcome"], "ok", "{}", recs[0]);
    assert!(recs[0]["completion_tokens"].is_null() && recs[0]["ttft"].is_null(), "{}", recs[0]);

    let m = gp.metrics().await;
    assert_eq!(metric(&m, "goodput_encoded_responses_total", &[("backend", "up")]), 2.0);
    assert_eq!(metric(&m, "goodput_usage_chunks_removed_total", &[]), 0.0);
}
