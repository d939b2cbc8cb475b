//! Which responses are scored: a deterministic choice by request id against a rate, so that a
//! replayed request gets the same decision, and a header that forces scoring.

/// The sampling key: the client's `x-request-id` when it sent one, else goodput's own id.
pub fn key(request_id: Option<&[u8]>, id: u64) -> u64 {
    match request_id {
        // FNV-1a: stable across processes and versions (std's hasher is neither).
        Some(b) => {
            b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &c| (h ^ u64::from(c)).wrapping_mul(0x100_0000_01b3))
        }
        None => id,
    }
}

/// Whether `key` falls within `rate` (0..=1): a splitmix64 finaliser spreads sequential ids.
pub fn sampled(key: u64, rate: f64) -> bool {
    if rate >= 1.0 {
        return true;
    }
    if rate <= 0.0 || rate.is_nan() {
        return false;
    }
    let mut z = key.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    ((z >> 11) as f64 / (1u64 << 53) as f64) < rate
}

/// A forcing header's value: anything but `0`, `false` or `no` forces.
pub fn forced(value: Option<&http::HeaderValue>) -> bool {
    value.is_some_and(|v| !matches!(v.as_bytes(), b"0" | b"false" | b"no" | b"False" | b"FALSE"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_is_honoured_and_deterministic() {
        let n = 100_000u64;
        for rate in [0.01, 0.1, 0.5] {
            let hits = (0..n).filter(|&i| sampled(i, rate)).count() as f64 / n as f64;
            assert!((hits - rate).abs() < 0.01 * rate.max(0.1), "{rate}: {hits}");
        }
        assert!((0..1000).all(|i| sampled(i, 1.0)));
        assert!(!(0..1000).any(|i| sampled(i, 0.0)));
        let k = key(Some(b"req-42"), 7);
        assert_eq!(k, key(Some(b"req-42"), 8), "the header decides, not the counter");
        assert_eq!(sampled(k, 0.3), sampled(key(Some(b"req-42"), 9), 0.3));
    }

    #[test]
    fn forcing_header() {
        assert!(forced(Some(&http::HeaderValue::from_static("1"))));
        assert!(forced(Some(&http::HeaderValue::from_static("yes"))));
        assert!(!forced(Some(&http::HeaderValue::from_static("0"))));
        assert!(!forced(None));
    }
}
