//! Header hygiene for a reverse proxy (RFC 9110 §7.6.1): hop-by-hop headers stop here,
//! X-Forwarded-For is extended and X-Forwarded-Proto set, everything else passes untouched.

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
    // One pass over the names (standard ones compare as enum values) finds what is there;
    // most messages carry none of them, or only `Connection`, and a removal hashes its name.
    let mut doomed: Vec<HeaderName> = Vec::new();
    for (name, value) in h.iter() {
        if name == header::CONNECTION {
            let named = value.to_str().ok().into_iter().flat_map(|v| v.split(','));
            doomed.extend(named.filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok()));
        }
        if is_hop_by_hop(name) && doomed.last() != Some(name) {
            doomed.push(name.clone());
        }
    }
    for n in doomed {
        h.remove(n);
    }
}

fn is_hop_by_hop(name: &HeaderName) -> bool {
    HOP_BY_HOP.contains(name) || name == "keep-alive" || name == "proxy-connection"
}

// Built once: `from_static` checks every byte of the name.
static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// Append the client address to X-Forwarded-For, after every address the client's lines
/// carry (joined into one line, as RFC 9110 allows for a list), and set X-Forwarded-Proto to
/// the scheme the client used with goodput: a client's own claim is not passed on.
pub fn add_forwarded(h: &mut HeaderMap, client: Option<IpAddr>) {
    if let Some(ip) = client {
        let mut lines = h.get_all(&X_FORWARDED_FOR).iter().filter_map(|v| v.to_str().ok()).map(str::trim);
        let value = match (lines.next(), lines.next()) {
            (None, _) | (Some(""), None) => Some(ip_value(ip)),
            (Some(one), None) => HeaderValue::from_str(&format!("{one}, {ip}")).ok(),
            (Some(a), Some(b)) => {
                let mut all = vec![a, b];
                all.extend(lines);
                all.retain(|l| !l.is_empty());
                HeaderValue::from_str(&format!("{}, {ip}", all.join(", "))).ok()
            }
        };
        if let Some(v) = value {
            h.insert(X_FORWARDED_FOR.clone(), v);
        }
    }
    h.insert(X_FORWARDED_PROTO.clone(), HeaderValue::from_static("http"));
}

/// An address as a header value; IPv4 without the formatting machinery (every request has one).
fn ip_value(ip: IpAddr) -> HeaderValue {
    let IpAddr::V4(v4) = ip else {
        return HeaderValue::from_str(&ip.to_string()).unwrap_or(HeaderValue::from_static("unknown"));
    };
    let mut buf = [0u8; 15];
    let mut n = 0;
    let mut push = |c: u8| {
        buf[n] = c;
        n += 1;
    };
    for (i, o) in v4.octets().into_iter().enumerate() {
        if i > 0 {
            push(b'.');
        }
        if o >= 100 {
            push(b'0' + o / 100);
        }
        if o >= 10 {
            push(b'0' + o / 10 % 10);
        }
        push(b'0' + o % 10);
    }
    HeaderValue::from_bytes(&buf[..n]).unwrap_or(HeaderValue::from_static("unknown"))
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
        assert_eq!(h["x-forwarded-proto"], "http", "the client's claim is not passed on");
        let mut h = HeaderMap::new();
        h.append("x-forwarded-for", "10.0.0.1".parse().unwrap());
        h.append("x-forwarded-for", " ".parse().unwrap());
        h.append("x-forwarded-for", "10.0.0.2, 10.0.0.3".parse().unwrap());
        add_forwarded(&mut h, Some("127.0.0.1".parse().unwrap()));
        let all: Vec<_> = h.get_all("x-forwarded-for").iter().collect();
        assert_eq!(all, ["10.0.0.1, 10.0.0.2, 10.0.0.3, 127.0.0.1"]);
    }

    #[test]
    fn addresses_as_values() {
        for ip in [
            "0.0.0.0",
            "10.0.0.1",
            "127.0.0.1",
            "192.168.100.9",
            "255.255.255.255",
            "8.80.108.99",
            "2001:db8::1",
            "::ffff:10.1.2.3",
        ] {
            let addr: IpAddr = ip.parse().unwrap();
            assert_eq!(ip_value(addr), addr.to_string().as_str());
        }
    }

    #[test]
    fn nothing_to_strip_leaves_every_header() {
        let mut h = HeaderMap::new();
        h.insert("content-type", "application/json".parse().unwrap());
        h.append("x-a", "1".parse().unwrap());
        h.append("x-a", "2".parse().unwrap());
        let before = h.clone();
        strip_hop_by_hop(&mut h);
        assert_eq!(h, before);
        let mut h = HeaderMap::new();
        h.append("connection", "close".parse().unwrap());
        h.append("connection", "upgrade, x-b".parse().unwrap());
        h.insert("upgrade", "websocket".parse().unwrap());
        h.insert("x-b", "1".parse().unwrap());
        h.insert("proxy-connection", "keep-alive".parse().unwrap());
        h.insert("te", "trailers".parse().unwrap());
        h.insert("x-c", "1".parse().unwrap());
        strip_hop_by_hop(&mut h);
        assert_eq!(h.keys().map(|k| k.as_str()).collect::<Vec<_>>(), vec!["x-c"]);
    }
}
