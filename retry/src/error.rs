//! Errors of the retry layer and the failure trait the upstream client implements.

use std::time::Duration;

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
    /// The upstream's certificate was rejected. Never retried (docs/retry-policy.md: a possible interception).
    TlsCertificate,
    /// Anything else (a local error of the client, a protocol error…). Never retried.
    Other,
}

impl FailureKind {
    /// Does this failure prove the request never reached the backend?
    pub(crate) fn proves_unprocessed(self) -> bool {
        matches!(
            self,
            FailureKind::ConnectRefused
                | FailureKind::ConnectTimeout
                | FailureKind::Dns
                | FailureKind::ResetBeforeSent
                | FailureKind::TlsHandshakeTimeout
        )
    }
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
/// The gateway turns it into `application/problem+json` in one place (its rescue layer),
/// from the variant and, for [`RetryError::Upstream`], from the upstream client's own error;
/// this crate does not guess statuses for failures it cannot see. The idempotency layer asks
/// [`is_provably_unprocessed`](RetryError::is_provably_unprocessed) whether to release the
/// key.
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
    /// The upstream's adaptive throttle refused the request: it is over the rate the
    /// upstream was learned to accept, so it was not sent.
    #[error("upstream over its learned rate of {rate:.1} requests/s; retry after {retry_after:?}")]
    Throttled {
        /// Time until the throttle admits its next request.
        retry_after: Duration,
        /// The rate enforced, in requests per second.
        rate: f64,
    },
    /// Reading the client's request body for replay failed; nothing was sent upstream.
    #[error("reading the request body failed")]
    RequestBody(#[source] axum::Error),
}

// === impl RetryError ===

impl<E: UpstreamFailure> RetryError<E> {
    /// True when no byte of the request can have reached the backend, so an idempotency
    /// key may be released: connect refused/timeout, DNS, reset before sending, TLS
    /// handshake timeout, an open breaker, the adaptive throttle, a deadline that passed before any attempt, an
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
                e.kind().proves_unprocessed() || matches!(e.kind(), FailureKind::TlsCertificate)
            }
            Self::AttemptTimeout { .. } => false,
            Self::DeadlineExceeded
            | Self::BreakerOpen { .. }
            | Self::Throttled { .. }
            | Self::RequestBody(_) => true,
        }
    }
}
