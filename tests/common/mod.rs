//! Test helpers: run the real `goodput` binary, upstream test doubles, an HTTP client.
#![allow(dead_code)]

pub mod llama;
pub mod prom;
pub mod vllm;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;

/// How long a test waits on the quality scorers. They run at SCHED_IDLE by design, so while
/// the suite's other tests keep both cores busy they progress only in the gaps: a check whose
/// embeddings take 0.5 s idle took 4 s beside three nice-10 loops and over 28 s beside two at
/// nice 0. This bounds a hang, not a speed.
pub const SCORER_PATIENCE: Duration = Duration::from_secs(180);

/// A running `goodput serve` process, killed on drop.
pub struct Goodput {
    pub child: Child,
    pub proxy: SocketAddr,
    pub admin: SocketAddr,
    pub dir: PathBuf,
    pub config: PathBuf,
    /// The rest of its stdout, after the line that says where it listens (kept open, so
    /// that what goodput writes there later, such as `--request-log -`, can be read).
    pub stdout: Option<BufReader<std::process::ChildStdout>>,
}

impl Drop for Goodput {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn temp_dir(tag: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let d = std::env::temp_dir().join(format!("goodput-test-{}-{tag}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

impl Goodput {
    /// Start the binary with `yaml` as its config, on ephemeral loopback ports.
    pub fn start(yaml: &str) -> Goodput {
        Self::start_with(yaml, &[])
    }

    pub fn start_with(yaml: &str, extra: &[&str]) -> Goodput {
        Self::spawn(yaml, extra, &[], false, None)
    }

    /// Logged, started with this soft and hard limit on open files.
    pub fn start_with_nofile(yaml: &str, soft: u64, hard: u64) -> Goodput {
        Self::spawn(yaml, &[], &[("RUST_LOG", "info")], true, Some((soft, hard)))
    }

    /// Like `start_with`, with extra environment, and stderr kept in `self.log()`.
    pub fn start_logged(yaml: &str, extra: &[&str], env: &[(&str, &str)]) -> Goodput {
        Self::spawn(yaml, extra, env, true, None)
    }

    fn spawn(
        yaml: &str,
        extra: &[&str],
        env: &[(&str, &str)],
        log: bool,
        nofile: Option<(u64, u64)>,
    ) -> Goodput {
        let dir = temp_dir("gp");
        let config = dir.join("goodput.yaml");
        std::fs::write(&config, yaml).unwrap();
        let stderr = if log {
            Stdio::from(std::fs::File::create(dir.join("stderr.log")).unwrap())
        } else {
            Stdio::inherit()
        };
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_goodput"));
        cmd.args(["serve", "--config"])
            .arg(&config)
            .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
            .args(extra)
            .env("RUST_LOG", "warn")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(stderr);
        // A test binary that is killed (a timeout, ^C) runs no Drop: goodput would outlive it,
        // polling its backends' ports every second, and a later test's listener that gets one
        // of those ports would see requests it never sent. The kernel kills it instead, when
        // the spawning *thread* exits: so start goodput on the test's own thread, never on a
        // blocking-pool thread, which may exit while the test still uses it.
        // SAFETY: prctl and setrlimit are async-signal-safe and touch nothing of the parent's
        // state.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                if let Some((soft, hard)) = nofile {
                    let l = libc::rlimit { rlim_cur: soft, rlim_max: hard };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &l) == -1 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().expect("spawn goodput");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let field = |k: &str| -> SocketAddr {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(k))
                .unwrap_or_else(|| panic!("no {k} in {line:?}"))
                .parse()
                .unwrap()
        };
        Goodput { proxy: field("proxy="), admin: field("admin="), child, dir, config, stdout: Some(stdout) }
    }

    /// What the process wrote to stderr (with `start_logged`).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("stderr.log")).unwrap_or_default()
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.proxy, path)
    }

    pub async fn metrics(&self) -> String {
        let r = send(self.admin, Request::get("/metrics").body(Full::default()).unwrap()).await;
        String::from_utf8(r.body.to_vec()).unwrap()
    }

    /// Wait until /readyz answers 200. goodput's start-up probe of the upstream is then over,
    /// so it holds no pooled upstream connection: for tests that count connections (on a busy
    /// machine the probe's connection was sometimes the one a request reused).
    pub async fn wait_ready(&self) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while send(self.admin, Request::get("/readyz").body(Full::default()).unwrap()).await.status != 200 {
            assert!(std::time::Instant::now() < deadline, "goodput never became ready");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    pub async fn admin_json(&self, path: &str) -> serde_json::Value {
        let r = send(self.admin, Request::get(path).body(Full::default()).unwrap()).await;
        serde_json::from_slice(&r.body).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// Wait until the router's statistics of `backend` hold at least `n` samples: a request's
    /// record reaches them at the recorder's next publish (a fraction of a second), and until
    /// the first has, an unmeasured backend is held back (one request at a time).
    pub async fn wait_samples(&self, backend: &str, n: u64) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let v = self.admin_json("/admin/routes").await;
            let samples = v["routes"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|r| r["backends"].as_array().unwrap())
                .find(|b| b["backend"] == backend)
                .and_then(|b| b["stats"]["samples"].as_u64())
                .unwrap_or(0);
            if samples >= n {
                return;
            }
            assert!(Instant::now() < deadline, "{backend} never had {n} samples: {v}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Wait until at least `n` records exist, then return them (newest first).
    pub async fn records(&self, n: usize) -> Vec<serde_json::Value> {
        self.records_when(n, "", |_| true).await
    }

    /// Wait until at least `n` records exist and `ready` holds for them (newest first), e.g.
    /// until the recorder has filed a score that another thread counted first.
    pub async fn records_when(
        &self,
        n: usize,
        what: &str,
        ready: impl Fn(&[serde_json::Value]) -> bool,
    ) -> Vec<serde_json::Value> {
        self.poll_records(n, &ready, Duration::from_secs(20))
            .await
            .unwrap_or_else(|a| panic!("expected {n} records {what}, have {a:?}"))
    }

    /// `records_when`, for a condition the idle-priority scorers must bring about: it waits
    /// up to `SCORER_PATIENCE`, and on timeout says what the scorers did (their metrics), not
    /// every record.
    pub async fn scored_when(
        &self,
        n: usize,
        what: &str,
        ready: impl Fn(&[serde_json::Value]) -> bool,
    ) -> Vec<serde_json::Value> {
        let a = match self.poll_records(n, &ready, SCORER_PATIENCE).await {
            Ok(a) => return a,
            Err(a) => a,
        };
        let m = self.metrics().await;
        let scorers: Vec<&str> = m
            .lines()
            .filter(|l| {
                let ours = ["goodput_scor", "goodput_shadow_skipped", "goodput_consistency"];
                !l.starts_with('#') && !l.contains("_bucket") && ours.iter().any(|p| l.starts_with(p))
            })
            .collect();
        panic!(
            "no {n} records {what} after {SCORER_PATIENCE:?} ({} records); the scorers' metrics:\n{}",
            a.len(),
            scorers.join("\n")
        )
    }

    /// The records once `ready` holds for at least `n` of them, or the last seen at `patience`.
    async fn poll_records(
        &self,
        n: usize,
        ready: &impl Fn(&[serde_json::Value]) -> bool,
        patience: Duration,
    ) -> Result<Vec<serde_json::Value>, Vec<serde_json::Value>> {
        let deadline = Instant::now() + patience;
        loop {
            let v = self.admin_json("/admin/records?limit=10000").await;
            let a = v.as_array().unwrap().clone();
            if a.len() >= n && ready(&a) {
                return Ok(a);
            }
            if Instant::now() >= deadline {
                return Err(a);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The record of the request that started last. Records are listed in the order they were
/// filed, which is after each answer's last write: a request that follows another at once can
/// be filed first when the proxy's thread is preempted in between.
pub fn latest(recs: &[serde_json::Value]) -> &serde_json::Value {
    recs.iter().max_by_key(|r| r["id"].as_u64()).expect("no records")
}

/// The reference model's directory and ONNX Runtime's library, as scripts/test.sh exports them.
pub fn reference_model() -> (String, String) {
    let get = |k: &str| {
        std::env::var(k).unwrap_or_else(|_| {
            panic!("{k} is not set: run the suite with scripts/test.sh (it sets up the model)")
        })
    };
    (get("GOODPUT_MODEL_DIR"), get("ORT_DYLIB_PATH"))
}

/// A loopback port nothing listens on (yet), for a server started as a child process, which
/// binds it seconds later (llama.cpp's server after loading its model). It is taken below the
/// kernel's ephemeral range: a port from `bind(0)` is free again the moment it is closed, and
/// until the child binds it, any test's listener or outgoing connection could be given it.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FROM: u32 = 20000;
    // Read once per test binary: the ports below the ephemeral range, and a counter from a
    // random start, so that consecutive calls in it never collide.
    static BELOW_EPHEMERAL: std::sync::OnceLock<Option<(u32, AtomicU32)>> = std::sync::OnceLock::new();
    let below = BELOW_EPHEMERAL.get_or_init(|| {
        let low: u32 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|r| r.split_whitespace().next()?.parse().ok())?;
        let start = std::process::id().wrapping_mul(7919)
            ^ std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
        (low > FROM + 1000).then(|| (low - FROM, AtomicU32::new(start)))
    });
    if let Some((span, next)) = below {
        for _ in 0..*span {
            let port = (FROM + next.fetch_add(1, Ordering::Relaxed) % span) as u16;
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return port;
            }
        }
    }
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A loopback port that refuses connections for as long as the returned socket lives: bound,
/// never listening, so no concurrently running test can take it over (a port merely found free
/// could be bound by another test's listener a moment later).
pub fn refusing_port() -> (tokio::net::TcpSocket, u16) {
    let s = tokio::net::TcpSocket::new_v4().unwrap();
    s.set_reuseport(true).unwrap();
    s.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let port = s.local_addr().unwrap().port();
    (s, port)
}

/// Start listening on a port held by `refusing_port`, while it is still held. Dropping the
/// holder first and binding again races every other socket on the machine for that port
/// (CI saw AddrInUse); SO_REUSEPORT on both sockets of this process keeps it ours throughout.
pub fn listen_on_refusing_port(port: u16) -> tokio::net::TcpListener {
    let s = tokio::net::TcpSocket::new_v4().unwrap();
    s.set_reuseport(true).unwrap();
    s.bind(SocketAddr::from(([127, 0, 0, 1], port))).unwrap();
    s.listen(128).unwrap()
}

/// The in-process simulator as an upstream, with fixed delays and output length.
pub async fn spawn_sim(
    ttft_ms: f64,
    tpot_ms: f64,
    output_tokens: u32,
) -> (SocketAddr, std::sync::Arc<goodput::sim::Sim>) {
    let cfg = goodput::sim::SimConfig { ttft_ms, tpot_ms, output_tokens, ..Default::default() };
    goodput::sim::spawn(cfg, "127.0.0.1:0").await.unwrap()
}

/// Sum of all samples of `name` whose labels include every `k="v"` in `labels`.
pub fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    series(text, name, labels).iter().sum()
}

/// The values of every series `name{labels}` in a Prometheus text exposition (empty when
/// none exists, which `metric` cannot tell from a series at 0).
pub fn series(text: &str, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            let (n, rest) = l.split_at(l.find(['{', ' ']).unwrap_or(l.len()));
            n == name && labels.iter().all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .collect()
}

/// Poll goodput's /metrics until `name{labels}` reaches `at_least` (20 s at most); the text
/// that reached it.
pub async fn wait_metric(gp: &Goodput, name: &str, labels: &[(&str, &str)], at_least: f64) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let text = gp.metrics().await;
        if metric(&text, name, labels) >= at_least {
            return text;
        }
        assert!(std::time::Instant::now() < deadline, "{name}{labels:?} never reached {at_least}:\n{text}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// Each body frame with its arrival time.
    pub frames: Vec<(Instant, Bytes)>,
    pub sent_at: Instant,
    pub error: Option<String>,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("{e}: {:?}", self.body))
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// One HTTP/1.1 request on a fresh connection; reads the whole body, frame by frame.
pub async fn send(addr: SocketAddr, req: Request<Full<Bytes>>) -> Reply {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    let mut req = req;
    if !req.headers().contains_key("host") {
        req.headers_mut().insert("host", addr.to_string().parse().unwrap());
    }
    let sent_at = Instant::now();
    let resp = sender.send_request(req).await.unwrap();
    read_reply(resp, sent_at).await
}

/// The status of `GET path`, or None when the server is not answering yet. A server that is
/// still starting may accept a connection and then reset it (seen with llama.cpp's uvicorn), so
/// a readiness probe must not treat a transport error as fatal.
pub async fn probe(addr: SocketAddr, path: &str) -> Option<u16> {
    let stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.ok()?;
    tokio::spawn(conn);
    let req = Request::get(path).header("host", addr.to_string()).body(Full::<Bytes>::default()).ok()?;
    let resp = tokio::time::timeout(Duration::from_secs(10), sender.send_request(req)).await.ok()?.ok()?;
    Some(resp.status().as_u16())
}

pub async fn read_reply(resp: Response<Incoming>, sent_at: Instant) -> Reply {
    let (parts, mut body) = resp.into_parts();
    let mut frames = Vec::new();
    let mut all = Vec::new();
    let mut error = None;
    loop {
        match body.frame().await {
            None => break,
            Some(Err(e)) => {
                // With its causes: hyper's own message alone ("error reading a body from
                // connection") does not say whether the peer cut the body or reset.
                let mut chain = e.to_string();
                let mut source = std::error::Error::source(&e);
                while let Some(s) = source {
                    chain += &format!(": {s}");
                    source = s.source();
                }
                error = Some(chain);
                break;
            }
            Some(Ok(f)) => {
                if let Ok(d) = f.into_data() {
                    all.extend_from_slice(&d);
                    frames.push((Instant::now(), d));
                }
            }
        }
    }
    Reply { status: parts.status, headers: parts.headers, body: all.into(), frames, sent_at, error }
}

pub fn post_json(path: &str, body: &str) -> Request<Full<Bytes>> {
    Request::post(path)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

/// A scripted upstream: answers each path with fixed bytes in fixed frames, and keeps
/// every request it received.
#[derive(Clone)]
pub struct Canned {
    pub status: u16,
    pub content_type: &'static str,
    pub frames: Vec<Bytes>,
    pub gap: Duration,
    /// After the frames: stall forever (idle timeout) or abort (reset).
    pub then: Then,
    pub delay_headers: Duration,
}

#[derive(Clone, Copy, PartialEq)]
pub enum Then {
    End,
    Stall,
    Reset,
}

#[derive(Clone, Default)]
pub struct Seen {
    pub requests: Arc<Mutex<Vec<(String, HeaderMap, Bytes)>>>,
}

pub async fn spawn_canned(routes: Vec<(&'static str, Canned)>) -> (SocketAddr, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Seen::default();
    let s2 = seen.clone();
    let routes = Arc::new(routes);
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let routes = routes.clone();
            let seen = s2.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let routes = routes.clone();
                    let seen = seen.clone();
                    async move {
                        let path = req.uri().path().to_string();
                        let (parts, body) = req.into_parts();
                        let body = body.collect().await.map(|c| c.to_bytes()).unwrap_or_default();
                        // goodput's own requests (readiness, /metrics and /v1/models polls)
                        // are not the traffic under test.
                        let probe = parts
                            .headers
                            .get("user-agent")
                            .is_some_and(|v| v == "goodput-readiness" || v == "goodput-watch");
                        if !probe {
                            seen.requests.lock().unwrap().push((path.clone(), parts.headers, body));
                        }
                        let Some(c) = routes.iter().find(|(p, _)| *p == path).map(|(_, c)| c.clone()) else {
                            let r = Response::builder()
                                .status(404)
                                .body(goodput::sim::ChannelBody::new(tokio::sync::mpsc::channel(1).1));
                            return Ok(r.unwrap());
                        };
                        tokio::time::sleep(c.delay_headers).await;
                        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(8);
                        let frames = c.frames.clone();
                        tokio::spawn(async move {
                            for (i, f) in frames.into_iter().enumerate() {
                                if i > 0 {
                                    tokio::time::sleep(c.gap).await;
                                }
                                if tx.send(Ok(f)).await.is_err() {
                                    return;
                                }
                            }
                            match c.then {
                                Then::End => {}
                                Then::Stall => {
                                    tx.closed().await;
                                }
                                Then::Reset => {
                                    // Let the last frame reach the wire before aborting.
                                    tokio::time::sleep(Duration::from_millis(50)).await;
                                    let _ = tx.send(Err(std::io::Error::other("reset"))).await;
                                }
                            }
                        });
                        let resp = Response::builder()
                            .status(c.status)
                            .header("content-type", c.content_type)
                            .header("x-upstream", "canned")
                            .body(goodput::sim::ChannelBody::new(rx))
                            .unwrap();
                        Ok::<_, std::convert::Infallible>(resp)
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, seen)
}

/// An HTTP relay in front of a real server that keeps, for each request to `path`, the
/// response body's data frames as it handed them on: what the server really sent the client
/// (goodput), to hold goodput's own counts against. Each request gets a connection of its own
/// upstream, closed when the client drops the response, so a hang-up reaches the server as it
/// would without the relay.
pub struct Tap {
    pub addr: SocketAddr,
    bodies: Arc<Mutex<Vec<Vec<Bytes>>>>,
}

impl Tap {
    pub async fn spawn(upstream: SocketAddr, path: &'static str) -> Tap {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let bodies: Arc<Mutex<Vec<Vec<Bytes>>>> = Arc::default();
        let kept = bodies.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let kept = kept.clone();
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let kept = kept.clone();
                    async move {
                        let up = tokio::net::TcpStream::connect(upstream).await.unwrap();
                        let (mut sender, conn) =
                            hyper::client::conn::http1::handshake(TokioIo::new(up)).await?;
                        let conn = AbortOnDrop(tokio::spawn(conn));
                        let slot = (req.uri().path() == path).then(|| {
                            let mut b = kept.lock().unwrap();
                            b.push(Vec::new());
                            b.len() - 1
                        });
                        let resp = sender.send_request(req).await?;
                        Ok::<_, hyper::Error>(resp.map(|inner| Tapped { inner, kept, slot, _conn: conn }))
                    }
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc),
                );
            }
        });
        Tap { addr, bodies }
    }

    /// The bodies of the requests to `path` so far, in the order they came.
    pub fn bodies(&self) -> Vec<Vec<Bytes>> {
        self.bodies.lock().unwrap().clone()
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<Result<(), hyper::Error>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A response body that keeps each data frame as it passes.
struct Tapped {
    inner: Incoming,
    kept: Arc<Mutex<Vec<Vec<Bytes>>>>,
    slot: Option<usize>,
    _conn: AbortOnDrop,
}

impl hyper::body::Body for Tapped {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, hyper::Error>>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        if let (std::task::Poll::Ready(Some(Ok(f))), Some(i)) = (&polled, self.slot)
            && let Some(d) = f.data_ref()
        {
            self.kept.lock().unwrap()[i].push(d.clone());
        }
        polled
    }
}

/// The content of each whole event of a chat completion stream that carries any, in order. A
/// last event cut short (a stream read up to a hang-up) is left out.
pub fn sse_contents(sse: &str) -> Vec<String> {
    let sse = sse.replace("\r\n", "\n");
    let whole = &sse[..sse.rfind("\n\n").map_or(0, |i| i + 2)];
    whole
        .split("\n\n")
        .filter_map(|event| event.strip_prefix("data: "))
        .filter(|data| *data != "[DONE]")
        .filter_map(|data| {
            let v: serde_json::Value = serde_json::from_str(data).expect("each event is one JSON chunk");
            v["choices"][0]["delta"]["content"].as_str().filter(|c| !c.is_empty()).map(str::to_string)
        })
        .collect()
}

pub fn canned_json(body: &str) -> Canned {
    Canned {
        status: 200,
        content_type: "application/json",
        frames: vec![Bytes::from(body.to_string())],
        gap: Duration::ZERO,
        then: Then::End,
        delay_headers: Duration::ZERO,
    }
}

pub fn canned_sse(events: &[&str], gap: Duration) -> Canned {
    Canned {
        status: 200,
        content_type: "text/event-stream",
        frames: events.iter().map(|e| Bytes::from(e.to_string())).collect(),
        gap,
        then: Then::End,
        delay_headers: Duration::ZERO,
    }
}

/// A TCP upstream that runs `f` on every connection it accepts.
pub async fn raw_upstream<F, Fut>(f: F) -> SocketAddr
where
    F: Fn(tokio::net::TcpStream) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let f = Arc::new(f);
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let f = f.clone();
            tokio::spawn(async move {
                let mut s = s;
                if is_watch(&s).await {
                    use tokio::io::AsyncWriteExt;
                    let _ = s
                        .write_all(
                            b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                        )
                        .await;
                    return;
                }
                f(s).await
            });
        }
    });
    addr
}

/// goodput's own polls of an upstream (`/metrics`, `/v1/models`) are answered 404 here, so
/// that a raw upstream's handler sees only the traffic under test: such a poll is found by
/// peeking at the head without taking it off the socket.
async fn is_watch(s: &tokio::net::TcpStream) -> bool {
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(1);
    while Instant::now() < deadline {
        let n = match tokio::time::timeout(Duration::from_millis(50), s.peek(&mut buf)).await {
            Ok(Ok(n)) => n,
            Ok(Err(_)) => return false,
            Err(_) => continue,
        };
        let head = String::from_utf8_lossy(&buf[..n]).to_ascii_lowercase();
        if head.contains("\r\n\r\n") || n == buf.len() {
            return head.contains("user-agent: goodput-watch");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    false
}

/// A complete HTTP/1.1 head at the front of `buf`: (its length less the blank line, the status
/// for a response, the content-length).
pub fn head_of(buf: &[u8]) -> Option<(usize, u16, usize)> {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let len = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    Some((end, status, len))
}

/// Read one request (head and content-length body) off the socket.
pub async fn read_request(s: &mut tokio::net::TcpStream) -> bool {
    read_request_bytes(s).await.is_some()
}

/// One whole request (head and content-length body) read from `s`, or `None` at its end.
pub async fn read_request_bytes(s: &mut tokio::net::TcpStream) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        if let Some((end, _, len)) = head_of(&buf)
            && buf.len() >= end + 4 + len
        {
            return Some(buf);
        }
        match tokio::io::AsyncReadExt::read(s, &mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// join_all without the futures crate: the requests run concurrently on the runtime.
pub async fn join_all<F: std::future::Future + Send + 'static>(fs: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F::Output: Send,
{
    let handles: Vec<_> = fs.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}
