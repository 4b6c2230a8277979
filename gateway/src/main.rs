//! The `portcullis` binary: parse the command line, load and validate the configuration,
//! set up logging and the runtime, run. `anyhow` lives only here.

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use portcullis_control::cli as admin_cli;
use portcullis_gateway::config::{self, Config, LogFormat, ProcessEnv};
use portcullis_gateway::edge::listener::handover;
use portcullis_gateway::telemetry::fields::PlainFields;

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
    /// Without FILE: the `--config` file, else the embedded default (what `portcullis`
    /// alone would run).
    CheckConfig {
        /// The file to check.
        file: Option<PathBuf>,
    },
    /// Hand a running gateway's listening sockets to a new process started from the same
    /// executable path and arguments (a binary upgrade or a restart that drops no
    /// connection): sends it SIGUSR2 and waits for the outcome. Prints the successor's PID;
    /// exits 1, saying why, if the hand-over failed (the old process then still serves).
    Upgrade {
        /// The running gateway's process id.
        #[arg(long)]
        pid: u32,
        /// How long to wait for the successor to be serving.
        #[arg(long, default_value = "75s", value_parser = humantime::parse_duration)]
        timeout: std::time::Duration,
    },
    /// Administer tenants, keys and quotas through a running gateway's admin API (token from
    /// PORTCULLIS_ADMIN_TOKEN).
    // Boxed: its many optional flags make it much larger than the other variant.
    Admin(Box<admin_cli::AdminArgs>),
}

fn main() -> std::process::ExitCode {
    // Before anything can change the working directory: what a successor is started as.
    handover::Invocation::remember();
    let cli = Cli::parse();
    if let Some(Command::Upgrade { pid, timeout }) = cli.command {
        return upgrade(pid, timeout);
    }
    match real_main(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            let report = report(&err);
            // A successor started by a running gateway tells it why (it keeps serving).
            handover::report_failure(&report);
            eprintln!("portcullis: {report}");
            std::process::ExitCode::from(2)
        }
    }
}

/// `portcullis upgrade`: 0 and the successor's PID on stdout once it serves; 1 and the
/// reason when the hand-over failed; 2 when the command itself could not run.
fn upgrade(pid: u32, timeout: std::time::Duration) -> std::process::ExitCode {
    match handover::status::upgrade(pid, timeout) {
        Ok(handover::status::Outcome::Ready(successor)) => {
            println!("{successor}");
            eprintln!("portcullis: hand-over complete: pid {successor} serves; pid {pid} drains and exits");
            std::process::ExitCode::SUCCESS
        }
        Ok(handover::status::Outcome::Failed(reason)) => {
            eprintln!("portcullis: hand-over failed, pid {pid} still serves: {reason}");
            std::process::ExitCode::from(1)
        }
        Err(err) => {
            eprintln!("portcullis: upgrade --pid {pid}: {err}");
            std::process::ExitCode::from(2)
        }
    }
}

/// The error and its causes on one line, each cause once: many errors repeat their source in
/// their own message (sqlx, the OS), and `{:#}` would print it again for every level.
fn report(err: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

fn real_main(cli: Cli) -> anyhow::Result<()> {
    if let Some(Command::Admin(args)) = cli.command {
        admin_cli::run(*args)?;
        return Ok(());
    }
    if let Some(Command::Upgrade { .. }) = cli.command {
        return Ok(()); // handled in `main`
    }
    if let Some(Command::CheckConfig { file }) = &cli.command {
        let (text, name) = match file.as_ref().or(cli.config.as_ref()) {
            Some(file) => (
                std::fs::read_to_string(file)
                    .with_context(|| format!("cannot read {}", file.display()))?,
                file.display().to_string(),
            ),
            None => (
                EMBEDDED_CONFIG.to_owned(),
                "the embedded default (config/portcullis.example.toml)".to_owned(),
            ),
        };
        let parsed = Config::parse(&text, &ProcessEnv)?;
        for renamed in &parsed.renamed {
            eprintln!("warning: {renamed}");
        }
        print!("{}", config::effective_toml(&text)?);
        eprintln!("configuration OK: {name}");
        return Ok(());
    }
    let mut config = match &cli.config {
        Some(path) => Config::load(path, &ProcessEnv)?,
        None => Config::parse(EMBEDDED_CONFIG, &ProcessEnv)?,
    };
    let log_format = match cli.log_format.as_deref() {
        Some("json") => Some(LogFormat::Json),
        Some(_) => Some(LogFormat::Human),
        None => None,
    };
    if let Some(format) = log_format {
        config.server.log_format = format;
    }
    // Read again on reload (SIGHUP, the admin endpoint, `server.watch_config`).
    let source = cli.config.as_ref().map(|path| {
        let source = portcullis_gateway::ConfigSource::file(path);
        match log_format {
            Some(format) => source.with_log_format(format),
            None => source,
        }
    });
    // The banner is printed by `run` once both listeners are bound, in this format.
    init_tracing(config.server.log_format);
    // A current-thread runtime: requests, upstream connections and timers share one event
    // loop without cross-thread wake-ups (like one nginx worker). With more workers, the
    // proxy listener starts one such runtime per extra worker (`edge::listener::accept`).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(portcullis_gateway::run_with(
        config,
        source,
        shutdown_signal(),
    ))?;
    Ok(())
}

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Every log line, the banner and start-up errors on stderr, as nginx's error log and
    // Envoy do in containers; stdout carries only command output (check-config, admin).
    // Colour only for a person at a terminal: escape codes in a file, a pipe or a
    // container's log would garble every field.
    let ansi = std::io::stderr().is_terminal();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    match format {
        LogFormat::Json => builder.json().init(),
        // The same text as the default field formatter, at a fraction of its cost (the
        // access log writes 18 fields per request).
        LogFormat::Human if !ansi => {
            builder.fmt_fields(PlainFields).init();
            // The access line's own writer produces the same text for ~1/10 of the cost.
            portcullis_gateway::telemetry::write_access_lines_directly();
        }
        LogFormat::Human => builder.init(),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn report_prints_each_cause_once() {
        let io = std::io::Error::new(std::io::ErrorKind::AddrInUse, "Address already in use");
        let err = anyhow::Error::new(Outer(io)).context("server.listen = 127.0.0.1:1");
        assert_eq!(
            report(&err),
            "server.listen = 127.0.0.1:1: outer: Address already in use"
        );
        // A cause already quoted by the level above is not repeated.
        let err = anyhow::anyhow!("database error: unable to open database file")
            .context("storage.database");
        let repeated = err.context("storage.database");
        assert_eq!(
            report(&repeated),
            "storage.database: database error: unable to open database file"
        );
    }
}
