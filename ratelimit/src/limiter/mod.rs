//! The storage trait: one atomic, all-or-nothing decision over all policies of a request.
//!
//! Backends: [`LocalLimiter`] (in process), [`RedisLimiter`] (shared by replicas) and the
//! [`FallbackLimiter`] wrapper that keeps serving when the shared store is down. All pass
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

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use smallvec::SmallVec;

use crate::decision::Verdict;
use crate::key::LimitKey;
use crate::policy::Policy;

mod fallback;
mod local;
mod redis;

pub use self::fallback::{FailMode, FallbackConfig, FallbackLimiter};
pub use self::local::{LocalLimiter, LocalLimiterConfig};
pub use self::redis::{RedisLimiter, RedisLimiterConfig};

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
    /// (for the admin usage view) and whether a request of that cost would pass now.
    async fn peek(&self, checks: &[Check]) -> Result<Verdict, LimiterError>;
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
        use ::redis::ErrorKind as K;
        let transient = err.is_io_error()
            || err.is_connection_refusal()
            || err.is_connection_dropped()
            || err.is_timeout()
            || matches!(
                err.kind(),
                K::BusyLoadingError
                    | K::TryAgain
                    | K::ClusterDown
                    | K::MasterDown
                    | K::ReadOnly
                    | K::IoError
            );
        if transient {
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
