//! Scoring throughput of the reference LM through goodput's own path (ort + tokenizers):
//! tokens/s at batch 1x512 and 8x128 (`cargo bench --bench scoring`). Needs GOODPUT_MODEL_DIR
//! and ORT_DYLIB_PATH (scripts/setup-models.sh, scripts/setup-onnxruntime.sh);
//! scripts/bench-scoring.sh runs it beside Python onnxruntime and llama.cpp on the same model.
//! Prints one JSON line per shape: median tokens/s over BENCH_REPS runs (default 7). With
//! GOODPUT_EMBED_DIR (scripts/setup-embeddings.sh) also the sentence encoder's sentences/s.
//! BENCH_DEVICE=cuda:N runs the LM on a GPU (a build with `--features cuda`; scripts/gpu-check.sh),
//! BENCH_SHAPES="1x512 8x128 32x512" sets the batch shapes.

use goodput::config::Device;
use goodput::quality::lm::{LmAssets, LmOptions, ReferenceLm};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

fn main() {
    let Some(dir) = std::env::var_os("GOODPUT_MODEL_DIR").map(PathBuf::from) else {
        eprintln!("scoring bench: GOODPUT_MODEL_DIR is not set (scripts/bench-scoring.sh sets it); skipped");
        return;
    };
    let threads: usize = std::env::var("BENCH_THREADS").ok().and_then(|v| v.parse().ok()).unwrap_or(2);
    let reps: usize = std::env::var("BENCH_REPS").ok().and_then(|v| v.parse().ok()).unwrap_or(7);
    let assets = Arc::new(LmAssets::load(&dir).expect("model assets"));
    let device: Device =
        std::env::var("BENCH_DEVICE").unwrap_or_else(|_| "cpu".into()).parse().expect("BENCH_DEVICE");
    let shapes: Vec<(usize, usize)> = std::env::var("BENCH_SHAPES")
        .unwrap_or_else(|_| "1x512 8x128".into())
        .split_whitespace()
        .map(|s| {
            s.split_once('x')
                .and_then(|(b, s)| Some((b.parse().ok()?, s.parse().ok()?)))
                .expect("BENCH_SHAPES")
        })
        .collect();
    let opts = LmOptions { device, intra_op_threads: threads, ..Default::default() };
    let mut lm = ReferenceLm::load(&dir, assets, &opts).expect("model");
    // Fixed pseudo-random ids (same generator as scripts/bench/scoring.py: LCG mod 49152).
    let ids = |n: usize, seed: u64| -> Vec<u32> {
        let mut x = seed;
        (0..n)
            .map(|_| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407) % (1 << 63);
                ((x >> 33) % 49_000 + 100) as u32
            })
            .collect()
    };
    if let Some(edir) = std::env::var_os("GOODPUT_EMBED_DIR").map(PathBuf::from) {
        embedding(&edir, threads, reps);
    }
    let dev = if device == Device::Cpu { String::new() } else { format!(",\"device\":\"{device:?}\"") };
    for (b, s) in shapes {
        let rows: Vec<Vec<u32>> = (0..b).map(|i| ids(s, i as u64 + 1)).collect();
        let refs: Vec<&[u32]> = rows.iter().map(|r| r.as_slice()).collect();
        lm.next_token_logprobs(&refs).expect("warm-up run");
        let mut rates: Vec<f64> = (0..reps)
            .map(|_| {
                let t = Instant::now();
                let out = lm.next_token_logprobs(&refs).expect("run");
                std::hint::black_box(out);
                (b * s) as f64 / t.elapsed().as_secs_f64()
            })
            .collect();
        rates.sort_by(f64::total_cmp);
        println!(
            "{{\"impl\":\"goodput (ort)\",\"shape\":\"{b}x{s}\",\"threads\":{threads}{dev},\"tokens_per_s\":{:.1}}}",
            rates[reps / 2]
        );
    }
}

/// Sentences/s of the embedding model on typical response sentences (12-25 words), in batches
/// of 1 and 16 (a check embeds a response's sentences, then each sample's, batch by batch).
fn embedding(dir: &std::path::Path, threads: usize, reps: usize) {
    let mut e = goodput::quality::embed::Embedder::load(dir, None, threads).expect("embedding model");
    let words =
        ["the", "tower", "was", "built", "in", "Paris", "for", "a", "fair", "and", "it", "stands", "tall"];
    let sentences: Vec<String> = (0..64)
        .map(|i| {
            (0..12 + i % 14).map(|j| words[(i * 7 + j * 3) % words.len()]).collect::<Vec<_>>().join(" ") + "."
        })
        .collect();
    let refs: Vec<&str> = sentences.iter().map(String::as_str).collect();
    for batch in [1usize, 16] {
        e.embed(&refs[..batch]).expect("warm-up");
        let mut rates: Vec<f64> = (0..reps)
            .map(|_| {
                let t = Instant::now();
                for chunk in refs.chunks(batch) {
                    std::hint::black_box(e.embed(chunk).expect("embed"));
                }
                refs.len() as f64 / t.elapsed().as_secs_f64()
            })
            .collect();
        rates.sort_by(f64::total_cmp);
        println!(
            "{{\"impl\":\"goodput embedding (ort)\",\"shape\":\"batch {batch}\",\"threads\":{threads},\"sentences_per_s\":{:.1}}}",
            rates[reps / 2]
        );
    }
}
