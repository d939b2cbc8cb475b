//! Quality, sampled: a deterministic share of responses is scored off the hot path by
//! dedicated threads. Perplexity under a reference LM run with ONNX Runtime is the first signal.

pub mod budget;
pub mod calibration;
pub mod consistency;
pub mod drift;
pub mod lm;
pub mod offline;
pub mod ppl;
pub mod sampler;
pub mod scorer;
pub mod template;

/// Which request a job or a result is about, with its metric labels.
#[derive(Debug, Clone)]
pub struct Subject {
    pub id: u64,
    pub backend: std::sync::Arc<str>,
    pub model: std::sync::Arc<str>,
    pub route: std::sync::Arc<str>,
    pub class: std::sync::Arc<str>,
    /// The pool endpoint that served it (`host:port`); empty outside a pool.
    pub endpoint: std::sync::Arc<str>,
}

impl Subject {
    pub fn of(r: &crate::meter::record::RequestRecord) -> Subject {
        Subject {
            id: r.id,
            backend: r.backend.clone(),
            model: r.model.clone(),
            route: r.route.clone(),
            class: r.class.clone(),
            endpoint: r.endpoint.clone(),
        }
    }

    /// gen_ai_request_model, backend, route.
    pub fn labels(&self) -> [&str; 3] {
        [&self.model, &self.backend, &self.route]
    }
}

/// What the quality pipeline sends back to the recorder (numbers only).
pub enum QualityEvent {
    Perplexity(scorer::QualityResult),
    Consistency(consistency::ConsistencyResult),
}
pub mod embed;
