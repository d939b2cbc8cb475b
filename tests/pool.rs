//! Routing within a pool of replicas, end to end over real sockets: replica doubles that report
//! a queue and a KV cache on `/metrics` as vLLM does, and answer chat completions. goodput's
//! picks follow the queues they report (including traffic goodput does not see), keep a shared
//! prompt prefix on one replica, fail over within the pool, shed when a class asks for it, and
//! follow a pool found in DNS (a real DNS server on loopback, from PyPI).

use crate::common::*;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A replica double: `/metrics` reports `waiting` and `kv` (percent) as set; chat
/// completions answer at once, and each one's first message is kept.
#[derive(Clone, Default)]
struct Replica {
    waiting: Arc<AtomicU64>,
    kv_pct: Arc<AtomicU64>,
    served: Arc<Mutex<Vec<String>>>,
    scrapes: Arc<AtomicU64>,
}

impl Replica {
    async fn spawn(bind: &str) -> (SocketAddr, Replica) {
        let l = tokio::net::TcpListener::bind(bind).await.unwrap();
        let addr = l.local_addr().unwrap();
        let r = Replica::default();
        let r2 = r.clone();
        tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                let r = r2.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let r = r.clone();
                        async move {
                            use http_body_util::BodyExt;
                            let path = req.uri().path().to_string();
                            let body =
                                req.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
                            let (mut slow, mut quick) = (false, false);
                            let (ctype, text) = if path == "/metrics" {
                                r.scrapes.fetch_add(1, Ordering::Relaxed);
                                let page = format!(
                                    "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{engine=\"0\"}} {}\n\
                                     # TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{engine=\"0\"}} 0\n\
                                     # TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{{engine=\"0\"}} {}\n",
                                    r.waiting.load(Ordering::Relaxed),
                                    r.kv_pct.load(Ordering::Relaxed) as f64 / 100.0
                                );
                                ("text/plain; version=0.0.4", page)
                            } else if path == "/v1/models" {
                                ("application/json", r#"{"data":[{"id":"m"}]}"#.to_string())
                            } else {
                                let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                                let first = v["messages"][0]["content"].as_str().unwrap_or("").to_string();
                                quick = first == "quick";
                                slow = first == "slow" || quick;
                                r.served.lock().unwrap().push(first);
                                if slow {
                                    ("text/event-stream", String::new())
                                } else {
                                    (
                                        "application/json",
                                        r#"{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}"#.to_string(),
                                    )
                                }
                            };
                            // "slow": a stream of 20 tokens, 200 ms apart.
                            let (tx, rx) =
                                tokio::sync::mpsc::channel::<Result<bytes::Bytes, std::io::Error>>(4);
                            tokio::spawn(async move {
                                if !slow {
                                    let _ = tx.send(Ok(bytes::Bytes::from(text))).await;
                                    return;
                                }
                                // "quick": 3 tokens 20 ms apart.
                                let (n, gap) = if quick { (3, 20) } else { (20, 200) };
                                for i in 0..n {
                                    let ev = format!(
                                        "data: {{\"id\":\"s\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"t{i} \"}},\"finish_reason\":null}}]}}\n\n"
                                    );
                                    if tx.send(Ok(bytes::Bytes::from(ev))).await.is_err() {
                                        return;
                                    }
                                    tokio::time::sleep(Duration::from_millis(gap)).await;
                                }
                                let _ = tx.send(Ok(bytes::Bytes::from_static(b"data: [DONE]\n\n"))).await;
                            });
                            Ok::<_, std::convert::Infallible>(
                                http::Response::builder()
                                    .header("content-type", ctype)
                                    .body(goodput::sim::ChannelBody::new(rx))
                                    .unwrap(),
                            )
                        }
                    });
                    let _ =
                        hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
                            .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                            .await;
                });
            }
        });
        (addr, r)
    }

    fn served(&self) -> usize {
        self.served.lock().unwrap().len()
    }

    async fn scraped(&self, n: u64) {
        let at = self.scrapes.load(Ordering::Relaxed);
        while self.scrapes.load(Ordering::Relaxed) < at + n {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn chat(system: &str, user: &str) -> http::Request<http_body_util::Full<bytes::Bytes>> {
    let body = serde_json::json!({
        "model": "m",
        "max_tokens": 4,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
    });
    post_json("/v1/chat/completions", &body.to_string())
}

fn header(r: &Reply, k: &str) -> String {
    r.headers.get(k).map(|v| v.to_str().unwrap().to_string()).unwrap_or_default()
}

fn pool_yaml(endpoints: &[String], extra: &str) -> String {
    let list: Vec<String> = endpoints.iter().map(|e| format!("\"{e}\"")).collect();
    format!(
        r#"
backends:
  - name: pool
    endpoints: [{}]
    models: [m]
    server_metrics: {{interval_ms: 100}}
routing: {{exploration: 0.0, response_headers: true}}
{extra}
"#,
        list.join(", ")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn picks_follow_the_queue_each_replica_reports() {
    let (a_addr, a) = Replica::spawn("127.0.0.1:0").await;
    let (b_addr, b) = Replica::spawn("127.0.0.1:0").await;
    let gp = Goodput::start(&pool_yaml(&[format!("http://{a_addr}"), format!("http://{b_addr}")], ""));
    // Traffic goodput does not see keeps `a` busy: its server says so.
    a.waiting.store(4, Ordering::Relaxed);
    a.scraped(2).await;
    b.scraped(2).await;
    let mut reasons = HashMap::new();
    for i in 0..20 {
        let r = send(gp.proxy, chat("short system prompt", &format!("q{i}"))).await;
        assert_eq!(r.status, 200, "{}", r.text());
        if header(&r, "x-goodput-endpoint") == b_addr.to_string() {
            *reasons.entry(header(&r, "x-goodput-endpoint-reason")).or_insert(0) += 1;
        }
    }
    assert_eq!((a.served(), b.served()), (0, 20), "every pick avoids the reported queue");
    assert_eq!(reasons.get("least_queue"), Some(&20), "{reasons:?}");
    // The queue moves to `b`: picks follow within a few scrape intervals.
    a.waiting.store(0, Ordering::Relaxed);
    b.waiting.store(4, Ordering::Relaxed);
    a.scraped(2).await;
    b.scraped(2).await;
    for i in 0..10 {
        let r = send(gp.proxy, chat("short system prompt", &format!("again {i}"))).await;
        assert_eq!(r.status, 200);
    }
    assert_eq!((a.served(), b.served()), (10, 20));
    // Explained in /admin/routes and counted per endpoint and reason.
    let routes = gp.admin_json("/admin/routes").await;
    let d = &routes["routes"][0]["recent_decisions"][0];
    assert_eq!(d["endpoint"], a_addr.to_string(), "{d}");
    assert_eq!(d["endpoint_reason"], "least_queue", "{d}");
    let why = d["endpoint_explanation"].as_str().unwrap();
    assert!(why.contains(&format!("{b_addr} score")) && why.contains("load 4"), "{why}");
    let m = gp.metrics().await;
    let n = |e: SocketAddr| {
        metric(
            &m,
            "goodput_endpoint_decisions_total",
            &[("endpoint", &e.to_string()), ("reason", "least_queue")],
        )
    };
    assert_eq!((n(a_addr), n(b_addr)), (10.0, 20.0));
    let counted = &routes["routes"][0]["backends"][0]["endpoint_decisions"][b_addr.to_string()];
    assert_eq!(counted["least_queue"], 20, "{routes}");
    assert_eq!(metric(&m, "goodput_server_requests_waiting", &[("endpoint", &b_addr.to_string())]), 4.0);
    assert_eq!(metric(&m, "goodput_server_metrics_up", &[("endpoint", &a_addr.to_string())]), 1.0);
    // The double exports no preemption counter, so goodput makes up none.
    assert!(!m.contains("goodput_server_preemptions_total{"), "{m}");
    assert_eq!(metric(&m, "goodput_pool_endpoints", &[("backend", "pool")]), 2.0);
    // /admin/backends shows each endpoint and the pool's servers together.
    let bk = gp.admin_json("/admin/backends").await;
    let pool = &bk["backends"][0];
    assert_eq!(pool["endpoints"].as_array().unwrap().len(), 2, "{pool}");
    assert_eq!(pool["server"]["waiting"], 4.0, "{pool}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_prompt_prefix_stays_on_one_replica() {
    let (a_addr, a) = Replica::spawn("127.0.0.1:0").await;
    let (b_addr, b) = Replica::spawn("127.0.0.1:0").await;
    let gp = Goodput::start(&pool_yaml(&[format!("http://{a_addr}"), format!("http://{b_addr}")], ""));
    a.scraped(1).await;
    b.scraped(1).await;
    // Four long system prompts (each many blocks), many questions each.
    let systems: Vec<String> = (0..4).map(|k| format!("You are assistant number {k}. ").repeat(80)).collect();
    let mut reasons: HashMap<String, usize> = HashMap::new();
    for round in 0..8 {
        for s in &systems {
            let r = send(gp.proxy, chat(s, &format!("question {round}"))).await;
            assert_eq!(r.status, 200);
            *reasons.entry(header(&r, "x-goodput-endpoint-reason")).or_insert(0) += 1;
        }
    }
    // Each system prompt went to one replica only, and the prompts were spread over both.
    let by = |r: &Replica| -> HashMap<String, usize> {
        let mut m = HashMap::new();
        for s in r.served.lock().unwrap().iter() {
            *m.entry(s.clone()).or_insert(0) += 1;
        }
        m
    };
    let (ma, mb) = (by(&a), by(&b));
    for s in &systems {
        let (na, nb) = (ma.get(s).copied().unwrap_or(0), mb.get(s).copied().unwrap_or(0));
        assert!(na == 8 && nb == 0 || na == 0 && nb == 8, "a prompt split over replicas: {na} / {nb}");
    }
    assert!(!ma.is_empty() && !mb.is_empty(), "the prompts are spread over both replicas");
    assert!(reasons.get("prefix_hit").copied().unwrap_or(0) >= 24, "{reasons:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_refuses_connections_is_failed_over_within_the_pool() {
    let (_hold, refusing) = refusing_port();
    let (b_addr, b) = Replica::spawn("127.0.0.1:0").await;
    let yaml = pool_yaml(&[format!("http://127.0.0.1:{refusing}"), format!("http://{b_addr}")], "").replace(
        "response_headers: true}",
        "response_headers: true, breaker: {consecutive_failures: 2, open_secs: 30}}",
    );
    let gp = Goodput::start(&yaml);
    for i in 0..12 {
        let r = send(gp.proxy, chat("s", &format!("q{i}"))).await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(header(&r, "x-goodput-endpoint"), b_addr.to_string());
    }
    assert_eq!(b.served(), 12, "each request reached the healthy replica once");
    let bk = gp.admin_json("/admin/backends").await;
    let eps = bk["backends"][0]["endpoints"].as_array().unwrap().clone();
    let refusing_ep = eps.iter().find(|e| e["endpoint"] == format!("127.0.0.1:{refusing}")).unwrap();
    assert_eq!(refusing_ep["circuit"], "open", "{eps:?}");
    assert_eq!(bk["backends"][0]["circuit"], "closed", "the backend is up while one endpoint is");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saturated_pool_sheds_only_classes_that_ask_for_it() {
    let (a_addr, a) = Replica::spawn("127.0.0.1:0").await;
    let (b_addr, b) = Replica::spawn("127.0.0.1:0").await;
    let extra = r#"
classes:
  interactive: {ttft_p95_ms: 500, shed: true}
  batch: {}
routes:
  - {name: interactive, class: interactive, match: {headers: {x-class: interactive}}}
  - {name: batch, class: batch}
limits: {retry_after_secs: 2}
"#;
    let gp = Goodput::start(&pool_yaml(&[format!("http://{a_addr}"), format!("http://{b_addr}")], extra));
    a.waiting.store(9, Ordering::Relaxed);
    b.kv_pct.store(97, Ordering::Relaxed);
    a.scraped(2).await;
    b.scraped(2).await;
    let mut req = chat("s", "now");
    req.headers_mut().insert("x-class", "interactive".parse().unwrap());
    let r = send(gp.proxy, req).await;
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(header(&r, "retry-after"), "2");
    let err = &r.json()["error"];
    assert_eq!(err["code"], "overloaded", "{err}");
    let msg = err["message"].as_str().unwrap();
    assert!(msg.contains("saturated") && msg.contains(&a_addr.to_string()), "{msg}");
    // A class that does not shed is served: by the least loaded, and said so.
    let r = send(gp.proxy, chat("s", "later")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(header(&r, "x-goodput-endpoint"), b_addr.to_string());
    // Its one backend is saturated and still the one to serve (saturation is soft): the
    // class's objective decided, and the pool says why this endpoint.
    assert_eq!(header(&r, "x-goodput-reason"), "best_value");
    assert_eq!(header(&r, "x-goodput-endpoint-reason"), "all_saturated");
    assert_eq!(a.served() + b.served(), 1, "the shed request reached no replica");
    let m = gp.metrics().await;
    assert_eq!(metric(&m, "goodput_rejected_total", &[("reason", "overloaded")]), 1.0, "the shed is counted");
}

/// A DNS server from PyPI (dnslib) on loopback, answering from a zone file it re-reads.
struct Dns {
    child: std::process::Child,
    zone: std::path::PathBuf,
    port: u16,
}

impl Drop for Dns {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Dns {
    fn start(dir: &std::path::Path) -> Dns {
        let python = std::env::var("GOODPUT_DEPLOY_PYTHON").unwrap_or_else(|_| {
            panic!("GOODPUT_DEPLOY_PYTHON is not set: run the suite with scripts/test.sh (scripts/setup-deploy-check.sh)")
        });
        let port = free_port();
        let zone = dir.join("zone.txt");
        std::fs::write(&zone, "").unwrap();
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/e2e/dns_server.py");
        let child = std::process::Command::new(python)
            .args([script, "--port", &port.to_string(), "--zone"])
            .arg(&zone)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start the DNS server");
        let mut dns = Dns { child, zone, port };
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(dns.child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        assert!(line.starts_with("ready"), "the DNS server did not start: {line:?}");
        dns
    }

    fn answer(&self, name: &str, ips: &[&str]) {
        let text: String = ips.iter().map(|ip| format!("{name} 1 IN A {ip}\n")).collect();
        std::fs::write(&self.zone, text).unwrap();
    }
}

/// A DNS server answering `name` with `ips`, and goodput with a pool discovered from it.
fn dns_pool(dir: &std::path::Path, name: &str, port: u16, ips: &[&str]) -> (Dns, Goodput) {
    let dns = Dns::start(dir);
    dns.answer(name, ips);
    let gp = Goodput::start(&format!(
        r#"
backends:
  - name: pool
    discovery: {{dns: "{name}", port: {port}, refresh_secs: 1, nameserver: "127.0.0.1:{}"}}
    models: [m]
    server_metrics: {{interval_ms: 100}}
routing: {{exploration: 0.0, response_headers: true}}
"#,
        dns.port
    ));
    (dns, gp)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_found_in_dns_follows_the_answer_while_requests_flow() {
    // Replicas on one port at three loopback addresses, as pods behind a headless Service.
    let port = free_port();
    let mut replicas = Vec::new();
    for ip in ["127.0.0.2", "127.0.0.3", "127.0.0.4"] {
        replicas.push(Replica::spawn(&format!("{ip}:{port}")).await.1);
    }
    let dir = temp_dir("dns");
    let name = "vllm.goodput-test.svc.cluster.local.";
    let (dns, gp) = dns_pool(&dir, name, port, &["127.0.0.2", "127.0.0.3"]);
    let send_some = |n: usize, tag: &'static str| {
        let proxy = gp.proxy;
        async move {
            let mut seen = std::collections::BTreeSet::new();
            for i in 0..n {
                let r = send(proxy, chat("s", &format!("{tag} {i}"))).await;
                assert_eq!(r.status, 200, "{}", r.text());
                seen.insert(header(&r, "x-goodput-endpoint"));
            }
            seen
        }
    };
    let at = |ip: &str| format!("{ip}:{port}");
    let seen = send_some(16, "first").await;
    assert_eq!(seen, [at("127.0.0.2"), at("127.0.0.3")].into(), "the first answer's two");
    // A replica joins and one leaves, while requests keep coming.
    dns.answer(name, &["127.0.0.3", "127.0.0.4"]);
    let t = std::time::Instant::now();
    loop {
        let seen = send_some(8, "flow").await;
        if seen == [at("127.0.0.3"), at("127.0.0.4")].into() {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "the new answer was not followed: {seen:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let bk = gp.admin_json("/admin/backends").await;
    let eps: Vec<String> = bk["backends"][0]["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["endpoint"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(eps, [at("127.0.0.3"), at("127.0.0.4")]);
    assert_eq!(bk["backends"][0]["discovery"]["addresses"], 2, "{bk}");
    // The replica that left lost its gauges (its decision counter keeps its history).
    let gone = |m: &str| {
        !m.lines().any(|l| {
            (l.starts_with("goodput_endpoint_outstanding_requests") || l.starts_with("goodput_server_"))
                && l.contains(&at("127.0.0.2"))
        })
    };
    let t = std::time::Instant::now();
    while !gone(&gp.metrics().await) {
        assert!(t.elapsed() < Duration::from_secs(3), "{}", gp.metrics().await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The DNS server failing keeps the last endpoints, and the failed lookups are counted.
    drop(dns);
    wait_metric(&gp, "goodput_discovery_refreshes_total", &[("backend", "pool"), ("result", "error")], 1.0)
        .await;
    let seen = send_some(8, "dns down").await;
    assert!(seen.is_subset(&[at("127.0.0.3"), at("127.0.0.4")].into()) && !seen.is_empty());
    assert!(replicas[0].served() > 0 && replicas[2].served() > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_whose_name_does_not_resolve_refuses_counted_until_it_does() {
    let port = free_port();
    let replica = Replica::spawn(&format!("127.0.0.2:{port}")).await.1;
    let dir = temp_dir("dns-none");
    let name = "vllm.not-yet.svc.cluster.local.";
    let (dns, gp) = dns_pool(&dir, name, port, &[]);
    let failed = [("backend", "pool"), ("result", "error")];
    wait_metric(&gp, "goodput_discovery_refreshes_total", &failed, 1.0).await;
    // No address known: a clear refusal with Retry-After, counted as one for want of capacity.
    let r = send(gp.proxy, chat("s", "too early")).await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(header(&r, "retry-after"), "1");
    assert_eq!(r.json()["error"]["code"], "no_endpoint", "{}", r.text());
    let m = gp.metrics().await;
    assert_eq!(metric(&m, "goodput_rejected_total", &[("reason", "no_endpoint")]), 1.0);
    assert_eq!(metric(&m, "goodput_pool_endpoints", &[("backend", "pool")]), 0.0);
    let bk = gp.admin_json("/admin/backends").await;
    let why = bk["backends"][0]["discovery"]["error"].as_str().unwrap_or_default().to_string();
    assert!(why.contains("not-yet"), "the lookup's error is shown: {bk}");
    // The name resolves: the pool follows at the next refresh.
    dns.answer(name, &["127.0.0.2"]);
    let t = std::time::Instant::now();
    loop {
        let r = send(gp.proxy, chat("s", "now")).await;
        if r.status == 200 {
            break;
        }
        assert_eq!(r.status, 503, "{}", r.text());
        assert!(t.elapsed() < Duration::from_secs(10), "the answer was not followed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(replica.served(), 1);
    let ok = [("backend", "pool"), ("result", "success")];
    assert!(metric(&gp.metrics().await, "goodput_discovery_refreshes_total", &ok) >= 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_in_flight_to_an_endpoint_that_left_the_pool_finishes() {
    let port = free_port();
    let (_, old) = Replica::spawn(&format!("127.0.0.5:{port}")).await;
    let (_, new) = Replica::spawn(&format!("127.0.0.6:{port}")).await;
    let dir = temp_dir("dns-drain");
    let name = "drain.goodput-test.svc.cluster.local.";
    let (dns, gp) = dns_pool(&dir, name, port, &["127.0.0.5"]);
    let body = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"slow"}]}"#;
    let proxy = gp.proxy;
    let stream = tokio::spawn(async move { send(proxy, post_json("/v1/chat/completions", body)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The replica leaves the pool while its stream runs (4 s in all).
    dns.answer(name, &["127.0.0.6"]);
    let t = std::time::Instant::now();
    loop {
        let bk = gp.admin_json("/admin/backends").await;
        let eps = bk["backends"][0]["endpoints"].as_array().unwrap().clone();
        if eps.len() == 1 && eps[0]["endpoint"] == format!("127.0.0.6:{port}") {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(3), "the pool did not change: {eps:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!stream.is_finished(), "the stream is still running when its endpoint leaves");
    let r = send(gp.proxy, chat("s", "after")).await;
    assert_eq!(
        header(&r, "x-goodput-endpoint"),
        format!("127.0.0.6:{port}"),
        "new requests go to the new one"
    );
    let r = stream.await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(header(&r, "x-goodput-endpoint"), format!("127.0.0.5:{port}"));
    let text = r.text();
    assert!(text.contains("t19 ") && text.trim_end().ends_with("data: [DONE]"), "the whole stream: {text}");
    let recs = gp.records_when(2, "", |rs| rs.iter().any(|r| r["stream"] == true)).await;
    let rec = recs.iter().find(|r| r["stream"] == true).unwrap();
    assert_eq!(rec["outcome"], "ok", "{rec}");
    assert_eq!(rec["endpoint"], format!("127.0.0.5:{port}"), "{rec}");
    assert_eq!((old.served(), new.served()), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_class_that_sheds_refuses_when_the_predicted_wait_passes_its_ttft_objective() {
    let (a_addr, a) = Replica::spawn("127.0.0.1:0").await;
    let (b_addr, b) = Replica::spawn("127.0.0.1:0").await;
    let gp = Goodput::start(&format!(
        r#"
backends:
  - name: pool
    endpoints: ["http://{a_addr}", "http://{b_addr}"]
    models: [m]
    server_metrics: {{interval_ms: 100}}
classes:
  interactive: {{ttft_p95_ms: 50, shed: true}}
routing: {{exploration: 0.0, response_headers: true, default_class: interactive, min_samples: 2}}
"#
    ));
    let quick = || {
        post_json(
            "/v1/chat/completions",
            r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"quick"}]}"#,
        )
    };
    // Both replicas measured: a few ms to the first token, ~40 ms in all.
    for _ in 0..12 {
        assert_eq!(send(gp.proxy, quick()).await.status, 200);
    }
    assert!(a.served() >= 2 && b.served() >= 2, "{} / {}", a.served(), b.served());
    tokio::time::sleep(Duration::from_millis(600)).await;
    // Three queued at each (not saturated: 3 <= 5): ~3 x 40 ms predicted, past the 50 ms objective.
    a.waiting.store(3, Ordering::Relaxed);
    b.waiting.store(3, Ordering::Relaxed);
    a.scraped(2).await;
    b.scraped(2).await;
    let r = send(gp.proxy, quick()).await;
    assert_eq!(r.status, 429, "{}", r.text());
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(msg.contains("predicted TTFT"), "{msg}");
    // The queues drain: served again.
    a.waiting.store(0, Ordering::Relaxed);
    b.waiting.store(0, Ordering::Relaxed);
    a.scraped(2).await;
    b.scraped(2).await;
    assert_eq!(send(gp.proxy, quick()).await.status, 200);
}

/// Quality is kept per endpoint too: a replica whose text has gone bad shows a higher
/// consistency score than its healthy peer, each check's re-samples come from the replica that
/// served the response, and the backend's window holds them all. Drift against the pool's
/// other endpoint is confident for the degraded replica only, and exported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quality_is_measured_per_endpoint() {
    let sim = |quality: f64| goodput::sim::SimConfig {
        model: "m".into(),
        quality: Some(quality),
        output_tokens: 20,
        ..Default::default()
    };
    let (good_addr, good) = goodput::sim::spawn(sim(1.0), "127.0.0.1:0").await.unwrap();
    let (poor_addr, poor) = goodput::sim::spawn(sim(0.3), "127.0.0.1:0").await.unwrap();
    let yaml = pool_yaml(
        &[format!("http://{good_addr}"), format!("http://{poor_addr}")],
        "quality:\n  consistency: {sample_rate: 1.0, samples: 3, methods: [unigram], max_token_share: 100}\n\
         \x20 drift: {min_samples: 3, min_effect_consistency: 0.0, drain_on: [consistency]}\n",
    );
    let gp = Goodput::start(&yaml);
    let (g, p) = (good_addr.to_string(), poor_addr.to_string());
    let ask = |i: usize| {
        let body = serde_json::json!({"model": "m", "max_tokens": 20,
            "messages": [{"role": "user", "content": format!("Tell me about place number {i}.")}]});
        let proxy = gp.proxy;
        async move {
            let r = send(proxy, post_json("/v1/chat/completions", &body.to_string())).await;
            assert_eq!(r.status, 200, "{}", r.text());
            header(&r, "x-goodput-endpoint")
        }
    };
    let mut served: HashMap<String, u64> = HashMap::new();
    let mut sent = 0;
    // Until each replica has the scores drift needs (near-ties split at random).
    while sent < 16 || served.get(&g).is_none_or(|&n| n < 3) || served.get(&p).is_none_or(|&n| n < 3) {
        assert!(sent < 60, "both replicas serve: {served:?}");
        *served.entry(ask(sent).await).or_default() += 1;
        sent += 1;
    }
    let n = |e: &str| served.get(e).copied().unwrap_or(0);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let bk = loop {
        let bk = gp.admin_json("/admin/backends").await;
        if bk["backends"][0]["window"]["quality"]["consistency_checked"] == sent {
            break bk;
        }
        assert!(std::time::Instant::now() < deadline, "checks did not finish: {bk}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let eps = bk["backends"][0]["endpoints"].as_array().unwrap();
    let q = |e: &str| eps.iter().find(|x| x["endpoint"] == e).unwrap()["window"]["quality"].clone();
    let (gq, pq) = (q(&g), q(&p));
    assert_eq!(
        (gq["consistency_checked"].as_u64(), pq["consistency_checked"].as_u64()),
        (Some(n(&g)), Some(n(&p))),
        "{eps:?}"
    );
    let (gs, ps) =
        (gq["consistency_score_mean"].as_f64().unwrap(), pq["consistency_score_mean"].as_f64().unwrap());
    assert!(ps > gs, "the degraded replica scores worse: {ps} against {gs}");
    // One request per check (the simulator honours `n`), to the replica that served it.
    assert_eq!((good.requests(), poor.requests()), (2 * n(&g), 2 * n(&p)));

    let drift = |e: &str| {
        let d = eps.iter().find(|x| x["endpoint"] == e).unwrap()["drift"].clone();
        d.as_array().unwrap().iter().find(|x| x["signal"] == "consistency").cloned().unwrap()
    };
    {
        let (gd, pd) = (drift(&g), drift(&p));
        assert_eq!(pd["reference"]["names"], serde_json::json!([g.clone()]), "{pd}");
        assert_eq!(
            (pd["confident"].as_bool(), gd["confident"].as_bool()),
            (Some(true), Some(false)),
            "{pd} {gd}"
        );
        let m = gp.metrics().await;
        let confident = |e: &str| {
            metric(
                &m,
                "goodput_quality_drift_confident",
                &[("scope", "endpoint"), ("name", e), ("backend", "pool"), ("signal", "consistency")],
            )
        };
        assert_eq!((confident(&p), confident(&g)), (1.0, 0.0), "{m}");
    }
    // Routing acts on it: the degraded replica is drained but for the probe share (5%).
    let decided = |m: &str, e: &str, reason: &str| {
        metric(
            m,
            "goodput_endpoint_decisions_total",
            &[("backend", "pool"), ("endpoint", e), ("reason", reason)],
        )
    };
    let m0 = gp.metrics().await;
    let mut after: HashMap<String, u64> = HashMap::new();
    for i in 0..40 {
        *after.entry(ask(100 + i).await).or_default() += 1;
    }
    let (to_good, to_poor) = (after.get(&g).copied().unwrap_or(0), after.get(&p).copied().unwrap_or(0));
    assert!(to_poor <= 6 && to_good >= 34, "drained: {after:?}");
    let m = gp.metrics().await;
    let delta = |e: &str, reason: &str| decided(&m, e, reason) - decided(&m0, e, reason);
    assert_eq!(delta(&g, "quality_degraded"), to_good as f64, "{m}");
    assert_eq!(delta(&p, "quality_probe"), to_poor as f64, "{m}");
    let routes = gp.admin_json("/admin/routes").await.to_string();
    assert!(
        routes.contains(&format!("quality_degraded: {g}"))
            && routes.contains(&format!("{p} drained (consistency +")),
        "{routes}"
    );
}
