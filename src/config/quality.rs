//! The `quality:` section: which responses are scored, and the perplexity scorer's model.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct QualityConfig {
    /// Share of metered requests scored, chosen deterministically by request id (the
    /// `x-request-id` header when present). Routes may override it.
    pub sample_rate: f64,
    /// A request carrying this header (any value but `0` or `false`) is scored whatever the rate.
    pub force_header: String,
    /// Responses waiting for a scoring thread; when full, new ones are dropped and counted.
    pub queue_capacity: usize,
    /// Length of the per-backend quality windows (scores are sparse: longer than latency's).
    pub window_secs: u64,
    /// Cores that scoring (perplexity and embeddings) may keep busy on average; what is sampled
    /// beyond it is dropped and counted. Default: 5% of the cores available, at least 0.1. Read at
    /// start-up.
    pub max_cpu: Option<f64>,
    /// The reference language model; without it no perplexity is scored. Read at start-up.
    pub perplexity: Option<PerplexityConfig>,
    /// SelfCheckGPT-style consistency checks by shadow re-sampling; without it none run.
    pub consistency: Option<ConsistencyConfig>,
    /// When a backend's or an endpoint's windowed scores count as worse than its reference.
    pub drift: DriftConfig,
}

/// Drift (`quality::drift`): each backend and pool endpoint against its peers serving the same
/// model, or its own baseline, per signal (bits per byte, consistency score).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DriftConfig {
    /// Scores needed on each side before a drift is stated.
    pub min_samples: u64,
    /// Confident drift: the 95% interval of (mean − reference mean) lies above this.
    pub min_effect_bits_per_byte: f64,
    pub min_effect_consistency: f64,
    /// The baseline window of a unit without peers (it includes the quality window).
    pub baseline_secs: u64,
    /// Route around a confident drift of these signals: such a backend complies with no
    /// class, and such a pool endpoint is drained but for its pool's `degraded_probe` share.
    /// Bits per byte only by default: a fault that makes answers uniform (a broken template)
    /// lowers the consistency score, and between two replicas the healthy one then looks worse.
    pub drain_on: Vec<crate::quality::drift::Signal>,
}

impl Default for DriftConfig {
    fn default() -> Self {
        DriftConfig {
            min_samples: 20,
            min_effect_bits_per_byte: 0.1,
            min_effect_consistency: 0.05,
            baseline_secs: 21_600,
            drain_on: vec![crate::quality::drift::Signal::BitsPerByte],
        }
    }
}

impl DriftConfig {
    pub fn settings(&self) -> crate::quality::drift::Settings {
        crate::quality::drift::Settings {
            min_samples: self.min_samples,
            min_effect_bits_per_byte: self.min_effect_bits_per_byte,
            min_effect_consistency: self.min_effect_consistency,
        }
    }
}

impl QualityConfig {
    /// The scorers' CPU budget in cores: `max_cpu`, or 5% of the cores available (at least 0.1).
    pub fn cpu_budget(&self) -> f64 {
        self.max_cpu.unwrap_or_else(crate::quality::budget::default_cores)
    }
}

impl Default for QualityConfig {
    fn default() -> Self {
        QualityConfig {
            sample_rate: 0.0,
            force_header: "x-goodput-score".into(),
            queue_capacity: 64,
            window_secs: 600,
            max_cpu: None,
            perplexity: None,
            consistency: None,
            drift: DriftConfig::default(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PerplexityConfig {
    /// Holds `model.onnx` and `tokenizer.json` (scripts/setup-models.sh makes SmolLM2's).
    pub model_dir: PathBuf,
    /// libonnxruntime.so; otherwise ORT_DYLIB_PATH (scripts/setup-onnxruntime.sh installs one).
    #[serde(default)]
    pub onnxruntime: Option<PathBuf>,
    /// `cpu`, or `cuda:N` (needs a build with the `cuda` feature and onnxruntime-gpu).
    #[serde(default = "default_device")]
    pub device: String,
    /// When CUDA is asked for but cannot be used: fall back to the CPU (logged) instead of
    /// refusing to start.
    #[serde(default)]
    pub allow_cpu_fallback: bool,
    /// Scoring threads, each with its own ONNX Runtime session and its own copy of the weights
    /// in memory (SmolLM2-135M: about 700 MB each): to use more CPU, prefer intra_op_threads.
    #[serde(default = "one")]
    pub threads: usize,
    /// ONNX Runtime intra-op threads per session.
    #[serde(default = "one")]
    pub intra_op_threads: usize,
    /// Response tokens scored at most (the rest of a longer response is not scored).
    #[serde(default = "default_max_response")]
    pub max_response_tokens: usize,
    /// Prompt tokens kept as context at most (the oldest are cut).
    #[serde(default = "default_max_prompt")]
    pub max_prompt_tokens: usize,
    /// Responses scored together in one model call, taken from what already waits in the queue
    /// (a thread never waits for a batch to fill). Default 1 on the CPU, where a batch buys
    /// little; 16 on CUDA, where one call of 16 costs little more than a call of one.
    #[serde(default)]
    pub max_batch: Option<usize>,
}

impl PerplexityConfig {
    pub fn max_batch_for(&self, device: Device) -> usize {
        self.max_batch.unwrap_or(if device == Device::Cpu { 1 } else { 16 }).max(1)
    }
}

fn default_device() -> String {
    "cpu".into()
}
fn one() -> usize {
    1
}
fn default_max_response() -> usize {
    512
}
fn default_max_prompt() -> usize {
    1024
}

/// A consistency scoring method.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    /// SelfCheck-Unigram: -log p of each sentence's tokens under a unigram model of the samples.
    Unigram,
    /// SelfCheck-Prompt: a judge answers whether each sample supports each sentence.
    Prompt,
    /// BERTScore-style: each sentence's best cosine match (sentence embeddings) in each sample.
    Embedding,
}

impl Method {
    /// Its score reads as a probability (SelfCheck-Prompt: the share of the judge's answers
    /// that say a sample does not support the sentence), so a threshold on it gives a rate.
    /// The others only rank responses: a rate from them needs a calibrated threshold.
    pub fn is_probability(self) -> bool {
        matches!(self, Method::Prompt)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Method::Unigram => "unigram",
            Method::Prompt => "prompt",
            Method::Embedding => "embedding",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ConsistencyConfig {
    /// Share of metered requests checked (deterministic by request id, like `sample_rate`; the
    /// force header forces it too). Each check costs `samples` more generations upstream.
    #[serde(default = "default_consistency_rate")]
    pub sample_rate: f64,
    /// K: shadow re-samples of the same prompt, from the same backend.
    #[serde(default = "default_samples")]
    pub samples: usize,
    /// Temperature of the re-samples (SelfCheckGPT's setting).
    #[serde(default = "default_temperature")]
    pub temperature: f64,
    /// Output tokens per re-sample at most (the original's max_tokens when lower).
    #[serde(default = "default_shadow_max_tokens")]
    pub max_tokens: u64,
    /// Methods run on every check; the first is the one the hallucination score comes from.
    #[serde(default = "default_methods")]
    pub methods: Vec<Method>,
    /// The backend that judges for `prompt` (default: the request's own backend).
    #[serde(default)]
    pub judge_backend: Option<String>,
    /// The model named in judge requests (default: the request's model).
    #[serde(default)]
    pub judge_model: Option<String>,
    /// Response sentences judged at most per check (`prompt` costs samples x sentences calls).
    #[serde(default = "default_max_sentences")]
    pub max_sentences: usize,
    /// Shadow tokens (re-samples and judge calls) may be at most this share of the user
    /// traffic's tokens since start; a check that would exceed it is skipped and counted.
    #[serde(default = "default_token_share")]
    pub max_token_share: f64,
    /// Shadow requests in flight at most, over all checks.
    #[serde(default = "default_concurrent")]
    pub max_concurrent: usize,
    /// Checks waiting to start; when full, new ones are dropped and counted.
    #[serde(default = "default_consistency_queue")]
    pub queue_capacity: usize,
    /// vLLM's `priority` field for shadow requests (with --scheduling-policy priority a larger
    /// value is served later); not sent when absent.
    #[serde(default)]
    pub priority: Option<i64>,
    /// For a method whose score is a probability (`prompt`): a response scoring above this
    /// counts as hallucinated. A ranking method (`unigram`, `embedding`) gives a rate only once
    /// `calibration` has set its threshold.
    #[serde(default = "default_threshold")]
    pub threshold: f64,
    /// How a ranking method's threshold is set from a reference; without it such a method
    /// reports scores and no rate.
    #[serde(default)]
    pub calibration: Option<CalibrationConfig>,
    /// How the K re-samples are asked for.
    #[serde(default)]
    pub resample: Resample,
    /// Per shadow request: headers, then the whole body.
    #[serde(default = "default_shadow_timeout")]
    pub timeout_ms: u64,
    /// For `embedding`: model.onnx (output `sentence_embedding`) and tokenizer.json;
    /// scripts/setup-embeddings.sh makes all-MiniLM-L6-v2's. Read at start-up.
    #[serde(default)]
    pub embedding_model_dir: Option<PathBuf>,
    /// libonnxruntime.so for `embedding` when no perplexity model names one (else ORT_DYLIB_PATH).
    #[serde(default)]
    pub onnxruntime: Option<PathBuf>,
}

/// One request with `n: K` shares the prompt's prefill among the re-samples (vLLM does); K
/// requests work with any server.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Resample {
    /// `n: K` until a backend shows it does not honour `n` (an error status where single
    /// requests succeed, or fewer choices than asked); K requests to that backend from then on.
    #[default]
    Auto,
    /// Always one request with `n: K` (whatever choices come back are the re-samples).
    N,
    /// Always K requests.
    Separate,
}

/// Calibrating a ranking method's threshold on a reference taken as healthy: the threshold is
/// the score above which `reference_rate` of the reference's checked responses lie, so that
/// the reference reports that rate and any other backend reports the share of its responses
/// as suspicious as the reference's worst `reference_rate`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CalibrationConfig {
    /// The healthy reference: this backend's checks set one threshold for every backend. Absent:
    /// each backend's own first `checks` checks set its threshold (the period it is taken as
    /// healthy in).
    #[serde(default)]
    pub reference_backend: Option<String>,
    /// Checked responses the threshold is set from.
    #[serde(default = "default_calibration_checks")]
    pub checks: usize,
    /// The reference's own hallucination rate, from a labelled evaluation of it
    /// (README, "Hallucination rate"); stated, never guessed by goodput.
    pub reference_rate: f64,
    /// How many labelled answers `reference_rate` was measured on: its sampling error widens
    /// the reported rate's interval. Absent: the stated rate is taken as exact, and only the
    /// reference checks' own sampling widens it.
    #[serde(default)]
    pub reference_labelled: Option<usize>,
    /// Where thresholds are kept across restarts (JSON); absent: in memory only.
    #[serde(default)]
    pub path: Option<PathBuf>,
}

fn default_calibration_checks() -> usize {
    50
}

fn default_consistency_rate() -> f64 {
    0.01
}
fn default_samples() -> usize {
    3
}
fn default_temperature() -> f64 {
    1.0
}
fn default_shadow_max_tokens() -> u64 {
    256
}
fn default_methods() -> Vec<Method> {
    vec![Method::Unigram]
}
fn default_max_sentences() -> usize {
    8
}
fn default_token_share() -> f64 {
    0.2
}
fn default_concurrent() -> usize {
    2
}
fn default_consistency_queue() -> usize {
    16
}
fn default_threshold() -> f64 {
    0.5
}
fn default_shadow_timeout() -> u64 {
    120_000
}

/// Where a session runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Cuda(i32),
}

impl std::str::FromStr for Device {
    type Err = String;
    fn from_str(s: &str) -> Result<Device, String> {
        match s {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse::<i32>().ok())
                .filter(|n| *n >= 0)
                .map(Device::Cuda)
                .ok_or_else(|| format!("`{s}` is not a device: use `cpu` or `cuda:N`")),
        }
    }
}

impl QualityConfig {
    pub(super) fn validate(&self, err: &mut dyn FnMut(String, String)) {
        if !(0.0..=1.0).contains(&self.sample_rate) {
            err("quality.sample_rate".into(), format!("must be between 0 and 1, got {}", self.sample_rate));
        }
        if http::HeaderName::from_bytes(self.force_header.as_bytes()).is_err() {
            err("quality.force_header".into(), format!("`{}` is not a header name", self.force_header));
        }
        if self.queue_capacity == 0 {
            err("quality.queue_capacity".into(), "must be > 0".into());
        }
        if let Some(c) = self.max_cpu
            && !(c.is_finite() && c > 0.0)
        {
            err("quality.max_cpu".into(), "must be a number of cores > 0".into());
        }
        if !(10..=86_400).contains(&self.window_secs) {
            err("quality.window_secs".into(), "must be between 10 and 86400".into());
        }
        let d = &self.drift;
        if d.min_samples < 2 {
            err("quality.drift.min_samples".into(), "must be at least 2".into());
        }
        for (k, v) in [
            ("min_effect_bits_per_byte", d.min_effect_bits_per_byte),
            ("min_effect_consistency", d.min_effect_consistency),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                err(format!("quality.drift.{k}"), "must be a number >= 0".into());
            }
        }
        if !(self.window_secs..=604_800).contains(&d.baseline_secs) {
            err(
                "quality.drift.baseline_secs".into(),
                "must be between quality.window_secs and 604800".into(),
            );
        }
        if let Some(c) = &self.consistency {
            let p = "quality.consistency";
            if !(0.0..=1.0).contains(&c.sample_rate) {
                err(format!("{p}.sample_rate"), format!("must be between 0 and 1, got {}", c.sample_rate));
            }
            if !(1..=20).contains(&c.samples) {
                err(format!("{p}.samples"), "must be between 1 and 20".into());
            }
            if !(c.temperature.is_finite() && (0.0..=2.0).contains(&c.temperature)) {
                err(format!("{p}.temperature"), "must be between 0 and 2".into());
            }
            if c.max_tokens == 0 {
                err(format!("{p}.max_tokens"), "must be > 0".into());
            }
            if c.methods.is_empty() {
                err(format!("{p}.methods"), "name at least one of unigram, prompt, embedding".into());
            }
            if c.methods.contains(&Method::Embedding) {
                match &c.embedding_model_dir {
                    None => {
                        err(format!("{p}.embedding_model_dir"), "required by the embedding method".into())
                    }
                    Some(d) if !d.join("model.onnx").is_file() || !d.join("tokenizer.json").is_file() => err(
                        format!("{p}.embedding_model_dir"),
                        format!(
                            "no model.onnx and tokenizer.json in {} (scripts/setup-embeddings.sh)",
                            d.display()
                        ),
                    ),
                    Some(_) => {}
                }
            }
            if c.max_sentences == 0 || c.max_concurrent == 0 || c.queue_capacity == 0 || c.timeout_ms == 0 {
                err(
                    p.into(),
                    "max_sentences, max_concurrent, queue_capacity and timeout_ms must be > 0".into(),
                );
            }
            if !(c.max_token_share.is_finite() && c.max_token_share >= 0.0) {
                err(format!("{p}.max_token_share"), "must be >= 0".into());
            }
            if !(0.0..=1.0).contains(&c.threshold) {
                err(format!("{p}.threshold"), "must be between 0 and 1".into());
            }
            if let Some(k) = &c.calibration {
                if !(k.reference_rate > 0.0 && k.reference_rate < 1.0) {
                    err(
                        format!("{p}.calibration.reference_rate"),
                        format!("must be between 0 and 1 (exclusive), got {}", k.reference_rate),
                    );
                }
                if !(10..=100_000).contains(&k.checks) {
                    err(format!("{p}.calibration.checks"), "must be between 10 and 100000".into());
                }
                if k.reference_labelled == Some(0) {
                    err(format!("{p}.calibration.reference_labelled"), "must be at least 1".into());
                }
            }
        }
        let Some(p) = &self.perplexity else { return };
        if !p.model_dir.join("model.onnx").is_file() {
            err(
                "quality.perplexity.model_dir".into(),
                format!("no model.onnx in {} (scripts/setup-models.sh makes one)", p.model_dir.display()),
            );
        }
        if !p.model_dir.join("tokenizer.json").is_file() {
            err(
                "quality.perplexity.model_dir".into(),
                format!("no tokenizer.json in {}", p.model_dir.display()),
            );
        }
        if let Some(lib) = &p.onnxruntime
            && !lib.is_file()
        {
            err("quality.perplexity.onnxruntime".into(), format!("no such file: {}", lib.display()));
        }
        if let Err(e) = p.device.parse::<Device>() {
            err("quality.perplexity.device".into(), e);
        }
        if !(1..=64).contains(&p.threads) {
            err("quality.perplexity.threads".into(), "must be between 1 and 64".into());
        }
        if !(1..=256).contains(&p.intra_op_threads) {
            err("quality.perplexity.intra_op_threads".into(), "must be between 1 and 256".into());
        }
        for (f, v) in
            [("max_response_tokens", p.max_response_tokens), ("max_prompt_tokens", p.max_prompt_tokens)]
        {
            if !(1..=131_072).contains(&v) {
                err(format!("quality.perplexity.{f}"), "must be between 1 and 131072".into());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_quality_settings_are_reported_with_their_paths() {
        let e = crate::config::Config::from_yaml(
            "backends:\n  - name: a\n    url: http://127.0.0.1:1\n\
             quality:\n  sample_rate: 1.5\n  max_cpu: 0\n  force_header: 'bad header'\n  perplexity:\n    model_dir: /nonexistent\n    device: gpu\n\
             \x20 consistency:\n    samples: 0\n    methods: [embedding]\n    judge_backend: b\n",
        )
        .unwrap_err();
        let paths: Vec<&str> = e.0.iter().map(|e| e.path.as_str()).collect();
        for p in [
            "quality.sample_rate",
            "quality.force_header",
            "quality.max_cpu",
            "quality.perplexity.model_dir",
            "quality.perplexity.device",
            "quality.consistency.samples",
            "quality.consistency.embedding_model_dir",
            "quality.consistency.judge_backend",
        ] {
            assert!(paths.contains(&p), "{p} not in {paths:?}");
        }
        let e = crate::config::Config::from_yaml(
            "backends:\n  - name: a\n    url: http://127.0.0.1:1\nquality:\n  consistency:\n    methods: [nli]\n",
        )
        .unwrap_err();
        assert_eq!(e.0[0].path, "quality.consistency.methods[0]", "{e}");
    }

    #[test]
    fn bad_calibration_settings_are_reported_and_an_uncalibrated_ranking_method_warned_of() {
        let base = "backends:\n  - name: a\n    url: http://127.0.0.1:1\nquality:\n  consistency:\n";
        let e = crate::config::Config::from_yaml(&format!(
            "{base}    calibration: {{reference_backend: nope, checks: 5, reference_rate: 1.5, reference_labelled: 0}}\n"
        ))
        .unwrap_err();
        let paths: Vec<&str> = e.0.iter().map(|e| e.path.as_str()).collect();
        for p in ["reference_backend", "checks", "reference_rate", "reference_labelled"] {
            let p = format!("quality.consistency.calibration.{p}");
            assert!(paths.contains(&p.as_str()), "{p} not in {paths:?}");
        }
        // The reference's error rate is stated, never defaulted.
        let e = crate::config::Config::from_yaml(&format!("{base}    calibration: {{checks: 50}}\n"))
            .unwrap_err();
        assert!(e.to_string().contains("reference_rate"), "{e}");
        let warned = |extra: &str| {
            let c = crate::config::Config::from_yaml(&format!("{base}{extra}")).unwrap();
            c.warnings().iter().any(|w| w.contains("no hallucination rate is reported"))
        };
        assert!(warned("    methods: [unigram]\n"));
        assert!(!warned("    methods: [unigram]\n    calibration: {reference_rate: 0.3}\n"));
        assert!(!warned("    methods: [prompt, unigram]\n"));
    }

    #[test]
    fn devices() {
        assert_eq!("cpu".parse::<Device>(), Ok(Device::Cpu));
        assert_eq!("cuda".parse::<Device>(), Ok(Device::Cuda(0)));
        assert_eq!("cuda:3".parse::<Device>(), Ok(Device::Cuda(3)));
        assert!("gpu".parse::<Device>().is_err());
        assert!("cuda:-1".parse::<Device>().is_err());
    }
}
