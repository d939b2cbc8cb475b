//! The `goodput` binary: parse the command line, set up logging, run a subcommand.
//! The path of a request starts in `goodput::proxy`.

use clap::Parser;
use goodput::cli::{Cli, Command};

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let result = match cli.command {
        Command::CheckConfig { file } => goodput::cli::check_config(&file),
        Command::Serve(args) => runtime().block_on(goodput::cli::serve(args)),
        Command::Sim(args) => runtime().block_on(goodput::cli::sim(args)),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("goodput-worker")
        .build()
        .expect("tokio runtime")
}
