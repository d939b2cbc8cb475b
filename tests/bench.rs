//! `goodput bench` against the simulator: open-loop Poisson arrivals, closed-loop concurrency,
//! the vLLM-style figures and goodput, a ShareGPT file, errors reported, and the outputs'
//! perplexity under the real reference model (the tput-vs-ppl picture of two backends).

use crate::common::*;
use serde_json::Value;
use std::process::Command;

fn bench(args: &[&str]) -> (bool, Value, String) {
    let dir = temp_dir("bench");
    let json = dir.join("result.json");
    let out = Command::new(env!("CARGO_BIN_EXE_goodput"))
        .arg("bench")
        .args(args)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let v = std::fs::read(&json).map(|b| serde_json::from_slice(&b).unwrap()).unwrap_or(Value::Null);
    let _ = std::fs::remove_dir_all(&dir);
    (out.status.success(), v, text)
}

fn f(v: &Value, path: &str) -> f64 {
    v.pointer(path).and_then(Value::as_f64).unwrap_or_else(|| panic!("{path} in {v}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_poisson_run_reports_latency_throughput_and_goodput() {
    let (addr, sim) = spawn_sim(20.0, 2.0, 16).await;
    let target = format!("http://{addr}");
    let (ok, r, text) = bench(&[
        "--target",
        &target,
        "--rate",
        "50",
        "--num-requests",
        "100",
        "--goodput",
        "ttft:200",
        "tpot:20",
    ]);
    assert!(ok, "{text}");
    assert!(text.contains("Request goodput (req/s):") && text.contains("P99 TTFT (ms):"), "{text}");
    assert_eq!((r["completed"].as_u64(), r["failed"].as_u64()), (Some(100), Some(0)));
    assert_eq!(sim.requests(), 100);
    assert_eq!(r["total_output_tokens"], 1600, "16 tokens each, from usage");
    assert_eq!(r["output_tokens_from_usage"], 1.0);
    // The simulator's TTFT is 20 ms and its TPOT 2 ms. The upper bounds leave room for a
    // machine busy with other work (CI warms two vLLM servers up beside this test); they still
    // tell TPOT from TTFT, and a unit error (seconds, µs) from either.
    let ttft = f(&r, "/ttft/median_ms");
    assert!((19.0..60.0).contains(&ttft), "TTFT median {ttft}");
    let tpot = f(&r, "/tpot/median_ms");
    assert!((1.9..10.0).contains(&tpot), "TPOT median {tpot}");
    let itl = f(&r, "/itl/median_ms");
    assert!((1.5..10.0).contains(&itl), "ITL median {itl}");
    // 100 Poisson arrivals at 50/s take about 2 s (seeded: the same every run).
    let rate = f(&r, "/request_throughput");
    assert!((30.0..70.0).contains(&rate), "{rate} req/s");
    assert_eq!(f(&r, "/request_goodput"), rate, "every request met the SLOs");
    let (ok, r, _) =
        bench(&["--target", &target, "--rate", "50", "--num-requests", "20", "--goodput", "ttft:5"]);
    assert!(ok);
    assert_eq!(f(&r, "/request_goodput"), 0.0, "none met a 5 ms TTFT");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_loop_concurrency_non_streaming_and_a_sharegpt_file() {
    let (addr, sim) = spawn_sim(10.0, 2.0, 16).await;
    let target = format!("http://{addr}");
    let (ok, r, text) =
        bench(&["--target", &target, "--concurrency", "4", "--num-requests", "80", "--no-stream", "--quiet"]);
    assert!(ok, "{text}");
    assert!(!text.contains("done,"), "--quiet prints no progress");
    assert_eq!(r["completed"], 80);
    assert_eq!(r["concurrency"], 4);
    // Four clients back to back, each request ~40 ms (10 + 15 x 2): about 100 req/s at most.
    let rate = f(&r, "/request_throughput");
    assert!((40.0..105.0).contains(&rate), "{rate} req/s");
    assert_eq!(f(&r, "/ttft/median_ms"), f(&r, "/e2el/median_ms"), "a non-stream TTFT is its e2e");
    assert!(sim.completed() >= 80);

    let dir = temp_dir("sharegpt");
    let data = dir.join("sharegpt.json");
    std::fs::write(
        &data,
        r#"[{"conversations":[{"from":"human","value":"Tell me about the old bridge over the river."},{"from":"gpt","value":"It was built of stone long ago."}]},
            {"conversations":[{"from":"human","value":"What do bakers do in the morning?"},{"from":"gpt","value":"They open early and bake bread."}]}]"#,
    )
    .unwrap();
    let (ok, r, text) = bench(&[
        "--target",
        &target,
        "--concurrency",
        "2",
        "--num-requests",
        "6",
        "--dataset",
        data.to_str().unwrap(),
    ]);
    assert!(ok, "{text}");
    assert_eq!(r["completed"], 6);
    assert_eq!(r["total_output_tokens"], 3 * 7 + 3 * 6, "max_tokens = each answer's words (7 and 6)");
    assert!(r["workload"].as_str().unwrap().starts_with("sharegpt:"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_counted_and_reported() {
    let cfg = goodput::sim::SimConfig { error_rate: 1.0, ..Default::default() };
    let (addr, _sim) = goodput::sim::spawn(cfg, "127.0.0.1:0").await.unwrap();
    let (ok, r, text) = bench(&[
        "--target",
        &format!("http://{addr}"),
        "--concurrency",
        "2",
        "--num-requests",
        "5",
        "--quiet",
    ]);
    assert!(!ok, "no request succeeded: a failed run");
    assert!(text.contains("HTTP 500"), "{text}");
    assert_eq!(r["failed"], 5);
    let (_refusing, refused) = refusing_port();
    let (ok, _, text) = bench(&[
        "--target",
        &format!("http://127.0.0.1:{refused}"),
        "--rate",
        "10",
        "--num-requests",
        "2",
        "--quiet",
    ]);
    assert!(!ok && text.contains("request failed"), "{text}");
    let (ok, _, text) = bench(&["--target", "http://x", "--goodput", "latency:5"]);
    assert!(!ok && text.contains("ttft, tpot and e2el"), "{text}");
}

/// One run per backend gives the seed's tput-vs-ppl picture: the backend whose text is mostly
/// noise has a far higher perplexity under the reference model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outputs_are_scored_for_perplexity() {
    let (dir, ort) = reference_model();
    let mut ppl = Vec::new();
    let dir_out = temp_dir("bench-plot");
    let mut results = Vec::new();
    for q in [1.0, 0.3] {
        let cfg = goodput::sim::SimConfig {
            quality: Some(q),
            output_tokens: 24,
            ttft_ms: 5.0,
            tpot_ms: 1.0,
            ..Default::default()
        };
        let (addr, _sim) = goodput::sim::spawn(cfg, "127.0.0.1:0").await.unwrap();
        let (ok, r, text) = bench(&[
            "--target",
            &format!("http://{addr}"),
            "--concurrency",
            "2",
            "--num-requests",
            "8",
            "--quiet",
            "--score-model",
            &dir,
            "--onnxruntime",
            &ort,
            "--label",
            &format!("quality {q}"),
        ]);
        assert!(ok, "{text}");
        assert!(text.contains("Perplexity (geometric mean):"), "{text}");
        assert_eq!(r["quality"]["scored"], 8, "{r}");
        ppl.push(f(&r, "/quality/perplexity_geomean"));
        let file = dir_out.join(format!("q{q}.json"));
        std::fs::write(&file, r.to_string()).unwrap();
        results.push(file);
    }
    assert!(ppl[0] < 100.0 && ppl[1] > 300.0, "{ppl:?}");

    // The seed's picture from the two results: a PNG that decodes and has two coloured points.
    let png = dir_out.join("tput-vs-ppl.png");
    let out = Command::new(env!("CARGO_BIN_EXE_goodput"))
        .args(["bench", "--plot", png.to_str().unwrap(), "--results"])
        .arg(&results[0])
        .arg("--results")
        .arg(&results[1])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (w, h, colours, dark) = png_stats(&png);
    assert_eq!((w, h), (960, 600));
    assert!(colours >= 2, "two series colours: {colours}");
    assert!(dark > 2_000, "axes and text drawn: {dark} dark pixels");
    let _ = std::fs::remove_dir_all(&dir_out);
}

/// Width, height, distinct saturated colours, and near-black pixels of a PNG.
fn png_stats(path: &std::path::Path) -> (u32, u32, usize, usize) {
    let img = image::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).to_rgb8();
    let mut colours = std::collections::HashSet::new();
    let mut dark = 0;
    for p in img.pixels() {
        let [r, g, b] = p.0;
        let (mx, mn) = (r.max(g).max(b), r.min(g).min(b));
        if mx < 60 {
            dark += 1;
        } else if mx - mn > 80 {
            colours.insert((r / 32, g / 32, b / 32));
        }
    }
    (img.width(), img.height(), colours.len(), dark)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_draws_its_latency_cdf() {
    let (addr, _sim) = spawn_sim(10.0, 2.0, 8).await;
    let dir = temp_dir("bench-cdf");
    let png = dir.join("cdf.png");
    let (ok, _, text) = bench(&[
        "--target",
        &format!("http://{addr}"),
        "--rate",
        "100",
        "--num-requests",
        "50",
        "--quiet",
        "--plot",
        png.to_str().unwrap(),
    ]);
    assert!(ok, "{text}");
    let (w, h, colours, dark) = png_stats(&png);
    assert_eq!((w, h), (960, 600));
    assert!(colours >= 1 && dark > 2_000, "a curve, axes and text: {colours} colours, {dark} dark pixels");
    let _ = std::fs::remove_dir_all(&dir);
}
