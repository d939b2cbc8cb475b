//! `ResponseMeter`: reads a response beside the forwarding, timestamps token events and
//! finds `usage`. It never changes a byte, except to undo what the proxy's own include_usage
//! did to the stream (and only when it asked): the usage-only chunk is taken out, and the
//! `system_fingerprint` a server moved onto that chunk (vLLM does) goes back onto the stream's
//! finish chunks, where the same server puts it when usage is off.

// On the request path: no function over clippy.toml's line threshold.
#![warn(clippy::too_many_lines)]

use bytes::{Bytes, BytesMut};
use prometheus::Histogram;
use std::time::{Duration, Instant};

use crate::openai::response::{ChunkInfo, Usage, finish_reason_label, parse_chunk, parse_response};
use crate::openai::sse::SseReader;

/// Largest non-streaming body the meter reads for usage (the body itself is forwarded whole).
const MAX_JSON_BODY: usize = 8 * 1024 * 1024;
/// An incomplete event held back while looking for the usage chunk is released past this size:
/// a usage chunk is a few hundred bytes.
const MAX_HELD: usize = 64 * 1024;
const MAX_CHOICES: usize = 128;

enum Mode {
    Sse(SseReader),
    Json(Vec<u8>),
    /// In a content coding the meter cannot read: forwarded, not looked at.
    Unread,
}

/// What the meter learned; turned into a `RequestRecord` at the end.
#[derive(Debug, Default, Clone)]
pub struct Observed {
    pub first_content: Option<Instant>,
    pub content_chunks: u64,
    pub content_choice_chunks: u64,
    pub itl_sum: Duration,
    pub itl_count: u64,
    pub usage: Option<Usage>,
    pub finish_reason: Option<&'static str>,
    pub error_event: bool,
    pub done: bool,
    pub texts: Option<Vec<String>>,
    pub usage_chunks_removed: u64,
}

pub struct ResponseMeter {
    mode: Mode,
    strip_usage: bool,
    single_choice: bool,
    last_content: Option<Instant>,
    last_completion_tokens: Option<u64>,
    itl: Option<Histogram>,
    held: Vec<u8>,
    held_start: u64,
    max_held: usize,
    edits: Vec<Edit>,
    /// Finish chunks without a `system_fingerprint`, held back until the next event shows
    /// whether it is the usage chunk carrying one: (start, end) in the stream.
    finishing: Vec<(u64, u64)>,
    pub observed: Observed,
}

/// A change to the stream range [start, end): removed (`insert` None), or `insert` written
/// before the last `}` in it (the closing brace of the event's JSON).
#[derive(Debug)]
struct Edit {
    start: u64,
    end: u64,
    insert: Option<Bytes>,
}

/// The JSON text of a chunk's top-level `system_fingerprint`, when it has a non-null one. Read
/// for finish and usage chunks only (a few per stream).
fn fingerprint(data: &[u8]) -> Option<Box<serde_json::value::RawValue>> {
    #[derive(serde::Deserialize)]
    struct F {
        system_fingerprint: Option<Box<serde_json::value::RawValue>>,
    }
    serde_json::from_slice::<F>(data).ok()?.system_fingerprint.filter(|r| r.get() != "null")
}

impl ResponseMeter {
    /// `sse`: the response is text/event-stream. `strip_usage`: the proxy injected
    /// include_usage, so the usage-only chunk must not reach the client. `collect_text`: keep
    /// the generated text (tokenizer fallback). `itl`: observed inline per content chunk.
    pub fn new(sse: bool, strip_usage: bool, n: u32, collect_text: bool, itl: Option<Histogram>) -> Self {
        ResponseMeter {
            mode: if sse { Mode::Sse(SseReader::default()) } else { Mode::Json(Vec::new()) },
            strip_usage: sse && strip_usage,
            single_choice: n <= 1,
            last_content: None,
            last_completion_tokens: None,
            itl,
            held: Vec::new(),
            held_start: 0,
            max_held: MAX_HELD,
            edits: Vec::new(),
            finishing: Vec::new(),
            observed: Observed { texts: collect_text.then(Vec::new), ..Default::default() },
        }
    }

    /// A meter for an answer it cannot read (one in a content coding): every frame goes through
    /// untouched and nothing is learned from it; its first bytes count as its first token,
    /// for the timeouts.
    pub fn unread() -> Self {
        let mut m = Self::new(false, false, 1, false, None);
        m.mode = Mode::Unread;
        m
    }

    /// Bound the bytes held back while looking for the usage chunk (default 64 KiB). The fuzz
    /// target sets it tiny so that releasing an oversized event is exercised on small inputs.
    pub fn with_max_held(mut self, bytes: usize) -> Self {
        self.max_held = bytes;
        self
    }

    /// Whether bytes may be taken out (then the body length is not known in advance).
    pub fn may_rewrite(&self) -> bool {
        self.strip_usage
    }

    /// Whether the answer's first token has come: a stream's first content, or any bytes of an
    /// answer that is not a stream (it comes whole, at its end).
    pub fn first_token_seen(&self) -> bool {
        !matches!(self.mode, Mode::Sse(_)) || self.observed.first_content.is_some()
    }

    /// Observe one body frame that arrived at `now`. Returns the bytes to forward: the same
    /// `Bytes` (no copy) unless a usage-only chunk is being taken out.
    pub fn on_data(&mut self, frame: Bytes, now: Instant) -> Option<Bytes> {
        let reader = match &mut self.mode {
            Mode::Unread => return Some(frame),
            Mode::Json(buf) => {
                if buf.len() + frame.len() <= MAX_JSON_BODY {
                    buf.extend_from_slice(&frame);
                } else {
                    buf.clear();
                    buf.shrink_to_fit();
                    self.mode = Mode::Json(Vec::new());
                }
                return Some(frame);
            }
            Mode::Sse(r) => r,
        };
        let strip = self.strip_usage;
        let obs = &mut self.observed;
        let edits = &mut self.edits;
        let finishing = &mut self.finishing;
        let last_content = &mut self.last_content;
        let last_tokens = &mut self.last_completion_tokens;
        let itl = &self.itl;
        let single = self.single_choice;
        reader.feed(&frame, |ev| {
            let c =
                if ev.is_done() || ev.truncated { None } else { parse_chunk(ev.data, obs.texts.is_some()) };
            if strip {
                restore_fingerprint(ev.start, ev.end, ev.data, c.as_ref(), edits, finishing);
            }
            if ev.is_done() {
                obs.done = true;
                return;
            }
            let Some(c) = c else { return };
            obs.error_event |= c.error;
            if let Some(u) = c.usage {
                // With continuous_usage_stats a chunk may carry several tokens: ITL per token.
                let tokens_in_chunk = match (u.completion_tokens, *last_tokens) {
                    (Some(now_t), Some(prev)) if now_t > prev => Some(now_t - prev),
                    _ => None,
                };
                if let Some(t) = u.completion_tokens {
                    *last_tokens = Some(t);
                }
                obs.usage = Some(u);
                if c.usage_only && strip {
                    obs.usage_chunks_removed += 1;
                }
                if c.content {
                    record_content(obs, last_content, itl, single, now, tokens_in_chunk.unwrap_or(1));
                }
            } else if c.content {
                record_content(obs, last_content, itl, single, now, 1);
            }
            if c.content {
                obs.content_choice_chunks += u64::from(c.content_choices);
            }
            if obs.finish_reason.is_none()
                && let Some((_, f)) = c.finish_reasons.first()
            {
                obs.finish_reason = Some(finish_reason_label(f));
            }
            if let Some(texts) = &mut obs.texts {
                for (idx, t) in &c.texts {
                    let i = *idx as usize;
                    if i < MAX_CHOICES {
                        if texts.len() <= i {
                            texts.resize(i + 1, String::new());
                        }
                        texts[i].push_str(t);
                    }
                }
            }
        });
        if !self.strip_usage {
            return Some(frame);
        }
        self.release(frame, false)
    }

    /// Decide which bytes may go to the client now: everything up to the last complete event,
    /// less any usage-only chunk found. An incomplete trailing event waits (a client cannot
    /// act on half an event anyway) so that a usage chunk split across frames is still found.
    fn release(&mut self, frame: Bytes, at_end: bool) -> Option<Bytes> {
        let Mode::Sse(reader) = &self.mode else { return Some(frame) };
        let pos = reader.position();
        // An event whose head was already released (it outgrew max_held) holds nothing back:
        // the boundary never goes below what was released.
        let mut boundary = if reader.in_event() && !at_end { reader.event_start() } else { pos };
        if let Some(&(start, _)) = self.finishing.first()
            && !at_end
        {
            boundary = boundary.min(start);
        }
        boundary = boundary.max(self.held_start);
        let frame_start = pos - frame.len() as u64;
        if self.held.is_empty() && self.edits.is_empty() && boundary == pos {
            self.held_start = pos;
            return Some(frame);
        }
        if (self.held.len() + frame.len()) > self.max_held {
            boundary = pos;
        }
        if boundary == pos || at_end {
            // Nothing is held back any more: finish chunks still waiting go as they are.
            self.finishing.clear();
        }
        // Logical pending bytes: held ++ frame, covering [held_start, pos).
        debug_assert_eq!(self.held_start + self.held.len() as u64, frame_start);
        let mut out = BytesMut::with_capacity((boundary - self.held_start) as usize);
        let mut cursor = self.held_start;
        let pending = Pending { held: &self.held, held_start: self.held_start, frame: &frame, frame_start };
        self.edits.sort_by_key(|e| e.start);
        for edit in &self.edits {
            // An event whose head was already released (oversized) cannot be changed.
            if edit.start < cursor {
                continue;
            }
            if edit.end > boundary {
                break;
            }
            match &edit.insert {
                None => {
                    pending.copy(cursor, edit.start, |b| out.extend_from_slice(b));
                    cursor = edit.end;
                }
                Some(text) => {
                    let Some(brace) = pending.rfind(edit.start, edit.end, b'}') else { continue };
                    pending.copy(cursor, brace, |b| out.extend_from_slice(b));
                    out.extend_from_slice(text);
                    cursor = brace;
                }
            }
        }
        pending.copy(cursor, boundary, |b| out.extend_from_slice(b));
        // Keep [boundary, pos) for later.
        let mut rest = Vec::with_capacity((pos - boundary) as usize);
        pending.copy(boundary, pos, |b| rest.extend_from_slice(b));
        self.edits.retain(|e| e.end > boundary && e.start >= boundary);
        self.held = rest;
        self.held_start = boundary;
        if out.is_empty() { None } else { Some(out.freeze()) }
    }

    /// The upstream body ended: returns any held bytes to forward, then the final state.
    pub fn on_end(&mut self) -> Option<Bytes> {
        match &mut self.mode {
            Mode::Unread => None,
            Mode::Json(buf) => {
                if let Some(r) = parse_response(buf, self.observed.texts.is_some()) {
                    self.observed.usage = r.usage;
                    self.observed.error_event |= r.error;
                    self.observed.finish_reason =
                        r.finish_reasons.first().map(|(_, f)| finish_reason_label(f));
                    self.observed.content_choice_chunks = u64::from(r.content_choices);
                    if let Some(texts) = &mut self.observed.texts {
                        for (idx, t) in &r.texts {
                            let i = *idx as usize;
                            if i < MAX_CHOICES {
                                if texts.len() <= i {
                                    texts.resize(i + 1, String::new());
                                }
                                texts[i].push_str(t);
                            }
                        }
                    }
                }
                *buf = Vec::new();
                None
            }
            Mode::Sse(reader) => {
                let strip = self.strip_usage;
                let (edits, finishing) = (&mut self.edits, &mut self.finishing);
                let obs = &mut self.observed;
                reader.finish(|ev| {
                    let c = parse_chunk(ev.data, false);
                    if strip {
                        restore_fingerprint(ev.start, ev.end, ev.data, c.as_ref(), edits, finishing);
                    }
                    if let Some(c) = c
                        && c.usage_only
                    {
                        obs.usage = c.usage;
                        if strip {
                            obs.usage_chunks_removed += 1;
                        }
                    }
                });
                if !self.strip_usage || (self.held.is_empty() && self.edits.is_empty()) {
                    return None;
                }
                self.release(Bytes::new(), true)
            }
        }
    }
}

/// While the proxy's include_usage is being undone, one event at [start, end): the usage-only
/// chunk is marked for removal, and the finish chunks held just before it get back the
/// `system_fingerprint` it carried. Any other event ends the wait: the finish chunks go as
/// they are (with `n` > 1, a choice that finished before the others keeps no fingerprint).
fn restore_fingerprint(
    start: u64,
    end: u64,
    data: &[u8],
    c: Option<&ChunkInfo<'_>>,
    edits: &mut Vec<Edit>,
    finishing: &mut Vec<(u64, u64)>,
) {
    match c {
        Some(c) if c.usage_only => {
            if !finishing.is_empty()
                && let Some(fp) = fingerprint(data)
            {
                let text = Bytes::from(format!(",\"system_fingerprint\":{}", fp.get()));
                for &(s, e) in finishing.iter() {
                    edits.push(Edit { start: s, end: e, insert: Some(text.clone()) });
                }
            }
            finishing.clear();
            edits.push(Edit { start, end, insert: None });
        }
        Some(c) if !c.finish_reasons.is_empty() && fingerprint(data).is_none() => {
            finishing.push((start, end));
        }
        _ => finishing.clear(),
    }
}

/// The bytes not yet released: `held` (from `held_start`) followed by the current frame.
struct Pending<'a> {
    held: &'a [u8],
    held_start: u64,
    frame: &'a [u8],
    frame_start: u64,
}

impl Pending<'_> {
    /// The stream offset of the last `byte` in [from, to).
    fn rfind(&self, from: u64, to: u64, byte: u8) -> Option<u64> {
        let mut found = None;
        let mut at = from;
        self.copy(from, to, |b| {
            if let Some(i) = memchr::memrchr(byte, b) {
                found = Some(at + i as u64);
            }
            at += b.len() as u64;
        });
        found
    }

    /// Pass the stream range [from, to) to `sink`, in at most two slices.
    fn copy(&self, from: u64, to: u64, mut sink: impl FnMut(&[u8])) {
        if from >= to {
            return;
        }
        if from < self.frame_start {
            let b = to.min(self.frame_start);
            sink(&self.held[(from - self.held_start) as usize..(b - self.held_start) as usize]);
        }
        if to > self.frame_start {
            let a = from.max(self.frame_start);
            sink(&self.frame[(a - self.frame_start) as usize..(to - self.frame_start) as usize]);
        }
    }
}

fn record_content(
    obs: &mut Observed,
    last: &mut Option<Instant>,
    itl: &Option<Histogram>,
    single_choice: bool,
    now: Instant,
    tokens_in_chunk: u64,
) {
    obs.content_chunks += 1;
    if obs.first_content.is_none() {
        obs.first_content = Some(now);
    } else if let Some(prev) = *last
        && single_choice
    {
        let gap = now.saturating_duration_since(prev) / tokens_in_chunk.clamp(1, 1 << 20) as u32;
        obs.itl_sum += gap;
        obs.itl_count += 1;
        if let Some(h) = itl {
            h.observe(gap.as_secs_f64());
        }
    }
    *last = Some(now);
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHAT: &str = concat!(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" world\"},\"finish_reason\":\"stop\"}]}\n\n",
    );
    const USAGE: &str = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":2}}\n\n";
    const DONE: &str = "data: [DONE]\n\n";

    #[test]
    fn an_unread_answer_passes_as_it_came_and_teaches_nothing() {
        // Even text that reads as a usage chunk: a coded body's bytes are not SSE.
        let mut m = ResponseMeter::unread();
        assert!(!m.may_rewrite());
        let frame = Bytes::from([CHAT, USAGE, DONE].concat());
        let out = m.on_data(frame.clone(), Instant::now()).unwrap();
        assert_eq!((out.as_ptr(), out.len()), (frame.as_ptr(), frame.len()), "the same bytes, not a copy");
        assert!(m.first_token_seen());
        assert_eq!(m.on_end(), None);
        let o = &m.observed;
        assert!(o.usage.is_none() && o.texts.is_none() && o.first_content.is_none() && o.content_chunks == 0);
    }

    fn run(pieces: &[&[u8]], strip: bool) -> (Vec<u8>, Observed) {
        let mut m = ResponseMeter::new(true, strip, 1, true, None);
        let mut out = Vec::new();
        let t = Instant::now();
        for (i, p) in pieces.iter().enumerate() {
            if let Some(b) = m.on_data(Bytes::copy_from_slice(p), t + Duration::from_millis(i as u64)) {
                out.extend_from_slice(&b);
            }
        }
        if let Some(b) = m.on_end() {
            out.extend_from_slice(&b);
        }
        (out, m.observed)
    }

    /// An event larger than the hold bound, arriving in many frames, while removal is on: its
    /// head is released, and the frames after it must pass without holding anything back.
    /// (Found by tests/faults.rs: the boundary went below the released bytes and a capacity
    /// computation underflowed.)
    #[test]
    fn event_larger_than_the_hold_bound_passes_in_pieces() {
        let big = format!("data: {}\n\n", "x".repeat(200_000));
        let full = format!("{CHAT}{big}{USAGE}{DONE}");
        let want = format!("{CHAT}{big}{DONE}");
        let pieces: Vec<&[u8]> = full.as_bytes().chunks(16 * 1024).collect();
        let (out, obs) = run(&pieces, true);
        assert_eq!(out, want.as_bytes());
        assert_eq!(obs.usage_chunks_removed, 1);
    }

    /// A usage chunk whose block opens with other fields (`retry:`, `id:`, a comment) is removed
    /// whole at every split, never half-released.
    #[test]
    fn usage_block_with_leading_fields_is_removed_at_every_split() {
        let block = format!(": keep-alive\nretry: 10\nid: 7\n{USAGE}");
        let full = format!("{CHAT}{block}{DONE}");
        let want = format!("{CHAT}{DONE}");
        let b = full.as_bytes();
        for i in 0..=b.len() {
            let (out, _) = run(&[&b[..i], &b[i..]], true);
            assert_eq!(String::from_utf8_lossy(&out), want, "split at {i}");
        }
    }

    #[test]
    fn passthrough_is_identical_and_metered() {
        let full = format!("{CHAT}{USAGE}{DONE}");
        let (out, obs) = run(&[full.as_bytes()], false);
        assert_eq!(out, full.as_bytes());
        assert_eq!(obs.content_chunks, 2);
        assert_eq!(obs.usage.unwrap().completion_tokens, Some(2));
        assert_eq!(obs.finish_reason, Some("stop"));
        assert!(obs.done);
        assert_eq!(obs.texts.unwrap()[0], "Hello world");
    }

    #[test]
    fn injected_usage_chunk_is_removed_at_every_split() {
        let full = format!("{CHAT}{USAGE}{DONE}");
        let want = format!("{CHAT}{DONE}");
        let b = full.as_bytes();
        for i in 0..=b.len() {
            for j in i..=b.len() {
                let (out, obs) = run(&[&b[..i], &b[i..j], &b[j..]], true);
                assert_eq!(String::from_utf8(out).unwrap(), want, "split {i},{j}");
                assert_eq!(obs.usage.unwrap().prompt_tokens, Some(4));
                assert_eq!(obs.usage_chunks_removed, 1);
            }
        }
    }

    #[test]
    fn complete_frames_are_not_copied() {
        let mut m = ResponseMeter::new(true, true, 1, false, None);
        let f = Bytes::from(CHAT.rsplit_once("data:").unwrap().0.to_string());
        let out = m.on_data(f.clone(), Instant::now()).unwrap();
        assert_eq!(out.as_ptr(), f.as_ptr());
    }

    /// vLLM puts `system_fingerprint` on the finish chunk when usage is off and on the usage
    /// chunk when it is on: with usage injected, the client still gets the stream it would
    /// have got without goodput, byte for byte, at every split.
    #[test]
    fn fingerprint_moves_back_onto_the_finish_chunk_at_every_split() {
        let fin = "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"!\"},\"finish_reason\":\"stop\"}]}\n\n";
        let fin_fp = "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"!\"},\"finish_reason\":\"stop\"}],\"system_fingerprint\":\"fp-1\"}\n\n";
        let usage = "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":2},\"system_fingerprint\":\"fp-1\"}\n\n";
        let head = "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n";
        let full = format!("{head}{fin}{usage}{DONE}");
        let want = format!("{head}{fin_fp}{DONE}");
        let b = full.as_bytes();
        for i in 0..=b.len() {
            for j in (i..=b.len()).step_by(7) {
                let (out, obs) = run(&[&b[..i], &b[i..j], &b[j..]], true);
                assert_eq!(String::from_utf8(out).unwrap(), want, "split {i},{j}");
                assert_eq!(obs.usage_chunks_removed, 1);
                assert_eq!(obs.content_chunks, 2);
            }
        }
        // Without injection nothing changes; a finish chunk that has one keeps it alone.
        let (out, _) = run(&[full.as_bytes()], false);
        assert_eq!(out, full.as_bytes());
        let already = format!("{head}{fin_fp}{usage}{DONE}");
        let (out, _) = run(&[already.as_bytes()], true);
        assert_eq!(String::from_utf8(out).unwrap(), want);
        // A server without a fingerprint: the finish chunk goes as it came.
        let plain = format!("{head}{fin}{USAGE}{DONE}");
        let (out, _) = run(&[plain.as_bytes()], true);
        assert_eq!(String::from_utf8(out).unwrap(), format!("{head}{fin}{DONE}"));
    }

    /// Two choices finishing in the same step both get it back; a choice that finished while
    /// the other still streamed goes on at once, without one.
    #[test]
    fn fingerprint_with_two_choices() {
        let fin = |i: u32, fp: bool| {
            format!(
                "data: {{\"choices\":[{{\"index\":{i},\"delta\":{{}},\"finish_reason\":\"stop\"}}]{}}}\n\n",
                if fp { ",\"system_fingerprint\":\"f\"" } else { "" }
            )
        };
        let tok =
            |i: u32| format!("data: {{\"choices\":[{{\"index\":{i},\"delta\":{{\"content\":\"x\"}}}}]}}\n\n");
        let usage = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":3},\"system_fingerprint\":\"f\"}\n\n";
        let together = format!("{}{}{}{}{usage}{DONE}", tok(0), tok(1), fin(0, false), fin(1, false));
        let (out, _) = run(&[together.as_bytes()], true);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            format!("{}{}{}{}{DONE}", tok(0), tok(1), fin(0, true), fin(1, true))
        );
        // Choice 0's finish is released as soon as choice 1's next token arrives.
        let apart = format!("{}{}{}{}{usage}{DONE}", tok(0), fin(0, false), tok(1), fin(1, false));
        let mut m = ResponseMeter::new(true, true, 2, false, None);
        let parts: Vec<&str> = apart.split_inclusive("\n\n").collect();
        let mut out = String::new();
        for p in &parts[..3] {
            if let Some(b) = m.on_data(Bytes::copy_from_slice(p.as_bytes()), Instant::now()) {
                out.push_str(std::str::from_utf8(&b).unwrap());
            }
        }
        assert_eq!(out, format!("{}{}{}", tok(0), fin(0, false), tok(1)));
    }

    #[test]
    fn unterminated_tail_is_released_at_end() {
        let s = format!("{CHAT}data: {{\"partial\"");
        let (out, _) = run(&[s.as_bytes()], true);
        assert_eq!(out, s.as_bytes());
    }

    #[test]
    fn ttft_and_itl() {
        let (_, obs) = run(&[CHAT.as_bytes()], false);
        assert_eq!(obs.content_chunks, 2);
        // Chunks that arrive together are a zero gap for the client.
        assert_eq!((obs.itl_count, obs.itl_sum), (1, Duration::ZERO));
        let parts: Vec<&str> = CHAT.split_inclusive("\n\n").collect();
        let (_, obs) = run(&[parts[0].as_bytes(), parts[1].as_bytes(), parts[2].as_bytes()], false);
        assert_eq!(obs.itl_count, 1);
        assert_eq!(obs.itl_sum, Duration::from_millis(1));
    }

    #[test]
    fn json_body_usage() {
        let mut m = ResponseMeter::new(false, true, 1, false, None);
        let body = br#"{"choices":[{"index":0,"message":{"content":"hi"},"finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":9}}"#;
        let out = m.on_data(Bytes::from_static(&body[..10]), Instant::now()).unwrap();
        assert_eq!(&out[..], &body[..10]);
        m.on_data(Bytes::from_static(&body[10..]), Instant::now());
        assert!(m.on_end().is_none());
        assert_eq!(m.observed.usage.unwrap().completion_tokens, Some(9));
        assert_eq!(m.observed.finish_reason, Some("length"));
    }
}
