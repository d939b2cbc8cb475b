//! What the proxy understands of the OpenAI API. Pure functions, no I/O.

// On the request path: no function over clippy.toml's line threshold.
#![warn(clippy::too_many_lines)]

pub mod request;
pub mod response;
pub mod sse;
pub mod types;

pub use request::{Operation, RequestInfo, inject_include_usage};
pub use response::{ChunkInfo, Usage, parse_chunk, parse_response};
pub use sse::{SseEvent, SseReader};
