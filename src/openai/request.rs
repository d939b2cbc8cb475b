//! The few request fields the proxy needs to understand, and the one rewrite it may make.

use serde::Deserialize;

pub use super::types::{Operation, RequestInfo};

impl Operation {
    /// `gen_ai.operation.name` values of the OpenTelemetry GenAI conventions.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Chat => "chat",
            Operation::Completion => "text_completion",
        }
    }

    /// Metered paths; anything else is forwarded without metering.
    pub fn from_path(path: &str) -> Option<Operation> {
        let p = path.trim_end_matches('/');
        if p.ends_with("/chat/completions") {
            Some(Operation::Chat)
        } else if p.ends_with("/v1/completions") || p == "/completions" {
            Some(Operation::Completion)
        } else {
            None
        }
    }
}

#[derive(Deserialize)]
struct Fields<'a> {
    #[serde(default, borrow)]
    messages: Option<&'a serde_json::value::RawValue>,
    #[serde(default, borrow)]
    prompt: Option<&'a serde_json::value::RawValue>,
    #[serde(default)]
    model: Option<serde_json::Value>,
    #[serde(default)]
    stream: Option<serde_json::Value>,
    #[serde(default)]
    stream_options: Option<serde_json::Value>,
    #[serde(default)]
    n: Option<serde_json::Value>,
    #[serde(default)]
    max_tokens: Option<serde_json::Value>,
    #[serde(default)]
    max_completion_tokens: Option<serde_json::Value>,
}

impl RequestInfo {
    /// serde_json's reading of the fields above; every other member is skipped, its grammar
    /// checked.
    pub fn parse(body: &[u8]) -> RequestInfo {
        // Lenient on types: a wrong type is the upstream's error to report, not ours.
        let is_object = body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
        // JSON is UTF-8. serde skips unknown members without checking their strings, so a body
        // with invalid UTF-8 in, say, a message would otherwise pass as valid and be rewritten
        // (found by fuzzing); malformed bodies must reach the upstream unchanged.
        let parsed = match std::str::from_utf8(body) {
            Ok(text) if is_object => serde_json::from_str::<Fields>(text).ok(),
            _ => None,
        };
        let Some(f) = parsed else {
            return RequestInfo { n: 1, ..Default::default() };
        };
        let so = f.stream_options.as_ref().and_then(|v| v.as_object());
        RequestInfo {
            valid_json: true,
            model: f.model.as_ref().and_then(|m| m.as_str()).map(str::to_owned),
            stream: f.stream.as_ref().and_then(|v| v.as_bool()).unwrap_or(false),
            include_usage: so.and_then(|o| o.get("include_usage")).and_then(|v| v.as_bool()),
            has_stream_options: f.stream_options.as_ref().is_some_and(|v| !v.is_null()),
            continuous_usage_stats: so
                .and_then(|o| o.get("continuous_usage_stats"))
                .and_then(|v| v.as_bool())
                .unwrap_or(false),
            n: f.n.as_ref().and_then(|v| v.as_u64()).map(|n| n.clamp(1, 1024) as u32).unwrap_or(1),
            max_tokens: f.max_completion_tokens.as_ref().or(f.max_tokens.as_ref()).and_then(|v| v.as_u64()),
            prompt: f.messages.or(f.prompt).map(|raw| {
                // The raw value borrows from `body`: its offset is where it stands in it.
                let start = raw.get().as_ptr() as usize - body.as_ptr() as usize;
                (start, start + raw.get().len())
            }),
        }
    }

    /// Whether the proxy should ask the upstream for a usage chunk the client did not request.
    pub fn wants_injected_usage(&self) -> bool {
        self.valid_json && self.stream && self.include_usage != Some(true)
    }
}

/// Add `stream_options.include_usage: true` to a request body, leaving every other byte as
/// the client wrote it where possible. Returns `None` if the body cannot be rewritten.
pub fn inject_include_usage(body: &[u8], info: &RequestInfo) -> Option<Vec<u8>> {
    if !info.valid_json {
        return None;
    }
    if !info.has_stream_options {
        // Append the member before the closing brace: no re-serialisation, key order kept.
        let end = body.iter().rposition(|b| !b.is_ascii_whitespace())?;
        if body[end] != b'}' {
            return None;
        }
        let inner_empty =
            body[..end].iter().rposition(|b| !b.is_ascii_whitespace()).is_some_and(|i| body[i] == b'{');
        let member: &[u8] = if inner_empty {
            br#""stream_options":{"include_usage":true}"#
        } else {
            br#","stream_options":{"include_usage":true}"#
        };
        let mut out = Vec::with_capacity(body.len() + member.len());
        out.extend_from_slice(&body[..end]);
        out.extend_from_slice(member);
        out.extend_from_slice(&body[end..]);
        return Some(out);
    }
    // stream_options exists (e.g. continuous_usage_stats, or include_usage:false): merge it,
    // and only it; every other member keeps the client's bytes.
    replace_member(body, "stream_options", |old| match old {
        Some(so) if so.get().starts_with('{') => {
            replace_member(so.get().as_bytes(), "include_usage", |_| Some("true".into()))
                .and_then(|v| String::from_utf8(v).ok())
        }
        _ => Some(r#"{"include_usage":true}"#.into()),
    })
}

/// Set the body's `model` (a route's `rewrite_model`). `None` if the body is not a JSON object.
pub fn rewrite_model(body: &[u8], model: &str) -> Option<Vec<u8>> {
    let value = serde_json::to_string(model).ok()?;
    replace_member(body, "model", |_| Some(value.clone()))
}

/// Rewrite one top-level member of a JSON object, keeping every other member's bytes exactly as
/// the client sent them (a parse into `Value` and back would round numbers: found by fuzzing,
/// `455555.55555505555555554` came back as a different float). Every member named `key` gets
/// the new value; without one, it is appended. Keys are written back in JSON's canonical form.
fn replace_member(
    body: &[u8],
    key: &str,
    mut value: impl FnMut(Option<&serde_json::value::RawValue>) -> Option<String>,
) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(body).ok()?;
    let members: Members<'_> = serde_json::from_str(text).ok()?;
    let mut out = Vec::with_capacity(body.len() + key.len() + 64);
    out.push(b'{');
    let mut found = false;
    for (i, (k, v)) in members.0.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(serde_json::to_string(k).ok()?.as_bytes());
        out.push(b':');
        if k == key {
            found = true;
            out.extend_from_slice(value(Some(v))?.as_bytes());
        } else {
            out.extend_from_slice(v.get().as_bytes());
        }
    }
    if !found {
        if !members.0.is_empty() {
            out.push(b',');
        }
        out.extend_from_slice(serde_json::to_string(key).ok()?.as_bytes());
        out.push(b':');
        out.extend_from_slice(value(None)?.as_bytes());
    }
    out.push(b'}');
    Some(out)
}

/// A JSON object's members in order, duplicates kept, values as the raw text.
struct Members<'a>(Vec<(std::borrow::Cow<'a, str>, &'a serde_json::value::RawValue)>);

impl<'de> serde::Deserialize<'de> for Members<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Members<'de>, A::Error> {
                let mut v = Vec::new();
                while let Some(k) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    v.push((k, map.next_value()?));
                }
                Ok(Members(v))
            }
        }
        d.deserialize_map(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewrites_keep_other_members_byte_for_byte() {
        let body = br#"{"ex":455555.55555505555555554, "model" : "a","big":123456789012345678901234567890,"stream_options":{"continuous_usage_stats":true}}"#;
        let out = rewrite_model(body, "b").unwrap();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"ex":455555.55555505555555554,"model":"b","big":123456789012345678901234567890,"stream_options":{"continuous_usage_stats":true}}"#
        );
        let info = RequestInfo::parse(body);
        let out = inject_include_usage(body, &info).unwrap();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"ex":455555.55555505555555554,"model":"a","big":123456789012345678901234567890,"stream_options":{"continuous_usage_stats":true,"include_usage":true}}"#
        );
        let body = br#"{"stream":true,"stream_options":{"x":1.0000000000001e32,"include_usage":false}}"#;
        let out = inject_include_usage(body, &RequestInfo::parse(body)).unwrap();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"stream":true,"stream_options":{"x":1.0000000000001e32,"include_usage":true}}"#
        );
        assert_eq!(rewrite_model(b"{}", "m").unwrap(), br#"{"model":"m"}"#);
        assert_eq!(rewrite_model(b"[1]", "m"), None);
    }

    #[test]
    fn invalid_utf8_is_not_valid_json() {
        let body = b"{\"model\":\"m\",\"stream\":true,\"messages\":[{\"content\":\"\xff\xfe\"}]}";
        let info = RequestInfo::parse(body);
        assert!(!info.valid_json);
        assert_eq!(inject_include_usage(body, &info), None);
    }

    #[test]
    fn parses_fields() {
        let i = RequestInfo::parse(
            br#"{"model":"m","stream":true,"n":2,"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#,
        );
        assert!(i.valid_json && i.stream);
        assert_eq!(i.model.as_deref(), Some("m"));
        assert_eq!((i.n, i.max_tokens, i.include_usage), (2, Some(5), None));
        assert!(i.wants_injected_usage());
    }

    #[test]
    fn malformed_and_wrong_types_do_not_fail() {
        let i = RequestInfo::parse(b"{not json");
        assert!(!i.valid_json);
        assert_eq!(i.n, 1);
        assert!(!i.wants_injected_usage());
        let i = RequestInfo::parse(br#"{"model":5,"stream":"yes","n":-3}"#);
        assert!(i.valid_json);
        assert_eq!((i.model, i.stream, i.n), (None, false, 1));
        assert!(!RequestInfo::parse(b"[1,2]").valid_json);
        assert!(!RequestInfo::parse(b"").valid_json);
    }

    #[test]
    fn client_usage_request_is_respected() {
        let i = RequestInfo::parse(br#"{"stream":true,"stream_options":{"include_usage":true}}"#);
        assert_eq!(i.include_usage, Some(true));
        assert!(!i.wants_injected_usage());
    }

    #[test]
    fn injection_appends_member_and_keeps_bytes() {
        let body = br#"{"model":"m", "stream":true}  "#;
        let info = RequestInfo::parse(body);
        let out = inject_include_usage(body, &info).unwrap();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"model":"m", "stream":true,"stream_options":{"include_usage":true}}  "#
        );
        assert_eq!(RequestInfo::parse(&out).include_usage, Some(true));
    }

    #[test]
    fn injection_merges_existing_stream_options() {
        let body =
            br#"{"stream":true,"stream_options":{"continuous_usage_stats":true,"include_usage":false}}"#;
        let info = RequestInfo::parse(body);
        assert!(info.wants_injected_usage());
        let out = inject_include_usage(body, &info).unwrap();
        let back = RequestInfo::parse(&out);
        assert_eq!(back.include_usage, Some(true));
        assert!(back.continuous_usage_stats);
    }

    #[test]
    fn model_rewrite() {
        let out = rewrite_model(br#"{"model":"chat","stream":true}"#, "Qwen/Qwen2.5-7B").unwrap();
        let i = RequestInfo::parse(&out);
        assert_eq!((i.model.as_deref(), i.stream), (Some("Qwen/Qwen2.5-7B"), true));
        assert!(rewrite_model(b"[1]", "m").is_none());
    }

    const REQUESTS: &[&str] = &[
        r#"{"model":"m","stream":true,"n":2,"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#,
        r#"{"model":"Qwen/Qwen2.5-7B-Instruct","messages":[{"role":"system","content":"You are \"helpful\".\n"},{"role":"user","content":[{"type":"text","text":"caf\u00e9 \ud83d\ude00"}]}],"temperature":0.7,"top_p":1e-1,"stop":null,"stream":false}"#,
        r#"{"stream":true,"stream_options":{"include_usage":false,"continuous_usage_stats":true,"x":[1,{}]},"max_completion_tokens":7,"max_tokens":null}"#,
        r#"{"model":"m","prompt":["a","b"],"n":5000,"stream":null,"stream_options":null,"logprobs":3,"echo":false}"#,
        r#"  { "model" : "m\u002fx" , "stream" : true , "tools" : [ { "type" : "function" } ] }  "#,
        r#"{}"#,
        r#"{"messages" : null , "prompt" :  "abc"  ,"n":1}"#,
    ];

    #[test]
    fn the_prompt_is_located_in_the_body() {
        let at = |s: &str| RequestInfo::parse(s.as_bytes()).prompt.map(|(a, b)| s[a..b].to_string());
        assert_eq!(at(REQUESTS[0]).as_deref(), Some(r#"[{"role":"user","content":"hi"}]"#));
        assert_eq!(at(REQUESTS[3]).as_deref(), Some(r#"["a","b"]"#));
        assert_eq!(at(REQUESTS[6]).as_deref(), Some(r#""abc""#), "null messages: the prompt");
        assert_eq!(at(r#"{"messages":[1] , "prompt":"p"}"#).as_deref(), Some("[1]"), "messages first");
        assert_eq!(at(REQUESTS[5]), None);
    }

    #[test]
    fn reads_the_fields_and_skips_the_rest() {
        let read = |s: &str| {
            let i = RequestInfo::parse(s.as_bytes());
            let flags =
                (i.valid_json, i.stream, i.include_usage, i.has_stream_options, i.continuous_usage_stats);
            format!("{:?} {flags:?} n={} max={:?}", i.model, i.n, i.max_tokens)
        };
        let want = [
            r#"Some("m") (true, true, None, false, false) n=2 max=Some(5)"#,
            r#"Some("Qwen/Qwen2.5-7B-Instruct") (true, false, None, false, false) n=1 max=None"#,
            r#"None (true, true, Some(false), true, true) n=1 max=Some(7)"#,
            r#"Some("m") (true, false, None, false, false) n=1024 max=None"#,
            r#"Some("m/x") (true, true, None, false, false) n=1 max=None"#,
            r#"None (true, false, None, false, false) n=1 max=None"#,
            r#"None (true, false, None, false, false) n=1 max=None"#,
        ];
        assert_eq!(REQUESTS.len(), want.len());
        for (s, want) in REQUESTS.iter().zip(want) {
            assert_eq!(read(s), want, "{s}");
        }
        // A wrong type is the upstream's to refuse: the body is valid, the field unread.
        assert_eq!(
            read(r#"{"model":5,"stream":"yes","n":-3}"#),
            "None (true, false, None, false, false) n=1 max=None"
        );
        assert_eq!(
            read(r#"{"n":2.0,"max_completion_tokens":"7","max_tokens":3}"#),
            "None (true, false, None, false, false) n=1 max=None"
        );
        assert_eq!(read(r#"{"stream_options":true}"#), "None (true, false, None, true, false) n=1 max=None");
        // Not a JSON object, or not well-formed: forwarded unchanged, never rewritten.
        for s in [r#"{"model":"a","model":"b"}"#, r#"{"a":1} x"#, "[1]", "\u{c}{}", ""] {
            assert_eq!(RequestInfo::parse(s.as_bytes()), RequestInfo { n: 1, ..Default::default() }, "{s}");
        }
        assert!(!RequestInfo::parse(b"{\"messages\":\"\xff\"}").valid_json, "invalid UTF-8");
    }

    #[test]
    fn operation_from_path() {
        assert_eq!(Operation::from_path("/v1/chat/completions"), Some(Operation::Chat));
        assert_eq!(Operation::from_path("/v1/completions/"), Some(Operation::Completion));
        assert_eq!(Operation::from_path("/v1/models"), None);
        assert_eq!(Operation::from_path("/v1/embeddings"), None);
    }
}
