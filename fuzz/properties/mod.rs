//! The properties the fuzz targets check, one `check(data)` per target. The fuzz targets
//! (`fuzz/fuzz_targets/`) run them under libFuzzer; `tests/fuzz_corpus.rs` replays the committed
//! corpus (`fuzz/corpus/`) through them in the ordinary test suite.

pub mod config;
pub mod openai_parsers;
pub mod split;
pub mod sse_reader;
pub mod usage_strip;
