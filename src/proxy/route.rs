//! Phase 2, route (pingora's `upstream_peer`): the request's route and SLA class, whether its
//! response is sampled for scoring, then per attempt a backend chosen by the router and a claim
//! on that backend's capacity.

use http::HeaderMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Sampling;
use super::admit::Metered;
use super::error::{Error, Kind};
use super::meter::MeteredRequest;
use crate::config::Config;
use crate::config::reload::{ResolvedBackend, ResolvedRoute, Snapshot};
use crate::meter::record::{Payload, RequestRecord};
use crate::meter::window::{DriftView, WindowSnapshot};
use crate::quality::sampler::{forced, key, sampled};
use crate::route::{Ask, Dispatch, Endpoint, EndpointWindows, PickReason, Reason, Router, SloHeaders};

/// When and how a request started, for its record.
pub struct Start {
    pub t0: Instant,
    /// Reading the client's body (the client's time, not the proxy's).
    pub client_time: Duration,
    pub id: u64,
    pub sampling: Sampling,
}

/// The record of a metered request, started: its route, class, SLOs and whether it is sampled.
pub fn start_record(
    metered: Metered,
    route: &ResolvedRoute,
    slo_headers: SloHeaders,
    headers: &HeaderMap,
    cfg: &Config,
    at: Start,
) -> MeteredRequest {
    let Start { t0, client_time, id, sampling } = at;
    let Metered { op, info, injected, original } = metered;
    let (ppl, cons) = sample(sampling, cfg, headers, id, route.sample_rate);
    let (ppl, cons) = (ppl && info.valid_json, cons && info.valid_json);
    let mut slo = route.slo;
    slo.ttft_ms = slo_headers.ttft_ms.or(slo.ttft_ms);
    slo.tpot_ms = slo_headers.tpot_ms.or(slo.tpot_ms);
    let record = RequestRecord {
        request_id: RequestRecord::client_request_id(headers.get("x-request-id")),
        route: route.name.clone(),
        class: route.class_name.clone(),
        slo: Some(slo),
        stream: info.stream,
        n: info.n,
        ..RequestRecord::start(id, op)
    };
    let payload = Payload {
        request: (ppl || cons).then_some(original),
        perplexity: ppl,
        consistency: cons,
        texts: None,
    };
    MeteredRequest { record, payload, n: info.n, injected, t0, client_time }
}

/// Whether this request is scored for perplexity, and checked for consistency: by the forcing
/// header, else deterministically by request id (independent draws for the two).
fn sample(s: Sampling, cfg: &Config, headers: &HeaderMap, id: u64, rate: f64) -> (bool, bool) {
    if !(s.perplexity || s.consistency) {
        return (false, false);
    }
    let q = &cfg.quality;
    let force = forced(headers.get(q.force_header.as_str()));
    let k = key(headers.get("x-request-id").map(|v| v.as_bytes()), id);
    let cons_rate = q.consistency.as_ref().map_or(0.0, |c| c.sample_rate);
    (
        s.perplexity && (force || sampled(k, rate)),
        // A different salt: the two samples are drawn independently.
        s.consistency && (force || sampled(k ^ 0x5eed_c0de_5eed_c0de, cons_rate)),
    )
}

/// A backend and one of its endpoints chosen for one attempt, with a slot of its capacity
/// claimed.
pub struct Peer {
    /// Index into `Snapshot::backends`.
    pub index: usize,
    pub backend: Arc<ResolvedBackend>,
    pub reason: Reason,
    pub endpoint: Arc<Endpoint>,
    pub pick: PickReason,
    pub dispatch: Dispatch,
}

/// What earlier attempts of this request left behind.
#[derive(Default)]
pub struct Tried {
    /// Backends (snapshot indices) with no endpoint left for it.
    pub backends: Vec<usize>,
    /// Endpoints that failed to connect for it.
    pub endpoints: Vec<Arc<Endpoint>>,
}

impl Tried {
    /// The endpoint failed before the request reached it: the next attempt goes elsewhere.
    pub fn failed(&mut self, peer: &Peer) {
        self.endpoints.push(peer.endpoint.clone());
        let eps = peer.backend.state.endpoints();
        if eps.iter().all(|e| self.endpoints.iter().any(|t| Arc::ptr_eq(t, e))) {
            self.backends.push(peer.index);
        }
    }

    /// Whether some candidate of the route has an endpoint this request has not failed at.
    pub fn any_left(&self, snap: &Snapshot, route: &ResolvedRoute) -> bool {
        route.candidates.iter().any(|&i| {
            !self.backends.contains(&i)
                && snap.backends[i]
                    .state
                    .endpoints()
                    .iter()
                    .any(|e| !self.endpoints.iter().any(|t| Arc::ptr_eq(t, e)))
        })
    }
}

/// What the router reads for one choice: the windows the recorder publishes.
pub struct Windows<'a> {
    pub backends: &'a arc_swap::ArcSwap<std::collections::HashMap<String, WindowSnapshot>>,
    pub endpoints: &'a arc_swap::ArcSwap<EndpointWindows>,
    pub drift: &'a arc_swap::ArcSwap<DriftView>,
}

/// Choose a backend, then an endpoint of its pool, for one attempt of a request. A backend
/// that filled up between the choice and the claim is chosen again (rare); when every
/// candidate is at its `max_concurrency`, the request is refused with 503 and Retry-After; a
/// class that sheds refuses with 429 when every endpoint it may use is saturated.
#[allow(clippy::too_many_arguments)]
pub fn upstream_peer(
    router: &Router,
    windows: Windows<'_>,
    snap: &Snapshot,
    route: &ResolvedRoute,
    slo_headers: SloHeaders,
    id: u64,
    tried: &Tried,
    prompt: Option<&[u8]>,
    sample: bool,
) -> Result<Peer, Error> {
    let retry = snap.config.limits.retry_after_secs;
    let mut empty: Vec<usize> = tried.backends.clone();
    for _ in 0..=8 {
        // The statistics snapshots are read per attempt and never held across an await.
        let endpoint_windows = windows.endpoints.load();
        let drift = windows.drift.load();
        let ask = Ask {
            slo: slo_headers,
            id,
            tried: &empty,
            tried_endpoints: &tried.endpoints,
            prompt,
            endpoint_windows: &endpoint_windows,
            drift: &drift,
            sample,
        };
        let mut choice = router.choose(snap, route, &windows.backends.load(), &ask);
        if let Some(why) = choice.shed {
            return Err(Error::new(
                Kind::Shed,
                format!("every endpoint this request may use is saturated: {why}; retry later"),
            )
            .retry_after(retry));
        }
        if choice.at_capacity {
            return Err(Error::new(
                Kind::AtCapacity,
                "every backend of this route is at its max_concurrency; retry later",
            )
            .retry_after(retry));
        }
        let backend = &snap.backends[choice.backend];
        let Some(endpoint) = choice.endpoint else {
            // An empty pool, or every endpoint failed this request: another backend, if any.
            empty.push(choice.backend);
            if route.candidates.iter().all(|i| empty.contains(i)) {
                break;
            }
            continue;
        };
        if let Some(dispatch) =
            Dispatch::try_start(&backend.state, &endpoint, backend.max_concurrency, choice.sample.take())
        {
            return Ok(Peer {
                index: choice.backend,
                backend: backend.clone(),
                reason: choice.reason,
                endpoint,
                pick: choice.pick,
                dispatch,
            });
        }
    }
    if route.candidates.iter().all(|i| empty.contains(i)) {
        return Err(Error::new(
            Kind::NoEndpoint,
            "no endpoint of this route's backends is known (an empty DNS answer?); retry later",
        )
        .retry_after(retry));
    }
    Err(Error::new(Kind::AtCapacity, "every backend of this route is at its max_concurrency; retry later")
        .retry_after(retry))
}

/// The record names the backend that serves the request and the model as that backend knows
/// it (a route with `rewrite_model` sends the backend's own name).
pub fn label(
    record: &mut RequestRecord,
    backend: &ResolvedBackend,
    endpoint: &Endpoint,
    route: &ResolvedRoute,
    model: Option<&str>,
) {
    record.backend = backend.name.clone();
    record.endpoint = endpoint.label.clone();
    let effective = match (route.rewrite_model, model, &backend.served_model) {
        (true, Some(m), Some(served)) if !backend.serves(m) => Some(&**served),
        _ => model,
    };
    record.model = backend.model_label(effective);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_is_off_without_scorers_and_forced_by_the_header() {
        let cfg = Config::default();
        let mut h = HeaderMap::new();
        assert_eq!(sample(Sampling::default(), &cfg, &h, 1, 1.0), (false, false));
        let on = Sampling { perplexity: true, consistency: false };
        assert_eq!(sample(on, &cfg, &h, 1, 0.0), (false, false));
        let name = http::HeaderName::from_bytes(cfg.quality.force_header.as_bytes()).unwrap();
        h.insert(name, "1".parse().unwrap());
        assert_eq!(sample(on, &cfg, &h, 1, 0.0), (true, false));
    }
}
