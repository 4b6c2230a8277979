//! Portcullis: an edge API gateway that rate-limits per tenant, deduplicates keyed POST/PATCH
//! requests, and owns the single retry layer toward backends.
//!
//! This crate is the binary and the data plane. It assembles the concern crates
//! (`portcullis-ratelimit`, `portcullis-idempotency`, `portcullis-retry`) and its own layers
//! into one pipeline and runs the listeners ([`run`]). The request path, layer by layer, is
//! described in one place: `stack/mod.rs`. The folders:
//!
//! - [`config`]: the TOML file, parsed and validated fully, then frozen (a reload builds a
//!   new pipeline from a new one: `start::reload`);
//! - [`plumbing`]: what the layers share (step scaffold, held bodies, client address,
//!   request context, header names);
//! - [`telemetry`]: metrics, access log, traces;
//! - [`edge`]: listeners, the framing guard and the connection-level layers;
//! - `upstream`: the pooled client that sends one attempt, balancing, the demo upstream;
//! - `pipeline`: resolution (route, tenant), protection (shedding, concurrency, buffering,
//!   rate-limit and idempotency wiring), rescue;
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

pub use start::{run, run_with, ConfigSource, StartError};
