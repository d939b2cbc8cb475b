//! The SSE reader: never panics, and the events (data, byte span, truncation) are the same
//! whether the stream arrives whole or cut into pieces. Also with a tiny event cap, so that
//! truncation is exercised at every split.

use goodput::openai::sse::SseReader;

use super::split;

type Ev = (Vec<u8>, u64, u64, bool);

fn read(pieces: &[&[u8]], cap: usize) -> (Vec<Ev>, u64) {
    let mut r = SseReader::new(cap);
    let mut evs = Vec::new();
    for p in pieces {
        r.feed(p, |e| evs.push((e.data.to_vec(), e.start, e.end, e.truncated)));
    }
    r.finish(|e| evs.push((e.data.to_vec(), e.start, e.end, e.truncated)));
    (evs, r.position())
}

pub fn check(data: &[u8]) {
    let (stream, pieces) = split::pieces(data);
    for cap in [16usize, 16 * 1024 * 1024] {
        let whole = read(&[stream], cap);
        let split = read(&pieces, cap);
        assert_eq!(whole, split, "events differ when the stream is split (cap {cap})");
        assert_eq!(whole.1, stream.len() as u64, "position is not the stream length");
        for (d, start, end, truncated) in &whole.0 {
            assert!(start <= end && *end <= stream.len() as u64, "span out of the stream");
            assert!(d.len() <= cap, "event data over the cap");
            assert!(!truncated || d.is_empty(), "a truncated event carries data");
        }
    }
}
