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
