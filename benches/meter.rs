//! Per-chunk cost of metering a stream (`cargo bench --bench meter`).
//!
//! Feeds realistic vLLM chat chunks (one event per frame, ~240 bytes) through `ResponseMeter`
//! as the proxy does for every frame it forwards, and reports the median time per chunk over
//! repeated runs, next to the bare SSE reader and a plain `Bytes` clone (the floor). The chunk
//! reader is also timed against serde_json's reading of the same chunks (its fallback), and on
//! a whole non-streaming response of about 2 KB. Last, the recorder's publish: a snapshot of a
//! full 60 s window, the first of a second (which merges every slot) against the later ones.

use bytes::Bytes;
use goodput::meter::RequestRecord;
use goodput::meter::observe::ResponseMeter;
use goodput::meter::window::Window;
use goodput::openai::Operation;
use goodput::openai::SseReader;
use goodput::openai::response::{parse_chunk, parse_chunk_serde};
use std::hint::black_box;
use std::time::{Duration, Instant};

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
    let payloads: Vec<Bytes> = frames().iter().map(|f| f.slice(6..f.len() - 2)).collect(); // the JSON of each event
    let read_with = |f: fn(&[u8], bool) -> Option<goodput::openai::ChunkInfo<'_>>| {
        let payloads = payloads.clone();
        assert!(payloads.iter().all(|p| f(p, false).is_some_and(|c| c.content)), "every chunk reads");
        median_ns_per_chunk(move |_| {
            for p in &payloads {
                black_box(f(p, false));
            }
        })
    };
    let fast = read_with(parse_chunk);
    let serde = read_with(parse_chunk_serde);
    // Generated text as JSON escapes it: quotes and newlines.
    let words = "The quick brown fox jumps over the lazy dog, and then \"explains\" why.\n".repeat(28);
    let words = serde_json::to_string(&words).expect("a string");
    let response = format!(
        "{{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"created\":1733000000,\"model\":\"Qwen/Qwen2.5-1.5B-Instruct\",\"choices\":[{{\"index\":0,\"message\":{{\"role\":\"assistant\",\"content\":{words}}},\"logprobs\":null,\"finish_reason\":\"stop\"}}],\"usage\":{{\"prompt_tokens\":20,\"total_tokens\":420,\"completion_tokens\":400}}}}"
    );
    let whole = |f: fn(&[u8], bool) -> Option<goodput::openai::ChunkInfo<'_>>| {
        let r = response.clone();
        let read = f(r.as_bytes(), true).expect("the response reads");
        assert!(read.texts.len() == 1 && read.usage.is_some(), "the response reads whole");
        median_ns_per_chunk(move |_| {
            for _ in 0..CHUNKS / 20 {
                black_box(f(r.as_bytes(), true));
            }
        }) * 20.0
    };
    let (resp_fast, resp_serde) = (whole(parse_chunk), whole(parse_chunk_serde));
    let pass = meter(false, false);
    let strip = meter(true, false);
    let text = meter(true, true);
    println!("per-chunk cost, median of {RUNS} runs x {CHUNKS} chunks (~240 B each):");
    println!("  Bytes clone (floor)                      {floor:>8.0} ns");
    println!("  SseReader::feed                          {sse:>8.0} ns");
    println!("  ResponseMeter (client asked for usage)   {pass:>8.0} ns");
    println!("  ResponseMeter (usage injected, stripped) {strip:>8.0} ns");
    println!("  ResponseMeter (+ text for tokenizer)     {text:>8.0} ns");
    println!("  parse_chunk (one-pass reader)            {fast:>8.0} ns");
    println!(
        "  parse_chunk_serde (serde_json)           {serde:>8.0} ns   ({:.2}x the reader's)",
        serde / fast
    );
    println!("per response of {} bytes, with its text:", response.len());
    println!("  parse_response (one-pass reader)         {resp_fast:>8.0} ns");
    println!(
        "  serde_json                               {resp_serde:>8.0} ns   ({:.2}x the reader's)",
        resp_serde / resp_fast
    );
    let (first, later) = window_snapshots();
    println!(
        "per snapshot of a 60 s window, 100 records in each second (the recorder publishes 4 a second):"
    );
    println!("  first of its second (merges every slot)  {first:>8.0} ns");
    println!(
        "  later in that second (one slot added)    {later:>8.0} ns   ({:.2}x the first's)",
        later / first
    );
}

/// Median ns per snapshot: alternating between two seconds (each one a first), and repeating
/// one second (each one a later snapshot).
fn window_snapshots() -> (f64, f64) {
    let mut w = Window::new(60);
    let mut r = RequestRecord::start(0, "b".into(), "r".into(), "c".into(), "m".into(), Operation::Chat);
    for second in 0..=60 {
        for i in 0..100u64 {
            r.ttft = Some(Duration::from_micros(20_000 + i * 997 % 200_000));
            r.tpot = Some(Duration::from_micros(5_000 + i * 131 % 20_000));
            r.e2e = Duration::from_micros(200_000 + i * 7919 % 2_000_000);
            r.completion_tokens = Some(100 + i);
            w.add(second, &r, 0.0);
        }
    }
    fn time(f: &mut dyn FnMut(u64) -> u64) -> f64 {
        let mut samples: Vec<f64> = (0..RUNS)
            .map(|_| {
                let t = Instant::now();
                for k in 0..20 {
                    black_box(f(k));
                }
                t.elapsed().as_nanos() as f64 / 20.0
            })
            .collect();
        samples.sort_by(|a, b| a.partial_cmp(b).unwrap());
        samples[RUNS / 2]
    }
    let first = time(&mut |k| w.snapshot(59 + k % 2).counts.requests);
    let later = time(&mut |_| w.snapshot(60).counts.requests);
    assert_eq!(w.snapshot(60).counts.requests, 6_000, "a full window");
    (first, later)
}
