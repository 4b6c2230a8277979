//! Classification of one attempt's outcome and the safety ladder, as pure functions.
//!
//! Two questions are kept apart: *is this failure transient?* (status 408/429/500/502/503/504
//! and the transport failures of docs/retry-policy.md) and *is repeating this request safe?* (the
//! ladder below). A retry needs both.

use http::{Method, StatusCode};

use super::error::FailureKind;
use portcullis_problem::grpc::GrpcCode;

/// At most this many attempts may end in a DNS failure (docs/retry-policy.md).
pub(crate) const DNS_MAX_ATTEMPTS: u32 = 2;

/// What one upstream attempt produced, reduced to what classification needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AttemptOutcome {
    /// Response headers arrived with this status.
    Status(StatusCode),
    /// A gRPC call ended with this status (HTTP 200 with `grpc-status`, in a Trailers-Only
    /// response or in trailers that came before any message).
    Grpc(GrpcCode),
    /// The upstream client failed below HTTP.
    Failure(FailureKind),
    /// The per-attempt timeout fired before response headers arrived.
    Timeout,
}

/// How an outcome relates to the request having been processed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FailureClass {
    /// Not a transient failure: success, redirect, other 4xx, 501…, TLS certificate, other.
    Final,
    /// Provably no byte reached the backend (connect refused/timeout, DNS, reset before
    /// sending, TLS handshake timeout).
    Unprocessed,
    /// The backend answered that it did not (or will not now) process it: 408, 429, 503.
    Declined,
    /// The backend may have acted: 500, 502, 504, reset after sending, attempt timeout.
    Ambiguous,
}

/// The rung of the safety ladder that allows a retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rung {
    /// 1: provably unprocessed, any method.
    Unprocessed,
    /// 2: idempotent method (GET, HEAD, OPTIONS, PUT, DELETE) or route declared idempotent.
    Idempotent,
    /// 3: a request holding the gateway's idempotency lock (the same key on every attempt).
    Protected,
}

/// What the ladder needs to know about the request and its upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RequestSafety {
    /// Idempotent by method or by route declaration.
    pub idempotent: bool,
    /// Holds the idempotency lock (the key is forwarded on every attempt).
    pub protected: bool,
    /// The upstream dedupes on the forwarded `Idempotency-Key`.
    pub dedupes: bool,
}

/// How an attempt counts for the circuit breaker: upstream *health*, not request success.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BreakerOutcome {
    /// The upstream answered deliberately (2xx–4xx except 408/429, 5xx other than
    /// 500/502/503/504).
    Success,
    /// A gateway failure (Envoy's `consecutive_gateway_failure`): 502, 503, 504, a
    /// transport failure (connect, DNS, TLS, reset) or an attempt timeout.
    Failure,
    /// Says nothing about the upstream's health: 429 (it is alive and throttling), 500 (an
    /// application error one path or one body can provoke), 408 (the client was too slow)
    /// and [`FailureKind::Other`] (usually a local error of the client).
    Neutral,
}

/// Failures that prove the request never reached the backend.
pub(crate) fn is_provably_unprocessed(kind: FailureKind) -> bool {
    kind.proves_unprocessed()
}

/// Methods that are idempotent by definition (docs/retry-policy.md).
pub(crate) fn is_idempotent_method(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::PUT | Method::DELETE
    )
}

/// The class of an outcome.
pub(crate) fn failure_class(outcome: AttemptOutcome) -> FailureClass {
    match outcome {
        AttemptOutcome::Status(s) => match s.as_u16() {
            408 | 429 | 503 => FailureClass::Declined,
            500 | 502 | 504 => FailureClass::Ambiguous,
            _ => FailureClass::Final,
        },
        // The gRPC analogues of 503/429 and of 504, as docs/retry-policy.md lists them; ABORTED
        // (a concurrency conflict) may have acted, as a 500 may.
        AttemptOutcome::Grpc(code) => match code {
            GrpcCode::Unavailable | GrpcCode::ResourceExhausted => FailureClass::Declined,
            GrpcCode::DeadlineExceeded | GrpcCode::Aborted => FailureClass::Ambiguous,
            _ => FailureClass::Final,
        },
        AttemptOutcome::Failure(k) if is_provably_unprocessed(k) => FailureClass::Unprocessed,
        AttemptOutcome::Failure(FailureKind::ResetAfterSent) => FailureClass::Ambiguous,
        AttemptOutcome::Failure(_) => FailureClass::Final,
        AttemptOutcome::Timeout => FailureClass::Ambiguous,
    }
}

/// The safety ladder: `Some(rung)` if the outcome may be retried for this request.
///
/// 1. provably unprocessed → any method;
/// 2. idempotent method or route → every transient failure;
/// 3. holding the idempotency lock → 408/429/503 always, 500/502/504/reset-after-sent/
///    timeouts only when the upstream dedupes on the key;
/// 4. anything else → never once a byte may have reached the backend.
pub(crate) fn retry_rung(outcome: AttemptOutcome, safety: RequestSafety) -> Option<Rung> {
    match failure_class(outcome) {
        FailureClass::Final => None,
        FailureClass::Unprocessed => Some(Rung::Unprocessed),
        _ if safety.idempotent => Some(Rung::Idempotent),
        FailureClass::Declined if safety.protected => Some(Rung::Protected),
        FailureClass::Ambiguous if safety.protected && safety.dedupes => Some(Rung::Protected),
        _ => None,
    }
}

/// How an outcome counts for the circuit breaker (see [`BreakerOutcome`]).
pub(crate) fn breaker_outcome(outcome: AttemptOutcome) -> BreakerOutcome {
    match outcome {
        AttemptOutcome::Status(s) => match s.as_u16() {
            408 | 429 | 500 => BreakerOutcome::Neutral,
            502..=504 => BreakerOutcome::Failure,
            _ => BreakerOutcome::Success,
        },
        AttemptOutcome::Grpc(code) => match code {
            GrpcCode::Unavailable | GrpcCode::DeadlineExceeded => BreakerOutcome::Failure,
            GrpcCode::ResourceExhausted
            | GrpcCode::Internal
            | GrpcCode::Aborted
            | GrpcCode::Other => BreakerOutcome::Neutral,
            _ => BreakerOutcome::Success,
        },
        AttemptOutcome::Failure(FailureKind::Other) => BreakerOutcome::Neutral,
        AttemptOutcome::Failure(_) | AttemptOutcome::Timeout => BreakerOutcome::Failure,
    }
}

/// Short label for logs and metrics (`status_503`, `connect_refused`, `attempt_timeout`…).
pub(crate) fn error_type(outcome: AttemptOutcome) -> std::borrow::Cow<'static, str> {
    use std::borrow::Cow;
    match outcome {
        AttemptOutcome::Status(s) => Cow::Owned(format!("status_{}", s.as_u16())),
        AttemptOutcome::Grpc(code) => Cow::Borrowed(code.label()),
        AttemptOutcome::Timeout => Cow::Borrowed("attempt_timeout"),
        AttemptOutcome::Failure(k) => Cow::Borrowed(match k {
            FailureKind::ConnectRefused => "connect_refused",
            FailureKind::ConnectTimeout => "connect_timeout",
            FailureKind::Dns => "dns",
            FailureKind::ResetBeforeSent => "reset_before_sent",
            FailureKind::ResetAfterSent => "reset_after_sent",
            FailureKind::TlsHandshakeTimeout => "tls_handshake_timeout",
            FailureKind::TlsCertificate => "tls_certificate",
            FailureKind::Other => "other",
        }),
    }
}

// === impl RequestSafety ===

impl RequestSafety {
    /// Safety facts of a request. `protected` is whether it holds the idempotency lock.
    pub(crate) fn new(
        method: &Method,
        idempotent_route: bool,
        protected: bool,
        dedupes: bool,
    ) -> Self {
        Self {
            idempotent: idempotent_route || is_idempotent_method(method),
            protected,
            dedupes,
        }
    }
}

#[cfg(test)]
mod tests;
