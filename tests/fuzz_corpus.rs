//! The fuzz targets' properties (`fuzz/properties/`) over the committed corpus (`fuzz/corpus/`,
//! the seeds and the regression inputs of every bug fuzzing found): each input is checked as
//! libFuzzer would check it, without the instrumented build. Fuzzing itself is
//! `scripts/fuzz.sh` (RELIABILITY.md).

#[path = "../fuzz/properties/mod.rs"]
mod properties;

use std::path::Path;

fn replay(target: &str, check: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus").join(target);
    let mut inputs: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    inputs.sort();
    assert!(!inputs.is_empty(), "no corpus in {}", dir.display());
    for p in &inputs {
        let data = std::fs::read(p).unwrap();
        if let Err(e) = std::panic::catch_unwind(|| check(&data)) {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()));
            panic!("{target}: {} fails: {}", p.display(), msg.unwrap_or_default());
        }
    }
}

#[test]
fn sse_reader() {
    replay("sse_reader", properties::sse_reader::check);
}

#[test]
fn usage_strip() {
    replay("usage_strip", properties::usage_strip::check);
}

#[test]
fn openai_parsers() {
    replay("openai_parsers", properties::openai_parsers::check);
}

#[test]
fn config() {
    replay("config", properties::config::check);
}
