//! Portcullis test kit: the harness every end-to-end and conformance test stands on.
//!
//! What it guarantees:
//! - **Loopback only.** Every server it starts binds `127.0.0.1` on a port the kernel picked
//!   (`bind :0`); nothing here ever targets another address.
//! - **Bounded waits.** Readiness checks retry a fixed number of times with a short sleep and
//!   then fail loudly; no loop here is unbounded.
//! - **Kill by PID.** Every child process sits in a [`ChildGuard`], which kills and reaps it
//!   on drop, so a panicking test does not leak servers.
//! - **Real servers.** Redis and PostgreSQL are the real binaries: either the shared ones
//!   started by `scripts/test.sh` (URLs in `PORTCULLIS_TEST_REDIS_URL` and
//!   `PORTCULLIS_TEST_DATABASE_URL`) or a private child for tests that must kill one.
//!
//! ```no_run
//! # async fn demo() {
//! use portcullis_testkit::{upstream::{ScriptedUpstream, Step}, gateway::GatewayProcess};
//! let upstream = ScriptedUpstream::start(vec![Step::status(503), Step::ok("done")]).await;
//! let config = format!("[[upstreams]]\nname = \"u\"\nendpoints = [\"{}\"]\n", upstream.url());
//! // In a test target of the gateway package: env!("CARGO_BIN_EXE_portcullis").
//! let gateway = GatewayProcess::start("target/debug/portcullis", &config).await;
//! # }
//! ```

// A test harness fails loudly: panicking with a message is how it reports a broken setup.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod gateway;
pub mod grpc;
pub mod h2frames;
pub mod jwt;
pub mod otlp;
pub mod ports;
pub mod postgres;
pub mod process;
pub mod redis;
pub mod redis_cluster;
pub mod tls;
pub mod upstream;

pub use process::ChildGuard;

/// Installs a tracing subscriber for the current test, writing to the test's captured output.
///
/// Returns a guard; keep it alive for the duration of the test (`let _trace = trace_init();`).
pub fn trace_init() -> tracing::subscriber::DefaultGuard {
    let subscriber = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .finish();
    tracing::subscriber::set_default(subscriber)
}
