//! Router statistics from Prometheus's HTTP query API, so that several router replicas decide
//! on one view: every replica (or sidecar) exports its windows' raw material as metrics,
//! Prometheus aggregates them by backend, and each replica reads the same numbers back.
//! Latency comes from the histograms over `routing.stats.range`, quality over
//! `quality.window_secs`. Perplexity here is the histogram's median (the local windows use
//! the geometric mean; both are typical values that one degenerate response cannot drag).

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Router;
use super::decide::Stats;
use crate::config::{ConfigHandle, StatsSource};

type HttpClient = Client<HttpConnector, Full<Bytes>>;

fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `{a,b}` from the non-empty matchers.
fn matchers(parts: &[&str]) -> String {
    let v: Vec<&str> = parts.iter().copied().filter(|p| !p.trim().is_empty()).collect();
    format!("{{{}}}", v.join(","))
}

/// One instant query: value by `backend` label.
async fn query(client: &HttpClient, base: &str, q: &str) -> Result<HashMap<String, f64>, String> {
    let url = format!("{}/api/v1/query?query={}", base.trim_end_matches('/'), encode(q));
    let req = http::Request::get(url).body(Full::new(Bytes::new())).map_err(|e| e.to_string())?;
    let resp = tokio::time::timeout(Duration::from_secs(5), client.request(req))
        .await
        .map_err(|_| "Prometheus did not answer within 5 s".to_string())?
        .map_err(|e| format!("cannot reach Prometheus: {e}"))?;
    let status = resp.status();
    let body = http_body_util::Limited::new(resp.into_body(), 8 * 1024 * 1024)
        .collect()
        .await
        .map_err(|e| format!("reading Prometheus's answer: {e}"))?
        .to_bytes();
    let v: serde_json::Value = serde_json::from_slice(&body)
        .map_err(|e| format!("Prometheus answered {status} with invalid JSON: {e}"))?;
    if v["status"] != "success" {
        return Err(format!(
            "Prometheus answered {status}: {}",
            v["error"].as_str().unwrap_or("no error text")
        ));
    }
    let mut out = HashMap::new();
    for r in v["data"]["result"].as_array().into_iter().flatten() {
        let (Some(b), Some(x)) = (r["metric"]["backend"].as_str(), r["value"][1].as_str()) else { continue };
        if let Ok(x) = x.parse::<f64>()
            && x.is_finite()
        {
            out.insert(b.to_string(), x);
        }
    }
    Ok(out)
}

/// The queries for every backend at once, and the statistics they give.
pub async fn read(
    client: &HttpClient,
    base: &str,
    range: &str,
    quality_range_secs: u64,
    selector: &str,
) -> Result<HashMap<String, Stats>, String> {
    let sel = matchers(&[selector]);
    let ok = matchers(&["outcome=\"ok\"", selector]);
    let out = matchers(&["type=\"output\"", selector]);
    let band_lower = matchers(&["end=\"lower\"", selector]);
    let qr = format!("{quality_range_secs}s");
    let p95 = |m: &str, s: &str| {
        format!("histogram_quantile(0.95, sum by (backend, le) (rate({m}_bucket{s}[{range}]))) * 1000")
    };
    let qs = [
        format!("sum by (backend) (increase(goodput_requests_total{sel}[{range}]))"),
        p95("gen_ai_server_time_to_first_token_seconds", &sel),
        p95("gen_ai_server_time_per_output_token_seconds", &sel),
        p95("gen_ai_server_request_duration_seconds", &ok),
        format!("sum by (backend) (rate(goodput_tokens_total{out}[{range}]))"),
        format!("sum by (backend) (increase(goodput_response_perplexity_count{sel}[{qr}]))"),
        format!(
            "histogram_quantile(0.5, sum by (backend, le) (rate(goodput_response_perplexity_bucket{sel}[{qr}])))"
        ),
        format!("sum by (backend) (increase(goodput_consistency_rated_total{sel}[{qr}]))"),
        format!("sum by (backend) (increase(goodput_consistency_hallucinated_total{sel}[{qr}]))"),
        format!("sum by (backend) (increase(goodput_consistency_hallucinated_band_total{band_lower}[{qr}]))"),
    ];
    let mut r = Vec::with_capacity(qs.len());
    for q in &qs {
        r.push(query(client, base, q).await?);
    }
    let mut names: Vec<&String> = r.iter().flat_map(|m| m.keys()).collect();
    names.sort();
    names.dedup();
    let stats = names.into_iter().map(|b| (b.clone(), stats_of(|i| r[i].get(b).copied()))).collect();
    Ok(stats)
}

/// One backend's statistics from its value of each query, in `read`'s order.
fn stats_of(g: impl Fn(usize) -> Option<f64>) -> Stats {
    let count = |i: usize| g(i).unwrap_or(0.0).round() as u64;
    let rated = count(7);
    // The band's counter is absent from replicas older than it: then the verdicts' own interval.
    let lower = if g(9).is_some() { count(9) } else { count(8) };
    Stats {
        samples: count(0),
        ttft_p95_ms: g(1),
        tpot_p95_ms: g(2),
        e2e_p95_ms: g(3),
        tokens_per_sec: g(4).unwrap_or(0.0),
        scored: count(5),
        perplexity: g(6),
        rated,
        hallucination_rate: (rated > 0).then(|| (g(8).unwrap_or(0.0) / g(7).unwrap_or(1.0)).min(1.0)),
        hallucination_rate_lower: crate::goodput::wilson(lower, rated, 1.96).map(|i| i.0),
    }
}

/// Refresh the router's statistics from Prometheus while the config says so (reloads can turn
/// it on and off). A failed read keeps the last good view for three refresh periods, then the
/// router falls back to this process's own windows rather than deciding on stale numbers.
/// `reads` is `goodput_route_stats_reads_total{result}`.
pub fn spawn_refresher(config: Arc<ConfigHandle>, router: Arc<Router>, reads: prometheus::IntCounterVec) {
    tokio::spawn(async move {
        let client: HttpClient = Client::builder(TokioExecutor::new()).build(HttpConnector::new());
        let mut last_ok: Option<Instant> = None;
        loop {
            let snap = config.load_full();
            let s = &snap.config.routing.stats;
            let period = Duration::from_secs(s.refresh_secs.max(1));
            match (s.source, &s.prometheus_url) {
                (StatsSource::Prometheus, Some(url)) => {
                    let result =
                        read(&client, url, &s.range, snap.config.quality.window_secs, &s.selector).await;
                    let label = match result {
                        Ok(stats) => {
                            router.set_remote_stats(Some(stats));
                            last_ok = Some(Instant::now());
                            "success"
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "reading router statistics from Prometheus failed");
                            if last_ok.is_none_or(|t| t.elapsed() > period * 3) {
                                router.set_remote_stats(None);
                            }
                            "error"
                        }
                    };
                    reads.with_label_values(&[label]).inc();
                }
                _ => {
                    router.set_remote_stats(None);
                    last_ok = None;
                }
            }
            tokio::time::sleep(period).await;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_building() {
        assert_eq!(matchers(&["outcome=\"ok\"", ""]), "{outcome=\"ok\"}");
        assert_eq!(matchers(&[""]), "{}");
        assert_eq!(matchers(&["a=\"1\"", "namespace=\"llm\""]), "{a=\"1\",namespace=\"llm\"}");
        assert_eq!(encode("rate(x{a=\"b\"}[1m])"), "rate%28x%7Ba%3D%22b%22%7D%5B1m%5D%29");
    }

    #[test]
    fn the_rate_lower_bound_comes_from_the_band_counter() {
        // 40 rated, 20 judged hallucinated, 14 of them at the band's lower end.
        let values = |band: Option<f64>| {
            move |i: usize| match i {
                7 => Some(40.0),
                8 => Some(20.0),
                9 => band,
                _ => None,
            }
        };
        let s = stats_of(values(Some(14.0)));
        assert_eq!((s.rated, s.hallucination_rate), (40, Some(0.5)));
        let want = crate::goodput::wilson(14, 40, 1.96).unwrap().0;
        assert_eq!(s.hallucination_rate_lower, Some(want));
        assert!((want - 0.2213).abs() < 1e-3, "{want}");
        // A replica without the band's counter: the verdicts' own Wilson interval.
        let s = stats_of(values(None));
        assert_eq!(s.hallucination_rate_lower, Some(crate::goodput::wilson(20, 40, 1.96).unwrap().0));
        // Nothing rated: no rate and no bound.
        let s = stats_of(|_| None);
        assert_eq!((s.hallucination_rate, s.hallucination_rate_lower), (None, None));
    }
}
