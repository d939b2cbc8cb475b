//! goodput: a metering sidecar for OpenAI-compatible LLM servers.
//!
//! Read `main.rs` for the wiring, then `proxy` for the path of a request.

pub mod admin;
pub mod bench;
pub mod cli;
pub mod config;
pub mod goodput;
pub mod meter;
pub mod openai;
pub mod proxy;
pub mod quality;
pub mod route;
pub mod sim;
pub mod tls;
