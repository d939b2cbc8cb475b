//! Perplexity of a bench run's outputs under the reference model, with the same scorer the
//! proxy uses (its threads, its prompt rendering and truncation), so the figures compare.

use std::path::Path;
use std::sync::mpsc::channel;
use std::time::Duration;

use super::Sample;
use super::report::QualitySummary;
use crate::config::QualityConfig;
use crate::meter::Metrics;
use crate::openai::Operation;
use crate::quality::scorer::{ScoreJob, Scorer};
use crate::quality::{QualityEvent, Subject};

pub struct BenchScorer {
    scorer: Scorer,
    results: std::sync::mpsc::Receiver<QualityEvent>,
    model: String,
}

impl BenchScorer {
    /// Load the model (seconds; blocking).
    pub fn load(dir: &Path, onnxruntime: Option<&Path>) -> Result<BenchScorer, String> {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let ppl = serde_json::json!({
            "model_dir": dir, "onnxruntime": onnxruntime, "threads": 1, "intra_op_threads": threads,
        });
        let cfg = QualityConfig {
            queue_capacity: 1 << 20,
            perplexity: Some(serde_json::from_value(ppl).map_err(|e| e.to_string())?),
            ..Default::default()
        };
        let (tx, results) = channel();
        // Offline: scoring is the job, so no CPU budget paces it.
        let budget = std::sync::Arc::new(crate::quality::budget::CpuBudget::unlimited());
        let scorer = Scorer::start(&cfg, Metrics::new(), tx, budget)
            .map_err(|e| format!("--score-model {}: {e}", dir.display()))?
            .ok_or("no perplexity model")?;
        Ok(BenchScorer { scorer, results, model: dir.display().to_string() })
    }

    /// Score every successful output (blocking). Outputs leave memory as they are scored.
    pub fn score(self, samples: Vec<Sample>, chat: bool) -> QualitySummary {
        let op = if chat { Operation::Chat } else { Operation::Completion };
        let mut offered = 0usize;
        for (i, s) in samples.into_iter().enumerate() {
            let (Some(request), Some(response)) = (s.request, s.text) else { continue };
            if !s.ok || response.trim().is_empty() {
                continue;
            }
            let of = Subject {
                id: i as u64,
                backend: "bench".into(),
                model: "bench".into(),
                route: "bench".into(),
                class: "bench".into(),
                endpoint: "".into(),
            };
            offered += usize::from(self.scorer.offer(ScoreJob { of, operation: op, request, response }));
        }
        let (mut ppl, mut bpb) = (Vec::new(), Vec::new());
        while ppl.len() < offered {
            // A response that fails to score sends nothing: stop when the scorer goes quiet.
            match self.results.recv_timeout(Duration::from_secs(120)) {
                Ok(QualityEvent::Perplexity(r)) => {
                    ppl.push(r.perplexity);
                    bpb.push(r.bits_per_byte);
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        let n = ppl.len();
        let mut sorted = ppl.clone();
        sorted.sort_by(f64::total_cmp);
        QualitySummary {
            model: self.model,
            scored: n,
            perplexity_mean: (n > 0).then(|| ppl.iter().sum::<f64>() / n as f64),
            perplexity_geomean: (n > 0).then(|| (ppl.iter().map(|p| p.ln()).sum::<f64>() / n as f64).exp()),
            perplexity_median: (n > 0).then(|| sorted[n / 2]),
            bits_per_byte_mean: (n > 0).then(|| bpb.iter().sum::<f64>() / n as f64),
        }
    }
}
