//! Reading what the upstream answered: stream chunks and whole responses.

use serde::Deserialize;
use std::borrow::Cow;

pub use super::types::{ChunkInfo, Usage};

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

/// Parse one chunk. `None` means the payload was not a JSON object (the stream is still
/// forwarded; the chunk just teaches the meter nothing). `texts`: also return the generated
/// text (the tokenizer fallback, scoring); without it `ChunkInfo::texts` stays empty.
///
/// The one-pass reader in `skim.rs` answers wherever it can vouch for the same answer as
/// serde_json (every chunk a real server sends); anything else is read by serde_json.
pub fn parse_chunk(data: &[u8], texts: bool) -> Option<ChunkInfo<'_>> {
    match super::skim::chunk(data, texts) {
        Ok(info) => Some(info),
        Err(super::skim::Unsure) => parse_chunk_serde(data, texts),
    }
}

/// `parse_chunk` by serde_json alone: the fallback, and the reference the fast path is
/// tested against (unit tests here, the `openai_parsers` fuzz target).
#[doc(hidden)]
pub fn parse_chunk_serde(data: &[u8], want_texts: bool) -> Option<ChunkInfo<'_>> {
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
                            if want_texts {
                                info.texts.push((idx, t));
                            }
                        }
                    }
                }
                if let Some(t) = c.text
                    && !t.is_empty()
                {
                    has = true;
                    if want_texts {
                        info.texts.push((idx, t));
                    }
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
pub fn parse_response(body: &[u8], texts: bool) -> Option<ChunkInfo<'_>> {
    parse_chunk(body, texts)
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
    use crate::openai::skim;

    #[test]
    fn chat_delta_chunk() {
        let c = parse_chunk(
            br#"{"id":"x","choices":[{"index":0,"delta":{"content":"Hi \"there\""},"finish_reason":null}]}"#,
            true,
        )
        .unwrap();
        assert!(c.content && !c.usage_only);
        assert_eq!(c.texts, vec![(0, Cow::Borrowed("Hi \"there\""))]);
    }

    #[test]
    fn texts_only_when_asked() {
        let c = parse_chunk(br#"{"choices":[{"index":0,"delta":{"content":"Hi"}}]}"#, false).unwrap();
        assert!(c.content && c.texts.is_empty());
        assert_eq!(c.content_choices, 1);
    }

    #[test]
    fn role_only_chunk_is_not_content() {
        let c = parse_chunk(br#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#, true)
            .unwrap();
        assert!(!c.content);
    }

    #[test]
    fn usage_only_chunk() {
        let c = parse_chunk(
            br#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":7,"total_tokens":10}}"#,
            true,
        )
        .unwrap();
        assert!(c.usage_only);
        assert_eq!(c.usage, Some(Usage { prompt_tokens: Some(3), completion_tokens: Some(7) }));
    }

    #[test]
    fn continuous_usage_is_not_usage_only() {
        let c = parse_chunk(
            br#"{"choices":[{"index":0,"text":"a"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}"#,
            true,
        )
        .unwrap();
        assert!(c.content && !c.usage_only && c.usage.is_some());
    }

    #[test]
    fn n_choices_and_finish() {
        let c = parse_chunk(
            br#"{"choices":[{"index":0,"text":"a"},{"index":1,"text":"b","finish_reason":"length"}]}"#,
            true,
        )
        .unwrap();
        assert_eq!(c.content_choices, 2);
        assert_eq!(c.finish_reasons, vec![(1, Cow::Borrowed("length"))]);
    }

    #[test]
    fn tool_call_delta_counts_as_content() {
        let c =
            parse_chunk(br#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0}]}}]}"#, true).unwrap();
        assert!(c.content);
    }

    #[test]
    fn non_stream_response() {
        let r = parse_response(
            br#"{"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}"#,
            true,
        )
        .unwrap();
        assert_eq!(r.usage.unwrap().completion_tokens, Some(1));
        assert_eq!(r.finish_reasons[0].1, "stop");
    }

    #[test]
    fn garbage_is_none() {
        assert!(parse_chunk(b"[DONE]", true).is_none());
        assert!(parse_chunk(b"", true).is_none());
        assert!(parse_chunk(br#"{"choices":"x"}"#, true).is_none());
    }

    /// What servers send: vLLM (chat, completions, usage, continuous usage, tool calls,
    /// reasoning), llama.cpp's server, n > 1, escapes, and a Python server's ensure_ascii
    /// output (an emoji as a surrogate pair).
    const REAL: &[&str] = &[
        r#"{"id":"chatcmpl-9f1c","object":"chat.completion.chunk","created":1733000000,"model":"Qwen/Qwen2.5-1.5B-Instruct","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}"#,
        r#"{"id":"chatcmpl-9f1c","object":"chat.completion.chunk","created":1733000000,"model":"Qwen/Qwen2.5-1.5B-Instruct","choices":[{"index":0,"delta":{"content":" token"},"logprobs":null,"finish_reason":null}]}"#,
        r#"{"id":"chatcmpl-9f1c","object":"chat.completion.chunk","created":1733000000,"model":"m","choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"stop","stop_reason":null}]}"#,
        r#"{"id":"chatcmpl-9f1c","object":"chat.completion.chunk","created":1733000000,"model":"m","choices":[],"usage":{"prompt_tokens":12,"total_tokens":40,"completion_tokens":28,"prompt_tokens_details":null}}"#,
        r#"{"id":"x","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" a"},"logprobs":null,"finish_reason":null}],"usage":{"prompt_tokens":5,"total_tokens":7,"completion_tokens":2}}"#,
        r#"{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" Paris","logprobs":null,"finish_reason":null,"stop_reason":null}],"usage":null}"#,
        r#"{"id":"x","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get","arguments":"{\"city\": \"Oslo\"}"}}]},"finish_reason":null}]}"#,
        r#"{"id":"x","choices":[{"index":0,"delta":{"reasoning_content":"Let me think.\nFirst,","content":null},"finish_reason":null}]}"#,
        r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"content":" the"}}],"created":1733000000,"id":"chatcmpl-abc","model":"smollm2","system_fingerprint":"b1-abc","object":"chat.completion.chunk","timings":{"prompt_n":5,"predicted_ms":12.5}}"#,
        r#"{"choices":[{"index":1,"text":"b"},{"index":0,"text":"a","finish_reason":"length"}]}"#,
        r#"{"choices":[{"index":0,"delta":{"content":"caf\u00e9 \ud83d\ude00 \"q\" \\ \/ \b\f\n\r\t"}}]}"#,
        r#"  {"choices" : [ { "index" : 0 , "delta" : { "content" : "x" } } ] , "usage" : { "prompt_tokens" : 0 , "completion_tokens" : 18446744073709551615 } }  "#,
        r#"{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hello! How can I help?","tool_calls":[]},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"total_tokens":15,"completion_tokens":6},"prompt_logprobs":null}"#,
        r#"{"error":{"message":"boom","type":"server_error","code":500}}"#,
        r#"{"choices":[{"index":0,"delta":{"content":"é—ü"}}],"x":[1,-2.5e-3,true,false,null,{"a":[]},0,-0,1E+2]}"#,
    ];

    #[test]
    fn the_fast_path_reads_what_servers_send_as_serde_does() {
        for s in REAL {
            for texts in [false, true] {
                let fast = skim::chunk(s.as_bytes(), texts);
                assert!(fast.is_ok(), "fast path gave up on {s}");
                assert_eq!(fast.ok(), parse_chunk_serde(s.as_bytes(), texts), "{s}");
            }
        }
    }

    #[test]
    fn the_fast_path_leaves_the_unusual_to_serde() {
        for s in [
            r#"{"choices":[],"choices":[]}"#,
            r#"{"usage":{"prompt_tokens":1,"prompt_tokens":2}}"#,
            r#"{"choi\u0063es":[]}"#,
            r#"{"choices":[{"delta":{"content":"\ud83d"}}]}"#,
            r#"{"choices":[{"delta":{"content":"\ude00"}}]}"#,
            r#"{"choices":[[0,null,"x"]]}"#,
            r#"{"choices":[{"index":1.0}]}"#,
            r#"{"choices":[{"index":4294967296}]}"#,
            r#"{"choices":[{"index":-1}]}"#,
            r#"{"usage":{"completion_tokens":18446744073709551616}}"#,
            r#"{"usage":{"completion_tokens":01}}"#,
            r#"{"choices":[]} x"#,
            r#"{"choices":[],}"#,
            r#"{"a":"tab	inside"}"#,
            r#"{"a":1.}"#,
            r#"{"a":"\x"}"#,
            "[1]",
            "",
        ] {
            assert_eq!(skim::chunk(s.as_bytes(), true), Err(skim::Unsure), "{s}");
            assert_eq!(parse_chunk(s.as_bytes(), true), parse_chunk_serde(s.as_bytes(), true), "{s}");
        }
        let deep = format!("{{\"a\":{}{}}}", "[".repeat(120), "]".repeat(120));
        assert_eq!(skim::chunk(deep.as_bytes(), true), Err(skim::Unsure));
        assert_eq!(skim::chunk(b"{\"a\":\"\xff\"}", true), Err(skim::Unsure));
    }

    /// Mutations of the real chunks: wherever the fast path answers, serde_json answers the same.
    #[test]
    fn the_fast_path_agrees_with_serde_under_mutation() {
        crate::openai::mutated(REAL, |v, round| {
            let texts = round % 2 == 0;
            let fast = skim::chunk(v, texts);
            if let Ok(fast) = &fast {
                assert_eq!(
                    Some(fast),
                    parse_chunk_serde(v, texts).as_ref(),
                    "{}",
                    String::from_utf8_lossy(v)
                );
            }
            fast.is_ok()
        });
    }
}
