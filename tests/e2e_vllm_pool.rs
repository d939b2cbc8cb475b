//! Routing within a pool of two real vLLM replicas: the CPU build serving SmolLM2, started once
//! for the run by `scripts/test.sh`, each with `--max-num-seqs 4` and a KV cache of 32 blocks of
//! 128 tokens (4,096 tokens), so that a queue forms in seconds and a few long system prompts fill
//! one replica's prefix cache but not the pool's.
//! - A queue that traffic goodput does not see moves goodput's picks to the other replica
//!   within a few scrapes, before goodput's own latency windows hold a single sample.
//! - Prefix affinity (its index sized from each replica's KV cache as vLLM reports it):
//!   requests sharing long system prompts, through goodput's picker and through
//!   round robin (what a Kubernetes Service gives, near enough): vLLM's own prefix-cache hit
//!   ratio is clearly higher with affinity, and TTFT lower.

use crate::common::vllm::*;
use crate::common::*;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

fn pool_yaml(a: &Vllm, b: &Vllm, pool: &str) -> String {
    format!(
        r#"
backends:
  - name: pool
    endpoints: ["{}", "{}"]
    server_metrics: {{interval_ms: 250}}
    pool: {{prefix: {{max_load_gap: 2}}{pool}}}
routing: {{exploration: 0.0, response_headers: true, recent_decisions: 1000}}
metrics: {{recent_records: 1000}}
"#,
        a.url, b.url
    )
}

fn header(r: &Reply, k: &str) -> String {
    r.headers.get(k).map(|v| v.to_str().unwrap().to_string()).unwrap_or_default()
}

/// What vLLM itself reports of one replica's load.
async fn load(v: &Vllm) -> f64 {
    let m = v.metrics().await;
    m.get("vllm:num_requests_waiting").copied().unwrap_or(0.0)
        + m.get("vllm:num_requests_running").copied().unwrap_or(0.0)
}

async fn idle(v: &Vllm) {
    let t = Instant::now();
    while load(v).await > 0.0 {
        assert!(t.elapsed() < Duration::from_secs(60), "vLLM still busy:\n{}", v.tail());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_goodput_does_not_see_moves_its_picks_to_the_other_replica() {
    let (_one, a, b) = vllm_pool().await;
    idle(&a).await;
    idle(&b).await;
    let gp = Goodput::start(&pool_yaml(&a, &b, ""));
    // Eight clients straight to `a`, each sending its next long generation as the last ends:
    // four run and four wait for as long as the test takes (on a busy two-core machine the six
    // requests below can outlast one round of generations).
    let direct: Vec<_> = (0..8)
        .map(|i| {
            let addr = a.addr;
            tokio::spawn(async move {
                for round in 0.. {
                    let body = format!(
                        r#"{{"model":"smollm2","prompt":"Tell me a long story, number {i}.{round}.","max_tokens":600,"ignore_eos":true}}"#
                    );
                    send(addr, post_json("/v1/completions", &body)).await;
                }
            })
        })
        .collect();
    // goodput sees it through a's /metrics.
    let t = Instant::now();
    loop {
        let bk = gp.admin_json("/admin/backends").await;
        let eps = bk["backends"][0]["endpoints"].as_array().unwrap().clone();
        let a_view = eps.iter().find(|e| e["endpoint"] == a.addr.to_string()).unwrap();
        if a_view["server"]["waiting"].as_f64().unwrap_or(0.0) >= 2.0 {
            assert!(a_view["window"].is_null(), "goodput has measured nothing at a: {a_view}");
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "goodput never saw a's queue: {eps:?}\n{}", a.tail());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut to = HashMap::new();
    let mut seen = Vec::new();
    for i in 0..6 {
        let body = format!(
            r#"{{"model":"smollm2","messages":[{{"role":"user","content":"Say hello, {i}."}}],"max_tokens":4}}"#
        );
        let r = send(gp.proxy, post_json("/v1/chat/completions", &body)).await;
        assert_eq!(r.status, 200, "{}", r.text());
        *to.entry((header(&r, "x-goodput-endpoint"), header(&r, "x-goodput-endpoint-reason")))
            .or_insert(0) += 1;
        let routes = gp.admin_json("/admin/routes").await;
        seen.push(format!(
            "{:.1}s: {} (vLLM at a: {} running, {} waiting)",
            t.elapsed().as_secs_f64(),
            routes["routes"][0]["recent_decisions"][0]["endpoint_explanation"],
            a.metrics().await.get("vllm:num_requests_running").copied().unwrap_or(-1.0),
            a.metrics().await.get("vllm:num_requests_waiting").copied().unwrap_or(-1.0),
        ));
    }
    eprintln!("{}", seen.join("\n"));
    assert_eq!(
        to,
        HashMap::from([((b.addr.to_string(), "least_queue".to_string()), 6)]),
        "{to:?}\n{}",
        seen.join("\n")
    );
    let routes = gp.admin_json("/admin/routes").await;
    let why =
        routes["routes"][0]["recent_decisions"][0]["endpoint_explanation"].as_str().unwrap().to_string();
    assert!(why.starts_with(&format!("least_queue: {}", b.addr)), "{why}");
    eprintln!("decision: {why}");
    for d in direct {
        d.abort();
    }
    // The hang-ups abort the generations: the replicas are idle for the next test.
    idle(&a).await;
}

/// One mode of the prefix experiment: `rounds` of the same six long system prompts (fresh ones
/// per mode), each with a new question, from two clients at once. Returns vLLM's prefix-cache
/// hit ratio over the pool, goodput's TTFTs, and how many of each prompt's requests went to
/// each endpoint.
async fn shared_prefixes(
    gp: &Goodput,
    a: &Vllm,
    b: &Vllm,
    tag: &str,
    rounds: usize,
) -> (f64, Vec<f64>, Vec<BTreeMap<String, usize>>, HashMap<String, usize>) {
    let systems: Vec<String> = (0..6)
        .map(|k| {
            (0..40)
                .map(|j| format!("Rule {j} of desk {tag}-{k}: answer in one short sentence and cite handbook section {k}.{j}. "))
                .collect()
        })
        .collect();
    let count = |m: &HashMap<String, f64>, k: &str| m.get(k).copied().unwrap_or(0.0);
    let (qa, qb) = (a.metrics().await, b.metrics().await);
    // Two clients at once, each going through all six prompts, the second half a cycle behind.
    // Not three prompts each: with two replicas of the same speed the clients move in step, and
    // round robin's counter then sends one client's every request to A and the other's to B,
    // an affinity by accident that no real traffic has (seen in CI once each replica got a core
    // of its own).
    let n_prompts = systems.len();
    let worker = |offset: usize| {
        let (proxy, systems) = (gp.proxy, systems.clone());
        async move {
            let mut out = Vec::new();
            for r in 0..rounds {
                for k in (0..n_prompts).map(|i| (i + offset) % n_prompts) {
                    let body = serde_json::json!({
                        "model": "smollm2", "stream": true, "max_tokens": 4,
                        "messages": [{"role": "system", "content": systems[k]}, {"role": "user", "content": format!("Question {r}: which section?")}],
                    });
                    let resp = send(proxy, post_json("/v1/chat/completions", &body.to_string())).await;
                    assert_eq!(resp.status, 200, "{}", resp.text());
                    out.push((
                        k,
                        header(&resp, "x-goodput-endpoint"),
                        header(&resp, "x-goodput-endpoint-reason"),
                    ));
                }
            }
            out
        }
    };
    let (w0, w1) = tokio::join!(worker(0), worker(n_prompts / 2));
    let mut went: Vec<BTreeMap<String, usize>> = vec![BTreeMap::new(); systems.len()];
    let mut reasons = HashMap::new();
    for (k, e, why) in w0.into_iter().chain(w1) {
        *went[k].entry(e).or_insert(0) += 1;
        *reasons.entry(why).or_insert(0) += 1;
    }
    let (za, zb) = (a.metrics().await, b.metrics().await);
    let queries = count(&za, "vllm:prefix_cache_queries_total")
        - count(&qa, "vllm:prefix_cache_queries_total")
        + count(&zb, "vllm:prefix_cache_queries_total")
        - count(&qb, "vllm:prefix_cache_queries_total");
    let hits = count(&za, "vllm:prefix_cache_hits_total") - count(&qa, "vllm:prefix_cache_hits_total")
        + count(&zb, "vllm:prefix_cache_hits_total")
        - count(&qb, "vllm:prefix_cache_hits_total");
    let n = 2 * rounds * systems.len();
    let recs = gp.records(n).await;
    let mut ttft: Vec<f64> = recs.iter().take(n).filter_map(|r| r["ttft"].as_f64()).collect();
    ttft.sort_by(f64::total_cmp);
    (hits / queries.max(1.0), ttft, went, reasons)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefix_affinity_raises_vllms_own_prefix_hits_over_round_robin() {
    let (_one, a, b) = vllm_pool().await;
    idle(&a).await;
    idle(&b).await;
    let picker = Goodput::start(&pool_yaml(&a, &b, ""));
    // Round robin: what a Kubernetes Service gives, near enough, through the same proxy.
    let rr = Goodput::start(&pool_yaml(&a, &b, ", policy: round_robin"));
    // The index is sized from each replica's own KV cache (vllm:cache_config_info: 32 blocks
    // of 128 tokens), so that it forgets about when vLLM does: 4,096 tokens x 4 bytes / 256.
    let t = Instant::now();
    loop {
        let bk = picker.admin_json("/admin/backends").await;
        let eps = bk["backends"][0]["endpoints"].as_array().unwrap().clone();
        if eps.iter().all(|e| !e["server"].is_null()) {
            for e in &eps {
                assert_eq!(e["server"]["kv_cache_tokens"], 4096.0, "{e}");
                assert_eq!(e["prefix_index"]["capacity"], 64, "{e}");
            }
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "no scrape of the replicas: {eps:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rounds = 4;
    let (hit_p, ttft_p, went_p, why_p) = shared_prefixes(&picker, &a, &b, "p", rounds).await;
    let (hit_r, ttft_r, went_r, _) = shared_prefixes(&rr, &a, &b, "r", rounds).await;
    let med = |v: &[f64]| v[v.len() / 2];
    eprintln!(
        "prefix hit ratio: picker {hit_p:.3}, round robin {hit_r:.3}; TTFT p50: picker {:.0} ms, round robin {:.0} ms; \
         replicas per prompt: picker {:?}, round robin {:?}; reasons {why_p:?}",
        med(&ttft_p) * 1000.0,
        med(&ttft_r) * 1000.0,
        went_p.iter().map(BTreeMap::len).collect::<Vec<_>>(),
        went_r.iter().map(BTreeMap::len).collect::<Vec<_>>(),
    );
    // Each prompt has a home, the replica most of its requests went to. Every request after
    // each of the six prompts' first is a prefix hit there (two clients), but for a few the
    // policy sends elsewhere or decides otherwise: near ties, a home short of KV cache
    // (kv_headroom) or much busier (max_load_gap). CI saw one kv_headroom spill in 48.
    let (requests, prompts) = (2 * 6 * rounds, 6);
    let home = |w: &BTreeMap<String, usize>| w.iter().max_by_key(|(_, n)| **n).map(|(e, _)| e.clone());
    let strays: usize =
        went_p.iter().map(|w| w.values().sum::<usize>() - w.values().max().unwrap_or(&0)).sum();
    assert!(strays <= 4, "each prompt stays on its replica but for a few: {went_p:?}, reasons {why_p:?}");
    let homes: BTreeSet<String> = went_p.iter().filter_map(home).collect();
    assert_eq!(homes.len(), 2, "the prompts are spread over both replicas: {went_p:?}");
    assert!(why_p.get("prefix_hit").copied().unwrap_or(0) >= requests - prompts - 4, "{why_p:?}");
    assert!(hit_p > hit_r + 0.15, "vLLM's prefix hits: picker {hit_p:.3}, round robin {hit_r:.3}");
    assert!(
        med(&ttft_p) < med(&ttft_r),
        "TTFT p50: picker {:?}, round robin {:?}",
        med(&ttft_p),
        med(&ttft_r)
    );
}
