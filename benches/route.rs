//! Per-request cost of the routing decision (`cargo bench --bench route`): the pure `decide`
//! over 1, 3 and 8 candidates with full statistics, plus the request-id draw, as the proxy
//! runs them for every request. Median ns per decision over repeated runs.

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
            outstanding: i as u64,
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
                checked: 20,
                hallucination_rate: Some(0.05),
            },
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

fn main() {
    println!("| candidates | objective | ns per decision (median of {RUNS} x {N}) |");
    println!("|---|---|---|");
    for n in [1, 3, 8] {
        for o in [Objective::Cheapest, Objective::BestValue] {
            println!("| {n} | {o:?} | {:.0} |", median_ns(n, o));
        }
    }
}
