//! Fault injection over real sockets: upstreams that misbehave on purpose, clients that do,
//! the limits, graceful shutdown on SIGTERM and the security rules. Idle upstream connections
//! close after 300 ms (`timeouts.pool_idle_ms`), so that afterwards the process's fds and tasks
//! come back to what they were before; each fault is repeated so that a leak of one file
//! descriptor or task per fault shows above that. A healthy stream runs through the same proxy
//! the whole time and must come through intact.

use crate::common::*;
use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Wait until the peer closes (so a stalled upstream holds its socket as long as goodput does).
async fn until_closed(s: &mut TcpStream) {
    let mut b = [0u8; 1024];
    while matches!(s.read(&mut b).await, Ok(n) if n > 0) {}
}

/// Close with RST (SO_LINGER 0).
pub fn reset(s: TcpStream) {
    let _ = s.set_zero_linger();
    drop(s);
}

const SSE_HEAD: &[u8] =
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
const EVENT: &str =
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":null}]}\n\n";

fn chunk(data: &[u8]) -> Vec<u8> {
    let mut v = format!("{:x}\r\n", data.len()).into_bytes();
    v.extend_from_slice(data);
    v.extend_from_slice(b"\r\n");
    v
}

/// Bytes of the oversized SSE event: larger than the SSE reader's 16 MiB cap and any buffer.
const HUGE_EVENT: usize = 20 * 1024 * 1024;

async fn huge_event(mut s: TcpStream) {
    while read_request(&mut s).await {
        let _ = s.write_all(SSE_HEAD).await;
        let _ = s.write_all(&chunk(b"data: ")).await;
        let piece = vec![b'x'; 64 * 1024];
        for _ in 0..HUGE_EVENT / piece.len() {
            if s.write_all(&chunk(&piece)).await.is_err() {
                return;
            }
        }
        let _ = s.write_all(&chunk(b"\n\ndata: [DONE]\n\n")).await;
        let _ = s.write_all(b"0\r\n\r\n").await;
    }
}

struct Fault {
    name: &'static str,
    addr: String,
    /// The status the client must get.
    status: u16,
    /// The client's body must end with an error (the proxy must not invent a clean end).
    body_error: bool,
    /// The record's outcome.
    outcome: &'static str,
}

async fn fault_upstreams() -> Vec<Fault> {
    let mut v = Vec::new();
    let mut add = |name, addr: String, status, body_error, outcome| {
        v.push(Fault { name, addr, status, body_error, outcome })
    };
    let a = raw_upstream(|mut s| async move {
        if read_request(&mut s).await {
            tokio::time::sleep(Duration::from_secs(3)).await;
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await;
        }
    })
    .await;
    add("slow_headers", a.to_string(), 504, false, "timeout");
    let a = raw_upstream(|mut s| async move {
        if read_request(&mut s).await {
            until_closed(&mut s).await;
        }
    })
    .await;
    add("never_answers", a.to_string(), 504, false, "timeout");
    let a = raw_upstream(|mut s| async move {
        if read_request(&mut s).await {
            let _ = s.write_all(SSE_HEAD).await;
            let _ = s.write_all(&chunk(EVENT.as_bytes())).await;
            until_closed(&mut s).await;
        }
    })
    .await;
    add("slow_chunks", a.to_string(), 200, true, "timeout");
    let a = raw_upstream(|mut s| async move {
        if read_request(&mut s).await {
            reset(s);
        }
    })
    .await;
    add("reset_before_headers", a.to_string(), 502, false, "upstream_reset");
    let a = raw_upstream(|mut s| async move {
        if read_request(&mut s).await {
            let _ = s.write_all(SSE_HEAD).await;
            let _ = s.write_all(&chunk(EVENT.as_bytes())).await;
            tokio::time::sleep(Duration::from_millis(50)).await;
            reset(s);
        }
    })
    .await;
    add("reset_mid_stream", a.to_string(), 200, true, "upstream_reset");
    let a = raw_upstream(|mut s| async move {
        if read_request(&mut s).await {
            let _ = s.write_all(b"SSH-2.0-OpenSSH_9.2 this is not HTTP\r\n\r\n").await;
        }
    })
    .await;
    add("garbage", a.to_string(), 502, false, "upstream_reset");
    let a = raw_upstream(|mut s| async move {
        if read_request(&mut s).await {
            let _ = s.write_all(SSE_HEAD).await;
            let _ = s.write_all(&chunk(EVENT.as_bytes())).await;
            // A chunk header that promises more than ever comes, then FIN.
            let _ = s.write_all(b"400\r\ndata: {\"cho").await;
            let _ = s.shutdown().await;
        }
    })
    .await;
    add("truncated_chunked", a.to_string(), 200, true, "upstream_reset");
    let a = raw_upstream(|mut s| async move {
        if read_request(&mut s).await {
            let big = "a".repeat(1024 * 1024);
            let r = format!("HTTP/1.1 200 OK\r\nx-big: {big}\r\ncontent-length: 2\r\n\r\nok");
            let _ = s.write_all(r.as_bytes()).await;
        }
    })
    .await;
    add("huge_headers", a.to_string(), 502, false, "upstream_reset");
    let a = raw_upstream(|mut s| async move {
        while read_request(&mut s).await {
            let body = "<html><body>upstream is down</body></html>";
            let r = format!(
                "HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/html\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            let _ = s.write_all(r.as_bytes()).await;
        }
    })
    .await;
    add("html_503", a.to_string(), 503, false, "upstream_error");
    let a = raw_upstream(huge_event).await;
    add("huge_event", a.to_string(), 200, false, "ok");
    add("dns", "goodput-fault.invalid:8000".into(), 502, false, "connect_error");
    v
}

fn fault_yaml(healthy: SocketAddr, faults: &[Fault], extra: &str) -> String {
    let mut y = format!(
        "timeouts: {{connect_ms: 1000, first_byte_ms: 800, idle_ms: 2000, pool_idle_ms: 300}}\n\
         limits: {{header_read_timeout_ms: 1000, max_body_bytes: 1048576}}\n{extra}\
         backends:\n  - name: healthy\n    url: http://{healthy}\n"
    );
    for f in faults {
        y += &format!("  - name: {}\n    url: http://{}\n", f.name, f.addr);
    }
    y += "routes:\n  - name: healthy\n    match: {headers: {x-fault: healthy}}\n    backends: [healthy]\n";
    for f in faults {
        y += &format!(
            "  - name: {0}\n    match: {{headers: {{x-fault: {0}}}}}\n    backends: [{0}]\n",
            f.name
        );
    }
    y
}

fn stream_req(fault: &str, max_tokens: u32) -> Request<Full<Bytes>> {
    let body = serde_json::json!({
        "model": "m", "stream": true, "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "hello"}]
    });
    let mut r = post_json("/v1/chat/completions", &body.to_string());
    r.headers_mut().insert("x-fault", fault.parse().unwrap());
    r
}

/// A chat completion request written by hand, for a client that then misbehaves on the socket:
/// to the `x-fault` route `fault` (or the default one).
fn raw_chat(fault: Option<&str>, body: &str) -> String {
    let route = fault.map_or(String::new(), |f| format!("x-fault: {f}\r\n"));
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n{route}content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// (open fds, alive tasks) of the goodput process, as its /metrics reports them.
async fn usage(gp: &Goodput) -> (f64, f64) {
    let m = gp.metrics().await;
    (metric(&m, "process_open_fds", &[]), metric(&m, "goodput_runtime_alive_tasks", &[]))
}

/// Wait for the process's fds and tasks to come back to within `slack` of `base`. The wait is
/// long because a loaded CI machine (vLLM on both cores) delays every close; a leak never
/// settles however long it is given.
/// `legend` names the upstreams' ports for the report.
async fn settles(gp: &Goodput, base: (f64, f64), slack: f64, legend: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = usage(gp).await;
        if now.0 <= base.0 + slack && now.1 <= base.1 + slack {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "leak: fds/tasks {now:?}, baseline {base:?} (+{slack}); goodput's sockets:\n{}upstreams: {legend}",
            sockets(gp.child.id())
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The TCP sockets process `pid` holds, one per line (local, remote, state), for a leak report.
fn sockets(pid: u32) -> String {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.flatten().filter_map(|e| std::fs::read_link(e.path()).ok()).collect::<Vec<_>>())
        .unwrap_or_default()
        .iter()
        .filter_map(|l| l.to_str()?.strip_prefix("socket:[")?.strip_suffix(']').map(str::to_string))
        .collect();
    let mut out = String::new();
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() > 9 && inodes.iter().any(|i| i == f[9]) {
                let port = |a: &str| a.rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok());
                out += &format!("  :{:?} -> :{:?} state {}\n", port(f[1]), port(f[2]), f[3]);
            }
        }
    }
    format!("{} fds are sockets; TCP:\n{out}", inodes.len())
}

fn assert_alive(gp: &mut Goodput) {
    assert!(gp.child.try_wait().unwrap().is_none(), "goodput exited");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_faults_get_clear_answers_and_leave_nothing_behind() {
    const REPS: usize = 3;
    // The healthy stream lasts 8 s: longer than the reps (each waits idle_ms for slow_chunks).
    const HEALTHY: u32 = 800;
    let (sim_addr, sim) = spawn_sim(0.0, 10.0, HEALTHY).await;
    let faults = Arc::new(fault_upstreams().await);
    let mut gp = Goodput::start(&fault_yaml(sim_addr, &faults, ""));
    let ok = send(gp.proxy, stream_req("healthy", 4)).await;
    assert_eq!(ok.status, 200);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let base = usage(&gp).await;

    // A healthy stream through the same proxy while the faults happen.
    let proxy = gp.proxy;
    let healthy = tokio::spawn(async move { send(proxy, stream_req("healthy", HEALTHY)).await });
    for rep in 0..REPS {
        let runs = (0..faults.len()).map(|i| {
            let (proxy, name) = (gp.proxy, faults[i].name);
            async move { (i, send(proxy, stream_req(name, 8)).await) }
        });
        for (i, r) in join_all(runs).await {
            let f = &faults[i];
            let what = format!("{} (rep {rep})", f.name);
            assert_eq!(r.status.as_u16(), f.status, "{what}: {}", r.text());
            assert_eq!(r.error.is_some(), f.body_error, "{what}: body error {:?}", r.error);
            if f.status == 502 || f.status == 504 {
                let e = r.json();
                assert!(e["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{what}: {e}");
                assert!(e["error"]["type"].is_string() && e["error"]["code"].is_string(), "{what}: {e}");
            }
            match f.name {
                "html_503" => assert_eq!(r.text(), "<html><body>upstream is down</body></html>"),
                "huge_event" => {
                    assert_eq!(r.body.len(), 6 + HUGE_EVENT + 16, "{what}");
                    assert!(r.body.ends_with(b"\n\ndata: [DONE]\n\n"));
                }
                // Only what the upstream sent: the one complete event, nothing invented.
                "reset_mid_stream" | "slow_chunks" => assert_eq!(r.text(), EVENT, "{what}"),
                // The complete event, though the cut arrives in the same read as the data (the
                // incomplete one is held for usage removal and dies with the stream).
                "truncated_chunked" => assert!(r.text().starts_with(EVENT), "{what}: {}", r.text()),
                _ => {}
            }
        }
    }
    let h = healthy.await.unwrap();
    assert_eq!((h.status.as_u16(), &h.error), (200, &None));
    let text = h.text();
    assert!(text.matches("\"content\"").count() >= HEALTHY as usize, "the healthy stream lost tokens");
    assert!(text.ends_with("data: [DONE]\n\n"));

    let records = gp.records(1 + 1 + REPS * faults.len()).await;
    for f in faults.iter() {
        let mine: Vec<_> = records.iter().filter(|r| r["route"] == f.name).collect();
        assert_eq!(mine.len(), REPS, "{}: one record per request", f.name);
        for r in mine {
            assert_eq!(r["outcome"], f.outcome, "{}: {r}", f.name);
        }
    }
    assert_eq!(sim.cancelled(), 0, "the healthy stream was disturbed");
    assert_alive(&mut gp);
    let legend: Vec<String> = faults.iter().map(|f| format!("{} {}", f.name, f.addr)).collect();
    settles(&gp, base, 2.0, &format!("healthy {sim_addr}, {}", legend.join(", "))).await;
}

/// vLLM sends a stream's head at once and then queues the request until its first token: that
/// wait is bounded by `first_byte_ms`, not by `idle_ms`, and a stream cut in it counts as a
/// first-byte timeout. Once the first token has come, `idle_ms` applies again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_stream_waits_first_byte_ms_for_its_first_token() {
    // The head at once, the first token `queued_ms` later, then silence or the end.
    let queued = |queued_ms: u64, then_silent: bool| {
        raw_upstream(move |mut s| async move {
            if read_request(&mut s).await {
                let _ = s.write_all(SSE_HEAD).await;
                tokio::time::sleep(Duration::from_millis(queued_ms)).await;
                let _ = s.write_all(&chunk(EVENT.as_bytes())).await;
                if !then_silent {
                    let _ = s.write_all(&chunk(b"data: [DONE]\n\n")).await;
                    let _ = s.write_all(b"0\r\n\r\n").await;
                }
                until_closed(&mut s).await;
            }
        })
    };
    let upstreams = [
        ("queued", queued(1_000, false).await),
        ("never", queued(600_000, false).await),
        ("stalls", queued(500, true).await),
    ];
    let mut yaml = "timeouts: {first_byte_ms: 5000, idle_ms: 300}\nbackends:\n".to_string();
    for (name, addr) in &upstreams {
        yaml += &format!("  - name: {name}\n    url: http://{addr}\n");
    }
    yaml += "routes:\n";
    for (name, _) in &upstreams {
        yaml += &format!(
            "  - name: {name}\n    match: {{headers: {{x-fault: {name}}}}}\n    backends: [{name}]\n"
        );
    }
    let mut gp = Goodput::start_logged(&yaml, &[], &[]);

    let r = send(gp.proxy, stream_req("queued", 8)).await;
    assert_eq!((r.status.as_u16(), &r.error), (200, &None), "queued 1 s with idle_ms 300");
    assert_eq!(r.text(), format!("{EVENT}data: [DONE]\n\n"));

    let t = Instant::now();
    let r = send(gp.proxy, stream_req("never", 8)).await;
    let waited = t.elapsed();
    assert_eq!(r.status.as_u16(), 200);
    assert!(r.error.is_some() && r.body.is_empty(), "the stream is cut, nothing invented: {:?}", r.text());
    assert!(waited >= Duration::from_millis(4900), "cut after {waited:?}, before first_byte_ms");

    // Its first token after 0.5 s, then silence: cut idle_ms later, not at first_byte_ms.
    let t = Instant::now();
    let r = send(gp.proxy, stream_req("stalls", 8)).await;
    let waited = t.elapsed();
    assert_eq!(r.status.as_u16(), 200);
    assert!(r.error.is_some(), "silent past idle_ms after its first token");
    assert_eq!(r.text(), EVENT);
    assert!(waited < Duration::from_millis(4000), "cut after {waited:?}: idle_ms no longer applied");

    let records = gp.records(3).await;
    let of = |route: &str| records.iter().find(|r| r["route"] == route).unwrap().clone();
    let q = of("queued");
    assert_eq!(q["outcome"], "ok", "{q}");
    assert!(q["ttft"].as_f64().unwrap() >= 1.0, "{q}");
    assert_eq!(of("never")["outcome"], "timeout");
    assert_eq!(of("stalls")["outcome"], "timeout");
    let m = gp.metrics().await;
    let errors = |backend: &str, kind: &str| {
        metric(&m, "goodput_upstream_errors_total", &[("backend", backend), ("kind", kind)])
    };
    assert_eq!(errors("queued", "timeout_idle") + errors("queued", "timeout_first_byte"), 0.0);
    assert_eq!(errors("never", "timeout_first_byte"), 1.0);
    assert_eq!(errors("stalls", "timeout_idle"), 1.0);
    // Each cut is logged as an upstream failure, naming the request and the server.
    let log = gp.log();
    for (route, kind) in [("never", "timeout_first_byte"), ("stalls", "timeout_idle")] {
        let line =
            log.lines().find(|l| l.contains("upstream failure") && l.contains(&format!("kind=\"{kind}\"")));
        let line = line.unwrap_or_else(|| panic!("no {kind} failure logged: {log}"));
        let id = of(route)["id"].clone();
        assert!(
            line.contains(&format!("id={id} ")) && line.contains(&format!("backend=\"{route}\"")),
            "{line}"
        );
    }
    assert!(!log.contains("backend=\"queued\""), "{log}");
    assert_alive(&mut gp);
}

/// A client that stops reading for longer than `idle_ms` holds the upstream back through
/// backpressure: that wait is the client's, not silence of the upstream, so the stream must
/// come through whole when the client reads again (a loaded machine pauses clients too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_pauses_reading_is_not_an_idle_upstream() {
    const WRITES: u64 = 800; // 40 MiB: more than the sockets and hyper hold between them
    let written = Arc::new(AtomicU64::new(0));
    let counted = written.clone();
    let up = raw_upstream(move |mut s| {
        let written = counted.clone();
        async move {
            while read_request(&mut s).await {
                let _ = s.write_all(SSE_HEAD).await;
                let ev = chunk(&EVENT.repeat(600).into_bytes());
                for _ in 0..WRITES {
                    if s.write_all(&ev).await.is_err() {
                        return;
                    }
                    written.fetch_add(1, Ordering::SeqCst);
                }
                let _ = s.write_all(&chunk(b"data: [DONE]\n\n")).await;
                let _ = s.write_all(b"0\r\n\r\n").await;
            }
        }
    })
    .await;
    let yaml = format!(
        "timeouts: {{idle_ms: 300}}\nbackends:\n  - name: up\n    url: http://{up}\n\
         routes:\n  - name: up\n    backends: [up]\n"
    );
    let mut gp = Goodput::start(&yaml);
    let stream = TcpStream::connect(gp.proxy).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    let mut req = stream_req("up", 8);
    req.headers_mut().insert("host", gp.proxy.to_string().parse().unwrap());
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let mut got = body.frame().await.unwrap().unwrap().into_data().unwrap().len();
    // Five times idle_ms without reading, while the upstream has more to send.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let held = written.load(Ordering::SeqCst);
    assert!(held < WRITES, "the upstream was not held back: it wrote everything during the pause");
    eprintln!("paused client: the upstream was held at {held} of {WRITES} writes");
    while let Some(f) = body.frame().await {
        let f = f.unwrap_or_else(|e| panic!("the stream was cut after {got} bytes: {e}"));
        got += f.into_data().map_or(0, |d| d.len());
    }
    assert_eq!(got, WRITES as usize * EVENT.len() * 600 + "data: [DONE]\n\n".len());
    let r = latest(&gp.records(1).await).clone();
    assert_eq!(r["outcome"], "ok", "{r}");
    let m = gp.metrics().await;
    let idle = metric(&m, "goodput_upstream_errors_total", &[("backend", "up"), ("kind", "timeout_idle")]);
    assert_eq!(idle, 0.0);
    assert_alive(&mut gp);
}

/// A stream that writes as fast as the socket takes, counting what it got rid of.
async fn firehose(written: Arc<AtomicU64>, cut: Arc<AtomicBool>) -> SocketAddr {
    raw_upstream(move |mut s| {
        let (written, cut) = (written.clone(), cut.clone());
        async move {
            if !read_request(&mut s).await {
                return;
            }
            let _ = s.write_all(SSE_HEAD).await;
            let ev = chunk(&EVENT.repeat(600).into_bytes()); // ~50 KiB per write
            for _ in 0..5000 {
                if s.write_all(&ev).await.is_err() {
                    cut.store(true, Ordering::SeqCst);
                    return;
                }
                written.fetch_add(ev.len() as u64, Ordering::SeqCst);
            }
        }
    })
    .await
}

/// A firehose's count of what it wrote, and whether its request was cut.
struct Hose {
    written: Arc<AtomicU64>,
    cut: Arc<AtomicBool>,
}

impl Hose {
    /// Wait (at most 10 s from `since`) for the firehose's request to be cut.
    async fn until_cut(&self, since: Instant, who: &str) {
        while !self.cut.load(Ordering::SeqCst) {
            let written = self.written.load(Ordering::SeqCst);
            assert!(
                since.elapsed() < Duration::from_secs(10),
                "{who}: the upstream request is still held ({written} bytes written)"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        eprintln!("{who}: the upstream request was cut after {:?}", since.elapsed());
    }
}

/// The firehose's request is filed as cancelled and counted as one send timeout, and nothing
/// is left in flight.
async fn cancelled_by_the_send_timeout(gp: &Goodput) {
    let records = gp.records(2).await;
    let rec = records.iter().find(|r| r["route"] == "hose").unwrap();
    assert_eq!(rec["outcome"], "cancelled", "{rec}");
    let m = gp.metrics().await;
    assert_eq!(metric(&m, "goodput_client_send_timeouts_total", &[]), 1.0);
    assert_eq!(metric(&m, "goodput_in_flight_requests", &[]), 0.0);
}

/// goodput with `limits.send_timeout_ms: 500` before a simulated backend (route `sim`, 100
/// tokens 10 ms apart) and a firehose (route `hose`, header `x-fault: hose`).
async fn send_timeout_proxy() -> (Goodput, Arc<goodput::sim::Sim>, Hose) {
    let (sim_addr, sim) = spawn_sim(0.0, 10.0, 100).await;
    let hose = Hose { written: Arc::new(AtomicU64::new(0)), cut: Arc::new(AtomicBool::new(false)) };
    let hose_addr = firehose(hose.written.clone(), hose.cut.clone()).await;
    let yaml = format!(
        "limits: {{send_timeout_ms: 500}}\ntimeouts: {{idle_ms: 60000}}\n\
         backends:\n  - name: sim\n    url: http://{sim_addr}\n  - name: hose\n    url: http://{hose_addr}\n\
         routes:\n  - name: hose\n    match: {{headers: {{x-fault: hose}}}}\n    backends: [hose]\n\
         \x20 - name: sim\n    backends: [sim]\n"
    );
    (Goodput::start(&yaml), sim, hose)
}

/// A client that takes none of its answer (a hung process, a peer gone without a FIN) would
/// hold its connection, the upstream request and the generation for good: after
/// `limits.send_timeout_ms` of a blocked write goodput closes the connection, which cancels the
/// request upstream. A client that keeps reading is not cut, however long its stream lasts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_takes_nothing_is_closed_at_send_timeout_ms() {
    let (mut gp, sim, hose) = send_timeout_proxy().await;
    // A one-second stream, twice the send timeout, to a client that reads as it comes.
    let r = send(gp.proxy, stream_req("sim", 100)).await;
    assert_eq!((r.status.as_u16(), &r.error), (200, &None));
    assert_eq!(sse_contents(&r.text()).len(), 100, "{}", r.text());
    assert_eq!(sim.cancelled(), 0);

    // A client that sends its request, then reads nothing and keeps its socket open.
    let mut s = TcpStream::connect(gp.proxy).await.unwrap();
    let head = raw_chat(Some("hose"), r#"{"model":"m","stream":true,"messages":[]}"#);
    s.write_all(head.as_bytes()).await.unwrap();
    hose.until_cut(Instant::now(), "a client that takes nothing").await;
    // The connection is closed: what was in flight, then its end (or a reset).
    let mut sink = vec![0u8; 1 << 20];
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        while matches!(s.read(&mut sink).await, Ok(n) if n > 0) {}
    });
    assert!(closed.await.is_ok(), "the connection stayed open");
    cancelled_by_the_send_timeout(&gp).await;
    // Both connections' tasks end (the first client's closes when its sender is dropped).
    let t = Instant::now();
    while metric(&gp.metrics().await, "goodput_client_connections", &[]) > 0.0 {
        assert!(t.elapsed() < Duration::from_secs(5), "a client connection was left open");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_alive(&mut gp);
}

/// An h2 client whose connection keeps reading but that grants one stream no flow-control window
/// (an application that stopped taking its answer, behind a live h2 library) blocks no write
/// on the socket, so the connection's send timeout never fires. That stream alone is ended
/// after `limits.send_timeout_ms`, which cancels its upstream request; the connection's other
/// streams go on, before and after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_stream_the_client_stops_taking_is_ended_at_send_timeout_ms() {
    let (mut gp, sim, hose) = send_timeout_proxy().await;
    let io = TokioIo::new(TcpStream::connect(gp.proxy).await.unwrap());
    let (mut h2, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await.unwrap();
    tokio::spawn(conn);
    let req = |route: &str, tokens| {
        let mut r = stream_req(route, tokens);
        *r.uri_mut() = format!("http://{}/v1/chat/completions", gp.proxy).parse().unwrap();
        r
    };
    let mut hose_req = req("sim", 1);
    hose_req.headers_mut().insert("x-fault", "hose".parse().unwrap());
    // Held, never read: its stream's window closes once the first 64 KiB are in.
    let held = h2.send_request(hose_req).await.unwrap();
    assert_eq!(held.status(), 200);
    let t = Instant::now();
    // A one-second stream on the same connection, twice the send timeout, read as it comes.
    let r = read_reply(h2.send_request(req("sim", 100)).await.unwrap(), Instant::now()).await;
    assert_eq!(r.error, None);
    assert_eq!(sse_contents(&r.text()).len(), 100, "{}", r.text());
    assert_eq!(sim.cancelled(), 0);
    hose.until_cut(t, "an h2 stream the client stopped taking").await;
    cancelled_by_the_send_timeout(&gp).await;
    // The connection goes on serving; the held stream, read now, ends in a reset after what
    // was already on its way.
    let r = read_reply(h2.send_request(req("sim", 3)).await.unwrap(), Instant::now()).await;
    assert_eq!((r.status.as_u16(), &r.error), (200, &None));
    let mut body = held.into_body();
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match body.frame().await {
                Some(Ok(_)) => {}
                Some(Err(e)) => return Some(e),
                None => return None,
            }
        }
    });
    let e = ended.await.expect("the held stream never ended");
    assert!(e.is_some(), "the held stream ended as if whole");
    drop(h2);
    assert_alive(&mut gp);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_faults_are_contained() {
    let (sim_addr, sim) = spawn_sim(0.0, 20.0, 100).await;
    let (written, cut) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
    let hose = firehose(written.clone(), cut.clone()).await;
    let yaml = format!(
        "timeouts: {{idle_ms: 5000, pool_idle_ms: 300}}\nlimits: {{header_read_timeout_ms: 1000, max_body_bytes: 1048576}}\n\
         backends:\n  - name: sim\n    url: http://{sim_addr}\n  - name: hose\n    url: http://{hose}\n\
         routes:\n  - name: hose\n    match: {{headers: {{x-fault: hose}}}}\n    backends: [hose]\n\
         \x20 - name: sim\n    backends: [sim]\n"
    );
    let mut gp = Goodput::start(&yaml);
    assert_eq!(send(gp.proxy, stream_req("sim", 2)).await.status, 200);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let base = usage(&gp).await;
    let rss0 = metric(&gp.metrics().await, "process_resident_memory_bytes", &[]);

    // Slowloris: a request head trickling in is cut at header_read_timeout_ms.
    let mut s = TcpStream::connect(gp.proxy).await.unwrap();
    s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n").await.unwrap();
    let t = Instant::now();
    let closed = async {
        let mut b = [0u8; 256];
        for i in 0..100 {
            if s.write_all(format!("x-slow-{i}: 1\r\n").as_bytes()).await.is_err() {
                return;
            }
            // A 408 before the close is fine too; the close is what must come.
            if let Ok(r) = tokio::time::timeout(Duration::from_millis(200), s.read(&mut b)).await
                && matches!(r, Ok(0) | Err(_))
            {
                return;
            }
        }
        panic!("a slowloris client was kept for 20 s");
    };
    closed.await;
    assert!(t.elapsed() < Duration::from_secs(4), "slowloris cut after {:?}", t.elapsed());

    // A slow reader: goodput applies backpressure instead of buffering the stream.
    let mut s = TcpStream::connect(gp.proxy).await.unwrap();
    let head = raw_chat(Some("hose"), r#"{"model":"m","stream":true,"messages":[]}"#);
    s.write_all(head.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stuck = written.load(Ordering::SeqCst);
    let total = 5000 * (EVENT.len() as u64 * 600 + 10);
    assert!(
        stuck < 48 * 1024 * 1024,
        "the upstream wrote {stuck} of {total} bytes to a client reading nothing"
    );
    let rss1 = metric(&gp.metrics().await, "process_resident_memory_bytes", &[]);
    eprintln!(
        "slow reader: upstream wrote {:.1} MiB of {:.0} MiB; goodput RSS +{:.1} MiB",
        stuck as f64 / 1048576.0,
        total as f64 / 1048576.0,
        (rss1 - rss0) / 1048576.0
    );
    assert!(
        rss1 - rss0 < 32.0 * 1024.0 * 1024.0,
        "RSS grew {} MiB under a slow reader",
        (rss1 - rss0) / 1048576.0
    );
    // Reading a little lets more through; then the client leaves and the upstream is cut.
    let mut b = vec![0u8; 1 << 20];
    let _ = s.read(&mut b).await.unwrap();
    drop(s);
    let deadline = Instant::now() + Duration::from_secs(2);
    while !cut.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "the upstream kept writing after the client left");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Half-closed: a client that shuts its write side is treated as gone (as nginx does):
    // the upstream request is cancelled, so a generation nobody reads stops.
    let before = sim.cancelled();
    let mut s = TcpStream::connect(gp.proxy).await.unwrap();
    let head = raw_chat(None, r#"{"model":"m","stream":true,"max_tokens":100,"messages":[]}"#);
    s.write_all(head.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    s.shutdown().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(3);
    while sim.cancelled() == before {
        assert!(Instant::now() < deadline, "a half-closed client's generation was not cancelled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(s);

    // Pipelined HTTP/1.1: two requests in one write, two answers in order.
    let mut s = TcpStream::connect(gp.proxy).await.unwrap();
    let one =
        |tokens: u32| raw_chat(None, &format!(r#"{{"model":"m","max_tokens":{tokens},"messages":[]}}"#));
    s.write_all(format!("{}{}", one(3), one(5)).as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut b = [0u8; 65536];
    let deadline = Instant::now() + Duration::from_secs(5);
    let answers = loop {
        let a = parse_responses(&got);
        if a.len() == 2 {
            break a;
        }
        assert!(Instant::now() < deadline, "pipelined answers: {:?}", String::from_utf8_lossy(&got));
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut b)).await.unwrap().unwrap();
        assert!(n > 0, "closed after {:?}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&b[..n]);
    };
    for (a, tokens) in answers.iter().zip([3, 5]) {
        assert_eq!(a.0, 200);
        let v: serde_json::Value = serde_json::from_slice(&a.1).unwrap();
        assert_eq!(v["usage"]["completion_tokens"], tokens, "answers out of order: {v}");
    }
    drop(s);

    // h2: resetting one stream cancels its generation and leaves the other stream alone.
    let before = sim.cancelled();
    let io = TokioIo::new(TcpStream::connect(gp.proxy).await.unwrap());
    let (mut h2, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await.unwrap();
    tokio::spawn(conn);
    let req = |tokens| {
        let mut r = stream_req("sim", tokens);
        *r.uri_mut() = format!("http://{}/v1/chat/completions", gp.proxy).parse().unwrap();
        r
    };
    let a = h2.send_request(req(100)).await.unwrap();
    let b_resp = h2.send_request(req(30)).await.unwrap();
    let mut a_body = a.into_body();
    let first = a_body.frame().await.unwrap().unwrap();
    assert!(first.is_data());
    drop(a_body); // RST_STREAM(CANCEL)
    let b = read_reply(b_resp, Instant::now()).await;
    assert_eq!(b.error, None);
    assert!(b.text().matches("\"content\"").count() >= 30);
    let deadline = Instant::now() + Duration::from_secs(2);
    while sim.cancelled() == before {
        assert!(Instant::now() < deadline, "the reset h2 stream's generation was not cancelled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(h2);

    // Bodies over the limit, declared or chunked: 413 with an error body.
    let big = "x".repeat(2 * 1024 * 1024);
    let r = send(gp.proxy, post_json("/v1/chat/completions", &big)).await;
    assert_eq!(r.status, 413);
    assert_eq!(r.json()["error"]["code"], "request_too_large");
    let stream_body = Chunked::new(big.as_bytes());
    let io = TokioIo::new(TcpStream::connect(gp.proxy).await.unwrap());
    let (mut h1, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
    tokio::spawn(conn);
    let req = Request::post("/v1/chat/completions").header("host", "x").body(stream_body).unwrap();
    let r = h1.send_request(req).await.unwrap();
    assert_eq!(r.status(), 413);
    drop(h1);

    let records = gp.records(1).await;
    assert!(records.iter().any(|r| r["outcome"] == "cancelled"), "no cancelled record");
    assert_alive(&mut gp);
    settles(&gp, base, 2.0, &format!("sim {sim_addr}, hose {hose}")).await;
}

/// A body over the limit, declared or chunked, gets its 413 while the client is still sending
/// it; goodput then reads and discards the rest (as nginx's lingering close does), so a slow
/// sender still reads its answer, and a body that ends in time leaves the connection usable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_body_is_answered_at_once_and_the_rest_is_drained() {
    let (sim_addr, _sim) = spawn_sim(0.0, 0.0, 100).await;
    let yaml = format!(
        "limits: {{max_body_bytes: 1048576}}\nbackends:\n  - name: sim\n    url: http://{sim_addr}\n\
         routes:\n  - name: sim\n    backends: [sim]\n"
    );
    let mut gp = Goodput::start(&yaml);
    let small = r#"{"model":"m","max_tokens":3,"messages":[]}"#;
    let next = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{small}",
        small.len()
    );
    let piece = vec![b'x'; 1536 * 1024];
    let declared = {
        let mut first = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            2 * piece.len()
        )
        .into_bytes();
        first.extend_from_slice(&piece);
        (first, piece.clone())
    };
    let chunked = {
        let mut first = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
        first.extend_from_slice(&chunk(&piece));
        let mut rest = chunk(&piece);
        rest.extend_from_slice(b"0\r\n\r\n");
        (first, rest)
    };
    for (name, (first, rest)) in [("declared", declared), ("chunked", chunked)] {
        let mut s = TcpStream::connect(gp.proxy).await.unwrap();
        let (mut rd, mut wr) = s.split();
        let mut got = Vec::new();
        let mut b = [0u8; 65536];
        let mut read_answers = async |got: &mut Vec<u8>,
                                      rd: &mut tokio::net::tcp::ReadHalf<'_>,
                                      want: usize| {
            loop {
                let a = parse_responses(got);
                if a.len() >= want {
                    return a;
                }
                let n = tokio::time::timeout(Duration::from_secs(10), rd.read(&mut b)).await;
                let n = n.unwrap_or_else(|_| panic!("{name}: no answer in 10 s"));
                let n = n.unwrap_or_else(|e| panic!("{name}: {e} after {:?}", String::from_utf8_lossy(got)));
                assert!(n > 0, "{name}: closed after {:?}", String::from_utf8_lossy(got));
                got.extend_from_slice(&b[..n]);
            }
        };
        // Write the first part while reading: the 413 must come before the body is complete.
        let (w, a) = tokio::join!(wr.write_all(&first), read_answers(&mut got, &mut rd, 1));
        w.unwrap();
        assert_eq!(a[0].0, 413, "{name}");
        let v: serde_json::Value = serde_json::from_slice(&a[0].1).unwrap();
        assert_eq!(v["error"]["code"], "request_too_large", "{name}");
        // A pause longer than a short linger, then the rest of the body and a second request.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        wr.write_all(&rest).await.unwrap();
        wr.write_all(next.as_bytes()).await.unwrap();
        let a = read_answers(&mut got, &mut rd, 2).await;
        assert_eq!(a[1].0, 200, "{name}: the next request on the connection");
        let v: serde_json::Value = serde_json::from_slice(&a[1].1).unwrap();
        assert_eq!(v["usage"]["completion_tokens"], 3, "{name}");
    }
    let m = gp.metrics().await;
    assert_eq!(metric(&m, "goodput_request_body_too_large_total", &[]), 2.0);
    assert_alive(&mut gp);
}

/// A request body sent in 64 KiB chunks with no declared length (chunked on the wire).
struct Chunked(std::collections::VecDeque<Bytes>);

impl Chunked {
    fn new(data: &[u8]) -> Chunked {
        Chunked(data.chunks(64 * 1024).map(Bytes::copy_from_slice).collect())
    }
}

impl http_body::Body for Chunked {
    type Data = Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, std::io::Error>>> {
        std::task::Poll::Ready(self.0.pop_front().map(|b| Ok(http_body::Frame::data(b))))
    }
}

/// Complete HTTP/1.1 responses (status, content-length body) at the front of `buf`.
fn parse_responses(buf: &[u8]) -> Vec<(u16, Vec<u8>)> {
    let mut out = Vec::new();
    let mut rest = buf;
    while let Some((end, status, len)) = head_of(rest) {
        if rest.len() < end + 4 + len {
            break;
        }
        out.push((status, rest[end + 4..end + 4 + len].to_vec()));
        rest = &rest[end + 4 + len..];
    }
    out
}
