//! The proxy. hyper serves every client connection (`server`) and sends every upstream
//! request (one pooled client); goodput's own code is the four phases of `Proxy::handle`,
//! each in its own file, read in the order a request meets them:
//!
//! 1. `admit`: refuse what must not be forwarded, header hygiene, the body within its limit;
//!    metered paths (chat, completions) read it whole, skim its JSON and may ask for usage.
//! 2. `route`: the request's route and SLA class, its record and sampling; per attempt a
//!    backend chosen by the router and a slot of its capacity.
//! 3. `forward`: the upstream call within its timeouts, and failover while it is safe. (A
//!    model list on a route with several backends is `models`': every backend's, merged.)
//! 4. `meter`: the answer's head cleaned and labelled, its body forwarded frame by frame
//!    while it is metered, and the request's record filed exactly once; on h2, `stall`
//!    ends an answer whose client has granted it no window for `limits.send_timeout_ms`.
//!
//! Whatever goes wrong is one `error::Error`, whose kind decides the client's status and
//! body, the metrics and the record.

// On the request path: no function over clippy.toml's line threshold.
#![warn(clippy::too_many_lines)]

pub mod admit;
pub mod error;
pub mod forward;
pub mod headers;
pub mod meter;
pub mod models;
pub mod rewake;
pub mod route;
pub mod server;
pub mod stall;

use bytes::Bytes;
use http::{Request, Response, header};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::config::ConfigHandle;
use crate::meter::metrics::Metrics;
use crate::meter::recorder::Recorder;
use crate::route::{Router, SloHeaders};
pub use error::error_response;
use error::{Error, Kind};
use meter::{MeteredBody, MeteredRequest, Upstream};
pub use server::serve;

/// The request body as hyper's client sends it upstream.
pub type UpstreamBody = Either<Full<Bytes>, admit::StreamingBody>;
/// The response body the client gets: the upstream's, metered (on h2 under a watchdog for a
/// client that stops taking it), or goodput's own error body.
pub type ProxyBody = Either<Either<MeteredBody, stall::Watched<MeteredBody>>, Full<Bytes>>;

pub struct Proxy {
    pub config: Arc<ConfigHandle>,
    pub recorder: Recorder,
    pub metrics: Metrics,
    pub router: Arc<Router>,
    client: Client<crate::tls::Connector, UpstreamBody>,
    ready: AtomicBool,
    /// Set on SIGTERM: /readyz answers 503 so that load balancers stop sending.
    pub draining: AtomicBool,
    next_id: AtomicU64,
    /// Which scorers run: sampled requests keep their body and text for them.
    sampling: Sampling,
    out_of_fds: error::Quiet,
}

/// The scorers that are running (read at start-up).
#[derive(Debug, Clone, Copy, Default)]
pub struct Sampling {
    pub perplexity: bool,
    pub consistency: bool,
}

impl Proxy {
    /// The path of one request: admit → route → forward → meter.
    pub async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
        client: Option<SocketAddr>,
    ) -> Response<ProxyBody> {
        let t0 = Instant::now();
        let snap = self.config.load_full();
        let cfg = &snap.config;
        let h2 = req.version() == http::Version::HTTP_2;

        // 1. Admit.
        let admitted = match admit::request_filter(req, client, cfg, &self.metrics).await {
            Ok(a) => a,
            Err(e) => return self.fail(e, None),
        };

        // 2. Route: the class, and for metered requests the record.
        let parts = &admitted.parts;
        let model = admitted.metered.as_ref().and_then(|m| m.model()).map(str::to_owned);
        let route = snap.route(parts.uri.path(), model.as_deref(), &parts.headers);
        let slo_headers = SloHeaders::from(&parts.headers);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let prompt = admitted.metered.as_ref().and_then(|m| {
            m.info.prompt.and_then(|(a, z)| m.original.get(a..z).map(|_| m.original.slice(a..z)))
        });
        let mut metered = admitted.metered.map(|m| {
            let at = route::Start { t0, client_time: admitted.client_time, id, sampling: self.sampling };
            route::start_record(m, route, slo_headers, &parts.headers, cfg, at)
        });

        // A model list is every backend's, not the one the router would pick.
        if models::merges(&admitted.parts, &admitted.body, route) {
            return models::list(&self, &snap, route, admitted.parts).await;
        }

        // 3. Forward, choosing a backend per attempt.
        let out = forward::Outbound {
            parts: admitted.parts,
            body: admitted.body,
            route,
            slo_headers,
            model: model.as_deref(),
            id,
            prompt,
        };
        let (resp, peer, first_token_by) = match forward::forward(&self, &snap, out, &mut metered).await {
            Ok(r) => r,
            Err(e) => return self.fail(e, metered),
        };
        self.ready.store(true, Ordering::Relaxed);

        // 4. Meter the answer on its way to the client. An h2 stream the client stops taking
        //    blocks no socket write (the send timeout's cue), so it gets a watchdog.
        let upstream = Upstream {
            backend: peer.backend,
            reason: peer.reason,
            pick: peer.pick,
            dispatch: peer.dispatch,
            first_token_by,
        };
        let resp = meter::response_filter(resp, metered, upstream, cfg, &self.recorder);
        resp.map(|body| match h2 {
            false => Either::Left(Either::Left(body)),
            true => {
                let after = Duration::from_millis(cfg.limits.send_timeout_ms);
                let policy = stall::Policy { after, counter: self.metrics.client_send_timeouts.clone() };
                Either::Left(Either::Right(policy.watch(body)))
            }
        })
    }

    /// The answer to a request goodput refused or could not forward; a metered request's record
    /// is filed with the error's outcome.
    fn fail(&self, e: Error, metered: Option<MeteredRequest>) -> Response<ProxyBody> {
        // Refused for want of capacity, not for the request's fault: what an operator must see.
        if matches!(e.kind, Kind::AtCapacity | Kind::Shed | Kind::NoEndpoint | Kind::OutOfDescriptors) {
            self.metrics.rejected.with_label_values(&[e.kind.code()]).inc();
        }
        let mut which = None;
        if let Some(MeteredRequest { mut record, payload, t0, .. }) = metered {
            record.status = e.kind.status().as_u16();
            record.outcome = e.kind.outcome();
            record.e2e = t0.elapsed();
            which =
                Some((record.id, record.request_id.clone(), record.backend.clone(), record.endpoint.clone()));
            self.recorder.submit(record, payload);
        }
        if e.kind.is_upstream() {
            // Which request and server, so that the line can be found from the client's trace
            // and its record (ids and addresses only: never the request's content).
            let w = which.as_ref();
            tracing::warn!(
                id = w.map(|w| w.0),
                request_id = w.and_then(|w| w.1.as_deref()),
                backend = w.map(|w| &*w.2),
                endpoint = w.map(|w| &*w.3).filter(|e| !e.is_empty()),
                kind = e.kind.code(),
                error = %DisplayChain(&e),
                "upstream failure"
            );
        } else if e.kind == Kind::OutOfDescriptors {
            // goodput's own limit, the operator's to raise (`raise_fd_limit` in the command);
            // every request then fails alike, so once a second.
            if let Some(more) = self.out_of_fds.due() {
                tracing::warn!(kind = e.kind.code(), error = %DisplayChain(&e), more_since_last_line = more, "request refused: goodput is out of file descriptors");
            }
        } else {
            tracing::debug!(kind = e.kind.code(), error = %e, "request refused");
        }
        e.response()
    }

    pub fn new(
        config: Arc<ConfigHandle>,
        recorder: Recorder,
        metrics: Metrics,
        sampling: Sampling,
        connector: crate::tls::Connector,
    ) -> Arc<Proxy> {
        let pool_idle = Duration::from_millis(config.load().config.timeouts.pool_idle_ms);
        let client = crate::tls::client_builder(pool_idle).pool_max_idle_per_host(1024).build(connector);
        Arc::new(Proxy {
            config,
            recorder,
            router: Arc::new(
                Router::new(metrics.route_decisions.clone())
                    .with_endpoint_metric(metrics.endpoint_decisions.clone()),
            ),
            metrics,
            client,
            ready: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            next_id: AtomicU64::new(1),
            sampling,
            out_of_fds: error::Quiet::new(),
        })
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed) && !self.draining.load(Ordering::Relaxed)
    }

    /// Probe the upstream until it answers anything at all; /readyz turns ready then.
    pub fn spawn_readiness_probe(self: &Arc<Self>) {
        let this = self.clone();
        tokio::spawn(async move {
            let models = http::uri::PathAndQuery::from_static("/v1/models");
            while !this.is_ready() {
                let backend = this.config.load().default_backend().clone();
                if let Some(e) = backend.any_endpoint()
                    && let Ok(uri) = backend.uri(&e, &models)
                    && let Ok(req) = Request::get(uri)
                        .header(header::USER_AGENT, "goodput-readiness")
                        .body(Either::Left(Full::new(Bytes::new())))
                    && let Ok(Ok(_)) =
                        tokio::time::timeout(Duration::from_secs(5), this.client.request(req)).await
                {
                    this.ready.store(true, Ordering::Relaxed);
                    tracing::info!(upstream = %backend.describe(), "upstream answered; ready");
                    return;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
    }
}

/// An error and its causes on one line, for the log.
pub(super) struct DisplayChain<'a>(pub &'a (dyn std::error::Error + 'a));

impl std::fmt::Display for DisplayChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(s) = source {
            write!(f, ": {s}")?;
            source = s.source();
        }
        Ok(())
    }
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy").finish_non_exhaustive()
    }
}
