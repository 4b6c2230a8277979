//! Typed markers exchanged with neighbouring layers through request/response extensions.

use crate::key::IdempotencyKey;

/// Inserted into the **request** extensions when the layer holds the key for this request
/// and forwards it.
///
/// The retry layer reads it: a POST/PATCH carrying this marker is protected, so it may be
/// retried on 408/429/503 and provably-unprocessed failures (and on 500/502/504 when the
/// upstream dedupes on the key), always with the same `Idempotency-Key` header, which the
/// layer leaves on the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyLock {
    /// The client's key (also still present as the `Idempotency-Key` header).
    pub key: IdempotencyKey,
    /// Fencing token of this holder (useful in logs to correlate takeovers).
    pub fencing: u64,
}

/// Set in the **response** extensions by an inner layer when the request provably never
/// reached the upstream: connect failure, open circuit breaker, or a response the gateway
/// generated itself (its own 429/503, load shedding). The layer then releases the key so the
/// client may retry with it, instead of storing that response as the key's outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NotForwarded;

/// Set in the **response** extensions by the layer: what it did with a keyed request, for
/// the access log and spans outside. A response without it carried no key (or its method
/// and route do not take one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum IdempotencyOutcome {
    /// The key's lock was taken and the request forwarded: the first copy.
    First,
    /// A stored response was replayed (`Idempotent-Replayed: true`).
    Replayed,
    /// 409: the first copy is still in flight.
    InFlight,
    /// 409: the key's response was too large to store, so it cannot be replayed.
    TooLarge,
    /// 422: the key was used with a different request.
    Mismatch,
    /// An expired lease was taken over; the interrupted request is answered as such.
    TakenOver,
    /// 400: the key is missing on a route that requires it, or malformed.
    InvalidKey,
    /// The body could not be read or exceeds what can be fingerprinted.
    BodyRejected,
    /// 503: the record store is unreachable; nothing was forwarded.
    Unavailable,
}

impl IdempotencyOutcome {
    /// A stable lower-case name for logs and span attributes.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::First => "first",
            Self::Replayed => "replayed",
            Self::InFlight => "conflict_in_flight",
            Self::TooLarge => "conflict_too_large",
            Self::Mismatch => "mismatch",
            Self::TakenOver => "taken_over",
            Self::InvalidKey => "invalid_key",
            Self::BodyRejected => "body_rejected",
            Self::Unavailable => "unavailable",
        }
    }

    /// Marks `response` with this outcome.
    pub(crate) fn mark(
        self,
        mut response: http::Response<axum::body::Body>,
    ) -> http::Response<axum::body::Body> {
        response.extensions_mut().insert(self);
        response
    }
}
