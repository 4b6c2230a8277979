//! `Idempotency-Key` deduplication as a tower [`Layer`](tower::Layer): a client may send the
//! same POST or PATCH as often as its network forces it to, and the backend acts once.
//!
//! Usable in any axum or hyper service: the layer learns the tenant, route and policy of a
//! request from an extractor closure, and keeps records in any [`Store`] — [`MemoryStore`]
//! (one node), [`RedisStore`] or [`PostgresStore`] (shared by replicas).
//!
//! # Lifecycle of a keyed request
//!
//! 1. **Validate the key**: a bare token or an RFC 8941 quoted string of 1–64 (up to 255)
//!    visible ASCII characters, else 400. No key: pass through, or 400 if the route
//!    requires one.
//! 2. **Fingerprint**: buffer the body (413 past the limit) and hash method, path and
//!    query, tenant, content type and body.
//! 3. **`try_lock`** on `(tenant, route, key)`, atomically in the store: a completed record
//!    is replayed byte for byte with `Idempotent-Replayed: true`; another fingerprint gets
//!    422; a record in flight gets 409 + `Retry-After` (or a bounded wait, then replay);
//!    an unreachable store gets 503 + `Retry-After` — the request is never forwarded
//!    unprotected. The contract's "check again after taking the lock" is that atomicity:
//!    look-up and lock are one step, so nothing can complete in between.
//! 4. **Forward** with the `Idempotency-Key` header kept (so backends can dedupe too) and an
//!    [`IdempotencyLock`] in the request extensions (so the retry layer knows the request
//!    is protected).
//! 5. **Complete or release** with the fencing token, per the [`outcome`] table:
//!    definitive answers are stored, provably-unprocessed ones release the key, ambiguous
//!    ones (500/502/504) are stored unless the upstream dedupes on the key. A response too
//!    large to store leaves a tombstone: duplicates get 409, never a second execution.
//!
//! # Fencing tokens
//!
//! A lock is a lease: if a gateway dies mid-request, its in-flight record must not block
//! the key forever, so after `lease` a duplicate may take the key over. But "dead" may only
//! be "slow": the first holder can wake up after the takeover and try to store its result
//! over the new holder's. Each `try_lock` therefore hands out a fencing token that is
//! strictly greater than every earlier one for that key, and `complete`/`release` succeed
//! only when the presented token is the record's current one and its lease is live. The
//! late holder gets [`StoreError::Fenced`]; its response still goes to its client, but the
//! record keeps the new holder's outcome. The lease must therefore exceed the longest time
//! a request can spend downstream (the retry layer's total deadline), or a slow-but-alive
//! request can run twice; see [`IdempotencySettings::lease`].
//!
//! What does the new holder do with the key it took over? The lock is taken right before
//! forwarding, so a holder that stopped (crashed, was killed) most likely had already sent
//! the request. Sending it again could execute it twice, so on an upstream that does not
//! dedupe on the key the takeover is settled like any ambiguous outcome: a 502
//! "previous attempt interrupted" problem is stored and replayed, and the client checks the
//! resource before retrying with a new key. Only when the upstream dedupes on the forwarded
//! key is the request sent again. A crash thus never costs a duplicate execution, and never
//! a key locked for longer than its lease.
//!
//! # Failures and cancellation
//!
//! Once locked, the request runs to its outcome: inline while the client waits, in a task of
//! its own once the client disconnects, so the upstream call still finishes and the record
//! is still settled, so a retry gets the replay rather
//! than a second execution. If the inner service returns an error (no response), the
//! upstream may or may not have acted, so the key is settled as ambiguous: a 502
//! "outcome unknown" problem is stored and replayed (released instead when the upstream
//! dedupes on the key); the error itself is returned unchanged. If it panics, the client gets
//! a 500 problem and the lease is left to expire. No key is stuck longer than its lease. (Hence the service needs
//! a Tokio runtime, as axum and hyper-util servers provide.)
//!
//! An attempt the layer below stopped waiting for (its timeout) can still deliver its answer:
//! the request carries a [`LateAnswer`] the layer below may take; while it holds it the
//! record stays in flight until the answer lands or the lease ends (see the `late` module).
//!
//! # Where it sits
//!
//! After tenant resolution and rate limiting (a rejected request must not take a key) and
//! before the retry layer, which reads [`IdempotencyLock`] and sets [`NotForwarded`] on
//! responses it generated without reaching the upstream. The gateway's own order is
//! `gateway/src/stack/mod.rs`.
//!
//! ```no_run
//! use std::sync::Arc;
//! use axum::{routing::post, Router};
//! use portcullis_idempotency::{IdempotencyLayer, IdempotencySettings, MemoryStore, Store};
//!
//! let store: Arc<dyn Store> = Arc::new(MemoryStore::new(64 << 20));
//! let layer = IdempotencyLayer::new(store, Arc::new(|parts: &http::request::Parts| {
//!     let tenant = parts.headers.get("x-tenant")?.to_str().ok()?.to_owned();
//!     Some(IdempotencySettings::new(tenant, "/orders"))
//! }));
//! let app: Router = Router::new()
//!     .route("/orders", post(|| async { "created" }))
//!     .layer(layer);
//! ```

#![forbid(unsafe_code)]

mod detach;
mod extensions;
pub mod fingerprint;
mod forward;
pub mod key;
mod late;
mod layer;
pub mod outcome;
pub mod record;
pub mod rejection;
mod service;
pub mod settings;
pub mod store;

pub use extensions::{IdempotencyLock, IdempotencyOutcome, NotForwarded};
pub use fingerprint::{Fingerprint, FingerprintInput};
pub use key::{IdempotencyKey, KeyError};
pub use late::{LateAnswer, LateSender};
pub use layer::IdempotencyLayer;
pub use outcome::Outcome;
pub use portcullis_problem::clock::{ManualWallClock, SystemWallClock, WallClock};
pub use record::{Completion, RecordInfo, RecordState, StoredResponse};
pub use rejection::Rejection;
pub use service::Idempotency;
pub use settings::{ExtractSettings, IdempotencySettings, OnInFlight, SettingsError};
pub use store::memory::{MemoryStore, Shares, Whole};
pub use store::postgres::{PostgresSettings, PostgresStore};
pub use store::redis::RedisStore;
pub use store::{LockOutcome, RecordKey, Store, StoreError};
