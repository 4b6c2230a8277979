//! Portcullis: an edge API gateway that rate-limits per tenant, deduplicates keyed POST/PATCH
//! requests, and owns the single retry layer toward backends.
//!
//! This crate is the binary and the data plane. It assembles the concern crates
//! (`portcullis-ratelimit`, `portcullis-idempotency`, `portcullis-retry`) and its own layers
//! into one pipeline (`stack`, one commented line per layer), and runs the listeners
//! ([`run`]). Its tree is the request's path:
//!
//! - [`config`]: the TOML file, parsed once, validated fully, then frozen;
//! - [`edge`]: listeners, the framing guard, and the first layers (health, hop-by-hop
//!   fields, request id, size limits, request target);
//! - `pipeline`: observe, the request context (route and caller, resolved once and read by
//!   every later layer), shed, rate limit, idempotency, rescue;
//! - `upstream`: the pooled client that sends one attempt, forwarded headers, the demo
//!   upstream;
//! - [`tls`]: certificates and keys for both legs.
//!
//! The control plane (database, tenant directory and its reload, quotas, admin API and CLI)
//! is `portcullis-control`: this crate only reads its tenant snapshot on the request path.
//! Every layer answers in the one problem+json type of `portcullis-problem`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use portcullis_gateway::config::{Config, ProcessEnv};
//! let config = Config::load("config/portcullis.example.toml".as_ref(), &ProcessEnv)?;
//! portcullis_gateway::run(config, async { let _ = tokio::signal::ctrl_c().await; }).await?;
//! # Ok(()) }
//! ```

mod banner;
pub mod config;
pub mod edge;
pub(crate) mod pipeline;
pub mod plumbing;
pub(crate) mod stack;
/// The route table, for `benches/router.rs`.
pub use pipeline::router;
pub mod telemetry;
#[doc(hidden)]
pub use stack::bench::pipeline as bench_pipeline;
#[doc(hidden)]
pub use upstream::balance::bench::BenchSet as BenchBalance;
mod start;
pub mod tls;
pub(crate) mod upstream;

pub use start::{run, StartError};
