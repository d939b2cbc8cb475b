//! Quality, sampled: a deterministic share of responses is scored off the hot path by
//! dedicated threads. Perplexity under a reference LM run with ONNX Runtime is the first signal.

pub mod lm;
pub mod offline;
pub mod ppl;
pub mod sampler;
pub mod scorer;
pub mod template;
