//! Per-chunk cost of metering a stream (`cargo bench --bench meter`).
//!
//! Feeds realistic vLLM chat chunks (one event per frame, ~240 bytes) through `ResponseMeter`
//! as the proxy does for every frame it forwards, and reports the median time per chunk over
//! repeated runs, next to the bare SSE reader and a plain `Bytes` clone (the floor).

use bytes::Bytes;
use goodput::meter::observe::ResponseMeter;
use goodput::openai::SseReader;
use std::hint::black_box;
use std::time::Instant;

const CHUNKS: usize = 2_000;
const RUNS: usize = 41;

fn frames() -> Vec<Bytes> {
    (0..CHUNKS)
        .map(|i| {
            Bytes::from(format!(
                "data: {{\"id\":\"chatcmpl-9f1c2d7e8a5b4c3d\",\"object\":\"chat.completion.chunk\",\"created\":1733000000,\"model\":\"Qwen/Qwen2.5-1.5B-Instruct\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\" token{i}\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n"
            ))
        })
        .collect()
}

fn median_ns_per_chunk(mut f: impl FnMut(&[Bytes])) -> f64 {
    let fr = frames();
    let mut samples: Vec<f64> = (0..RUNS)
        .map(|_| {
            let t = Instant::now();
            f(&fr);
            t.elapsed().as_nanos() as f64 / CHUNKS as f64
        })
        .collect();
    samples.sort_by(|a, b| a.partial_cmp(b).unwrap());
    samples[RUNS / 2]
}

fn main() {
    let floor = median_ns_per_chunk(|fr| {
        for b in fr {
            black_box(b.clone());
        }
    });
    let sse = median_ns_per_chunk(|fr| {
        let mut r = SseReader::default();
        let mut n = 0;
        for b in fr {
            r.feed(b, |e| n += e.data.len());
        }
        black_box(n);
    });
    let meter = |strip: bool, text: bool| {
        median_ns_per_chunk(move |fr| {
            let mut m = ResponseMeter::new(true, strip, 1, text, None);
            let now = Instant::now();
            for b in fr {
                black_box(m.on_data(b.clone(), now));
            }
            black_box(m.on_end());
        })
    };
    let pass = meter(false, false);
    let strip = meter(true, false);
    let text = meter(true, true);
    println!("per-chunk cost, median of {RUNS} runs x {CHUNKS} chunks (~240 B each):");
    println!("  Bytes clone (floor)                      {floor:>8.0} ns");
    println!("  SseReader::feed                          {sse:>8.0} ns");
    println!("  ResponseMeter (client asked for usage)   {pass:>8.0} ns");
    println!("  ResponseMeter (usage injected, stripped) {strip:>8.0} ns");
    println!("  ResponseMeter (+ text for tokenizer)     {text:>8.0} ns");
}
