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
use crate::meter::window::WindowSnapshot;
use crate::quality::sampler::{forced, key, sampled};
use crate::route::{Dispatch, Reason, Router, SloHeaders};

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

/// A backend chosen for one attempt, with a slot of its capacity claimed.
pub struct Peer {
    /// Index into `Snapshot::backends`.
    pub index: usize,
    pub backend: Arc<ResolvedBackend>,
    pub reason: Reason,
    pub dispatch: Dispatch,
}

/// Choose a backend for one attempt of a request; `tried` have failed it already. A backend
/// that filled up between the choice and the claim is chosen again (rare); when every
/// candidate is at its `max_concurrency`, the request is refused with 503 and Retry-After.
#[allow(clippy::too_many_arguments)]
pub fn upstream_peer(
    router: &Router,
    windows: &arc_swap::ArcSwap<std::collections::HashMap<String, WindowSnapshot>>,
    snap: &Snapshot,
    route: &ResolvedRoute,
    slo_headers: SloHeaders,
    id: u64,
    tried: &[usize],
) -> Result<Peer, Error> {
    for _ in 0..=8 {
        // The statistics snapshot is read per attempt and never held across an await.
        let choice = router.choose(snap, route, slo_headers, &windows.load(), id, tried);
        if choice.at_capacity {
            break;
        }
        let backend = &snap.backends[choice.backend];
        if let Some(dispatch) = Dispatch::try_start(&backend.state, backend.max_concurrency) {
            return Ok(Peer {
                index: choice.backend,
                backend: backend.clone(),
                reason: choice.reason,
                dispatch,
            });
        }
    }
    Err(Error::new(Kind::AtCapacity, "every backend of this route is at its max_concurrency; retry later")
        .retry_after(snap.config.limits.retry_after_secs))
}

/// The record names the backend that serves the request and the model as that backend knows
/// it (a route with `rewrite_model` sends the backend's own name).
pub fn label(
    record: &mut RequestRecord,
    backend: &ResolvedBackend,
    route: &ResolvedRoute,
    model: Option<&str>,
) {
    record.backend = backend.name.clone();
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
