//! Measurement: per-request observation, records, metric definitions, sliding windows, and
//! the recorder thread that ties them together.

pub mod metrics;
pub mod observe;
pub mod process;
pub mod record;
pub mod recorder;
pub mod window;

pub use metrics::Metrics;
pub use record::{Outcome, RequestRecord, TokenSource};
pub use recorder::Recorder;
