//! Per-chunk cost of metering a stream (`cargo bench --bench meter`).
//!
//! Feeds realistic vLLM chat chunks (one event per frame, ~240 bytes) through `ResponseMeter`
//! as the proxy does for every frame it forwards, and reports the median time per chunk over
//! repeated runs, next to the bare SSE reader and a plain `Bytes` clone (the floor). The chunk
//! reading is also timed alone, and on a whole non-streaming response of about 2 KB. Last, the
//! recorder's work on a full 60 s window: a second's records and its four snapshots; the
//! one per-request step here, keeping the client's request id for the record; and what an h2
//! answer's send watchdog costs, per frame and per answer.

use bytes::Bytes;
use goodput::meter::RequestRecord;
use goodput::meter::observe::ResponseMeter;
use goodput::meter::window::Window;
use goodput::openai::Operation;
use goodput::openai::SseReader;
use goodput::openai::response::parse_chunk;
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
    let chunk = read_with(parse_chunk);
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
    let resp = whole(parse_chunk);
    let pass = meter(false, false);
    let strip = meter(true, false);
    let text = meter(true, true);
    println!("per-chunk cost, median of {RUNS} runs x {CHUNKS} chunks (~240 B each):");
    println!("  Bytes clone (floor)                      {floor:>8.0} ns");
    println!("  SseReader::feed                          {sse:>8.0} ns");
    println!("  ResponseMeter (client asked for usage)   {pass:>8.0} ns");
    println!("  ResponseMeter (usage injected, stripped) {strip:>8.0} ns");
    println!("  ResponseMeter (+ text for tokenizer)     {text:>8.0} ns");
    println!("  parse_chunk (serde_json)                 {chunk:>8.0} ns");
    println!("per response of {} bytes, with its text:", response.len());
    println!("  parse_response (serde_json)              {resp:>8.0} ns");
    let id = request_id_kept();
    println!("per request:");
    println!("  the client's x-request-id kept (UUID)    {id:>8.0} ns");
    let (second, first, later) = window_publishing();
    println!(
        "the recorder's work on a full 60 s window per second, 100 records in each (it publishes 4 times a second):"
    );
    println!("  a second: 100 records and 4 snapshots    {second:>8.0} ns");
    println!("  its first snapshot                       {first:>8.0} ns");
    println!("  a later snapshot in that second          {later:>8.0} ns");
    let (bare, watched, answer) = h2_watchdog();
    println!(
        "an h2 answer's send watchdog (proxy::stall), per frame (polled, then is_end_stream) and per answer:"
    );
    println!("  a body's frame, bare                     {bare:>8.0} ns");
    println!("  the same, watched                        {watched:>8.0} ns");
    println!("  an answer watched and dropped            {answer:>8.0} ns");
}

/// A body with the same frame whenever it is polled.
struct Frames(Bytes);

impl hyper::body::Body for Frames {
    type Data = Bytes;
    type Error = goodput::proxy::error::BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        std::task::Poll::Ready(Some(Ok(hyper::body::Frame::data(self.0.clone()))))
    }
}

/// Medians, in ns: a frame polled from a bare body and from the same body watched; an answer
/// watched (its watchdog task spawned) and dropped (the task told to end, and run to its end).
fn h2_watchdog() -> (f64, f64, f64) {
    use http_body_util::BodyExt;
    use hyper::body::Body;
    use std::time::Duration;
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("a runtime");
    let counter = prometheus::IntCounter::new("c", "c").expect("a counter");
    let policy =
        || goodput::proxy::stall::Policy { after: Duration::from_secs(60), counter: counter.clone() };
    let frame = frames()[0].clone();
    rt.block_on(async {
        let mut bare = Frames(frame.clone());
        let mut watched = policy().watch(Frames(frame.clone()));
        let mut b = Vec::new();
        let mut w = Vec::new();
        for _ in 0..RUNS {
            let t = Instant::now();
            // What hyper's h2 server calls per data frame: the frame, then whether the body ended.
            for _ in 0..CHUNKS {
                black_box(bare.frame().await);
                black_box(bare.is_end_stream());
            }
            b.push(t.elapsed().as_nanos() as f64 / CHUNKS as f64);
            let t = Instant::now();
            for _ in 0..CHUNKS {
                black_box(watched.frame().await);
                black_box(watched.is_end_stream());
            }
            w.push(t.elapsed().as_nanos() as f64 / CHUNKS as f64);
        }
        let mut a = Vec::new();
        for _ in 0..RUNS {
            let t = Instant::now();
            for _ in 0..CHUNKS / 10 {
                drop(black_box(policy().watch(Frames(frame.clone()))));
                tokio::task::yield_now().await; // the watchdog runs, sees the end, and returns
            }
            a.push(t.elapsed().as_nanos() as f64 / (CHUNKS / 10) as f64);
        }
        let median = |mut v: Vec<f64>| {
            v.sort_by(|a, b| a.partial_cmp(b).unwrap());
            v[v.len() / 2]
        };
        (median(b), median(w), median(a))
    })
}

/// The request-id step of a metered request's record: the header looked up among an SDK's
/// usual headers, checked and copied.
fn request_id_kept() -> f64 {
    let mut h = http::HeaderMap::new();
    for (k, v) in [
        ("host", "vllm.llm.svc:8000"),
        ("content-type", "application/json"),
        ("accept", "application/json"),
        ("user-agent", "OpenAI/Python 1.99.0"),
        ("authorization", "Bearer sk-0123456789abcdef"),
        ("x-stainless-lang", "python"),
        ("x-stainless-retry-count", "0"),
        ("x-request-id", "3f2c9d8e-1b7a-4c6d-9e0f-a1b2c3d4e5f6"),
    ] {
        h.insert(k, v.parse().expect("a header value"));
    }
    median_ns_per_chunk(move |_| {
        for _ in 0..CHUNKS {
            black_box(RequestRecord::client_request_id(black_box(&h).get("x-request-id")));
        }
    })
}

/// Medians over RUNS seconds of a full window, each second as the recorder lives it: the
/// second's 100 records (the first of them empties the slot that leaves the window), then four
/// snapshots. Returns ns for the whole second, its first snapshot and a later one.
fn window_publishing() -> (f64, f64, f64) {
    let mut w = Window::new(60);
    let mut r = RequestRecord::start(0, Operation::Chat);
    let mut fill = |w: &mut Window, second: u64| {
        for i in 0..100u64 {
            r.ttft = Some(Duration::from_micros(20_000 + (i + second) * 997 % 200_000));
            r.tpot = Some(Duration::from_micros(5_000 + (i + second) * 131 % 20_000));
            r.e2e = Duration::from_micros(200_000 + (i + second) * 7919 % 2_000_000);
            r.completion_tokens = Some(100 + i);
            w.add(second, &r, 0.0);
        }
    };
    for second in 0..60 {
        fill(&mut w, second);
        w.snapshot(second);
    }
    let (mut whole, mut first, mut later) = (Vec::new(), Vec::new(), Vec::new());
    for second in 60..60 + RUNS as u64 {
        let t = Instant::now();
        fill(&mut w, second);
        let t1 = Instant::now();
        black_box(w.snapshot(second).counts.requests);
        let t2 = Instant::now();
        for _ in 0..3 {
            black_box(w.snapshot(second).counts.requests);
        }
        let t3 = Instant::now();
        whole.push((t3 - t).as_nanos() as f64);
        first.push((t2 - t1).as_nanos() as f64);
        later.push((t3 - t2).as_nanos() as f64 / 3.0);
    }
    assert_eq!(w.snapshot(60 + RUNS as u64 - 1).counts.requests, 6_000, "a full window");
    let median = |mut v: Vec<f64>| {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[v.len() / 2]
    };
    (median(whole), median(first), median(later))
}
