//! Per-request cost of the routing decision (`cargo bench --bench route`): the pure `decide`
//! over 1, 3 and 8 candidates with full statistics, plus the request-id draw, as the proxy
//! runs them for every request; then the choice within a pool: hashing a prompt into blocks
//! (2k and 32k characters), the prefix index's lookup, and the pure `pick` over 2 and 8
//! endpoints. Median ns over repeated runs.

use goodput::config::PoolSettings;
use goodput::route::pool::{EndpointView, PrefixIndex, prompt_blocks};
use goodput::route::router::draw;
use goodput::route::{Candidate, Class, Objective, Policy, Stats, decide};
use std::hint::black_box;
use std::time::Instant;

const N: usize = 20_000;
const RUNS: usize = 31;

fn candidates(n: usize) -> Vec<Candidate> {
    (0..n)
        .map(|i| Candidate {
            name: format!("backend-{i}").into(),
            healthy: true,
            saturated: false,
            outstanding: i as u64,
            awaiting_sample: false,
            max_concurrency: Some(256),
            price_input: 0.1 * (i + 1) as f64,
            price_output: 0.3 * (i + 1) as f64,
            stats: Stats {
                samples: 500,
                ttft_p95_ms: Some(80.0 + 40.0 * i as f64),
                tpot_p95_ms: Some(20.0),
                e2e_p95_ms: Some(900.0),
                tokens_per_sec: 2000.0,
                scored: 40,
                perplexity: Some(8.0 + i as f64),
                rated: 20,
                hallucination_rate: Some(0.05),
                hallucination_rate_lower: Some(0.01),
            },
            degraded: None,
        })
        .collect()
}

fn median_ns(n: usize, objective: Objective) -> f64 {
    let cands = candidates(n);
    let class = Class {
        ttft_p95_ms: Some(200.0),
        tpot_p95_ms: Some(40.0),
        e2e_p95_ms: None,
        max_perplexity: Some(30.0),
        max_hallucination_rate: Some(0.2),
        objective,
    };
    let policy = Policy { min_samples: 20, min_quality_samples: 10, exploration: 0.03 };
    let mut s: Vec<f64> = (0..RUNS)
        .map(|r| {
            let t = Instant::now();
            for i in 0..N {
                black_box(decide(&class, black_box(&cands), &policy, draw((r * N + i) as u64)));
            }
            t.elapsed().as_nanos() as f64 / N as f64
        })
        .collect();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    s[RUNS / 2]
}

fn median(runs: usize, n: usize, mut f: impl FnMut(usize)) -> f64 {
    let mut s: Vec<f64> = (0..runs)
        .map(|r| {
            let t = Instant::now();
            for i in 0..n {
                f(r * n + i);
            }
            t.elapsed().as_nanos() as f64 / n as f64
        })
        .collect();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    s[runs / 2]
}

/// A chat request's `messages` JSON of about `chars` characters: a long shared system prompt.
fn messages(chars: usize) -> Vec<u8> {
    let system = "You are a careful assistant for the billing team. ".repeat(chars / 50);
    format!(r#"[{{"role":"system","content":"{system}"}},{{"role":"user","content":"What is my balance?"}}]"#)
        .into_bytes()
}

fn pool() {
    let p = PoolSettings::default();
    println!();
    println!("| pool step | ns per request (median of {RUNS}) |");
    println!("|---|---|");
    for chars in [2_000, 32_000] {
        let m = messages(chars);
        let ns = median(RUNS, 2_000, |_| {
            black_box(prompt_blocks(black_box(&m), p.prefix.block_bytes, p.prefix.max_prompt_blocks));
        });
        println!(
            "| hash a {}k-character prompt into {}-byte blocks | {ns:.0} |",
            chars / 1000,
            p.prefix.block_bytes
        );
    }
    let m = messages(32_000);
    let blocks = prompt_blocks(&m, p.prefix.block_bytes, p.prefix.max_prompt_blocks);
    let mut ix = PrefixIndex::default();
    let labels: Vec<std::sync::Arc<str>> = (0..8).map(|i| format!("10.0.0.{i}:8000").into()).collect();
    // Each endpoint's index full of other prompts, one holding this one.
    for (k, l) in labels.iter().enumerate() {
        for j in 0..(p.prefix.index_capacity(None) / 16) {
            ix.sent(l, &[(k * 1_000_000 + j) as u64], p.prefix.index_capacity(None));
        }
    }
    ix.sent(&labels[3], &blocks, p.prefix.index_capacity(None));
    let ns = median(RUNS, 2_000, |_| {
        for l in &labels {
            black_box(ix.matched(l, black_box(&blocks)));
        }
    });
    println!("| prefix index lookup, 8 endpoints, {} blocks | {ns:.0} |", blocks.len());
    for n in [2, 8] {
        let eps: Vec<EndpointView> = (0..n)
            .map(|i| EndpointView {
                label: labels[i].clone(),
                healthy: true,
                outstanding: i as u64,
                waiting: Some((i % 3) as f64),
                running: Some(4.0),
                kv_cache: Some(0.1 * i as f64),
                matched: if i == 1 { 100 } else { 0 },
                ttft_p95_ms: Some(100.0 + i as f64),
                degraded: None,
            })
            .collect();
        let ns = median(RUNS, 20_000, |i| {
            black_box(goodput::route::pool::choose(&p, black_box(&eps), 125, draw(i as u64)));
        });
        println!("| pick among {n} endpoints (no explanation) | {ns:.0} |");
    }
}

fn main() {
    println!("| candidates | objective | ns per decision (median of {RUNS} x {N}) |");
    println!("|---|---|---|");
    for n in [1, 3, 8] {
        for o in [Objective::Cheapest, Objective::BestValue] {
            println!("| {n} | {o:?} | {:.0} |", median_ns(n, o));
        }
    }
    pool();
}
