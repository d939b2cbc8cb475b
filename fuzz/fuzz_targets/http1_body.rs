//! The direct upstream path's HTTP/1.1 body decoder (chunked and content-length): never
//! panics, and the payload, the end state and any error are the same whether the bytes
//! arrive whole or cut into pieces. A length-delimited body never yields more than its length.
#![no_main]

use bytes::BytesMut;
use goodput::proxy::direct::{Chunked, Decoder};
use libfuzzer_sys::fuzz_target;

mod split;

/// (payload, Ok((end state, bytes left after the body)) or Err on a framing error)
fn decode(pieces: &[&[u8]], mut d: Decoder) -> (Vec<u8>, Result<(Decoder, Vec<u8>), ()>) {
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    // A last call with nothing new, as after a read that brought nothing decodable.
    for p in pieces.iter().chain(std::iter::once(&&[][..])) {
        buf.extend_from_slice(p);
        if d.decode(&mut buf, &mut |b| out.extend_from_slice(&b)).is_err() {
            return (out, Err(()));
        }
    }
    (out, Ok((d, buf.to_vec())))
}

fuzz_target!(|data: &[u8]| {
    let (stream, pieces) = split::pieces(data);
    let half = stream.len() as u64 / 2;
    for d in [Decoder::Chunked(Chunked::Size), Decoder::Length(half)] {
        let whole = decode(&[stream], d);
        let split = decode(&pieces, d);
        assert_eq!(whole, split, "{d:?}: decoding differs when the body is split");
        if let Decoder::Length(n) = d {
            assert_eq!(whole.0.len() as u64, n, "a length-delimited body yields exactly its length");
        }
        assert!(whole.0.len() <= stream.len(), "more payload than input");
    }
});
