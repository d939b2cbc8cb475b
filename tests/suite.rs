//! The black-box tests: the real `goodput` binary over real sockets, one module per area. One
//! test binary, not one per file: each links all of goodput, and the release build of two dozen
//! of them took longer than the rest of the build. Tests that share a server take it one at a
//! time (`common::vllm`); `tests/cuda.rs` is its own target (the `cuda` feature, on a GPU).
//! One module reads the source instead: `architecture` holds `src/` to ARCHITECTURE.md's table.

mod common;

mod architecture;
mod bench;
mod config_reload;
mod consistency;
mod content_coding;
mod dashboards;
mod deploy;
mod e2e_llama;
mod e2e_vllm;
mod e2e_vllm_drift;
mod e2e_vllm_pool;
mod e2e_vllm_quality;
mod embeddings;
mod faults;
mod fuzz_corpus;
mod http_defects;
mod lifecycle;
mod perplexity;
mod pool;
mod prometheus;
mod proxy;
mod routing;
mod sim;
mod status_page;
mod tls;
