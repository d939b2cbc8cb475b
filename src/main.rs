//! The `goodput` binary: parse the command line, set up logging, run a subcommand.
//! The path of a request starts in `goodput::proxy`.

use clap::Parser;

use goodput::cli::{Cli, Command, LogFormat};

fn main() -> std::process::ExitCode {
    tune_malloc();
    let cli = Cli::parse();
    let logs = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr);
    match cli.log_format {
        // Colour codes only on a terminal: a log collector (kubectl logs, Loki) gets plain text.
        LogFormat::Text => logs.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).init(),
        // One flat object per event: timestamp, level, target, message and the event's fields.
        LogFormat::Json => {
            logs.json().flatten_event(true).with_current_span(false).with_span_list(false).init()
        }
    }
    let result = match cli.command {
        Command::CheckConfig { file } => goodput::cli::check_config(&file),
        Command::Serve(args) => on_runtime(args.workers, goodput::cli::serve(args)),
        Command::Sim(args) => on_runtime(args.workers, goodput::cli::sim(args)),
        Command::Bench(args) => on_runtime(None, goodput::cli::bench(args)),
        Command::Ppl(args) => goodput::cli::ppl(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Run `fut` as a task, so that the accept loop shares the workers' event loop instead of waking
/// a thread of its own (on a multi-thread runtime the main thread only waits in `block_on`).
fn on_runtime(
    workers: Option<usize>,
    fut: impl std::future::Future<Output = Result<(), String>> + Send + 'static,
) -> Result<(), String> {
    let rt = runtime(workers);
    rt.block_on(async { tokio::spawn(fut).await.unwrap_or_else(|e| Err(format!("task failed: {e}"))) })
}

/// One worker is a current-thread runtime: the same one thread, without the work-stealing
/// scheduler's bookkeeping on every wake-up (each streamed chunk wakes two tasks, hyper's
/// upstream connection and the client's).
fn runtime(workers: Option<usize>) -> tokio::runtime::Runtime {
    let mut b = match workers {
        Some(n) if n <= 1 => tokio::runtime::Builder::new_current_thread(),
        Some(n) => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n);
            b
        }
        None => tokio::runtime::Builder::new_multi_thread(),
    };
    b.enable_all().thread_name("goodput-worker").build().expect("tokio runtime")
}

/// glibc grows and shrinks its per-thread heaps with an mprotect call each time, which under
/// proxy load was thousands of syscalls a second. Grow in larger steps and do not give memory
/// back below the trim threshold (RSS stays at its high-water mark; BENCHMARKS.md has both).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn tune_malloc() {
    // SAFETY: mallopt only sets allocator parameters; called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_TOP_PAD, 8 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 64 << 20);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn tune_malloc() {}
