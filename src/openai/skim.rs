//! The fast path of `parse_chunk`: one pass over a stream chunk (or a whole response), no
//! allocation unless generated text is asked for.
//!
//! The meter parses every SSE event the proxy forwards, on the path of the event to the client;
//! serde_json with derived structs took about 3,500 instructions and two allocations for a
//! one-token chunk. This reader validates the JSON grammar in full while it looks only at the
//! fields the meter needs, and it answers only where it is sure to agree with the serde_json
//! reading in `response.rs`: anything unusual (a duplicate known key, an escaped key, a known
//! field of an unexpected type, a surrogate escape that does not pair, deep nesting, invalid
//! UTF-8) is `Unsure`, and the caller falls back to serde_json, which then decides. The
//! `openai_parsers` fuzz target holds the two to the same answer.

use std::borrow::Cow;

use super::types::{ChunkInfo, RequestInfo, Usage};

/// This reader cannot vouch for the answer; serde_json must decide.
#[derive(Debug, PartialEq, Eq)]
pub struct Unsure;

type R<T> = Result<T, Unsure>;

/// Well below serde_json's recursion limit (128), so that nothing it refuses for depth is
/// accepted here.
const MAX_DEPTH: u32 = 100;

/// Bytes that end a run of plain string content: the quote, the escape, and the control
/// characters JSON does not allow raw.
static STOP: [bool; 256] = {
    let mut t = [false; 256];
    let mut c = 0;
    while c < 0x20 {
        t[c] = true;
        c += 1;
    }
    t[b'"' as usize] = true;
    t[b'\\' as usize] = true;
    t
};

/// Skips plain string content eight bytes at a time: returns the first position at or after
/// `i` that may be a quote, an escape or a control character, or where fewer than eight bytes
/// remain (the caller's byte loop settles both). Generated text makes strings long.
fn plain_run(b: &[u8], mut i: usize) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // The high bit of each byte that is zero; exact for the lowest such byte (a borrow can
    // only flag bytes above a true one), which is the one used.
    let zero = |v: u64| v.wrapping_sub(ONES) & !v & HIGH;
    while let Some(w) = b.get(i..i + 8).and_then(|w| <[u8; 8]>::try_from(w).ok()) {
        let w = u64::from_le_bytes(w);
        let stop = zero(w ^ (ONES * u64::from(b'"')))
            | zero(w ^ (ONES * u64::from(b'\\')))
            | (w.wrapping_sub(ONES * 0x20) & !w & HIGH); // bytes below 0x20
        if stop != 0 {
            return i + (stop.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    i
}

/// A string value as it stands in the input: the bytes between the quotes, and whether they
/// hold escapes (then the text is the unescaped form).
#[derive(Clone, Copy)]
struct Str {
    start: usize,
    end: usize,
    escaped: bool,
}

/// The fields of one `choices[]` element the meter uses, in the order `parse_chunk` reads
/// them (the input may order them differently).
#[derive(Default)]
struct Choice {
    index: Option<u32>,
    /// content, reasoning_content, reasoning of `delta`, then of `message`, then `text`.
    texts: [Option<Str>; 7],
    tool_calls: bool,
    finish_reason: Option<Str>,
}

pub fn chunk(data: &[u8], want_texts: bool) -> R<ChunkInfo<'_>> {
    // serde_json checks UTF-8 only in the strings it keeps; checking all of it here means
    // every string below can be sliced as text (and rejects nothing serde_json would accept
    // that the fallback would not then take).
    let s = std::str::from_utf8(data).map_err(|_| Unsure)?;
    let mut p = Skim { s, b: s.as_bytes(), i: 0, depth: 0, exact: false };
    let mut info = ChunkInfo::default();
    let mut choices_seen: Option<bool> = None; // Some(any element) once `choices` is an array
    p.object(
        |key| match key {
            b"choices" => 1,
            b"usage" => 2,
            b"error" => 3,
            _ => 0,
        },
        |p, field| match field {
            1 => {
                if p.null()? {
                    return Ok(());
                }
                let mut any = false;
                p.array(|p| {
                    any = true;
                    let c = p.choice()?;
                    p.emit(c, &mut info, want_texts);
                    Ok(())
                })?;
                choices_seen = Some(any);
                Ok(())
            }
            2 => {
                if !p.null()? {
                    info.usage = Some(p.usage()?);
                }
                Ok(())
            }
            3 => {
                info.error = !p.null()?;
                if info.error {
                    p.value()?;
                }
                Ok(())
            }
            _ => p.value(),
        },
    )?;
    p.ws();
    if p.i != p.b.len() {
        return Err(Unsure);
    }
    if choices_seen == Some(false) {
        info.usage_only = info.usage.is_some();
    }
    Ok(info)
}

/// The request fields `RequestInfo` holds, in one pass over the body (which is mostly
/// messages the proxy does not read); `Unsure` where serde_json must decide (the caller then
/// takes `RequestInfo::parse_serde`, which a body that is not JSON also ends in). Where
/// serde_json reads a field of another type as absent, this is `Unsure` too.
pub fn request(body: &[u8]) -> R<RequestInfo> {
    let s = std::str::from_utf8(body).map_err(|_| Unsure)?;
    let mut p = Skim { s, b: s.as_bytes(), i: 0, depth: 0, exact: false };
    let mut info = RequestInfo { valid_json: true, n: 1, ..Default::default() };
    let (mut max_tokens, mut max_completion_tokens) = (None, None);
    let (mut messages, mut prompt) = (None, None);
    p.object(
        |key| match key {
            b"model" => 1,
            b"stream" => 2,
            b"stream_options" => 3,
            b"n" => 4,
            b"max_tokens" => 5,
            b"max_completion_tokens" => 6,
            b"messages" => 7,
            b"prompt" => 8,
            _ => 0,
        },
        |p, field| {
            match field {
                1 => {
                    if let Some(m) = p.opt_str()? {
                        info.model = Some(p.text(m).into_owned());
                    }
                }
                2 => info.stream = p.opt_bool()?.unwrap_or(false),
                3 => {
                    if p.null()? {
                        return Ok(());
                    }
                    info.has_stream_options = true;
                    // serde_json reads stream_options into a `Value`.
                    p.exact = true;
                    p.object(
                        |key| match key {
                            b"include_usage" => 1,
                            b"continuous_usage_stats" => 2,
                            _ => 0,
                        },
                        |p, field| {
                            match field {
                                1 => info.include_usage = p.opt_bool()?,
                                2 => info.continuous_usage_stats = p.opt_bool()?.unwrap_or(false),
                                _ => p.value()?,
                            }
                            Ok(())
                        },
                    )?;
                    p.exact = false;
                }
                4 => info.n = p.opt_u64()?.map_or(1, |n| n.clamp(1, 1024) as u32),
                5 => max_tokens = p.opt_u64()?,
                6 => max_completion_tokens = p.opt_u64()?,
                7 | 8 => {
                    p.ws();
                    let start = p.i;
                    p.value()?;
                    if !p.b[start..p.i].starts_with(b"null") {
                        let at = if field == 7 { &mut messages } else { &mut prompt };
                        *at = Some((start, p.i));
                    }
                }
                _ => p.value()?,
            }
            Ok(())
        },
    )?;
    p.ws();
    if p.i != p.b.len() {
        return Err(Unsure);
    }
    info.max_tokens = max_completion_tokens.or(max_tokens);
    info.prompt = messages.or(prompt);
    Ok(info)
}

struct Skim<'a> {
    s: &'a str,
    b: &'a [u8],
    i: usize,
    depth: u32,
    /// Inside a value serde_json builds as a `Value` (it skips the rest): a number it could
    /// not hold (`1e999`) is an error there, so any number but a short integer is `Unsure`.
    exact: bool,
}

impl<'a> Skim<'a> {
    #[inline(always)]
    fn ws(&mut self) {
        // Servers send compact JSON: one comparison in the usual case.
        if self.b.get(self.i).is_some_and(|&c| c > b' ') {
            return;
        }
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.b.get(self.i) {
            self.i += 1;
        }
    }

    fn peek(&self) -> R<u8> {
        self.b.get(self.i).copied().ok_or(Unsure)
    }

    fn eat(&mut self, c: u8) -> R<()> {
        if self.peek()? != c {
            return Err(Unsure);
        }
        self.i += 1;
        Ok(())
    }

    fn enter(&mut self) -> R<()> {
        self.depth += 1;
        if self.depth > MAX_DEPTH { Err(Unsure) } else { Ok(()) }
    }

    /// A `null` (consumed, true), or leave anything else for the caller (false).
    fn null(&mut self) -> R<bool> {
        self.ws();
        if self.peek()? == b'n' {
            self.literal(b"null")?;
            return Ok(true);
        }
        Ok(false)
    }

    fn literal(&mut self, word: &[u8]) -> R<()> {
        if self.b.get(self.i..self.i + word.len()) != Some(word) {
            return Err(Unsure);
        }
        self.i += word.len();
        Ok(())
    }

    /// An object. `classify` names each key's field (0: one the caller does not read);
    /// `field` is called at each value with that number and must consume the value. A known
    /// field seen twice is a serde_json error (duplicate field): `Unsure`. So is a value that
    /// is not an object (serde_json would read a struct from an array too: it decides).
    fn object(
        &mut self,
        classify: impl Fn(&[u8]) -> u8,
        mut field: impl FnMut(&mut Self, u8) -> R<()>,
    ) -> R<()> {
        let mut seen = 0u32;
        if self.open(b'{', b'}')? {
            return Ok(());
        }
        loop {
            let k = self.string()?; // (which skips the whitespace before it)
            if k.escaped {
                return Err(Unsure);
            }
            let id = classify(&self.b[k.start..k.end]);
            if id != 0 {
                if seen & (1 << id) != 0 {
                    return Err(Unsure);
                }
                seen |= 1 << id;
            }
            self.ws();
            self.eat(b':')?;
            field(self, id)?;
            if self.next_or_close(b'}')? {
                return Ok(());
            }
        }
    }

    /// An array; `element` is called at each element and must consume it.
    fn array(&mut self, mut element: impl FnMut(&mut Self) -> R<()>) -> R<()> {
        if self.open(b'[', b']')? {
            return Ok(());
        }
        loop {
            element(self)?;
            if self.next_or_close(b']')? {
                return Ok(());
            }
        }
    }

    /// Enter an object or array at `open`; true if it is empty (then already closed).
    fn open(&mut self, open: u8, close: u8) -> R<bool> {
        self.ws();
        self.eat(open)?;
        self.enter()?;
        self.ws();
        if self.peek()? == close {
            self.i += 1;
            self.depth -= 1;
            return Ok(true);
        }
        Ok(false)
    }

    /// After a member or element: a comma (false, another follows) or `close` (true, done).
    fn next_or_close(&mut self, close: u8) -> R<bool> {
        self.ws();
        match self.peek()? {
            b',' => {
                self.i += 1;
                Ok(false)
            }
            c if c == close => {
                self.i += 1;
                self.depth -= 1;
                Ok(true)
            }
            _ => Err(Unsure),
        }
    }

    /// Any JSON value, validated and skipped.
    fn value(&mut self) -> R<()> {
        self.ws();
        match self.peek()? {
            b'{' => self.object(|_| 0, |p, _| p.value()),
            b'[' => self.array(|p| p.value()),
            b'"' => self.string().map(drop),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            b'-' | b'0'..=b'9' => self.number(),
            _ => Err(Unsure),
        }
    }

    /// A number, by JSON's grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
    fn number(&mut self) -> R<()> {
        if self.peek()? == b'-' {
            self.i += 1;
        }
        let at = self.i;
        match self.peek()? {
            b'0' => self.i += 1,
            b'1'..=b'9' => self.digits(),
            _ => return Err(Unsure),
        }
        if self.exact && (self.i - at > 18 || matches!(self.b.get(self.i), Some(b'.' | b'e' | b'E'))) {
            return Err(Unsure);
        }
        if self.b.get(self.i) == Some(&b'.') {
            self.i += 1;
            self.some_digits()?;
        }
        if let Some(b'e' | b'E') = self.b.get(self.i) {
            self.i += 1;
            if let Some(b'+' | b'-') = self.b.get(self.i) {
                self.i += 1;
            }
            self.some_digits()?;
        }
        // serde_json refuses a digit after a leading 0 ("01"); so does the caller's next
        // expectation (',' '}' ']' or the end), here or above.
        Ok(())
    }

    fn digits(&mut self) {
        while let Some(b'0'..=b'9') = self.b.get(self.i) {
            self.i += 1;
        }
    }

    fn some_digits(&mut self) -> R<()> {
        let at = self.i;
        self.digits();
        if self.i == at { Err(Unsure) } else { Ok(()) }
    }

    /// A non-negative integer as a u64 field takes it: plain digits (serde_json refuses a
    /// fraction or an exponent there; a sign is left to it).
    fn unsigned(&mut self) -> R<u64> {
        self.ws();
        let at = self.i;
        match self.peek()? {
            b'0' => self.i += 1,
            b'1'..=b'9' => self.digits(),
            _ => return Err(Unsure),
        }
        if let Some(b'.' | b'e' | b'E' | b'0'..=b'9') = self.b.get(self.i) {
            return Err(Unsure);
        }
        let mut v: u64 = 0;
        for &d in &self.b[at..self.i] {
            v = v.checked_mul(10).and_then(|v| v.checked_add(u64::from(d - b'0'))).ok_or(Unsure)?;
        }
        Ok(v)
    }

    fn opt_bool(&mut self) -> R<Option<bool>> {
        if self.null()? {
            return Ok(None);
        }
        match self.peek()? {
            b't' => self.literal(b"true").map(|_| Some(true)),
            b'f' => self.literal(b"false").map(|_| Some(false)),
            _ => Err(Unsure),
        }
    }

    fn opt_u64(&mut self) -> R<Option<u64>> {
        if self.null()? { Ok(None) } else { self.unsigned().map(Some) }
    }

    /// A string, validated (escapes, no raw control characters, surrogate escapes paired).
    fn string(&mut self) -> R<Str> {
        self.ws();
        self.eat(b'"')?;
        let start = self.i;
        let mut escaped = false;
        loop {
            let b = self.b;
            let mut i = plain_run(b, self.i);
            while i < b.len() && !STOP[b[i] as usize] {
                i += 1;
            }
            match b.get(i) {
                Some(b'"') => {
                    self.i = i + 1;
                    return Ok(Str { start, end: i, escaped });
                }
                Some(b'\\') => self.i = i + 1,
                _ => return Err(Unsure), // a raw control character (serde_json refuses it), or the end
            }
            escaped = true;
            match self.peek()? {
                b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => self.i += 1,
                b'u' => {
                    self.i += 1;
                    let u = self.hex4()?;
                    if (0xDC00..0xE000).contains(&u) {
                        return Err(Unsure);
                    }
                    if (0xD800..0xDC00).contains(&u) {
                        if self.b.get(self.i..self.i + 2) != Some(b"\\u") {
                            return Err(Unsure);
                        }
                        self.i += 2;
                        if !(0xDC00..0xE000).contains(&self.hex4()?) {
                            return Err(Unsure);
                        }
                    }
                }
                _ => return Err(Unsure),
            }
        }
    }

    fn hex4(&mut self) -> R<u32> {
        let h = self.b.get(self.i..self.i + 4).ok_or(Unsure)?;
        let mut v = 0u32;
        for &c in h {
            v = v * 16 + (c as char).to_digit(16).ok_or(Unsure)?;
        }
        self.i += 4;
        Ok(v)
    }

    fn opt_str(&mut self) -> R<Option<Str>> {
        if self.null()? { Ok(None) } else { self.string().map(Some) }
    }

    /// The text of a string value: borrowed from the input unless it holds escapes.
    fn text(&self, v: Str) -> Cow<'a, str> {
        let raw = &self.s[v.start..v.end];
        if !v.escaped {
            return Cow::Borrowed(raw);
        }
        // Runs between escapes are copied whole; `string` validated every escape, so each
        // has its bytes (`get` keeps a mistake from panicking all the same).
        let mut out = String::with_capacity(raw.len());
        let mut rest = raw;
        while let Some(j) = memchr::memchr(b'\\', rest.as_bytes()) {
            out.push_str(&rest[..j]);
            let esc = rest.as_bytes().get(j + 1).copied().unwrap_or(b'\\');
            let mut used = 2;
            out.push(match esc {
                b'b' => '\u{8}',
                b'f' => '\u{c}',
                b'n' => '\n',
                b'r' => '\r',
                b't' => '\t',
                b'u' => {
                    let hi = hex_at(rest, j + 2);
                    used = 6;
                    if (0xD800..0xDC00).contains(&hi) {
                        let lo = hex_at(rest, j + 8); // past the `\u` of the low half
                        used = 12;
                        char::from_u32(0x10000 + ((hi - 0xD800) << 10) + (lo.wrapping_sub(0xDC00) & 0x3FF))
                            .unwrap_or('\u{FFFD}')
                    } else {
                        char::from_u32(hi).unwrap_or('\u{FFFD}')
                    }
                }
                other => char::from(other), // " \ /
            });
            rest = rest.get(j + used..).unwrap_or("");
        }
        out.push_str(rest);
        Cow::Owned(out)
    }

    fn choice(&mut self) -> R<Choice> {
        self.ws();
        let mut c = Choice::default();
        self.object(
            |key| match key {
                b"index" => 1,
                b"delta" => 2,
                b"message" => 3,
                b"text" => 4,
                b"finish_reason" => 5,
                _ => 0,
            },
            |p, field| {
                match field {
                    1 => {
                        c.index = match p.opt_u64()? {
                            Some(v) => Some(u32::try_from(v).map_err(|_| Unsure)?),
                            None => None,
                        }
                    }
                    2 => p.message(&mut c, 0)?,
                    3 => p.message(&mut c, 3)?,
                    4 => c.texts[6] = p.opt_str()?,
                    5 => c.finish_reason = p.opt_str()?,
                    _ => p.value()?,
                }
                Ok(())
            },
        )?;
        Ok(c)
    }

    /// `delta` or `message`: its text fields go to `c.texts[at..at + 3]`.
    fn message(&mut self, c: &mut Choice, at: usize) -> R<()> {
        if self.null()? {
            return Ok(());
        }
        self.object(
            |key| match key {
                b"content" => 1,
                b"reasoning_content" => 2,
                b"reasoning" => 3,
                b"tool_calls" => 4,
                _ => 0,
            },
            |p, field| {
                match field {
                    1 => c.texts[at] = p.opt_str()?,
                    2 => c.texts[at + 1] = p.opt_str()?,
                    3 => c.texts[at + 2] = p.opt_str()?,
                    4 => {
                        if !p.null()? {
                            p.value()?;
                            c.tool_calls = true;
                        }
                    }
                    _ => p.value()?,
                }
                Ok(())
            },
        )
    }

    fn usage(&mut self) -> R<Usage> {
        let mut u = Usage::default();
        self.object(
            |key| match key {
                b"prompt_tokens" => 1,
                b"completion_tokens" => 2,
                _ => 0,
            },
            |p, field| {
                match field {
                    1 => u.prompt_tokens = p.opt_u64()?,
                    2 => u.completion_tokens = p.opt_u64()?,
                    _ => p.value()?,
                }
                Ok(())
            },
        )?;
        Ok(u)
    }

    /// Fold one choice into `info` as `parse_chunk` does.
    fn emit(&self, c: Choice, info: &mut ChunkInfo<'a>, want_texts: bool) {
        let idx = c.index.unwrap_or(0);
        let mut has = c.tool_calls;
        for t in c.texts.into_iter().flatten() {
            if t.end > t.start {
                has = true;
                if want_texts {
                    info.texts.push((idx, self.text(t)));
                }
            }
        }
        if has {
            info.content = true;
            info.content_choices += 1;
        }
        if let Some(f) = c.finish_reason {
            info.finish_reasons.push((idx, self.text(f)));
        }
    }
}

/// The four hex digits at `at`, which `string` already validated.
fn hex_at(s: &str, at: usize) -> u32 {
    let digits = s.as_bytes().get(at..at + 4).unwrap_or(b"0000");
    digits.iter().fold(0, |v, &c| v * 16 + (c as char).to_digit(16).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The word-at-a-time skip stops exactly where the byte loop would, for every stop byte
    /// at every position (and with several in one word).
    #[test]
    fn plain_run_stops_where_the_byte_loop_does() {
        let by_bytes = |b: &[u8], i: usize| (i..b.len()).find(|&j| STOP[b[j] as usize]).unwrap_or(b.len());
        for stop in [b'"', b'\\', 0x00, 0x1F, b'\n', b'\t'] {
            for len in 0..24 {
                for at in 0..len {
                    let mut v = vec![b'a'; len];
                    v[at] = stop;
                    for start in 0..=at {
                        let i = plain_run(&v, start);
                        assert!(i <= at, "skipped a stop byte: {v:?} from {start}");
                        assert_eq!(by_bytes(&v, i), by_bytes(&v, start));
                        // A second stop later in the same word does not hide the first.
                        if at + 2 < len {
                            v[at + 2] = b'"';
                            assert!(plain_run(&v, start) <= at);
                            v[at + 2] = b'a';
                        }
                    }
                }
            }
        }
        // Bytes that are not stops, near the thresholds and with the high bit set (UTF-8).
        let plain: Vec<u8> = [0x20, 0x21, 0x23, 0x5B, 0x5D, 0x7F, 0x80, 0xA2, 0xDC, 0xFF].repeat(3);
        assert_eq!(plain_run(&plain, 0), plain.len() - plain.len() % 8);
    }
}
