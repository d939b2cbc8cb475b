//! Header hygiene for a reverse proxy (RFC 9110 §7.6.1): hop-by-hop headers stop here,
//! X-Forwarded-For / X-Forwarded-Proto are added, everything else passes untouched.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use std::net::IpAddr;

const HOP_BY_HOP: &[HeaderName] = &[
    header::CONNECTION,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Remove hop-by-hop headers, including any that `Connection` names.
pub fn strip_hop_by_hop(h: &mut HeaderMap) {
    let named: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in named {
        h.remove(n);
    }
    for n in HOP_BY_HOP {
        h.remove(n);
    }
    h.remove("keep-alive");
    h.remove("proxy-connection");
}

/// Append the client address to X-Forwarded-For and set X-Forwarded-Proto if absent.
pub fn add_forwarded(h: &mut HeaderMap, client: Option<IpAddr>) {
    if let Some(ip) = client {
        let xff = HeaderName::from_static("x-forwarded-for");
        let value = match h.get(&xff).and_then(|v| v.to_str().ok()) {
            Some(prev) if !prev.trim().is_empty() => format!("{prev}, {ip}"),
            _ => ip.to_string(),
        };
        if let Ok(v) = HeaderValue::from_str(&value) {
            h.insert(xff, v);
        }
    }
    h.entry(HeaderName::from_static("x-forwarded-proto")).or_insert(HeaderValue::from_static("http"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_hop_by_hop_and_connection_named() {
        let mut h = HeaderMap::new();
        h.insert("connection", "keep-alive, x-private".parse().unwrap());
        h.insert("keep-alive", "timeout=5".parse().unwrap());
        h.insert("x-private", "1".parse().unwrap());
        h.insert("transfer-encoding", "chunked".parse().unwrap());
        h.insert("authorization", "Bearer k".parse().unwrap());
        h.insert("content-type", "application/json".parse().unwrap());
        strip_hop_by_hop(&mut h);
        let left: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, vec!["authorization", "content-type"]);
    }

    #[test]
    fn forwarded_headers() {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", "10.0.0.1".parse().unwrap());
        add_forwarded(&mut h, Some("127.0.0.1".parse().unwrap()));
        assert_eq!(h["x-forwarded-for"], "10.0.0.1, 127.0.0.1");
        assert_eq!(h["x-forwarded-proto"], "http");
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-proto", "https".parse().unwrap());
        add_forwarded(&mut h, Some("::1".parse().unwrap()));
        assert_eq!(h["x-forwarded-for"], "::1");
        assert_eq!(h["x-forwarded-proto"], "https");
    }
}
