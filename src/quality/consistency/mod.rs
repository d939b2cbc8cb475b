//! Consistency (SelfCheckGPT): does the backend agree with itself when asked again? For a
//! sampled request, K shadow re-samples of the same prompt are drawn from the same backend at
//! temperature 1.0; each response sentence is then scored against them (`ngram`: unigram
//! surprise; `prompt`: a judge asked whether each sample supports the sentence).

pub mod ngram;
pub mod shadow;
pub mod text;

pub use shadow::{Checker, ConsistencyJob, ConsistencyResult};
