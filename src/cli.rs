//! Command-line interface: `serve`, `sim`, `bench`, `ppl`, `check-config`.

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::config::{ConfigHandle, spawn_reloader};
use crate::meter::recorder::QualityLink;
use crate::meter::{Metrics, Recorder};
use crate::proxy::{Proxy, Sampling};
use crate::quality::scorer::Scorer;
use crate::sim::SimConfig;

#[derive(Parser, Debug)]
#[command(
    name = "goodput",
    version,
    about = "Metering proxy for OpenAI-compatible LLM servers: latency, tokens, goodput."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Log lines as text, or as JSON objects one per line for a log collector (Loki,
    /// Elasticsearch). The level comes from RUST_LOG (default: info).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "GOODPUT_LOG_FORMAT")]
    pub log_format: LogFormat,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the proxy.
    Serve(ServeArgs),
    /// Run the simulated OpenAI-compatible backend (a test double and demo, not a model).
    Sim(SimArgs),
    /// Load-test an OpenAI-compatible server (as `vllm bench serve`): latency, throughput,
    /// goodput, and optionally the outputs' perplexity.
    Bench(BenchArgs),
    /// Perplexity of text files under a reference LM (as lm-evaluation-harness's wikitext task).
    Ppl(PplArgs),
    /// Validate a config file and print precise errors.
    CheckConfig {
        /// The YAML config file.
        file: PathBuf,
    },
}

#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// YAML config file; hot-reloaded on change and on SIGHUP.
    #[arg(long, short)]
    pub config: Option<PathBuf>,
    /// Proxy listen address (overrides the config's `listen`).
    #[arg(long)]
    pub listen: Option<String>,
    /// Admin listen address (overrides the config's `admin_listen`).
    #[arg(long)]
    pub admin_listen: Option<String>,
    /// Upstream base URL, `URL` or `NAME=URL` (replaces the first backend's URL, or makes the
    /// only backend, named NAME or after the URL's host).
    #[arg(long)]
    pub upstream: Option<String>,
    /// Bearer token for /admin/* (overrides the config's `admin_token`). Prefer the
    /// environment variable: a command line is visible to every user of the machine.
    #[arg(long, env = "GOODPUT_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// Seconds to let in-flight requests finish after SIGTERM.
    #[arg(long, default_value_t = 30)]
    pub shutdown_grace_secs: u64,
    /// Tokio worker threads (default: one per CPU). A sidecar usually gets 1 or 2.
    #[arg(long, env = "GOODPUT_WORKERS")]
    pub workers: Option<usize>,
    /// Write every metered request's record as one JSON line (what /admin/records shows:
    /// numbers and labels, never text) to this file, appended, or to stdout with `-`.
    #[arg(long, env = "GOODPUT_REQUEST_LOG", value_name = "PATH")]
    pub request_log: Option<PathBuf>,
}

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Base URL of the server (or of goodput in front of it), e.g. http://127.0.0.1:8080.
    #[arg(long, required_unless_present = "results")]
    pub target: Option<String>,
    /// The `model` field sent.
    #[arg(long, default_value = "default")]
    pub model: String,
    /// chat (/v1/chat/completions) or completions (/v1/completions).
    #[arg(long, default_value = "chat", value_parser = ["chat", "completions"])]
    pub endpoint: String,
    /// Requests per second (open loop); omitted: as fast as --concurrency allows.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Gamma shape of the arrivals: 1 = Poisson, < 1 burstier, > 1 more regular.
    #[arg(long, default_value_t = 1.0)]
    pub burstiness: f64,
    /// Requests in flight at most.
    #[arg(long)]
    pub concurrency: Option<usize>,
    #[arg(long, default_value_t = 200)]
    pub num_requests: usize,
    /// Prompt length in words (about as many tokens), without --dataset.
    #[arg(long, default_value_t = 128)]
    pub input_len: usize,
    /// max_tokens per request (with --dataset: overrides each conversation's answer length).
    #[arg(long)]
    pub output_len: Option<u64>,
    /// A ShareGPT-format JSON file of conversations.
    #[arg(long)]
    pub dataset: Option<PathBuf>,
    /// Non-streaming requests (default: streams, whose TTFT and ITL are measured).
    #[arg(long)]
    pub no_stream: bool,
    /// Send vLLM's ignore_eos, so that every request generates max_tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// SLOs for goodput, e.g. --goodput ttft:500 tpot:50 e2el:10000.
    #[arg(long, num_args = 1..)]
    pub goodput: Vec<String>,
    /// Write the result as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Name of this run in the result and plots (default: the target).
    #[arg(long)]
    pub label: Option<String>,
    /// Draw a PNG: this run's latency CDF; with several --results, throughput against
    /// perplexity (one point per result; they need --score-model), else their latency CDFs.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Earlier --json results to plot instead of running (repeatable).
    #[arg(long)]
    pub results: Vec<PathBuf>,
    /// Score every output's perplexity with this reference model directory (model.onnx +
    /// tokenizer.json; scripts/setup-models.sh makes one).
    #[arg(long)]
    pub score_model: Option<PathBuf>,
    /// libonnxruntime.so for --score-model (default: ORT_DYLIB_PATH).
    #[arg(long)]
    pub onnxruntime: Option<PathBuf>,
    /// Extra header NAME:VALUE on every request (repeatable), e.g. authorization.
    #[arg(long = "header")]
    pub headers: Vec<String>,
    /// Per-request timeout in seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout_secs: u64,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// No progress lines on stderr.
    #[arg(long)]
    pub quiet: bool,
}

#[derive(Args, Debug, Clone)]
pub struct PplArgs {
    /// Directory with model.onnx and tokenizer.json (scripts/setup-models.sh prints SmolLM2's).
    #[arg(long, env = "GOODPUT_MODEL_DIR")]
    pub model: PathBuf,
    /// libonnxruntime.so (default: ORT_DYLIB_PATH).
    #[arg(long)]
    pub onnxruntime: Option<PathBuf>,
    /// `cpu` or `cuda:N`.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Tokens predicted per rolling window.
    #[arg(long, default_value_t = 2048)]
    pub max_length: usize,
    /// Windows per model call.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// ONNX Runtime intra-op threads (default: one per CPU).
    #[arg(long)]
    pub threads: Option<usize>,
    /// One JSON object per file: tokens, words, bytes, token_perplexity, word_perplexity,
    /// byte_perplexity, bits_per_byte.
    #[arg(long)]
    pub json: bool,
    /// Text files (UTF-8).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
}

pub fn ppl(args: PplArgs) -> Result<(), String> {
    let threads = args.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let opts = crate::quality::offline::PplOptions {
        model_dir: args.model,
        lm: crate::quality::lm::LmOptions {
            onnxruntime: args.onnxruntime,
            device: args.device.parse()?,
            allow_cpu_fallback: false,
            intra_op_threads: threads,
        },
        max_length: args.max_length.max(1),
        batch: args.batch.max(1),
        json: args.json,
    };
    crate::quality::offline::run(&opts, &args.files).map_err(|e| e.to_string())
}

#[derive(Args, Debug, Clone)]
pub struct SimArgs {
    #[arg(long, default_value = "127.0.0.1:8000")]
    pub listen: String,
    /// Tokio worker threads (default: one per CPU).
    #[arg(long)]
    pub workers: Option<usize>,
    #[arg(long)]
    pub seed: Option<u64>,
    #[arg(long)]
    pub model: Option<String>,
    /// Median time to first token, ms.
    #[arg(long)]
    pub ttft_ms: Option<f64>,
    /// Median time per output token, ms.
    #[arg(long)]
    pub tpot_ms: Option<f64>,
    /// Log-normal sigma on every delay (0 = fixed).
    #[arg(long)]
    pub jitter: Option<f64>,
    /// Mean output tokens per choice.
    #[arg(long)]
    pub output_tokens: Option<u32>,
    /// Output length spread: uniform in N*(1±spread).
    #[arg(long)]
    pub output_tokens_spread: Option<f64>,
    /// Share of requests answered 500.
    #[arg(long)]
    pub error_rate: Option<f64>,
    /// Share of streams reset mid-way.
    #[arg(long)]
    pub reset_rate: Option<f64>,
}

impl SimArgs {
    pub fn to_config(&self) -> SimConfig {
        let mut c = SimConfig::default();
        macro_rules! set {
            ($($f:ident),*) => { $( if let Some(v) = self.$f.clone() { c.$f = v; } )* };
        }
        set!(
            seed,
            model,
            ttft_ms,
            tpot_ms,
            jitter,
            output_tokens,
            output_tokens_spread,
            error_rate,
            reset_rate
        );
        c
    }
}

/// `--request-log`: stdout for `-`, else the file, created or appended to. Opened before the
/// proxy serves, so that a path that cannot be written is a start-up error.
fn open_request_log(path: &std::path::Path) -> Result<crate::meter::recorder::RequestLog, String> {
    use std::io::BufWriter;
    if path.as_os_str() == "-" {
        return Ok(Box::new(BufWriter::new(std::io::stdout())));
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| format!("--request-log {}: {e}", path.display()))?;
    Ok(Box::new(BufWriter::new(file)))
}

/// Raise the soft limit on open files to the hard one, as Go's runtime does for every Go
/// server. Each client connection and its upstream connection hold a descriptor, and the soft
/// limit a service often starts with (1024) runs out at a few hundred streams: every new
/// upstream connection then fails. Warns when even the hard limit is below what
/// `limits.max_connections` needs.
fn raise_fd_limit(max_connections: usize) {
    let Some(mut l) = crate::meter::process::open_file_limit() else { return };
    let before = l.rlim_cur;
    if l.rlim_cur < l.rlim_max {
        let raised = libc::rlimit { rlim_cur: l.rlim_max, rlim_max: l.rlim_max };
        // SAFETY: setrlimit reads only the struct it is given.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            l = raised;
            tracing::info!(from = before, to = l.rlim_cur, "raised the open-file limit to its hard limit");
        }
    }
    // A client and an upstream descriptor per connection, and a reserve for listeners, the
    // pool's idle connections, server watchers and files.
    let needed = 2 * max_connections as u64 + 256;
    if l.rlim_cur != libc::RLIM_INFINITY && l.rlim_cur < needed {
        tracing::warn!(
            limit = l.rlim_cur,
            needed,
            max_connections,
            "the open-file limit is below what limits.max_connections needs: past it, requests \
             are refused with 503 out_of_descriptors. Raise the hard limit (LimitNOFILE=, \
             ulimit -Hn) or lower limits.max_connections"
        );
    }
}

/// Start the proxy and admin listeners; runs until SIGTERM/SIGINT, then drains.
pub async fn serve(args: ServeArgs) -> Result<(), String> {
    let metrics = Metrics::new();
    // Simulated backends (the demo's) run in this process; started before the config that
    // names them is resolved.
    let sims = std::sync::Arc::new(crate::sim::Sims::default());
    crate::config::reload::start_sims(args.config.as_ref(), args.upstream.as_deref(), &sims)
        .await
        .map_err(|e| format!("invalid config:\n{e}"))?;
    let handle =
        ConfigHandle::start(args.config.clone(), args.upstream.clone(), metrics.config_reloads.clone(), sims)
            .await
            .map_err(|e| format!("invalid config:\n{e}"))?;
    let cfg = handle.load().config.clone();
    raise_fd_limit(cfg.limits.max_connections);
    let listen = args.listen.clone().unwrap_or(cfg.listen.clone());
    let admin_listen = args.admin_listen.clone().unwrap_or(cfg.admin_listen.clone());
    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    let admin = tokio::net::TcpListener::bind(&admin_listen)
        .await
        .map_err(|e| format!("cannot listen on {admin_listen}: {e}"))?;
    let proxy_addr: SocketAddr = listener.local_addr().map_err(|e| e.to_string())?;
    let admin_addr: SocketAddr = admin.local_addr().map_err(|e| e.to_string())?;
    let request_log = args.request_log.as_deref().map(open_request_log).transpose()?;

    // The scorer loads its model (seconds) before the proxy serves: a missing model or ONNX
    // Runtime library is a start-up error, not a silent gap in the quality metrics.
    let (results_tx, results_rx) = std::sync::mpsc::channel();
    let results_tx_c = results_tx.clone();
    // One CPU budget for every scorer (perplexity threads and the embedding thread).
    let budget = std::sync::Arc::new(crate::quality::budget::CpuBudget::new(cfg.quality.cpu_budget()));
    let (qcfg, m2, b2) = (cfg.quality.clone(), metrics.clone(), budget.clone());
    let scorer = tokio::task::spawn_blocking(move || Scorer::start(&qcfg, m2, results_tx, b2))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("perplexity scorer: {e}"))?;
    let embedder = match cfg.quality.consistency.as_ref() {
        Some(c) if c.methods.contains(&crate::config::Method::Embedding) => {
            let dir = c.embedding_model_dir.clone().unwrap_or_default();
            let lib =
                cfg.quality.perplexity.as_ref().and_then(|p| p.onnxruntime.clone()).or(c.onnxruntime.clone());
            let e = tokio::task::spawn_blocking(move || {
                crate::quality::embed::Embedder::load(&dir, lib.as_deref(), 1)
            })
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("embedding model: {e}"))?;
            Some(e)
        }
        _ => None,
    };
    // One upstream connector (TLS roots loaded once) for user and shadow requests.
    let connector =
        crate::tls::connector(&cfg.upstream_tls.ca_files, Duration::from_millis(cfg.timeouts.connect_ms))?;
    let checker = cfg.quality.consistency.clone().map(|c| {
        crate::quality::consistency::Checker::start(
            c,
            handle.clone(),
            metrics.clone(),
            results_tx_c,
            embedder,
            connector.clone(),
            budget.clone(),
        )
    });
    let sampling = Sampling { perplexity: scorer.is_some(), consistency: checker.is_some() };
    if sampling.perplexity || sampling.consistency {
        metrics.scoring_cpu_budget.set(budget.cores());
    }
    let quality = (sampling.perplexity || sampling.consistency).then(|| QualityLink {
        scorer,
        checker: checker.clone(),
        results: results_rx,
    });
    let recorder = Recorder::start(handle.clone(), metrics.clone(), quality, request_log);
    // Each server's own view (vLLM's /metrics) and its served model names, beside goodput's.
    crate::route::server::spawn_watcher(handle.clone(), metrics.clone(), connector.clone());
    let proxy = Proxy::new(handle.clone(), recorder, metrics, sampling, connector);
    proxy.spawn_readiness_probe();
    crate::route::prom::spawn_refresher(
        handle.clone(),
        proxy.router.clone(),
        proxy.metrics.route_stats_reads.clone(),
    );
    spawn_reloader(handle.clone());
    let token: Option<std::sync::Arc<str>> =
        args.admin_token.clone().or(cfg.admin_token.clone()).filter(|t| !t.is_empty()).map(Into::into);
    if token.is_none() && !admin_addr.ip().is_loopback() {
        tracing::warn!(%admin_addr, "the admin listener is not on loopback and has no admin_token: /admin/* is open to the network");
    }
    tokio::spawn(crate::admin::serve(admin, proxy.clone(), token));
    // One machine-readable line so that scripts and tests learn the bound ports.
    println!("goodput listening proxy={proxy_addr} admin={admin_addr}");
    tracing::info!(%proxy_addr, %admin_addr, backends = handle.load().backends.len(), "goodput serving");

    let grace = Duration::from_secs(args.shutdown_grace_secs);
    // Shadow requests stop at once on shutdown (their connections close: the server aborts them).
    let shutdown = async move {
        shutdown_signal().await;
        if let Some(c) = checker {
            c.cancel();
        }
    };
    crate::proxy::serve(listener, proxy.clone(), shutdown, grace).await;
    // Every finished request reaches the metrics before the process ends.
    let flushed = proxy.recorder.flush(Duration::from_secs(2)).await;
    let totals = proxy.metrics.requests_by_outcome();
    tracing::info!(flushed, ?totals, "shut down");
    Ok(())
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = match signal(SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => return std::future::pending().await,
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}

pub async fn sim(args: SimArgs) -> Result<(), String> {
    let cfg = args.to_config();
    cfg.validate().map_err(|(f, why)| format!("--{}: {why}", f.replace('_', "-")))?;
    let (addr, _sim) = crate::sim::spawn(cfg, &args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    println!("goodput-sim listening addr={addr}");
    tracing::info!(%addr, "simulated backend serving (a test double, not a model)");
    shutdown_signal().await;
    Ok(())
}

pub async fn bench(args: BenchArgs) -> Result<(), String> {
    use crate::bench::{Plan, Report, SloSpec, Workload, plot};
    if !args.results.is_empty() {
        let out = args.plot.as_ref().ok_or("--results needs --plot FILE.png")?;
        let reports = args
            .results
            .iter()
            .map(|p| {
                let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
                serde_json::from_str::<Report>(&text)
                    .map_err(|e| format!("{}: not a goodput bench result: {e}", p.display()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let scored =
            reports.iter().all(|r| r.quality.as_ref().is_some_and(|q| q.perplexity_geomean.is_some()));
        if reports.len() > 1 && scored {
            plot::tput_vs_ppl(&reports, out)?
        } else {
            plot::latency_cdf(&reports, out)?
        }
        println!("plot written to {}", out.display());
        return Ok(());
    }
    let target = args.target.clone().ok_or("--target is required")?;
    let slo = SloSpec::parse(&args.goodput)?;
    if args.rate.is_some_and(|r| !(r.is_finite() && r > 0.0)) {
        return Err("--rate must be > 0".into());
    }
    if !(args.burstiness.is_finite() && args.burstiness > 0.0) {
        return Err("--burstiness must be > 0".into());
    }
    let work = match &args.dataset {
        Some(p) => Workload::sharegpt(p, args.output_len, args.seed)?,
        None => Workload::fixed(args.num_requests, args.input_len, args.output_len.unwrap_or(128), args.seed),
    };
    let mut headers = Vec::new();
    for h in &args.headers {
        let (k, v) = h.split_once(':').ok_or_else(|| format!("--header {h}: expected NAME:VALUE"))?;
        let k =
            http::HeaderName::from_bytes(k.trim().as_bytes()).map_err(|e| format!("--header {h}: {e}"))?;
        let v = http::HeaderValue::from_str(v.trim()).map_err(|e| format!("--header {h}: {e}"))?;
        headers.push((k, v));
    }
    let plan = Plan {
        target: target.clone(),
        chat: args.endpoint == "chat",
        model: args.model.clone(),
        stream: !args.no_stream,
        rate: args.rate,
        burstiness: args.burstiness,
        concurrency: args.concurrency.or(if args.rate.is_none() { Some(1) } else { None }),
        num_requests: args.num_requests,
        ignore_eos: args.ignore_eos,
        timeout: Duration::from_secs(args.timeout_secs.max(1)),
        seed: args.seed,
        progress: !args.quiet,
        keep_text: args.score_model.is_some(),
        headers,
    };
    // Load the scorer first: a missing model fails before any load is sent.
    let scorer = match &args.score_model {
        None => None,
        Some(dir) => {
            let (dir, ort) = (dir.clone(), args.onnxruntime.clone());
            Some(
                tokio::task::spawn_blocking(move || {
                    crate::bench::quality::BenchScorer::load(&dir, ort.as_deref())
                })
                .await
                .map_err(|e| e.to_string())??,
            )
        }
    };
    let (samples, wall) = crate::bench::run(&plan, &work).await?;
    let mut report = Report::build(&samples, wall, slo);
    report.label = args.label.clone().unwrap_or_else(|| target.clone());
    report.target = target.clone();
    report.model = args.model.clone();
    report.workload = work.source.clone();
    report.stream = plan.stream;
    report.rate = plan.rate;
    report.burstiness = plan.burstiness;
    report.concurrency = plan.concurrency;
    if let Some(s) = scorer {
        report.quality = Some(
            tokio::task::spawn_blocking(move || s.score(samples, plan.chat))
                .await
                .map_err(|e| e.to_string())?,
        );
    }
    print!("{}", report.table());
    if let Some(p) = &args.json {
        let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        std::fs::write(p, text).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    if let Some(p) = &args.plot {
        plot::latency_cdf(std::slice::from_ref(&report), p)?;
    }
    if report.completed == 0 {
        return Err(format!("no request succeeded: {}", report.errors.join("; ")));
    }
    Ok(())
}

pub fn check_config(file: &std::path::Path) -> Result<(), String> {
    match crate::config::Config::load(file) {
        Ok(c) => {
            for w in c.warnings() {
                eprintln!("{}: warning: {w}", file.display());
            }
            println!("{}: ok ({} backend(s))", file.display(), c.backends.len());
            Ok(())
        }
        Err(e) => Err(format!("{}: invalid\n{e}", file.display())),
    }
}
