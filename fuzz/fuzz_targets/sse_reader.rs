#![no_main]

#[allow(dead_code)]
#[path = "../properties/mod.rs"]
mod properties;

libfuzzer_sys::fuzz_target!(|data: &[u8]| properties::sse_reader::check(data));
