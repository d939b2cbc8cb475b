//! The scoring pipeline: sampled responses wait in a bounded queue; dedicated threads (never
//! tokio workers), each with its own ONNX Runtime session, score them and send the results back
//! to the recorder. A full queue drops the response and counts it: the hot path never waits.

use bytes::Bytes;
use std::sync::mpsc::{Receiver, Sender, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::budget::CpuBudget;
use super::lm::{LmAssets, LmError, LmOptions, ReferenceLm};
use super::ppl::Totals;
use crate::config::QualityConfig;
use crate::meter::metrics::Metrics;
use crate::openai::Operation;
use crate::quality::{QualityEvent, Subject};

/// One sampled response: the request body as the client sent it and choice 0's text. User data:
/// held in memory only until scored, never logged.
pub struct ScoreJob {
    pub of: Subject,
    pub operation: Operation,
    pub request: Bytes,
    pub response: String,
}

/// Numbers only: what the recorder keeps and the windows aggregate.
#[derive(Debug, Clone)]
pub struct QualityResult {
    pub of: Subject,
    pub perplexity: f64,
    pub bits_per_byte: f64,
    /// Response tokens scored (at most max_response_tokens).
    pub tokens: u64,
    pub truncated: bool,
}

pub struct Scorer {
    tx: SyncSender<ScoreJob>,
    metrics: Metrics,
    budget: Arc<CpuBudget>,
}

struct Limits {
    max_prompt: usize,
    max_response: usize,
    max_batch: usize,
    /// ONNX Runtime threads per session: the scoring thread's own CPU time times this
    /// estimates its session's (the calling thread works alongside the intra-op pool).
    intra_op_threads: usize,
}

/// Padded tokens per model call at most: the graph's logits are [batch, len, vocab] floats
/// (SmolLM2: 8,192 tokens make 1.6 GB), so long rows go in smaller batches.
const MAX_BATCH_TOKENS: usize = 8192;

impl Scorer {
    /// Load the reference model once per thread. Blocking (seconds): call it off the async
    /// runtime. `None` when no perplexity model is configured. `budget` paces the scoring
    /// threads (shared with the embedding thread).
    pub fn start(
        cfg: &QualityConfig,
        metrics: Metrics,
        results: Sender<QualityEvent>,
        budget: Arc<CpuBudget>,
    ) -> Result<Option<Scorer>, LmError> {
        let Some(p) = &cfg.perplexity else { return Ok(None) };
        let device = p.device.parse().map_err(LmError)?;
        // ONNX Runtime is loaded once, before any other ort call, with a clear error if missing.
        super::lm::environment(p.onnxruntime.as_deref())?;
        let opts = LmOptions {
            onnxruntime: p.onnxruntime.clone(),
            device,
            allow_cpu_fallback: p.allow_cpu_fallback,
            intra_op_threads: p.intra_op_threads,
        };
        let assets = Arc::new(LmAssets::load(&p.model_dir)?);
        let (tx, rx) = sync_channel::<ScoreJob>(cfg.queue_capacity);
        let rx = Arc::new(Mutex::new(rx));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        for i in 0..p.threads {
            let (dir, opts, assets, rx, results, metrics, ready, budget) = (
                p.model_dir.clone(),
                opts.clone(),
                assets.clone(),
                rx.clone(),
                results.clone(),
                metrics.clone(),
                ready_tx.clone(),
                budget.clone(),
            );
            let limits = Limits {
                max_prompt: p.max_prompt_tokens,
                max_response: p.max_response_tokens,
                max_batch: p.max_batch_for(device),
                intra_op_threads: p.intra_op_threads,
            };
            std::thread::Builder::new()
                .name(format!("goodput-score-{i}"))
                .spawn(move || {
                    lower_priority();
                    match ReferenceLm::load(&dir, assets, &opts) {
                        Ok(lm) => {
                            let _ = ready.send(Ok(lm.device));
                            run(lm, rx, results, metrics, limits, &budget)
                        }
                        Err(e) => {
                            let _ = ready.send(Err(e));
                        }
                    }
                })
                .map_err(|e| LmError(format!("cannot start a scoring thread: {e}")))?;
        }
        drop(ready_tx);
        for _ in 0..p.threads {
            let device =
                ready_rx.recv().map_err(|_| LmError("a scoring thread died while loading".into()))??;
            tracing::info!(model = %p.model_dir.display(), ?device, "perplexity scorer ready");
        }
        Ok(Some(Scorer { tx, metrics, budget }))
    }

    /// Queue a response for scoring; never blocks. Returns whether it was queued. While the
    /// scorers rest within their CPU budget nothing is queued: it would only wait, holding user
    /// data, for a slot that later responses also want.
    pub fn offer(&self, job: ScoreJob) -> bool {
        if !self.budget.available() {
            self.metrics.scoring_dropped.with_label_values(&["cpu_budget"]).inc();
            return false;
        }
        match self.tx.try_send(job) {
            Ok(()) => {
                self.metrics.scoring_queue_depth.inc();
                true
            }
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.metrics.scoring_dropped.with_label_values(&["queue_full"]).inc();
                false
            }
        }
    }
}

/// Scoring yields the CPU to the proxy: this thread, and the ONNX Runtime threads its session
/// creates (they inherit it), run under SCHED_IDLE, so that any proxy thread that wakes up
/// preempts them at once (nice 19 where SCHED_IDLE is refused).
pub(crate) fn lower_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: both calls only change this thread's own scheduling; pid 0 / its tid is itself.
    unsafe {
        let param = libc::sched_param { sched_priority: 0 };
        if libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) != 0 {
            let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
            if libc::setpriority(libc::PRIO_PROCESS, tid, 19) != 0 {
                tracing::debug!("could not lower the scoring thread's priority");
            }
        }
    }
}

fn run(
    mut lm: ReferenceLm,
    rx: Arc<Mutex<Receiver<ScoreJob>>>,
    results: Sender<QualityEvent>,
    metrics: Metrics,
    limits: Limits,
    budget: &CpuBudget,
) {
    let cpu_used = metrics.scoring_cpu.with_label_values(&["perplexity"]);
    loop {
        budget.wait();
        // The lock is held only while taking jobs, by scoring threads only: one job waited for,
        // then whatever else already waits, up to max_batch.
        let jobs = {
            let rx = rx.lock().unwrap_or_else(|p| p.into_inner());
            let Ok(first) = rx.recv() else { return };
            let mut jobs = vec![first];
            while jobs.len() < limits.max_batch {
                match rx.try_recv() {
                    Ok(j) => jobs.push(j),
                    Err(_) => break,
                }
            }
            jobs
        };
        metrics.scoring_queue_depth.sub(jobs.len() as i64);
        budget
            .spend(limits.intra_op_threads, &cpu_used, || score(&mut lm, jobs, &results, &metrics, &limits));
    }
}

/// Prepare the jobs and score them, in batches of at most MAX_BATCH_TOKENS padded tokens.
fn score(
    lm: &mut ReferenceLm,
    jobs: Vec<ScoreJob>,
    results: &Sender<QualityEvent>,
    metrics: &Metrics,
    limits: &Limits,
) {
    let t = Instant::now();
    let mut ready: Vec<(ScoreJob, Prepared)> = Vec::with_capacity(jobs.len());
    for job in jobs {
        match prepare(&lm.assets, job.operation, &job.request, &job.response, limits) {
            Ok(Some(p)) => ready.push((job, p)),
            Ok(None) => metrics.scoring_dropped.with_label_values(&["nothing_to_score"]).inc(),
            Err(e) => fail(metrics, &job, &e),
        }
    }
    while !ready.is_empty() {
        let n = batch_len(ready.iter().map(|(_, p)| p.row.len()));
        let batch: Vec<(ScoreJob, Prepared)> = ready.drain(..n).collect();
        let rows: Vec<&[u32]> = batch.iter().map(|(_, p)| p.row.as_slice()).collect();
        metrics.scoring_batch_size.observe(rows.len() as f64);
        match lm.next_token_logprobs(&rows) {
            Ok(lps) => {
                let took = t.elapsed().as_secs_f64();
                for ((job, mut p), lp) in batch.into_iter().zip(lps) {
                    p.totals.add_logprobs(lp.get(p.prompt_len - 1..).unwrap_or_default());
                    report(metrics, results, job, &p, took);
                }
            }
            Err(e) => batch.iter().for_each(|(job, _)| fail(metrics, job, &e)),
        }
    }
}

/// How many of the rows (in order, at least one) go into one model call: all padded to the
/// longest, at most MAX_BATCH_TOKENS in all.
fn batch_len(lens: impl Iterator<Item = usize>) -> usize {
    let mut longest = 0;
    let mut n = 0;
    for len in lens {
        longest = longest.max(len);
        if n > 0 && longest * (n + 1) > MAX_BATCH_TOKENS {
            break;
        }
        n += 1;
    }
    n.max(1)
}

fn report(metrics: &Metrics, results: &Sender<QualityEvent>, job: ScoreJob, s: &Prepared, took: f64) {
    let labels = job.of.labels();
    let p = s.totals.perplexities();
    metrics.scoring_duration.observe(took);
    metrics.response_perplexity.with_label_values(&labels).observe(p.token_perplexity);
    metrics.response_bits_per_byte.with_label_values(&labels).observe(p.bits_per_byte);
    metrics.scored.with_label_values(&labels).inc();
    metrics.scored_tokens.with_label_values(&labels).inc_by(p.tokens);
    let _ = results.send(QualityEvent::Perplexity(QualityResult {
        of: job.of,
        perplexity: p.token_perplexity,
        bits_per_byte: p.bits_per_byte,
        tokens: p.tokens,
        truncated: s.truncated,
    }));
}

fn fail(metrics: &Metrics, job: &ScoreJob, e: &LmError) {
    metrics.scoring_failed.with_label_values(&["perplexity"]).inc();
    tracing::warn!(error = %e, backend = %job.of.backend, "perplexity scoring failed");
}

/// A response ready for the model: the prompt's and the response's token ids in one row.
struct Prepared {
    row: Vec<u32>,
    prompt_len: usize,
    /// Words and bytes of the scored text; the log-likelihoods are added after the model call.
    totals: Totals,
    truncated: bool,
}

/// Perplexity of the response tokens conditioned on the prompt: chat messages rendered with the
/// reference model's chat template, a completion prompt after the BOS token. `None` when there
/// is nothing to score (empty response, or a prompt given as token ids of another tokenizer).
fn prepare(
    assets: &LmAssets,
    op: Operation,
    request: &[u8],
    response: &str,
    limits: &Limits,
) -> Result<Option<Prepared>, LmError> {
    let body: serde_json::Value =
        serde_json::from_slice(request).map_err(|e| LmError(format!("request body: {e}")))?;
    let mut prompt = match op {
        Operation::Chat => {
            let text = assets
                .template
                .render(body.get("messages").unwrap_or(&serde_json::Value::Null))
                .map_err(|e| LmError(format!("chat template: {e}")))?;
            assets.encode(&text)?
        }
        Operation::Completion => {
            let text = match body.get("prompt") {
                Some(serde_json::Value::String(s)) => s.as_str(),
                Some(serde_json::Value::Array(a)) if a.first().is_some_and(|v| v.is_string()) => {
                    a[0].as_str().unwrap_or_default()
                }
                Some(serde_json::Value::Array(_)) => return Ok(None),
                _ => "",
            };
            let mut ids = vec![assets.prefix_id];
            ids.extend(assets.encode(text)?);
            ids
        }
    };
    if prompt.is_empty() {
        prompt.push(assets.prefix_id);
    }
    if prompt.len() > limits.max_prompt {
        prompt.drain(..prompt.len() - limits.max_prompt);
    }
    let mut resp = assets.encode(response)?;
    if resp.is_empty() {
        return Ok(None);
    }
    let truncated = resp.len() > limits.max_response;
    let totals = if truncated {
        resp.truncate(limits.max_response);
        let kept = assets.tokenizer.decode(&resp, false).map_err(|e| LmError(format!("tokenizer: {e}")))?;
        Totals::for_text(&kept)
    } else {
        Totals::for_text(response)
    };
    let prompt_len = prompt.len();
    let row: Vec<u32> = prompt.into_iter().chain(resp.iter().copied()).collect();
    Ok(Some(Prepared { row, prompt_len, totals, truncated }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_are_cut_at_the_padded_token_budget() {
        assert_eq!(batch_len([10, 20, 30].into_iter()), 3);
        // 4 rows padded to 2048 = 8192 tokens: the fifth would pass the budget.
        assert_eq!(batch_len([2048; 6].into_iter()), 4);
        // A longer row later shrinks what fits: 3 x 3000 > 8192.
        assert_eq!(batch_len([100, 100, 3000, 100].into_iter()), 2);
        // One row over the budget on its own still goes (alone).
        assert_eq!(batch_len([20_000, 10].into_iter()), 1);
    }
}
