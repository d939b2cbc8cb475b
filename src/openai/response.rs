//! Reading what the upstream answered: stream chunks and whole responses.

use serde::Deserialize;
use serde::de::IgnoredAny;
use std::borrow::Cow;

pub use super::types::{ChunkInfo, Usage};

/// A string borrowed from the chunk unless it has an escape: serde copies an `Option<Cow<str>>`
/// always, and borrows only a `Cow` marked `borrow` itself.
#[derive(Deserialize)]
#[serde(transparent)]
struct Text<'a>(#[serde(borrow)] Cow<'a, str>);

#[derive(Deserialize)]
struct RawMessage<'a> {
    #[serde(default, borrow)]
    content: Option<Text<'a>>,
    #[serde(default, borrow)]
    reasoning_content: Option<Text<'a>>,
    #[serde(default, borrow)]
    reasoning: Option<Text<'a>>,
    #[serde(default)]
    tool_calls: Option<IgnoredAny>,
}

/// Parse one chunk. `None` means the payload was not a JSON object (the stream is still
/// forwarded; the chunk just teaches the meter nothing). `texts`: also return the generated
/// text (the tokenizer fallback, scoring); without it `ChunkInfo::texts` stays empty.
///
/// serde_json reads it in one pass: the chunk's members are visited in place and each choice
/// is folded into the answer as it is read, so a token's chunk allocates nothing unless its
/// text is asked for. Stricter than JSON, never looser: a duplicated known member is
/// refused.
pub fn parse_chunk(data: &[u8], texts: bool) -> Option<ChunkInfo<'_>> {
    use serde::de::DeserializeSeed;
    // JSON is UTF-8; checked once here, so that serde_json need not check each string.
    let mut de = serde_json::Deserializer::from_str(std::str::from_utf8(data).ok()?);
    let info = ChunkSeed { texts }.deserialize(&mut de).ok()?;
    de.end().ok()?;
    Some(info)
}

/// Reads a known member into its slot; a second one is an error, as in serde's derived structs.
fn once<T, E: serde::de::Error>(
    slot: &mut Option<T>,
    name: &'static str,
    read: impl FnOnce() -> Result<T, E>,
) -> Result<(), E> {
    if slot.is_some() {
        return Err(E::duplicate_field(name));
    }
    *slot = Some(read()?);
    Ok(())
}

#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "snake_case")]
enum ChunkField {
    Choices,
    Usage,
    Error,
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "snake_case")]
enum ChoiceField {
    Index,
    /// Streamed chat.
    Delta,
    /// Non-streaming chat.
    Message,
    /// Completions, streamed or not.
    Text,
    FinishReason,
    #[serde(other)]
    Other,
}

struct ChunkSeed {
    texts: bool,
}

impl<'de> serde::de::DeserializeSeed<'de> for ChunkSeed {
    type Value = ChunkInfo<'de>;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> serde::de::Visitor<'de> for ChunkSeed {
    type Value = ChunkInfo<'de>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a chunk object")
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut info = ChunkInfo::default();
        let (mut choices, mut usage, mut error) = (None, None, None);
        let texts = self.texts;
        while let Some(key) = map.next_key::<ChunkField>()? {
            match key {
                ChunkField::Choices => once(&mut choices, "choices", || {
                    map.next_value_seed(ChoicesSeed { info: &mut info, texts })
                })?,
                ChunkField::Usage => once(&mut usage, "usage", || map.next_value::<Option<Usage>>())?,
                ChunkField::Error => once(&mut error, "error", || map.next_value::<Option<IgnoredAny>>())?,
                ChunkField::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        info.usage = usage.flatten();
        info.error = error.flatten().is_some();
        info.usage_only = choices == Some(Some(0)) && info.usage.is_some();
        Ok(info)
    }
}

/// `choices`: null, or an array whose choices are folded into `info`; the value is how many.
struct ChoicesSeed<'i, 'de> {
    info: &'i mut ChunkInfo<'de>,
    texts: bool,
}

impl<'de> serde::de::DeserializeSeed<'de> for ChoicesSeed<'_, 'de> {
    type Value = Option<usize>;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de> serde::de::Visitor<'de> for ChoicesSeed<'_, 'de> {
    type Value = Option<usize>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an array of choices or null")
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut n = 0;
        while seq.next_element_seed(ChoiceSeed { info: &mut *self.info, texts: self.texts })?.is_some() {
            n += 1;
        }
        Ok(Some(n))
    }
}

struct ChoiceSeed<'i, 'de> {
    info: &'i mut ChunkInfo<'de>,
    texts: bool,
}

impl<'de> serde::de::DeserializeSeed<'de> for ChoiceSeed<'_, 'de> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> serde::de::Visitor<'de> for ChoiceSeed<'_, 'de> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a choice object")
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let (mut index, mut delta, mut message, mut text, mut finish) = (None, None, None, None, None);
        while let Some(key) = map.next_key::<ChoiceField>()? {
            match key {
                ChoiceField::Index => once(&mut index, "index", || map.next_value::<Option<u32>>())?,
                ChoiceField::Delta => {
                    once(&mut delta, "delta", || map.next_value::<Option<RawMessage<'de>>>())?
                }
                ChoiceField::Message => {
                    once(&mut message, "message", || map.next_value::<Option<RawMessage<'de>>>())?
                }
                ChoiceField::Text => once(&mut text, "text", || map.next_value::<Option<Text<'de>>>())?,
                ChoiceField::FinishReason => {
                    once(&mut finish, "finish_reason", || map.next_value::<Option<Text<'de>>>())?
                }
                ChoiceField::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let idx = index.flatten().unwrap_or(0);
        let info = self.info;
        let mut has = false;
        for m in [delta.flatten(), message.flatten()].into_iter().flatten() {
            has |= m.tool_calls.is_some();
            for Text(t) in [m.content, m.reasoning_content, m.reasoning].into_iter().flatten() {
                if !t.is_empty() {
                    has = true;
                    if self.texts {
                        info.texts.push((idx, t));
                    }
                }
            }
        }
        if let Some(Text(t)) = text.flatten()
            && !t.is_empty()
        {
            has = true;
            if self.texts {
                info.texts.push((idx, t));
            }
        }
        if has {
            info.content = true;
            info.content_choices += 1;
        }
        if let Some(Text(f)) = finish.flatten() {
            info.finish_reasons.push((idx, f));
        }
        Ok(())
    }
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

    /// What each of `REAL` reads as: content choices, the texts, finish reasons, usage
    /// (prompt, completion), usage-only, error.
    fn summary(c: &ChunkInfo<'_>) -> String {
        let texts: Vec<String> = c.texts.iter().map(|(i, t)| format!("{i}:{t}")).collect();
        let finish: Vec<String> = c.finish_reasons.iter().map(|(i, f)| format!("{i}:{f}")).collect();
        let usage = c.usage.map(|u| (u.prompt_tokens, u.completion_tokens));
        format!("{} {texts:?} {finish:?} {usage:?} {} {}", c.content_choices, c.usage_only, c.error)
    }

    #[test]
    fn reads_what_servers_send() {
        let want = [
            r#"0 [] [] None false false"#,
            r#"1 ["0: token"] [] None false false"#,
            r#"0 [] ["0:stop"] None false false"#,
            r#"0 [] [] Some((Some(12), Some(28))) true false"#,
            r#"1 ["0: a"] [] Some((Some(5), Some(2))) false false"#,
            r#"1 ["0: Paris"] [] None false false"#,
            r#"1 [] [] None false false"#,
            r#"1 ["0:Let me think.\nFirst,"] [] None false false"#,
            r#"1 ["0: the"] [] None false false"#,
            r#"2 ["1:b", "0:a"] ["0:length"] None false false"#,
            "1 [\"0:caf\u{e9} \u{1f600} \\\"q\\\" \\\\ / \\u{8}\\u{c}\\n\\r\\t\"] [] None false false",
            r#"1 ["0:x"] [] Some((Some(0), Some(18446744073709551615))) false false"#,
            r#"1 ["0:Hello! How can I help?"] ["0:stop"] Some((Some(9), Some(6))) false false"#,
            r#"0 [] [] None false true"#,
            r#"1 ["0:é—ü"] [] None false false"#,
        ];
        assert_eq!(REAL.len(), want.len());
        for (s, want) in REAL.iter().zip(want) {
            let c = parse_chunk(s.as_bytes(), true).unwrap_or_else(|| panic!("unread: {s}"));
            assert_eq!(summary(&c), want, "{s}");
            assert_eq!(c.content, c.content_choices > 0, "{s}");
            let bare = parse_chunk(s.as_bytes(), false).unwrap();
            assert!(bare.texts.is_empty(), "texts only when asked: {s}");
            assert_eq!(ChunkInfo { texts: c.texts.clone(), ..bare }, c, "{s}");
        }
        // Borrowed where the text has no escape, so a chunk allocates nothing for it.
        for s in [REAL[1], REAL[5], REAL[9], REAL[12]] {
            let c = parse_chunk(s.as_bytes(), true).unwrap();
            assert!(c.texts.iter().all(|(_, t)| matches!(t, Cow::Borrowed(_))), "{s}");
            assert!(c.finish_reasons.iter().all(|(_, f)| matches!(f, Cow::Borrowed(_))), "{s}");
        }
        assert!(matches!(parse_chunk(REAL[10].as_bytes(), true).unwrap().texts[0].1, Cow::Owned(_)));
    }

    #[test]
    fn what_is_not_a_well_formed_chunk_teaches_nothing() {
        for s in [
            r#"{"choices":[],"choices":[]}"#,
            r#"{"usage":{"prompt_tokens":1,"prompt_tokens":2}}"#,
            r#"{"choices":[{"index":0,"index":1}]}"#,
            r#"{"choices":[{"delta":{"content":"a","content":"b"}}]}"#,
            r#"{"choices":[{"delta":{"content":"\ud83d"}}]}"#,
            r#"{"choices":[{"delta":{"content":"\ude00"}}]}"#,
            r#"{"choices":[[0,null,"x"]]}"#,
            r#"{"choices":[{"index":1.0}]}"#,
            r#"{"choices":[{"index":4294967296}]}"#,
            r#"{"choices":[{"index":-1}]}"#,
            r#"{"choices":"x"}"#,
            r#"{"usage":{"completion_tokens":18446744073709551616}}"#,
            r#"{"usage":{"completion_tokens":01}}"#,
            r#"{"choices":[]} x"#,
            r#"{"choices":[],}"#,
            r#"{"a":"tab	inside"}"#,
            r#"{"a":1.}"#,
            r#"{"a":"\x"}"#,
            "[1]",
            "[DONE]",
            "",
        ] {
            assert_eq!(parse_chunk(s.as_bytes(), true), None, "{s}");
        }
        assert_eq!(parse_chunk(b"{\"a\":\"\xff\"}", true), None, "invalid UTF-8");
        // What is skipped is skipped without recursion, however deep: no stack to exhaust.
        let nests = [
            ("{\"a\":", "}"),
            ("{\"usage\":{\"x\":", "}}"),
            ("{\"choices\":[{\"delta\":{\"tool_calls\":", "}}]}"),
        ];
        for (open, close) in nests {
            let deep = format!("{open}{}{}{close}", "[".repeat(100_000), "]".repeat(100_000));
            assert!(parse_chunk(deep.as_bytes(), true).is_some(), "{open}");
        }
        // An escaped key is the key it spells.
        let c = parse_chunk(br#"{"choi\u0063es":[],"usage":{"completion_tokens":1}}"#, true).unwrap();
        assert!(c.usage_only);
    }
}
