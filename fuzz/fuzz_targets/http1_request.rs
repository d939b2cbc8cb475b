//! The own server loop's request-head reader (src/proxy/front.rs): never panics; decides the
//! same whether the head arrives whole or in pieces; a head it hands to hyper leaves every
//! byte in place; a head it serves itself is one httparse and http's Uri read the same way
//! (target, every header, the declared length), with no framing hyper would have to decide.
#![no_main]

use bytes::BytesMut;
use goodput::proxy::front::decide;
use libfuzzer_sys::fuzz_target;

mod split;

/// The decision, fed piece by piece as reads bring them, and the bytes left in the buffer
/// once every piece has arrived: (decision as text, bytes left).
fn feed(pieces: &[&[u8]]) -> (String, Vec<u8>) {
    let mut buf = BytesMut::new();
    for (i, p) in pieces.iter().enumerate() {
        buf.extend_from_slice(p);
        let before = buf.to_vec();
        let decision = match decide(&mut buf, 1 << 20) {
            None => {
                assert_eq!(&buf[..], &before[..], "a partial head consumed bytes");
                continue;
            }
            Some(Err(reason)) => {
                assert_eq!(&buf[..], &before[..], "a hand-off ({reason}) lost bytes");
                format!("hand off: {reason}")
            }
            Some(Ok((parts, len, close))) => {
                let mut slots = [httparse::EMPTY_HEADER; 100];
                let mut r = httparse::Request::new(&mut slots);
                let n = match r.parse(&before) {
                    Ok(httparse::Status::Complete(n)) => n,
                    other => panic!("served a head httparse reads as {other:?}"),
                };
                assert_eq!(&before[n..], &buf[..], "the head taken out is not the whole head");
                assert_eq!(r.method, Some("POST"));
                assert_eq!(r.version, Some(1));
                // The target as hyper reads it (http's Uri: a stray `#fragment` is dropped).
                let target: http::Uri = r.path.unwrap().parse().expect("served a target Uri refuses");
                assert_eq!(parts.uri, target);
                assert!(r.path.unwrap().starts_with(parts.uri.path()));
                assert_eq!(parts.headers.len(), r.headers.len(), "headers lost or added");
                let mut declared = None;
                for h in r.headers.iter() {
                    let name = h.name.to_ascii_lowercase();
                    assert!(
                        !matches!(name.as_str(), "transfer-encoding" | "expect" | "upgrade"),
                        "served a request with {name}"
                    );
                    if name == "content-length" {
                        assert!(declared.is_none(), "served two content-lengths");
                        declared = Some(std::str::from_utf8(h.value).unwrap().parse::<usize>().unwrap());
                    }
                }
                assert_eq!(len, declared.unwrap_or(0));
                format!("{} {len} {close} {:?}", parts.uri, parts.headers)
            }
        };
        for later in &pieces[i + 1..] {
            buf.extend_from_slice(later);
        }
        return (decision, buf.to_vec());
    }
    ("partial".into(), buf.to_vec())
}

fuzz_target!(|data: &[u8]| {
    let (stream, pieces) = split::pieces(data);
    assert_eq!(feed(&[stream]), feed(&pieces), "the decision differs when the head is split");
});
