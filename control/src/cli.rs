//! `portcullis admin …`: the common admin actions from a shell, through the admin API over
//! HTTP (so the CLI works against any replica and every change is validated and audited the
//! same way), with readable tables.
//!
//! ```text
//! export PORTCULLIS_ADMIN_TOKEN=…
//! portcullis admin tenant add acme --rate 100 --per 1s --burst 200 --daily 100000
//! portcullis admin tenant list
//! portcullis admin key issue acme
//! portcullis admin key revoke acme 7
//! portcullis admin quota set acme --burst 50 --daily none
//! portcullis admin quota set acme --route /orders --rate 5 --burst 5
//! portcullis admin usage acme
//! portcullis admin upstreams
//! portcullis admin deliveries list --state dead --queue payments-webhook
//! portcullis admin deliveries replay-all --queue payments-webhook
//! ```

mod client;
mod commands;
mod output;

use crate::ENV_ADMIN_TOKEN;

/// Default admin API address (the default `server.admin_listen`).
pub const DEFAULT_URL: &str = "http://127.0.0.1:8081";

/// `portcullis admin` arguments.
#[derive(Debug, clap::Args)]
pub struct AdminArgs {
    /// Base URL of the admin listener.
    #[arg(long, default_value = DEFAULT_URL)]
    pub url: String,
    /// Name recorded in the audit log next to `admin-token` (X-Admin-Actor).
    #[arg(long)]
    pub actor: Option<String>,
    /// What to do.
    #[command(subcommand)]
    pub command: AdminCommand,
}

/// Admin actions.
#[derive(Debug, clap::Subcommand)]
pub enum AdminCommand {
    /// Tenants.
    #[command(subcommand)]
    Tenant(TenantCommand),
    /// API keys.
    #[command(subcommand)]
    Key(KeyCommand),
    /// Quotas.
    #[command(subcommand)]
    Quota(QuotaCommand),
    /// A tenant's current usage (buckets, periods, 429s), read without consuming.
    Usage {
        /// Tenant id.
        tenant: String,
    },
    /// Upstreams and their endpoints' health (state, ejections, in-flight, breaker).
    Upstreams,
    /// Messages of asynchronous routes: the dead-letter workflow.
    #[command(subcommand)]
    Deliveries(DeliveriesCommand),
}

/// `portcullis admin deliveries …`.
#[derive(Debug, clap::Subcommand)]
pub enum DeliveriesCommand {
    /// List messages (one page, oldest first).
    List {
        /// pending, delivered or dead.
        #[arg(long)]
        state: Option<String>,
        /// Queue (the route's name).
        #[arg(long)]
        queue: Option<String>,
        /// Tenant id.
        #[arg(long)]
        tenant: Option<String>,
        /// Page size (1–1000).
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// One message: headers, payload, attempts, reason.
    Show {
        /// Delivery id.
        id: String,
    },
    /// Deliver a delivered or dead message again.
    Replay {
        /// Delivery id.
        id: String,
    },
    /// Replay every dead message of a queue or tenant (one page of up to --limit).
    ReplayAll {
        /// Queue (the route's name).
        #[arg(long)]
        queue: Option<String>,
        /// Tenant id.
        #[arg(long)]
        tenant: Option<String>,
        /// At most this many (1–1000).
        #[arg(long, default_value_t = 1000)]
        limit: usize,
    },
    /// Remove a message for good.
    Purge {
        /// Delivery id.
        id: String,
    },
}

/// `portcullis admin tenant …`.
#[derive(Debug, clap::Subcommand)]
pub enum TenantCommand {
    /// Create a tenant.
    Add {
        /// Tenant id (1–64 of [A-Za-z0-9._-]).
        id: String,
        /// Display name.
        #[arg(long)]
        name: Option<String>,
        /// Tokens per period.
        #[arg(long)]
        rate: u64,
        /// Bucket period, e.g. 1s.
        #[arg(long, default_value = "1s")]
        per: String,
        /// Bucket capacity.
        #[arg(long)]
        burst: u64,
        /// Requests per UTC day.
        #[arg(long)]
        daily: Option<u64>,
        /// Requests per UTC month.
        #[arg(long)]
        monthly: Option<u64>,
        /// Requests in flight at once (per replica); over it → 429.
        #[arg(long)]
        max_in_flight: Option<u64>,
        /// Open WebSocket tunnels at once (per replica); a handshake over it → 429.
        #[arg(long)]
        max_websockets: Option<u64>,
        /// WebSocket idle timeout, e.g. 5m (the stricter of the route's and this applies).
        #[arg(long)]
        websocket_idle_timeout: Option<String>,
        /// WebSocket maximum lifetime, e.g. 24h (the stricter of the route's and this applies).
        #[arg(long)]
        websocket_max_lifetime: Option<String>,
    },
    /// List all tenants.
    List,
}

/// `portcullis admin key …`.
#[derive(Debug, clap::Subcommand)]
pub enum KeyCommand {
    /// Issue a key; it is printed once and cannot be shown again.
    Issue {
        /// Tenant id.
        tenant: String,
    },
    /// List a tenant's keys (prefixes only).
    List {
        /// Tenant id.
        tenant: String,
    },
    /// Revoke a key (it stops working within a second).
    Revoke {
        /// Tenant id.
        tenant: String,
        /// Key id from `key list`.
        key_id: i64,
    },
}

/// `portcullis admin quota …`.
#[derive(Debug, clap::Subcommand)]
pub enum QuotaCommand {
    /// Change a tenant's limits; with --route, set that route's override instead.
    Set {
        /// Tenant id.
        tenant: String,
        /// Route prefix whose override to set (needs --rate and --burst).
        #[arg(long)]
        route: Option<String>,
        /// Tokens per period.
        #[arg(long)]
        rate: Option<u64>,
        /// Bucket period, e.g. 1s.
        #[arg(long)]
        per: Option<String>,
        /// Bucket capacity.
        #[arg(long)]
        burst: Option<u64>,
        /// Requests per UTC day, or "none".
        #[arg(long)]
        daily: Option<String>,
        /// Requests per UTC month, or "none".
        #[arg(long)]
        monthly: Option<String>,
        /// Requests in flight at once (per replica), or "none".
        #[arg(long)]
        max_in_flight: Option<String>,
        /// Open WebSocket tunnels at once (per replica), or "none".
        #[arg(long)]
        max_websockets: Option<String>,
        /// WebSocket idle timeout (e.g. 5m), or "none".
        #[arg(long)]
        websocket_idle_timeout: Option<String>,
        /// WebSocket maximum lifetime (e.g. 24h), or "none".
        #[arg(long)]
        websocket_max_lifetime: Option<String>,
    },
}

/// Why an admin command failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminCliError {
    /// No token in the environment.
    #[error("{ENV_ADMIN_TOKEN} is not set; export the admin token first")]
    NoToken,
    /// Bad command-line value.
    #[error("{0}")]
    Usage(String),
    /// The admin API could not be reached.
    #[error("cannot reach the admin API at {url}: {source}")]
    Http {
        /// Base URL.
        url: String,
        /// The transport error.
        source: reqwest::Error,
    },
    /// The admin API refused the request.
    #[error("{status}: {detail}")]
    Api {
        /// HTTP status.
        status: u16,
        /// The problem's detail and field errors.
        detail: String,
    },
    /// The async runtime could not start.
    #[error("cannot start the runtime: {0}")]
    Runtime(#[from] std::io::Error),
}

/// Runs one admin command, reading the token from the process environment.
pub fn run(args: AdminArgs) -> Result<(), AdminCliError> {
    let token = std::env::var(ENV_ADMIN_TOKEN)
        .ok()
        .filter(|t| !t.is_empty())
        .ok_or(AdminCliError::NoToken)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(commands::execute(args, token))
}
