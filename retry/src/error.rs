//! Errors of the retry layer and the failure trait the upstream client implements.

use std::time::Duration;

use http::StatusCode;

/// How an upstream attempt failed below HTTP, as far as the upstream client can tell.
///
/// The retry layer's safety ladder is decided on this: the first five kinds prove that no
/// byte of the request reached the backend, [`FailureKind::ResetAfterSent`] does not.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureKind {
    /// TCP connection refused: nothing was sent.
    ConnectRefused,
    /// TCP connect did not finish in time: nothing was sent.
    ConnectTimeout,
    /// Name resolution failed: nothing was sent. Retried at most once (2 attempts).
    Dns,
    /// The connection was reset before any byte of the request was written.
    ResetBeforeSent,
    /// The connection was reset after (part of) the request was written: ambiguous.
    ResetAfterSent,
    /// The TLS handshake did not finish in time: no request byte was sent.
    TlsHandshakeTimeout,
    /// The upstream's certificate was rejected. Never retried (seed 002 R-9: possible MITM).
    TlsCertificate,
    /// Anything else (a local error of the client, a protocol error…). Never retried.
    Other,
}

/// Implemented by the upstream client's error type so the retry layer can classify it
/// without knowing the client.
pub trait UpstreamFailure: std::error::Error + Send + Sync + 'static {
    /// What kind of failure this was.
    fn kind(&self) -> FailureKind;
    /// Index of the endpoint the attempt went to, when one was chosen.
    fn endpoint(&self) -> Option<usize>;
}

/// Why a request through the retry layer produced no upstream response.
///
/// The gateway maps it to `application/problem+json` in one place with [`status`],
/// [`retry_after`], [`problem_type`] and [`title`]; the idempotency layer asks
/// [`is_provably_unprocessed`] to decide whether to release the key.
///
/// [`status`]: RetryError::status
/// [`retry_after`]: RetryError::retry_after
/// [`problem_type`]: RetryError::problem_type
/// [`title`]: RetryError::title
/// [`is_provably_unprocessed`]: RetryError::is_provably_unprocessed
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum RetryError<E> {
    /// The last attempt failed below HTTP; carries the upstream client's error.
    #[error("upstream attempt failed")]
    Upstream(#[source] E),
    /// The per-attempt timeout (`min(attempt_timeout, remaining deadline)`) fired before
    /// response headers arrived. Ambiguous: the backend may have processed the request.
    #[error("no upstream response headers within {after:?}")]
    AttemptTimeout {
        /// The effective timeout of the last attempt.
        after: Duration,
    },
    /// The deadline had passed before any attempt was made (nothing was sent).
    #[error("request deadline passed before an upstream attempt was made")]
    DeadlineExceeded,
    /// The upstream's circuit breaker is open (or its half-open probes are all in use).
    #[error("circuit breaker open for the upstream; retry after {retry_after:?}")]
    BreakerOpen {
        /// Time until the breaker admits its next probe.
        retry_after: Duration,
    },
    /// Reading the client's request body for replay failed; nothing was sent upstream.
    #[error("reading the request body failed")]
    RequestBody(#[source] axum::Error),
}

/// Stable `type` URIs of the problems the gateway builds from a [`RetryError`].
pub mod problem {
    /// An upstream attempt failed below HTTP (502).
    pub const UPSTREAM_FAILED: &str = "https://portcullis.dev/problems/upstream-failed";
    /// Upstream timed out, or the request deadline passed (504).
    pub const UPSTREAM_TIMEOUT: &str = "https://portcullis.dev/problems/upstream-timeout";
    /// The upstream's circuit breaker is open (503).
    pub const CIRCUIT_OPEN: &str = "https://portcullis.dev/problems/circuit-open";
    /// The request body could not be read (400).
    pub const BAD_REQUEST_BODY: &str = "https://portcullis.dev/problems/bad-request-body";
    /// The request body exceeded the gateway's limit (413).
    pub const BODY_TOO_LARGE: &str = "https://portcullis.dev/problems/body-too-large";
}

// === impl RetryError ===

impl<E: UpstreamFailure> RetryError<E> {
    /// HTTP status for the client: 502 for upstream failures, 504 for timeouts and the
    /// deadline, 503 for an open breaker, 413/400 for an unreadable request body.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::Upstream(e) => match e.kind() {
                FailureKind::ConnectTimeout | FailureKind::TlsHandshakeTimeout => {
                    StatusCode::GATEWAY_TIMEOUT
                }
                _ => StatusCode::BAD_GATEWAY,
            },
            Self::AttemptTimeout { .. } | Self::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Self::BreakerOpen { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::RequestBody(e) if is_length_limit(e) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::RequestBody(_) => StatusCode::BAD_REQUEST,
        }
    }

    /// How long the client should wait before trying again, when the layer knows it.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::BreakerOpen { retry_after } => Some(*retry_after),
            _ => None,
        }
    }

    /// True when no byte of the request can have reached the backend, so an idempotency
    /// key may be released: connect refused/timeout, DNS, reset before sending, TLS
    /// handshake timeout, an open breaker, a deadline that passed before any attempt, an
    /// unreadable request body.
    ///
    /// Only the last attempt is inspected. That is sound because of the safety ladder:
    /// a request whose earlier attempt may have been processed was only retried if it is
    /// idempotent or its upstream dedupes on the key, where releasing the key is harmless.
    pub fn is_provably_unprocessed(&self) -> bool {
        match self {
            // A rejected certificate ends the handshake before any request byte: never
            // retried (it may be an attack), but the idempotency key can be released.
            Self::Upstream(e) => {
                super::classify::is_provably_unprocessed(e.kind())
                    || matches!(e.kind(), FailureKind::TlsCertificate)
            }
            Self::AttemptTimeout { .. } => false,
            Self::DeadlineExceeded | Self::BreakerOpen { .. } | Self::RequestBody(_) => true,
        }
    }

    /// Stable problem `type` URI (see [`problem`]).
    pub fn problem_type(&self) -> &'static str {
        match self {
            Self::Upstream(e) => match e.kind() {
                FailureKind::ConnectTimeout | FailureKind::TlsHandshakeTimeout => {
                    problem::UPSTREAM_TIMEOUT
                }
                _ => problem::UPSTREAM_FAILED,
            },
            Self::AttemptTimeout { .. } | Self::DeadlineExceeded => problem::UPSTREAM_TIMEOUT,
            Self::BreakerOpen { .. } => problem::CIRCUIT_OPEN,
            Self::RequestBody(e) if is_length_limit(e) => problem::BODY_TOO_LARGE,
            Self::RequestBody(_) => problem::BAD_REQUEST_BODY,
        }
    }

    /// Short human-readable problem title.
    pub fn title(&self) -> &'static str {
        match self {
            Self::Upstream(e) => match e.kind() {
                FailureKind::ConnectTimeout | FailureKind::TlsHandshakeTimeout => {
                    "Upstream connection timed out"
                }
                _ => "Upstream request failed",
            },
            Self::AttemptTimeout { .. } => "Upstream response timed out",
            Self::DeadlineExceeded => "Request deadline exceeded",
            Self::BreakerOpen { .. } => "Upstream temporarily unavailable",
            Self::RequestBody(e) if is_length_limit(e) => "Request body too large",
            Self::RequestBody(_) => "Request body could not be read",
        }
    }
}

/// Whether a body error was caused by `http_body_util::Limited` (the gateway's body limit).
fn is_length_limit(e: &axum::Error) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if err.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        cur = err.source();
    }
    false
}
