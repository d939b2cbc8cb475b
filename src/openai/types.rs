//! The data types of what goodput reads of the OpenAI API, shared by the readers (`request`,
//! `response`).

use serde::Deserialize;
use std::borrow::Cow;

/// Which metered OpenAI operation a path is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Operation {
    #[default]
    Chat,
    Completion,
}

/// What the proxy learned from a request body. Parsing never fails: a body that is not a JSON
/// object yields `valid_json == false` and is forwarded unchanged.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestInfo {
    pub valid_json: bool,
    pub model: Option<String>,
    pub stream: bool,
    /// `stream_options.include_usage` as the client sent it.
    pub include_usage: Option<bool>,
    pub has_stream_options: bool,
    pub continuous_usage_stats: bool,
    pub n: u32,
    pub max_tokens: Option<u64>,
    /// Where the prompt stands in the body, as byte offsets: the JSON text of `messages` (chat)
    /// or else `prompt` (completions), when present and not null. The pool's prefix affinity
    /// hashes it.
    pub prompt: Option<(usize, usize)>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct Usage {
    #[serde(default)]
    pub prompt_tokens: Option<u64>,
    #[serde(default)]
    pub completion_tokens: Option<u64>,
}

/// What one stream chunk (one SSE `data:` payload) carried.
#[derive(Debug, Default, PartialEq)]
pub struct ChunkInfo<'a> {
    /// Generated text per choice index, for the tokenizer fallback (borrowed when unescaped).
    pub texts: Vec<(u32, Cow<'a, str>)>,
    /// Some choice carried generated content (text, reasoning or a tool call delta).
    pub content: bool,
    /// Number of choices that carried content in this chunk.
    pub content_choices: u32,
    pub finish_reasons: Vec<(u32, Cow<'a, str>)>,
    pub usage: Option<Usage>,
    /// `choices: []` with a usage object: the final usage-only chunk of include_usage.
    pub usage_only: bool,
    pub error: bool,
}
