//! A backend's pool of replicas: where its endpoints come from and how one is chosen.

use serde::{Deserialize, Serialize};

/// Endpoints from DNS: every address `dns` resolves to (A and AAAA), e.g. a Kubernetes
/// headless Service, each on `port`, resolved again every `refresh_secs`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Discovery {
    pub dns: String,
    pub port: u16,
    #[serde(default = "default_refresh")]
    pub refresh_secs: u64,
    /// `http` or `https`.
    #[serde(default = "default_scheme")]
    pub scheme: String,
    /// `IP:PORT` of the DNS server to ask; default: the system's (`/etc/resolv.conf`, with its
    /// search domains, as a pod has it).
    #[serde(default)]
    pub nameserver: Option<String>,
}

fn default_refresh() -> u64 {
    10
}

fn default_scheme() -> String {
    "http".into()
}

/// How an endpoint is chosen within the pool, after the SLA class chose the backend. Filters
/// first (an endpoint past a threshold is saturated), then a weighted score; the scores are
/// each 0-1 across the pool, so a weight is how much that signal may outvote the others.
/// How the pool's endpoint is chosen: goodput's picker, or the simple policies it is measured
/// against (what a Kubernetes Service or a plain load balancer gives).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum PoolPolicy {
    #[default]
    Picker,
    RoundRobin,
    LeastOutstanding,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PoolSettings {
    /// `picker` (below), `round_robin` or `least_outstanding` (goodput's own count; no server
    /// signal): healthy endpoints only, in every case.
    pub policy: PoolPolicy,
    /// An endpoint whose server has more requests waiting than this is saturated
    /// (`vllm:num_requests_waiting`).
    pub max_waiting: f64,
    /// An endpoint whose KV cache is fuller than this (0-1) is saturated
    /// (`vllm:kv_cache_usage_perc`).
    pub max_kv_cache: f64,
    pub weights: PoolWeights,
    /// Endpoints whose scores are within this share of the best are near-ties; the less loaded
    /// of two drawn among them is taken (power of two choices).
    pub near_tie: f64,
    pub prefix: PrefixSettings,
    /// The share of choices that still go to an endpoint drained for degraded quality, so that
    /// its scores stay fresh and it returns when it recovers (`quality.drift.drain_on`).
    pub degraded_probe: f64,
}

impl Default for PoolSettings {
    fn default() -> Self {
        PoolSettings {
            policy: PoolPolicy::Picker,
            max_waiting: 5.0,
            max_kv_cache: 0.9,
            weights: PoolWeights::default(),
            near_tie: 0.05,
            prefix: PrefixSettings::default(),
            degraded_probe: 0.05,
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PoolWeights {
    /// Fewer requests at the server (waiting + running; goodput's own count when higher or
    /// when the server's is unknown).
    pub queue: f64,
    /// More free KV cache.
    pub kv_cache: f64,
    /// A longer run of the prompt's leading blocks recently sent to the endpoint.
    pub prefix: f64,
    /// A lower TTFT p95 in goodput's own window of the endpoint (with enough samples).
    pub latency: f64,
}

impl Default for PoolWeights {
    fn default() -> Self {
        PoolWeights { queue: 1.0, kv_cache: 1.0, prefix: 3.0, latency: 1.0 }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PrefixSettings {
    /// The prompt is hashed in blocks of this many bytes of its JSON text (about a quarter
    /// as many tokens); only whole blocks count, as only whole blocks are cached.
    pub block_bytes: usize,
    /// Block hashes remembered per endpoint (least recently sent forgotten first), so that the
    /// index forgets about when the replica's cache does. Unset: the replica's KV-cache size in
    /// tokens (vLLM's `cache_config_info`) x 4 bytes per token / `block_bytes`, or 16384 while
    /// the server has not said.
    pub index_blocks: Option<usize>,
    /// Only the prompt's first this many blocks are hashed.
    pub max_prompt_blocks: usize,
    /// A prefix counts only at an endpoint holding at most this many requests more than the
    /// least loaded one: past it, the queue costs more than the prefill the cache saves.
    pub max_load_gap: f64,
}

impl Default for PrefixSettings {
    fn default() -> Self {
        PrefixSettings { block_bytes: 256, index_blocks: None, max_prompt_blocks: 512, max_load_gap: 2.0 }
    }
}

impl PrefixSettings {
    /// The blocks the index keeps for an endpoint whose KV cache holds `kv_cache_tokens`.
    pub fn index_capacity(&self, kv_cache_tokens: Option<f64>) -> usize {
        self.index_blocks.unwrap_or_else(|| match kv_cache_tokens {
            Some(t) => ((t * 4.0 / self.block_bytes as f64) as usize).clamp(16, 1 << 20),
            None => 16_384,
        })
    }
}

impl PoolSettings {
    /// What is wrong with these settings, as (field, message).
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut v = Vec::new();
        let w = self.weights;
        for (f, x) in [
            ("weights.queue", w.queue),
            ("weights.kv_cache", w.kv_cache),
            ("weights.prefix", w.prefix),
            ("weights.latency", w.latency),
            ("max_waiting", self.max_waiting),
        ] {
            if !(x.is_finite() && x >= 0.0) {
                v.push((f, format!("must be a finite number >= 0, got {x}")));
            }
        }
        if !(self.max_kv_cache > 0.0 && self.max_kv_cache <= 1.0) {
            v.push(("max_kv_cache", format!("must be in (0, 1], got {}", self.max_kv_cache)));
        }
        if !(0.0..1.0).contains(&self.near_tie) {
            v.push(("near_tie", format!("must be in [0, 1), got {}", self.near_tie)));
        }
        if !(0.0..1.0).contains(&self.degraded_probe) {
            v.push(("degraded_probe", format!("must be in [0, 1), got {}", self.degraded_probe)));
        }
        if self.prefix.block_bytes < 16 {
            v.push(("prefix.block_bytes", "must be at least 16".into()));
        }
        if !(self.prefix.max_load_gap.is_finite() && self.prefix.max_load_gap >= 0.0) {
            v.push(("prefix.max_load_gap", "must be a finite number >= 0".into()));
        }
        if self.prefix.index_blocks == Some(0) {
            v.push(("prefix.index_blocks", "must be at least 1".into()));
        }
        v
    }
}
