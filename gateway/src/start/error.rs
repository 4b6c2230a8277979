//! Why the gateway could not start: every start-up failure, naming what failed.

use std::net::SocketAddr;

use portcullis_control::DbError;

use crate::{pipeline, telemetry};

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The configuration database failed.
    #[error(transparent)]
    Database(#[from] DbError),
    /// The configuration database could not be opened: names the field and its value
    /// (password redacted); the source says which file and why.
    #[error("storage.database = \"{url}\"")]
    OpenDatabase {
        /// `storage.database` as configured, password redacted.
        url: String,
        /// Why it could not be opened.
        source: DbError,
    },
    /// A listener could not bind. The message starts with the field, as configuration
    /// errors do, and keeps "cannot listen" (the test kit retries on it).
    #[error("{what} = {addr}: cannot listen")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Which listener.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// The sockets of the running gateway could not be taken over.
    #[error("hand-over: {0}")]
    Handover(#[from] crate::edge::listener::handover::HandoverError),
    /// The queue of asynchronous routes could not be opened.
    #[error("storage.queue = \"{url}\": {source}")]
    Queue {
        /// `storage.queue` (or its default), password redacted.
        url: String,
        /// Why it could not be opened.
        source: portcullis_queue::QueueError,
    },
    /// The idempotency store could not be built.
    #[error(transparent)]
    Idempotency(#[from] pipeline::idempotency::IdempotencyStoreError),
    /// The rate limiter could not be built.
    #[error("storage.state: {0}")]
    RateLimit(#[from] portcullis_ratelimit::LimiterError),
    /// A Redis URL could not be used.
    #[error("storage: invalid Redis URL: {0}")]
    Redis(#[from] redis::RedisError),
    /// The OTLP trace exporter could not be built.
    #[error(transparent)]
    Telemetry(#[from] telemetry::export::ExportSetupError),
    /// A listener's TLS configuration could not be built.
    #[error("{what}: {source}")]
    Tls {
        /// Which listener's TLS table.
        what: &'static str,
        /// rustls' reason.
        source: rustls::Error,
    },
}
