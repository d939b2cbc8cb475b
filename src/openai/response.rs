//! Reading what the upstream answered: stream chunks and whole responses.

use serde::Deserialize;
use std::borrow::Cow;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct Usage {
    #[serde(default)]
    pub prompt_tokens: Option<u64>,
    #[serde(default)]
    pub completion_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct RawChunk<'a> {
    #[serde(default, borrow)]
    choices: Option<Vec<RawChoice<'a>>>,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default)]
    error: Option<serde::de::IgnoredAny>,
}

#[derive(Deserialize)]
struct RawChoice<'a> {
    #[serde(default)]
    index: Option<u32>,
    #[serde(default, borrow)]
    delta: Option<RawMessage<'a>>,
    /// Legacy completions stream text here.
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
    /// Non-streaming chat responses.
    #[serde(default, borrow)]
    message: Option<RawMessage<'a>>,
    #[serde(default, borrow)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct RawMessage<'a> {
    #[serde(default, borrow)]
    content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    reasoning_content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    reasoning: Option<Cow<'a, str>>,
    #[serde(default)]
    tool_calls: Option<serde::de::IgnoredAny>,
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

/// Parse one chunk. `None` means the payload was not a JSON object (the stream is still
/// forwarded; the chunk just teaches the meter nothing).
pub fn parse_chunk(data: &[u8]) -> Option<ChunkInfo<'_>> {
    let raw: RawChunk<'_> = serde_json::from_slice(data).ok()?;
    let mut info = ChunkInfo { usage: raw.usage, error: raw.error.is_some(), ..Default::default() };
    match raw.choices {
        Some(choices) if choices.is_empty() => info.usage_only = info.usage.is_some(),
        Some(choices) => {
            for c in choices {
                let idx = c.index.unwrap_or(0);
                let mut has = false;
                for m in [c.delta, c.message].into_iter().flatten() {
                    has |= m.tool_calls.is_some();
                    for t in [m.content, m.reasoning_content, m.reasoning].into_iter().flatten() {
                        if !t.is_empty() {
                            has = true;
                            info.texts.push((idx, t));
                        }
                    }
                }
                if let Some(t) = c.text
                    && !t.is_empty()
                {
                    has = true;
                    info.texts.push((idx, t));
                }
                if has {
                    info.content = true;
                    info.content_choices += 1;
                }
                if let Some(f) = c.finish_reason {
                    info.finish_reasons.push((idx, f));
                }
            }
        }
        None => {}
    }
    Some(info)
}

/// A non-streaming response body: it has the same shape as one big chunk.
pub fn parse_response(body: &[u8]) -> Option<ChunkInfo<'_>> {
    parse_chunk(body)
}

/// Bounded set of finish reasons for metric labels.
pub fn finish_reason_label(r: &str) -> &'static str {
    match r {
        "stop" => "stop",
        "length" => "length",
        "tool_calls" | "function_call" => "tool_calls",
        "content_filter" => "content_filter",
        "abort" => "abort",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_delta_chunk() {
        let c = parse_chunk(
            br#"{"id":"x","choices":[{"index":0,"delta":{"content":"Hi \"there\""},"finish_reason":null}]}"#,
        )
        .unwrap();
        assert!(c.content && !c.usage_only);
        assert_eq!(c.texts, vec![(0, Cow::Borrowed("Hi \"there\""))]);
    }

    #[test]
    fn role_only_chunk_is_not_content() {
        let c =
            parse_chunk(br#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#).unwrap();
        assert!(!c.content);
    }

    #[test]
    fn usage_only_chunk() {
        let c = parse_chunk(
            br#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":7,"total_tokens":10}}"#,
        )
        .unwrap();
        assert!(c.usage_only);
        assert_eq!(c.usage, Some(Usage { prompt_tokens: Some(3), completion_tokens: Some(7) }));
    }

    #[test]
    fn continuous_usage_is_not_usage_only() {
        let c = parse_chunk(
            br#"{"choices":[{"index":0,"text":"a"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}"#,
        )
        .unwrap();
        assert!(c.content && !c.usage_only && c.usage.is_some());
    }

    #[test]
    fn n_choices_and_finish() {
        let c = parse_chunk(
            br#"{"choices":[{"index":0,"text":"a"},{"index":1,"text":"b","finish_reason":"length"}]}"#,
        )
        .unwrap();
        assert_eq!(c.content_choices, 2);
        assert_eq!(c.finish_reasons, vec![(1, Cow::Borrowed("length"))]);
    }

    #[test]
    fn tool_call_delta_counts_as_content() {
        let c = parse_chunk(br#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0}]}}]}"#).unwrap();
        assert!(c.content);
    }

    #[test]
    fn non_stream_response() {
        let r = parse_response(
            br#"{"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}"#,
        )
        .unwrap();
        assert_eq!(r.usage.unwrap().completion_tokens, Some(1));
        assert_eq!(r.finish_reasons[0].1, "stop");
    }

    #[test]
    fn garbage_is_none() {
        assert!(parse_chunk(b"[DONE]").is_none());
        assert!(parse_chunk(b"").is_none());
        assert!(parse_chunk(br#"{"choices":"x"}"#).is_none());
    }
}
