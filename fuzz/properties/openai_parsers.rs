//! What goodput reads of OpenAI requests and responses: never panics, answers consistently,
//! and the two request rewrites change only what they say they change.

use goodput::openai::request::{RequestInfo, inject_include_usage, rewrite_model};
use goodput::openai::response::{ChunkInfo, parse_chunk, parse_response};
use serde_json::Value;
use serde_json::value::RawValue;

fn without(mut v: Value, key: &str) -> Value {
    if let Some(o) = v.as_object_mut() {
        o.remove(key);
    }
    v
}

pub fn check(data: &[u8]) {
    for texts in [false, true] {
        let c = parse_chunk(data, texts);
        // What is read is read from JSON: a chunk is well-formed.
        if c.is_some() {
            assert!(serde_json::from_slice::<&RawValue>(data).is_ok(), "read a chunk that is not JSON");
        }
        if let Some(c) = c.as_ref().filter(|c| c.usage_only) {
            assert!(c.usage.is_some() && !c.content, "usage_only without usage, or with content");
        }
        assert_eq!(parse_response(data, texts), c);
    }
    // Asking for the texts changes nothing else.
    if let (Some(bare), Some(full)) = (parse_chunk(data, false), parse_chunk(data, true)) {
        assert!(bare.texts.is_empty());
        assert_eq!(ChunkInfo { texts: full.texts.clone(), ..bare }, full, "texts changed the reading");
    } else {
        assert_eq!(parse_chunk(data, false).is_some(), parse_chunk(data, true).is_some());
    }
    let info = RequestInfo::parse(data);
    assert!(info.n >= 1);
    // JSON's grammar bounds no number, so a well-formed body may not fit a `Value` (1e999):
    // well-formedness is checked on the raw text, equality wherever `Value` can hold both.
    let well_formed = |b: &[u8]| serde_json::from_slice::<&RawValue>(b).is_ok();
    let original: Option<Value> = serde_json::from_slice(data).ok();
    // Stricter than JSON (duplicate known keys are refused), never looser.
    if info.valid_json {
        assert!(
            well_formed(data) && data.trim_ascii_start().starts_with(b"{"),
            "valid_json on a body that is not a JSON object"
        );
    }
    if let Some(out) = inject_include_usage(data, &info) {
        assert!(well_formed(data), "rewrote a body that is not JSON");
        assert!(well_formed(&out), "injection produced invalid JSON");
        if let (Some(o), Ok(v)) = (&original, serde_json::from_slice::<Value>(&out)) {
            assert_eq!(v["stream_options"]["include_usage"], Value::Bool(true));
            assert_eq!(
                without(v.clone(), "stream_options"),
                without(o.clone(), "stream_options"),
                "other fields changed"
            );
            // Members of an existing stream_options object survive.
            if let Some(so) = o.get("stream_options").and_then(Value::as_object) {
                for (k, val) in so {
                    if k != "include_usage" {
                        assert_eq!(&v["stream_options"][k], val, "stream_options.{k} changed");
                    }
                }
            }
        }
    }
    if let Some(out) = rewrite_model(data, "served-model") {
        assert!(well_formed(data), "rewrote a body that is not JSON");
        assert!(well_formed(&out), "model rewrite produced invalid JSON");
        if let (Some(o), Ok(v)) = (original, serde_json::from_slice::<Value>(&out)) {
            assert_eq!(v["model"], Value::String("served-model".into()));
            assert_eq!(without(v, "model"), without(o, "model"), "model rewrite changed other fields");
        }
    }
}
