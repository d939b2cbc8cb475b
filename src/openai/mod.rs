//! What the proxy understands of the OpenAI API. Pure functions, no I/O.

pub mod request;
pub mod response;
pub(crate) mod skim;
pub mod sse;
pub mod types;

pub use request::{Operation, RequestInfo, inject_include_usage};
pub use response::{ChunkInfo, Usage, parse_chunk, parse_response};
pub use sse::{SseEvent, SseReader};

/// Mutations of real inputs (bytes replaced by JSON's own punctuation, deleted, inserted,
/// cut), the same sequence every run: `check` gets each and says whether the fast reader
/// answered. Both outcomes must have been common, or the comparison proved little.
#[cfg(test)]
pub(crate) fn mutated(seeds: &[&str], mut check: impl FnMut(&[u8], usize) -> bool) {
    const BYTES: &[u8] = b"{}[]\",:\\ 0123456789.-+eEtrufalsn\nabu";
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let (mut answered, mut deferred) = (0, 0);
    for round in 0..40_000 {
        let mut v = seeds[round % seeds.len()].as_bytes().to_vec();
        for _ in 0..1 + next() % 3 {
            let at = (next() as usize) % v.len().max(1);
            match next() % 4 {
                0 if !v.is_empty() => v[at] = BYTES[(next() as usize) % BYTES.len()],
                1 if !v.is_empty() => drop(v.remove(at)),
                2 => v.insert(at.min(v.len()), BYTES[(next() as usize) % BYTES.len()]),
                _ => v.truncate(at),
            }
        }
        if check(&v, round) { answered += 1 } else { deferred += 1 }
    }
    assert!(answered > 5_000 && deferred > 5_000, "answered {answered}, deferred {deferred}");
}
