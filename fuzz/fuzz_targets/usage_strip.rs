//! The response meter and the usage-chunk removal, the one change goodput makes to a stream.
//! - Metering alone (no removal) forwards every byte as it came, in every split.
//! - With removal, the client gets the stream less exactly the usage-only events, and the
//!   same bytes however the upstream's frames were cut.
//! - With a tiny hold bound (events outgrow it and are released unread), no panic, and the
//!   client gets the stream less some of its usage-only events: never anything else removed.
#![no_main]

use bytes::Bytes;
use goodput::meter::observe::ResponseMeter;
use goodput::openai::response::parse_chunk;
use goodput::openai::sse::SseReader;
use libfuzzer_sys::fuzz_target;
use std::time::Instant;

mod split;

/// Past this, a pending event is released unread (bounded memory), so removal is best-effort.
const MAX_HELD: usize = 64 * 1024;

fn forward(pieces: &[&[u8]], sse: bool, strip: bool) -> Vec<u8> {
    forward_held(pieces, sse, strip, MAX_HELD)
}

fn forward_held(pieces: &[&[u8]], sse: bool, strip: bool, max_held: usize) -> Vec<u8> {
    let mut m = ResponseMeter::new(sse, strip, 1, true, None).with_max_held(max_held);
    let now = Instant::now();
    let mut out = Vec::new();
    for p in pieces {
        if let Some(b) = m.on_data(Bytes::copy_from_slice(p), now) {
            out.extend_from_slice(&b);
        }
    }
    if let Some(b) = m.on_end() {
        out.extend_from_slice(&b);
    }
    out
}

/// The byte spans of the stream's usage-only events.
fn usage_spans(stream: &[u8]) -> Vec<(usize, usize)> {
    let mut spans = Vec::new();
    let mut r = SseReader::default();
    let mut take = |e: goodput::openai::sse::SseEvent<'_>| {
        if !e.truncated && parse_chunk(e.data, false).is_some_and(|c| c.usage_only) {
            spans.push((e.start as usize, e.end as usize));
        }
    };
    r.feed(stream, &mut take);
    r.finish(&mut take);
    spans
}

/// The stream less its usage-only events, computed independently from the event spans.
fn expected(stream: &[u8]) -> Vec<u8> {
    let spans = usage_spans(stream);
    let mut out = Vec::new();
    let mut at = 0;
    for (s, e) in spans {
        out.extend_from_slice(&stream[at..s]);
        at = e;
    }
    out.extend_from_slice(&stream[at.min(stream.len())..]);
    out
}

/// Whether `out` is `stream` with some subset of `spans` removed (searching both choices).
fn is_stream_less_some(stream: &[u8], spans: &[(usize, usize)], at: usize, out: &[u8]) -> bool {
    let Some(&(s, e)) = spans.first() else { return out == &stream[at..] };
    let Some(rest) = out.strip_prefix(&stream[at..s]) else { return false };
    is_stream_less_some(stream, &spans[1..], e, rest)
        || rest.strip_prefix(&stream[s..e]).is_some_and(|r| is_stream_less_some(stream, &spans[1..], e, r))
}

fuzz_target!(|data: &[u8]| {
    let (stream, pieces) = split::pieces(data);
    for sse in [true, false] {
        assert_eq!(forward(&pieces, sse, false), stream, "metering changed bytes (sse={sse})");
    }
    assert_eq!(forward(&pieces, false, true), stream, "a JSON body was changed");
    let whole = forward(&[stream], true, true);
    assert_eq!(whole, expected(stream), "removal took out something other than usage-only events");
    if stream.len() <= MAX_HELD {
        assert_eq!(forward(&pieces, true, true), whole, "removal depends on how frames were cut");
    }
    let small = forward_held(&pieces, true, true, 32);
    let spans = usage_spans(stream);
    if spans.len() <= 16 {
        assert!(is_stream_less_some(stream, &spans, 0, &small), "a tiny hold bound removed other bytes");
    }
});
