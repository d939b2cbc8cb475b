//! `GET /v1/models` on a route with several backends (the default route has them all): one
//! list, the union of what each backend lists, in the config's order of backends, the first
//! listing of an id kept as that backend sent it. A client then sees every model it may ask
//! for, whichever backend would serve it. Forwarded to one backend, as other unmetered paths
//! are, the list would be that backend's alone and would change with the router's pick.
//!
//! The backends are asked at once, each within `first_byte_ms` for its head and `idle_ms` for
//! its body. One that fails is left out: a connection failure is logged and counted as its
//! upstream error, an answer that is not a list is logged at debug. When none lists, the
//! client gets the first backend's answer (a 401 stays a 401) or its error.

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderValue, Method, Response, StatusCode, header};
use http_body_util::{BodyExt, Either, Full, Limited};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use super::admit::ClientBody;
use super::error::{Error, Kind};
use super::{DisplayChain, Proxy, ProxyBody, forward};
use crate::config::reload::{ResolvedBackend, ResolvedRoute, Snapshot};

/// A model list larger than this is not a model list.
const MAX_LIST_BYTES: usize = 4 << 20;

/// Whether this request is a model list that goodput answers from all of the route's backends.
pub fn merges(parts: &Parts, body: &ClientBody, route: &ResolvedRoute) -> bool {
    parts.method == Method::GET
        && parts.uri.path() == "/v1/models"
        && matches!(body, ClientBody::Whole(b) if b.is_empty())
        && route.candidates.len() > 1
}

/// What one backend gave.
enum Listed {
    /// Its list's entries, each as it sent them.
    List(Vec<Box<RawValue>>),
    /// An answer that is not a list (a 401, a 404 from a server without the endpoint).
    Answer {
        status: StatusCode,
        content_type: Option<HeaderValue>,
        body: Bytes,
    },
    Failed(Error),
}

/// Ask every backend of the route for its models, and answer with their union.
pub async fn list(
    proxy: &Proxy,
    snap: &Snapshot,
    route: &ResolvedRoute,
    parts: Parts,
) -> Response<ProxyBody> {
    let timeouts = snap.config.timeouts;
    let mut asked = tokio::task::JoinSet::new();
    for (i, &b) in route.candidates.iter().enumerate() {
        let backend = snap.backends[b].clone();
        let req = backend
            .any_endpoint()
            .ok_or_else(|| Error::new(Kind::NoEndpoint, "the pool has no endpoint"))
            .and_then(|e| {
                let body = ClientBody::Whole(Bytes::new());
                forward::upstream_request(&parts, parts.headers.clone(), body, &backend, &e, route, None)
            });
        let client = proxy.client.clone();
        asked.spawn(async move {
            let listed = match req {
                Ok(req) => ask(&client, req, &timeouts).await,
                Err(e) => Listed::Failed(e),
            };
            (i, backend, listed)
        });
    }
    let mut answers: Vec<Option<(Arc<ResolvedBackend>, Listed)>> =
        (0..route.candidates.len()).map(|_| None).collect();
    while let Some(done) = asked.join_next().await {
        if let Ok((i, backend, listed)) = done {
            answers[i] = Some((backend, listed));
        }
    }
    let mut lists = Vec::new();
    let mut listed_by = Vec::new();
    let mut first_failure = None;
    for (backend, listed) in answers.into_iter().flatten() {
        match listed {
            Listed::List(entries) => {
                lists.push(entries);
                listed_by.push(backend.name.clone());
            }
            other => {
                note_failure(proxy, &backend, &other);
                first_failure.get_or_insert(other);
            }
        }
    }
    if lists.is_empty() {
        return match first_failure {
            Some(Listed::Answer { status, content_type, body }) => {
                let mut r = Response::new(Either::Right(Full::new(body)));
                *r.status_mut() = status;
                if let Some(ct) = content_type {
                    r.headers_mut().insert(header::CONTENT_TYPE, ct);
                }
                r
            }
            Some(Listed::Failed(e)) => e.response(),
            _ => Error::new(Kind::NoEndpoint, "the route has no backend").response(),
        };
    }
    let mut r = Response::new(Either::Right(Full::new(merged(lists))));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if snap.config.routing.response_headers
        && let Ok(v) = HeaderValue::from_str(&listed_by.join(","))
    {
        r.headers_mut().insert("x-goodput-backend", v);
    }
    r
}

/// One backend's list, within the head and body timeouts.
async fn ask(
    client: &hyper_util::client::legacy::Client<crate::tls::Connector, super::UpstreamBody>,
    req: http::Request<super::UpstreamBody>,
    timeouts: &crate::config::Timeouts,
) -> Listed {
    let sent = tokio::time::timeout(Duration::from_millis(timeouts.first_byte_ms), client.request(req)).await;
    let resp = match forward::answer(sent, timeouts) {
        Ok(r) => r,
        Err(e) => return Listed::Failed(e),
    };
    let (head, body) = resp.into_parts();
    let read = Limited::new(body, MAX_LIST_BYTES).collect();
    let body = match tokio::time::timeout(Duration::from_millis(timeouts.idle_ms), read).await {
        Ok(Ok(b)) => b.to_bytes(),
        Ok(Err(e)) => {
            return Listed::Failed(
                Error::new(Kind::UpstreamProtocol, "the model list could not be read")
                    .with_source(e)
                    .sent(true),
            );
        }
        Err(_) => {
            return Listed::Failed(
                Error::new(Kind::UpstreamIdleTimeout, "the model list did not come within timeouts.idle_ms")
                    .sent(true),
            );
        }
    };
    match entries(&body) {
        Some(list) if head.status.is_success() => Listed::List(list),
        _ => Listed::Answer {
            status: head.status,
            content_type: head.headers.get(header::CONTENT_TYPE).cloned(),
            body,
        },
    }
}

/// A backend left out of the list: a failed connection as any upstream failure is (logged,
/// counted, told to no breaker: no request of a client's was lost); an answer that is no
/// list only at debug, since a client may ask for the list often.
fn note_failure(proxy: &Proxy, backend: &ResolvedBackend, listed: &Listed) {
    match listed {
        Listed::Failed(e) if e.kind.is_upstream() => {
            proxy.metrics.upstream_errors.with_label_values(&[&*backend.name, e.kind.code()]).inc();
            tracing::warn!(backend = %backend.name, kind = e.kind.code(), error = %DisplayChain(e), "upstream failure; /v1/models lists the other backends");
        }
        Listed::Failed(e) => {
            tracing::debug!(backend = %backend.name, error = %e, "/v1/models lists the other backends");
        }
        Listed::Answer { status, .. } => {
            tracing::debug!(backend = %backend.name, %status, "no model list; /v1/models lists the other backends");
        }
        Listed::List(_) => {}
    }
}

/// The entries of an OpenAI model list (`{"object": "list", "data": [...]}`), each as sent.
fn entries(body: &[u8]) -> Option<Vec<Box<RawValue>>> {
    #[derive(Deserialize)]
    struct List {
        data: Vec<Box<RawValue>>,
    }
    serde_json::from_slice::<List>(body).ok().map(|l| l.data)
}

/// The union of the lists, in order; an id listed again is left out. An entry without an id is
/// kept (it cannot be told apart from another).
fn merged(lists: Vec<Vec<Box<RawValue>>>) -> Bytes {
    #[derive(Deserialize)]
    struct Entry {
        id: Option<String>,
    }
    #[derive(Serialize)]
    struct List<'a> {
        object: &'static str,
        data: Vec<&'a RawValue>,
    }
    let mut seen = HashSet::new();
    let data = lists
        .iter()
        .flatten()
        .filter(|entry| {
            let id = serde_json::from_str::<Entry>(entry.get()).ok().and_then(|e| e.id);
            id.is_none_or(|id| seen.insert(id))
        })
        .map(|entry| &**entry)
        .collect();
    let list = serde_json::to_vec(&List { object: "list", data }).expect("raw JSON values serialise");
    Bytes::from(list)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(s: &str) -> Vec<Box<RawValue>> {
        entries(s.as_bytes()).expect("a list")
    }

    #[test]
    fn the_union_keeps_order_and_the_first_listing_of_an_id() {
        let a = list(
            r#"{"object":"list","data":[{"id":"llama","owned_by":"vllm","max_model_len":8192},{"id":"qwen"}]}"#,
        );
        let b = list(r#"{"data":[{"id":"qwen","owned_by":"other"},{"id":"smol \u00e9","root":"x"}]}"#);
        let m = merged(vec![a, b]);
        assert_eq!(
            std::str::from_utf8(&m).unwrap(),
            r#"{"object":"list","data":[{"id":"llama","owned_by":"vllm","max_model_len":8192},{"id":"qwen"},{"id":"smol \u00e9","root":"x"}]}"#
        );
        let v: serde_json::Value = serde_json::from_slice(&m).unwrap();
        assert_eq!(v["data"][2]["id"], "smol é");
    }

    #[test]
    fn entries_without_an_id_are_kept_and_empty_lists_merge_to_an_empty_list() {
        let m =
            merged(vec![list(r#"{"data":[{"object":"model"},{"object":"model"}]}"#), list(r#"{"data":[]}"#)]);
        assert_eq!(&m[..], br#"{"object":"list","data":[{"object":"model"},{"object":"model"}]}"#);
        assert_eq!(&merged(vec![])[..], br#"{"object":"list","data":[]}"#);
    }

    #[test]
    fn what_is_not_a_model_list_is_not_read_as_one() {
        for body in [&b"not json"[..], br#"{"error":{"message":"no key"}}"#, br#"{"data":{"id":"x"}}"#, b""] {
            assert!(entries(body).is_none(), "{}", String::from_utf8_lossy(body));
        }
    }
}
