//! The storage trait: one atomic, all-or-nothing decision over all policies of a request.
//!
//! Backends: [`LocalLimiter`] (in process), [`RedisLimiter`] (shared by replicas), the
//! [`FallbackLimiter`] wrapper that keeps serving when the shared store is down, and the
//! [`BatchedLimiter`] wrapper that decides from leased batches of a shared store's tokens. All pass
//! the same conformance suite (`tests/conformance.rs`).
//!
//! # Consumption semantics (all backends)
//!
//! For the checks of one request:
//!
//! 1. every check is evaluated against its bucket as it is now;
//! 2. the request is **admitted** iff no *enforced* (non-shadow) check rejects it;
//! 3. if admitted, every check that allowed it consumes its cost, shadow ones included, so a
//!    shadow policy tracks the traffic that really got through, exactly as it would if it
//!    were switched to enforcing;
//! 4. if rejected, **nothing** is consumed anywhere: a client hammering a limit does not
//!    drain its other buckets;
//! 5. a shadow check that would reject consumes nothing (an enforced one would have
//!    consumed nothing either) and never affects the verdict.
//!
//! Steps 1–4 happen under one lock (local) or inside one Lua script (Redis), so concurrent
//! requests cannot both take the last token. Keys within one request should be distinct:
//! a key listed twice is evaluated twice against the same starting state.
//!
//! Calendar quotas ([`Policy::calendar`]) are checks like any other: "tokens" are the
//! current window's used count, "consumes its cost" adds the cost to it, and the same
//! all-or-nothing rule holds, so a request refused by a bucket spends no quota and a request
//! refused by the quota spends no bucket tokens. The window (and the window id appended to
//! the key) comes from the limiter's [`Clock`](crate::Clock) wall time.
//!
//! # Admin operations
//!
//! [`Limiter::reset`] and [`Limiter::give_back`] let an operator undo consumption (a manual
//! quota reset, a top-up after an incident). They act on the same state the decisions use,
//! atomically per key, and never on another window than the current one.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use smallvec::SmallVec;

use crate::decision::{Decision, Verdict};
use crate::gcra::Evaluation;
use crate::key::LimitKey;
use crate::period::{Period, QuotaEvaluation, Window};
use crate::policy::Policy;

mod batched;
mod fallback;
mod local;
mod redis;

pub use self::batched::{BatchedConfig, BatchedLimiter};
pub use self::fallback::{FailMode, FallbackConfig, FallbackLimiter};
pub use self::local::{LocalLimiter, LocalLimiterConfig};
pub use self::redis::{RedisLimiter, RedisLimiterConfig, QUOTA_TTL_MARGIN};

/// One bucket to check for a request: which key, under which policy, at what cost.
#[derive(Debug, Clone)]
pub struct Check {
    /// The bucket.
    pub key: LimitKey,
    /// Its policy (shared, never copied per request).
    pub policy: Arc<Policy>,
    /// Tokens this request takes (the route's cost weight; usually 1).
    pub cost: u32,
}

/// All checks that apply to one request, as returned by the layer's extractor.
///
/// Up to four checks (tenant or IP, route, global, one more) are stored inline, without a
/// heap allocation.
#[derive(Debug, Clone, Default)]
pub struct LimitRequest {
    checks: SmallVec<[Check; 4]>,
}

/// The rate-limit state store.
///
/// Object-safe; hold it as `Arc<dyn Limiter>`. Implementations make [`Limiter::check`]
/// atomic across all its checks (see the module docs for the exact semantics).
#[async_trait]
pub trait Limiter: Send + Sync + std::fmt::Debug {
    /// Decides a request: evaluates all checks and, if no enforced check rejects, consumes
    /// their costs. Returns one decision per check, in order.
    async fn check(&self, checks: &[Check]) -> Result<Verdict, LimiterError>;

    /// The same evaluation without consuming anything: the current state of each bucket
    /// and calendar counter (for the admin usage view) and whether a request of that cost
    /// would pass now.
    async fn peek(&self, checks: &[Check]) -> Result<Verdict, LimiterError>;

    /// Admin: refills every listed bucket and sets every listed calendar counter of the
    /// *current* window back to 0 (`cost` is ignored). Idempotent.
    async fn reset(&self, checks: &[Check]) -> Result<(), LimiterError>;

    /// Admin: gives `amount` units back to one check's state and returns it, as
    /// [`Limiter::peek`] would (for a request of `check.cost`).
    ///
    /// Calendar quota: the current window's used count decreases by `amount`, not below 0.
    /// Bucket: `amount` tokens are returned, capped at the burst (a full bucket).
    async fn give_back(&self, check: &Check, amount: u64) -> Result<Decision, LimiterError>;

    /// Hands back what this limiter holds on the shared store's behalf (the
    /// [`BatchedLimiter`]'s unspent leases), on graceful shutdown. Default: nothing held.
    async fn release(&self) {}
}

/// Why a limiter could not decide.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LimiterError {
    /// The store did not answer within the configured timeout.
    #[error("rate-limit store did not answer within {0:?}")]
    Timeout(Duration),
    /// The store could not be reached or failed in a way that may pass (connection refused
    /// or reset, loading, failover, …).
    // The cause is in the message too: the layer logs `%err`, and "unavailable" alone would
    // not say whether the connection was refused, reset or timed out.
    #[error("rate-limit store unavailable: {0}")]
    Unavailable(#[source] ::redis::RedisError),
    /// The fallback circuit is open and this request's policy fails closed.
    #[error("rate-limit store unavailable (circuit open, next probe in {retry_in:?})")]
    CircuitOpen {
        /// Time until the wrapper tries the store again.
        retry_in: Duration,
    },
    /// The store answered with an error that retrying will not fix (script error, auth).
    #[error("rate-limit store error: {0}")]
    Store(#[source] ::redis::RedisError),
    /// The store answered something this crate does not understand.
    #[error("unexpected reply from rate-limit store: {0}")]
    Protocol(String),
    /// The limiter was built with an invalid setting.
    #[error("invalid rate-limit store configuration: {0}")]
    Config(String),
}

/// One check evaluated against its state: a token bucket or a calendar window's counter.
/// Shared by the backends so they report identical decisions.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Eval {
    Bucket(Evaluation),
    Quota(QuotaEvaluation),
}

// === impl Eval ===

impl Eval {
    pub(crate) fn allowed(&self) -> bool {
        match self {
            Eval::Bucket(e) => e.allowed,
            Eval::Quota(e) => e.allowed,
        }
    }

    /// `tick`: the bucket's tick (1 ns locally; on Redis [`Policy::store_tick`]); unused by
    /// counters.
    pub(crate) fn decision(&self, committed: bool, shadow: bool, tick: Duration) -> Decision {
        match self {
            Eval::Bucket(e) => e.decision(committed, shadow, tick),
            Eval::Quota(e) => e.decision(committed, shadow),
        }
    }
}

/// The window of `period` at wall time `unix_now`, and the time left in it (always > 0:
/// a window ends strictly after any instant it contains).
pub(crate) fn window_at(period: Period, unix_now: Duration) -> (Window, Duration) {
    let window = period.window(unix_now.as_secs());
    (window, window.until_end(unix_now))
}

// === impl LimitRequest ===

impl LimitRequest {
    /// An empty request (no checks; a layer treats it as "pass through").
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a check; builder style.
    pub fn with(mut self, key: LimitKey, policy: Arc<Policy>, cost: u32) -> Self {
        self.push(key, policy, cost);
        self
    }

    /// Adds a check.
    pub fn push(&mut self, key: LimitKey, policy: Arc<Policy>, cost: u32) {
        self.checks.push(Check { key, policy, cost });
    }

    /// The checks, in order.
    pub fn checks(&self) -> &[Check] {
        &self.checks
    }

    /// Whether there is nothing to check.
    pub fn is_empty(&self) -> bool {
        self.checks.is_empty()
    }
}

impl FromIterator<Check> for LimitRequest {
    fn from_iter<I: IntoIterator<Item = Check>>(iter: I) -> Self {
        Self {
            checks: iter.into_iter().collect(),
        }
    }
}

// === impl LimiterError ===

impl LimiterError {
    /// Whether the store may answer if asked again shortly: the fallback wrapper falls back
    /// (fail open) or answers 503 (fail closed) on these, and passes the others through.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Self::Timeout(_) | Self::Unavailable(_) | Self::CircuitOpen { .. }
        )
    }

    /// A hint for `Retry-After` on the 503 the layer answers with, when the error knows
    /// better than the layer's default.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::CircuitOpen { retry_in } => Some(*retry_in),
            _ => None,
        }
    }

    /// Classifies a Redis error as [`LimiterError::Unavailable`] (transient) or
    /// [`LimiterError::Store`].
    pub fn from_redis(err: ::redis::RedisError) -> Self {
        if portcullis_redis::is_transient(&err) {
            Self::Unavailable(err)
        } else {
            Self::Store(err)
        }
    }
}

impl From<::redis::RedisError> for LimiterError {
    fn from(err: ::redis::RedisError) -> Self {
        Self::from_redis(err)
    }
}
