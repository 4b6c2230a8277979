//! The storage trait behind the layer, and its three backends.
//!
//! # Contract
//!
//! Every method is one atomic decision in the backend (one Lua script in Redis, one SQL
//! statement in PostgreSQL, one shard lock in memory):
//!
//! - [`Store::try_lock`] looks at the record for `(tenant, route, key)` and either creates an
//!   in-flight record with a fresh fencing token (`Acquired`), or reports what is there:
//!   `InFlight`, `Completed(response)`, `TooLarge`, or `Mismatch` when the fingerprint
//!   differs. The "check again after taking the lock" of the contract is this atomicity:
//!   no completion can slip in between the look-up and the lock.
//! - An in-flight record whose lease has expired is *taken over* by the next `try_lock`,
//!   with a new, strictly greater fencing token (`took_over: true`).
//! - [`Store::complete`] and [`Store::release`] succeed only for the current holder: the
//!   record must be in flight, carry the presented fencing token, and its lease must not
//!   have expired. Otherwise they fail with [`StoreError::Fenced`] (someone else holds or
//!   finished the key) or [`StoreError::LeaseLost`] (the lease ran out). Refusing a late
//!   holder even when nobody took over keeps the rule uniform across backends — in Redis the
//!   lease *is* the key's TTL, so an expired record no longer exists.
//! - Records disappear `retention` after they were locked (in flight) or completed.
//!
//! Fencing tokens only ever grow for a key (Redis: a per-tenant `INCR` counter that never
//! expires; PostgreSQL: a sequence; memory: a global atomic counter), so a token can never
//! be re-issued to a later holder, even after release or expiry.

use std::time::Duration;

use async_trait::async_trait;
use http::StatusCode;

use crate::fingerprint::Fingerprint;
use crate::key::IdempotencyKey;
use crate::record::{Completion, RecordInfo, StoredResponse};

mod error;
pub mod memory;
pub mod postgres;
pub mod redis;

pub use error::StoreError;

/// The scope of a record: keys are per tenant and per route, so no tenant can read, replay
/// or block another tenant's key, even if both pick the same UUID.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RecordKey {
    /// Tenant the request was resolved to.
    pub tenant: String,
    /// Route identifier (e.g. the route prefix from configuration).
    pub route: String,
    /// The client's idempotency key.
    pub key: IdempotencyKey,
}

/// Result of [`Store::try_lock`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockOutcome {
    /// The caller now holds the key and must execute the request, then complete or release.
    Acquired {
        /// Token to present to `complete`/`release`; greater than any earlier token.
        fencing: u64,
        /// True when an expired lease of an earlier holder was taken over.
        took_over: bool,
    },
    /// Another copy of the request holds the key.
    InFlight {
        /// Time left on the current holder's lease (an upper bound on the wait).
        lease_remaining: Duration,
    },
    /// The request already completed: replay this response.
    Completed(StoredResponse),
    /// The key was used with a different request fingerprint.
    Mismatch,
    /// The request already ran but its response was too large to store.
    TooLarge {
        /// Status of the original response.
        status: StatusCode,
    },
}

/// Storage for idempotency records. Object-safe; held as `Arc<dyn Store>`.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Atomically looks up the record and, if absent, expired or an expired lease, locks it
    /// for `lease` with a new fencing token. A new record is kept at most `retention`.
    async fn try_lock(
        &self,
        key: &RecordKey,
        fingerprint: &Fingerprint,
        lease: Duration,
        retention: Duration,
    ) -> Result<LockOutcome, StoreError>;

    /// Stores the outcome of the request held with `fencing`, kept for `retention` from now.
    async fn complete(
        &self,
        key: &RecordKey,
        fencing: u64,
        completion: Completion,
        retention: Duration,
    ) -> Result<(), StoreError>;

    /// Deletes the in-flight record held with `fencing`, so the key may be used again.
    async fn release(&self, key: &RecordKey, fencing: u64) -> Result<(), StoreError>;

    /// Admin look-up of a record; `None` when absent or expired.
    async fn get(&self, key: &RecordKey) -> Result<Option<RecordInfo>, StoreError>;

    /// Admin removal of a record in any state; returns whether one existed. Removing an
    /// in-flight record makes the holder's later `complete` fail and allows re-execution:
    /// an operator tool, not something the request path does.
    async fn delete(&self, key: &RecordKey) -> Result<bool, StoreError>;
}

// === impl RecordKey ===

impl RecordKey {
    /// Builds a record key.
    pub fn new(tenant: impl Into<String>, route: impl Into<String>, key: IdempotencyKey) -> Self {
        Self {
            tenant: tenant.into(),
            route: route.into(),
            key,
        }
    }
}

/// Milliseconds in a duration, saturating, at least 1 (a zero TTL means "no TTL" in Redis
/// and "already expired" in SQL; neither is what a caller asking for a tiny lease wants).
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX).max(1)
}
