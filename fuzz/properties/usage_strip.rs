//! The response meter and what it undoes of goodput's own include_usage, the one change goodput
//! makes to a stream: the usage-only events go, and a usage event's `system_fingerprint` is
//! written into the finish events just before it that lack one (as vLLM places it when usage
//! is off).
//! - Metering alone (no removal) forwards every byte as it came, in every split.
//! - With removal, the client gets exactly those edits of the stream, computed here apart from
//!   the meter, and the same bytes however the upstream's frames were cut.
//! - With a tiny hold bound (events outgrow it and are released unread), no panic, and the
//!   client gets the stream with some of those edits: never anything else.

use bytes::Bytes;
use goodput::meter::observe::ResponseMeter;
use goodput::openai::response::parse_chunk;
use goodput::openai::sse::SseReader;
use std::time::Instant;

use super::split;

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

/// One edit of the stream: [start, end) removed (`None`), or text inserted at `start`.
type Edit = (usize, usize, Option<Vec<u8>>);

/// The JSON text of a non-null top-level `system_fingerprint`, as the server wrote it.
fn fingerprint(data: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct F<'a> {
        #[serde(borrow)]
        system_fingerprint: Option<&'a serde_json::value::RawValue>,
    }
    let fp = serde_json::from_slice::<F<'_>>(data).ok()?.system_fingerprint?;
    (fp.get() != "null").then(|| fp.get().to_string())
}

/// The edits the rule asks for, found from the stream's events alone.
fn edits(stream: &[u8]) -> Vec<Edit> {
    let mut events = Vec::new();
    let mut r = SseReader::default();
    let mut take = |e: goodput::openai::sse::SseEvent<'_>| {
        let chunk = if e.is_done() || e.truncated { None } else { parse_chunk(e.data, false) };
        let usage_only = chunk.as_ref().is_some_and(|c| c.usage_only);
        let finish = chunk.as_ref().is_some_and(|c| !c.usage_only && !c.finish_reasons.is_empty());
        let fp = if usage_only || finish { fingerprint(e.data) } else { None };
        events.push((e.start as usize, e.end as usize, usage_only, finish, fp));
    };
    r.feed(stream, &mut take);
    r.finish(&mut take);
    let mut out = Vec::new();
    let mut run: Vec<(usize, usize)> = Vec::new();
    for (start, end, usage_only, finish, fp) in events {
        if usage_only {
            if let Some(fp) = fp {
                for &(s, e) in &run {
                    if let Some(i) = stream[s..e].iter().rposition(|&b| b == b'}') {
                        out.push((s + i, s + i, Some(format!(",\"system_fingerprint\":{fp}").into_bytes())));
                    }
                }
            }
            out.push((start, end, None));
            run.clear();
        } else if finish && fp.is_none() {
            run.push((start, end));
        } else {
            run.clear();
        }
    }
    out.sort_by_key(|e| e.0);
    out
}

fn apply(stream: &[u8], edits: &[Edit]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut at = 0;
    for (s, e, text) in edits {
        out.extend_from_slice(&stream[at..*s]);
        match text {
            None => at = *e,
            Some(t) => {
                out.extend_from_slice(t);
                at = *s;
            }
        }
    }
    out.extend_from_slice(&stream[at.min(stream.len())..]);
    out
}

/// Whether `out` is `stream` from `at` with some subset of `edits` applied.
fn is_stream_with_some(stream: &[u8], edits: &[Edit], at: usize, out: &[u8]) -> bool {
    let Some((s, e, text)) = edits.first() else { return out == &stream[at..] };
    let Some(rest) = out.strip_prefix(&stream[at..*s]) else { return false };
    match text {
        None => {
            is_stream_with_some(stream, &edits[1..], *e, rest)
                || rest
                    .strip_prefix(&stream[*s..*e])
                    .is_some_and(|r| is_stream_with_some(stream, &edits[1..], *e, r))
        }
        Some(t) => {
            is_stream_with_some(stream, &edits[1..], *s, rest)
                || rest
                    .strip_prefix(t.as_slice())
                    .is_some_and(|r| is_stream_with_some(stream, &edits[1..], *s, r))
        }
    }
}

pub fn check(data: &[u8]) {
    let (stream, pieces) = split::pieces(data);
    for sse in [true, false] {
        assert_eq!(forward(&pieces, sse, false), stream, "metering changed bytes (sse={sse})");
    }
    assert_eq!(forward(&pieces, false, true), stream, "a JSON body was changed");
    let whole = forward(&[stream], true, true);
    let edits = edits(stream);
    assert_eq!(whole, apply(stream, &edits), "the meter changed the stream otherwise than the rule says");
    if stream.len() <= MAX_HELD {
        assert_eq!(forward(&pieces, true, true), whole, "the edits depend on how frames were cut");
    }
    let small = forward_held(&pieces, true, true, 32);
    if edits.len() <= 16 {
        assert!(is_stream_with_some(stream, &edits, 0, &small), "a tiny hold bound changed other bytes");
    }
}
