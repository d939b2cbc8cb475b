//! The CUDA execution provider, on a machine with an NVIDIA GPU (scripts/gpu-check.sh runs it):
//! `cargo test --release --features cuda --test cuda` with ORT_DYLIB_PATH naming onnxruntime-gpu's
//! libonnxruntime.so (1.31, built for CUDA 13; its CUDA libraries on the loader path) and
//! GOODPUT_MODEL_DIR the converted SmolLM2 (scripts/setup-models.sh). Without the `cuda` feature
//! there is nothing to test here: tests/perplexity.rs checks how such a build refuses `cuda:N`.
#![cfg(feature = "cuda")]

use goodput::config::Device;
use goodput::quality::lm::{LmAssets, LmOptions, ReferenceLm};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

fn env(k: &str) -> PathBuf {
    std::env::var_os(k)
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("{k} is not set (scripts/gpu-check.sh sets it)"))
}

fn ppl(lps: &[Vec<f32>], rows: &[&[u32]]) -> f64 {
    let (mut ll, mut n) = (0f64, 0usize);
    for (l, r) in lps.iter().zip(rows) {
        ll += l[..r.len() - 1].iter().map(|&x| f64::from(x)).sum::<f64>();
        n += r.len() - 1;
    }
    (-ll / n as f64).exp()
}

#[test]
fn cuda_scores_as_the_cpu_does() {
    let dir = env("GOODPUT_MODEL_DIR");
    let ort = env("ORT_DYLIB_PATH");
    let assets = Arc::new(LmAssets::load(&dir).unwrap());
    let text = std::fs::read_to_string("tests/fixtures/paragraph.txt").unwrap();
    let mut ids = vec![assets.prefix_id];
    ids.extend(assets.encode(&text).unwrap());
    // The whole paragraph, and a right-padded batch of unequal rows.
    let whole: Vec<&[u32]> = vec![&ids];
    let batch: Vec<&[u32]> = (0..4).map(|i| &ids[..ids.len() - 13 * i]).collect();

    let opts = |device| LmOptions {
        onnxruntime: Some(ort.clone()),
        device,
        allow_cpu_fallback: false,
        intra_op_threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
    };
    let mut cpu = ReferenceLm::load(&dir, assets.clone(), &opts(Device::Cpu)).unwrap();
    let mut gpu = ReferenceLm::load(&dir, assets.clone(), &opts(Device::Cuda(0)))
        .unwrap_or_else(|e| panic!("the CUDA execution provider did not load: {e}"));
    assert_eq!(gpu.device, Device::Cuda(0), "no fallback was allowed");

    for rows in [&whole, &batch] {
        let c = cpu.next_token_logprobs(rows).unwrap();
        let g = gpu.next_token_logprobs(rows).unwrap();
        let max_diff = c
            .iter()
            .zip(&g)
            .zip(rows.iter())
            .flat_map(|((a, b), r)| {
                a[..r.len() - 1].iter().zip(&b[..r.len() - 1]).map(|(x, y)| (x - y).abs())
            })
            .fold(0f32, f32::max);
        let (pc, pg) = (ppl(&c, rows), ppl(&g, rows));
        eprintln!("rows {}: ppl cpu {pc:.4} cuda {pg:.4}, max |Δ log p| {max_diff:.5}", rows.len());
        // CUDA's kernels sum in another order (and may use TF32): equal to 0.5% in perplexity, and
        // no token's log-probability off by more than 0.05 nats.
        assert!((pc - pg).abs() / pc < 0.005, "perplexity cpu {pc} vs cuda {pg}");
        assert!(max_diff < 0.05, "a token's log-probability differs by {max_diff}");
    }

    // Timings for the record (scripts/gpu-check.sh prints them); not asserted.
    for (name, lm) in [("cpu", &mut cpu), ("cuda:0", &mut gpu)] {
        lm.next_token_logprobs(&batch).unwrap();
        let t = Instant::now();
        for _ in 0..5 {
            lm.next_token_logprobs(&batch).unwrap();
        }
        let toks: usize = batch.iter().map(|r| r.len()).sum::<usize>() * 5;
        eprintln!("{name}: {:.0} tokens/s", toks as f64 / t.elapsed().as_secs_f64());
    }
}
