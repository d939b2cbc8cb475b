//! Shared by the targets: cut the fuzzer's input into network-like pieces. The first byte
//! seeds the cut points, so the fuzzer explores splits and contents together.

/// `data[0]` chooses the cuts; the rest is the stream. Returns (stream, pieces).
pub fn pieces(data: &[u8]) -> (&[u8], Vec<&[u8]>) {
    let Some((&seed, stream)) = data.split_first() else { return (&[], Vec::new()) };
    let mut out = Vec::new();
    let mut rest = stream;
    let mut s = u32::from(seed).wrapping_mul(2_654_435_761).wrapping_add(1);
    while !rest.is_empty() {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        // Mostly tiny pieces (where boundary bugs live), sometimes large ones.
        let len = if s % 4 == 0 { (s >> 8) as usize % 512 + 1 } else { (s >> 8) as usize % 7 + 1 };
        let (a, b) = rest.split_at(len.min(rest.len()));
        out.push(a);
        rest = b;
    }
    (stream, out)
}
