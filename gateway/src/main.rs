//! The `portcullis` binary: parse the command line, load and validate the configuration,
//! set up logging and the runtime, run. `anyhow` lives only here.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use portcullis_control::cli as admin_cli;
use portcullis_gateway::config::{self, Config, LogFormat, ProcessEnv};

/// A faster allocator than glibc's for a proxy's many short-lived buffers: measured at about
/// +14 % pass-through throughput (BENCHMARKS.md, malloc was 19 % of the profile).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The embedded default: memory state, SQLite file, demo upstream.
const EMBEDDED_CONFIG: &str = include_str!("../../config/portcullis.example.toml");

/// Portcullis edge API gateway.
#[derive(Debug, Parser)]
#[command(name = "portcullis", version, about)]
struct Cli {
    /// Configuration file (TOML). Without it, the embedded default runs: memory state, a
    /// SQLite file in the working directory, and the demo upstream.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Log format, overriding `server.log_format`.
    #[arg(long, value_parser = ["human", "json"])]
    log_format: Option<String>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Validate a configuration file and print the effective configuration (secrets redacted).
    CheckConfig {
        /// The file to check.
        file: PathBuf,
    },
    /// Administer tenants, keys and quotas through a running gateway's admin API (token from
    /// PORTCULLIS_ADMIN_TOKEN).
    Admin(admin_cli::AdminArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match real_main(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("portcullis: {err:#}");
            std::process::ExitCode::from(2)
        }
    }
}

fn real_main(cli: Cli) -> anyhow::Result<()> {
    if let Some(Command::Admin(args)) = cli.command {
        admin_cli::run(args)?;
        return Ok(());
    }
    if let Some(Command::CheckConfig { file }) = &cli.command {
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("cannot read {}", file.display()))?;
        Config::parse(&text, &ProcessEnv)?;
        print!("{}", config::effective_toml(&text)?);
        eprintln!("configuration OK: {}", file.display());
        return Ok(());
    }
    let (config, embedded) = match &cli.config {
        Some(path) => (Config::load(path, &ProcessEnv)?, false),
        None => (Config::parse(EMBEDDED_CONFIG, &ProcessEnv)?, true),
    };
    let format = match cli.log_format.as_deref() {
        Some("json") => LogFormat::Json,
        Some(_) => LogFormat::Human,
        None => config.server.log_format,
    };
    init_tracing(format);
    if embedded || config.demo.enabled {
        print_welcome(&config);
    }
    // One worker thread: a current-thread runtime, so requests, upstream connections and
    // timers share one event loop without cross-thread wake-ups (like one nginx worker).
    let mut runtime = if config.server.worker_threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        if config.server.worker_threads > 0 {
            builder.worker_threads(config.server.worker_threads);
        }
        builder
    };
    runtime.enable_all();
    let runtime = runtime.build().context("cannot start the async runtime")?;
    runtime.block_on(portcullis_gateway::run(config, shutdown_signal()))?;
    Ok(())
}

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Human => builder.init(),
    }
}

fn print_welcome(config: &Config) {
    let base = format!("http://{}", config.server.listen);
    let key = config
        .tenants
        .first()
        .and_then(|t| t.api_keys.first())
        .map(|k| k.expose().to_owned());
    let auth = key
        .map(|k| format!(" -H 'Authorization: Bearer {k}'"))
        .unwrap_or_default();
    eprintln!(
        "\nPortcullis is starting on {base} (admin and /metrics on http://{}).",
        config.server.admin_listen
    );
    if config.demo.enabled {
        eprintln!("Try the demo upstream through the gateway:");
        eprintln!("  curl -i {base}/demo/orders{auth}");
        eprintln!("  curl -i -X POST {base}/demo/orders{auth} -H 'Idempotency-Key: order-1' -H 'content-type: application/json' -d '{{\"item\":\"book\"}}'");
        eprintln!("  curl -s {base}/demo/stats{auth}");
        eprintln!(
            "  curl -s http://{}/metrics | head",
            config.server.admin_listen
        );
    }
    eprintln!();
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
}
