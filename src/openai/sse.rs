//! Incremental Server-Sent Events reader (WHATWG SSE parsing rules).
//!
//! Bytes are fed in whatever pieces the network delivered; events come out as soon as their
//! terminating blank line has been seen. The reader never copies a line that lies wholly inside
//! one chunk, and reuses its buffers between events, so steady-state parsing does not allocate.
//! It also reports each event's byte span in the stream, which is what lets the proxy remove one
//! event (the usage chunk it asked for) without touching any other byte.

/// One dispatched event. `data` is the `data:` lines joined by `\n`, as the spec says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SseEvent<'a> {
    pub data: &'a [u8],
    /// Offset of the event's first byte in the whole stream.
    pub start: u64,
    /// Offset just past the blank line that ended the event.
    pub end: u64,
    /// The data exceeded the reader's cap: `data` is then empty (the bytes are still forwarded).
    pub truncated: bool,
}

impl SseEvent<'_> {
    pub fn is_done(&self) -> bool {
        self.data == b"[DONE]"
    }
}

/// Bytes beyond the cap a carried line may keep: `data: ` and then some.
const LINE_SLACK: usize = 64;

#[derive(Debug)]
pub struct SseReader {
    line: Vec<u8>,
    data: Vec<u8>,
    has_data: bool,
    truncated: bool,
    pending_cr: bool,
    pos: u64,
    event_start: u64,
    max_event_bytes: usize,
    comments: u64,
}

impl Default for SseReader {
    fn default() -> Self {
        Self::new(16 * 1024 * 1024)
    }
}

impl SseReader {
    /// `max_event_bytes` bounds the memory one event may take; larger events are reported as
    /// truncated (the bytes themselves are forwarded by the proxy regardless).
    pub fn new(max_event_bytes: usize) -> Self {
        SseReader {
            line: Vec::new(),
            data: Vec::new(),
            has_data: false,
            truncated: false,
            pending_cr: false,
            pos: 0,
            event_start: 0,
            max_event_bytes,
            comments: 0,
        }
    }

    /// Total bytes consumed so far.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Offset where the event currently being read began (== position() between events).
    pub fn event_start(&self) -> u64 {
        self.event_start
    }

    /// Comment lines (`: ping`) seen so far.
    pub fn comments(&self) -> u64 {
        self.comments
    }

    /// Feed the next piece of the stream; `on_event` is called for each completed event.
    pub fn feed(&mut self, mut chunk: &[u8], mut on_event: impl FnMut(SseEvent<'_>)) {
        if self.pending_cr && !chunk.is_empty() {
            // The previous piece ended in CR: it was a line end, and a LF right after it
            // belongs to the same line end.
            self.pending_cr = false;
            if chunk[0] == b'\n' {
                chunk = &chunk[1..];
                self.pos += 1;
            }
            self.process_line(LineRef::Carried, &mut on_event);
            self.line.clear();
        }
        while !chunk.is_empty() {
            match memchr::memchr2(b'\n', b'\r', chunk) {
                None => {
                    self.push_partial(chunk);
                    self.pos += chunk.len() as u64;
                    return;
                }
                Some(j) => {
                    let term = if chunk[j] == b'\r' {
                        match chunk.get(j + 1) {
                            Some(b'\n') => 2,
                            Some(_) => 1,
                            None => {
                                // Wait for the next byte to know whether this is CRLF.
                                self.push_partial(&chunk[..j]);
                                self.pos += (j + 1) as u64;
                                self.pending_cr = true;
                                return;
                            }
                        }
                    } else {
                        1
                    };
                    self.pos += (j + term) as u64;
                    if self.line.is_empty() {
                        self.process_line(LineRef::Chunk(&chunk[..j]), &mut on_event);
                    } else {
                        self.push_partial(&chunk[..j]);
                        self.process_line(LineRef::Carried, &mut on_event);
                        self.line.clear();
                    }
                    chunk = &chunk[j + term..];
                }
            }
        }
    }

    /// The stream ended: settle a line end that was waiting on its next byte.
    pub fn finish(&mut self, mut on_event: impl FnMut(SseEvent<'_>)) {
        if self.pending_cr {
            self.pending_cr = false;
            self.process_line(LineRef::Carried, &mut on_event);
            self.line.clear();
        }
    }

    /// Carry part of a line to the next chunk, keeping at most the cap plus room for the field
    /// name: a data line cut here is still longer than the cap, so `process_line` marks its
    /// event truncated exactly as it would had the line arrived whole (found by fuzzing: a cut
    /// comment line marked the next event truncated only when the stream was split).
    fn push_partial(&mut self, bytes: &[u8]) {
        let room = (self.max_event_bytes + LINE_SLACK).saturating_sub(self.line.len());
        self.line.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    fn process_line(&mut self, line: LineRef<'_>, on_event: &mut impl FnMut(SseEvent<'_>)) {
        // Take the carried line out so that `self` can be borrowed mutably below.
        let carried = std::mem::take(&mut self.line);
        let bytes: &[u8] = match line {
            LineRef::Chunk(b) => b,
            LineRef::Carried => &carried,
        };
        if bytes.is_empty() {
            if self.has_data {
                on_event(SseEvent {
                    // A cut event's data would depend on where the cut fell: give none.
                    data: if self.truncated { &[] } else { &self.data },
                    start: self.event_start,
                    end: self.pos,
                    truncated: self.truncated,
                });
            }
            self.data.clear();
            self.has_data = false;
            self.truncated = false;
            self.event_start = self.pos;
        } else if bytes[0] == b':' {
            // A comment belongs to the block it is in: removing an event removes its block.
            self.comments += 1;
        } else {
            let (field, value) = match memchr::memchr(b':', bytes) {
                Some(k) => {
                    let v = &bytes[k + 1..];
                    (&bytes[..k], v.strip_prefix(b" ").unwrap_or(v))
                }
                None => (bytes, &b""[..]),
            };
            if field == b"data" {
                // The joining newline counts against the cap too: otherwise a run of empty
                // `data` lines grows the buffer without bound (found by fuzzing).
                let sep = usize::from(self.has_data);
                let room = self.max_event_bytes.saturating_sub(self.data.len());
                if self.truncated || sep + value.len() > room {
                    self.truncated = true;
                } else {
                    if sep == 1 {
                        self.data.push(b'\n');
                    }
                    self.data.extend_from_slice(value);
                }
                self.has_data = true;
            }
        }
        self.line = carried;
    }

    /// True when bytes of an unfinished event block are pending: any line since the last blank
    /// one, data or not (an `id:`, `retry:` or comment line belongs to the block it opens, so
    /// releasing it early would make that block's event impossible to remove; found by fuzzing).
    pub fn in_event(&self) -> bool {
        self.pos > self.event_start || self.pending_cr
    }
}

enum LineRef<'a> {
    Chunk(&'a [u8]),
    Carried,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    struct Ev {
        data: String,
        start: u64,
        end: u64,
    }

    fn collect(pieces: &[&[u8]]) -> Vec<Ev> {
        let mut r = SseReader::default();
        let mut out = Vec::new();
        let mut push = |e: SseEvent<'_>| {
            out.push(Ev { data: String::from_utf8(e.data.to_vec()).unwrap(), start: e.start, end: e.end })
        };
        for p in pieces {
            r.feed(p, &mut push);
        }
        r.finish(&mut push);
        out
    }

    const STREAM: &[u8] = b": ping - 2024-01-01\r\n\r\ndata: {\"a\":1}\r\n\r\ndata: line1\ndata: line2\n\n:comment\nevent: x\ndata:nospace\r\rdata: [DONE]\n\n";

    fn expected() -> Vec<Ev> {
        let s = std::str::from_utf8(STREAM).unwrap();
        let a = s.find("data: {").unwrap() as u64;
        let a_end = s.find("data: line1").unwrap() as u64;
        let b_end = s.find(":comment").unwrap() as u64;
        let c_end = s.find("data: [DONE]").unwrap() as u64;
        vec![
            Ev { data: "{\"a\":1}".into(), start: a, end: a_end },
            Ev { data: "line1\nline2".into(), start: a_end, end: b_end },
            Ev { data: "nospace".into(), start: b_end, end: c_end },
            Ev { data: "[DONE]".into(), start: c_end, end: STREAM.len() as u64 },
        ]
    }

    #[test]
    fn whole_stream() {
        assert_eq!(collect(&[STREAM]), expected());
    }

    #[test]
    fn split_at_every_boundary() {
        for i in 0..=STREAM.len() {
            let (a, b) = STREAM.split_at(i);
            assert_eq!(collect(&[a, b]), expected(), "split at {i}");
        }
    }

    #[test]
    fn split_at_every_pair_of_boundaries() {
        for i in 0..=STREAM.len() {
            for j in i..=STREAM.len() {
                let got = collect(&[&STREAM[..i], &STREAM[i..j], &STREAM[j..]]);
                assert_eq!(got, expected(), "split at {i},{j}");
            }
        }
    }

    #[test]
    fn byte_by_byte() {
        let pieces: Vec<&[u8]> = STREAM.chunks(1).collect();
        assert_eq!(collect(&pieces), expected());
    }

    #[test]
    fn cr_only_line_endings() {
        let got = collect(&[b"data: x\r\rdata: y\r", b"\r"]);
        assert_eq!(got.len(), 2);
        assert_eq!(got[1].data, "y");
        assert_eq!(got[1].end, 18);
    }

    #[test]
    fn unterminated_event_is_not_dispatched() {
        let mut r = SseReader::default();
        let mut n = 0;
        r.feed(b"data: {\"partial\"", |_| n += 1);
        assert_eq!(n, 0);
        assert!(r.in_event());
    }

    #[test]
    fn oversized_event_is_truncated_not_buffered() {
        let mut r = SseReader::new(8);
        let mut got = Vec::new();
        r.feed(b"data: 0123456789abcdef", |_| {});
        for _ in 0..1000 {
            r.feed(b"0123456789", |_| {});
        }
        r.feed(b"\n\n", |e| got.push((e.data.len(), e.truncated)));
        assert_eq!(got, [(0, true)]);
        assert!(r.line.capacity() < 256, "{}", r.line.capacity());
    }

    /// Empty `data` lines add a newline each: they count against the cap like any data.
    #[test]
    fn empty_data_lines_cannot_grow_the_buffer() {
        let mut r = SseReader::new(8);
        let mut got = Vec::new();
        for _ in 0..10_000 {
            r.feed(b"data\n", |_| {});
        }
        assert!(r.data.capacity() <= 64, "{}", r.data.capacity());
        r.feed(b"\n", |e| got.push((e.data.len(), e.truncated)));
        assert_eq!(got, [(0, true)]);
    }

    /// With a small cap, every split of a stream with over-long comment and data lines gives
    /// the same events as the whole stream (the fuzz target's property, on its first finding).
    #[test]
    fn truncation_does_not_depend_on_the_split() {
        let stream: &[u8] = b": a comment longer than the cap\ndata: {\"ok\":1}\n\n\
                              data: {\"error\":{\"message\":\"boom\"}}\n\ndata: x\n\n";
        let events = |pieces: &[&[u8]]| {
            let mut r = SseReader::new(16);
            let mut got = Vec::new();
            for p in pieces {
                r.feed(p, |e| got.push((e.data.to_vec(), e.start, e.end, e.truncated)));
            }
            got
        };
        let whole = events(&[stream]);
        assert_eq!(whole.iter().map(|e| e.3).collect::<Vec<_>>(), [false, true, false]);
        for i in 0..=stream.len() {
            for j in i..=stream.len() {
                assert_eq!(events(&[&stream[..i], &stream[i..j], &stream[j..]]), whole, "split at {i},{j}");
            }
        }
    }

    #[test]
    fn comments_counted() {
        let mut r = SseReader::default();
        r.feed(b": ping - x\n\n: ping\n\n", |_| {});
        assert_eq!(r.comments(), 2);
    }
}
