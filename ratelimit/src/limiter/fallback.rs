//! Keeping the gateway up when the shared store is not: fail open or fail closed.
//!
//! [`FallbackLimiter`] wraps a primary (shared) limiter. When the primary fails with a
//! transient error ([`LimiterError::is_transient`]: timeout, connection refused/reset,
//! loading…), each request is decided by the policies' store-error mode
//! ([`Policy::with_on_store_error`](crate::Policy::with_on_store_error), else the wrapper's):
//!
//! - [`FailMode::Open`] (default): an in-process [`LocalLimiter`] decides, with every
//!   policy's rate and burst divided by `replicas`, so N replicas each enforcing their share
//!   admit about the configured total. Availability wins over exactness for the outage: the
//!   local buckets start full, and if the real replica count differs from `replicas` the
//!   total is off by that ratio.
//! - [`FailMode::Closed`]: the request gets an error the layer answers with 503 +
//!   `Retry-After`. If any enforced policy of a request fails closed, the request fails
//!   closed (all-or-nothing, like the decision itself). Shadow policies never fail closed.
//!
//! Non-transient errors (a script bug, wrong password) pass through unchanged: falling back
//! would hide a misconfiguration for ever.
//!
//! # Circuit and recovery
//!
//! Without a circuit, a dead Redis would add the full timeout (50 ms) to every request.
//! After a failure the wrapper skips the primary for `cool_down` (default 1 s); then exactly
//! one request probes it while the others keep using the fallback; the first success closes
//! the circuit and every request goes back to the shared store. So the gateway recovers by
//! itself within about `cool_down` of Redis returning, and costs at most one timeout per
//! `cool_down` while it is down. `cool_down = 0` probes on every request (still one at a
//! time). The opening is logged once (`warn`) and counted in
//! `ratelimit_fallback_activations_total`; each decision made without the store is counted in
//! `ratelimit_fallback_decisions_total{mode}`.
//!
//! # Calendar quotas while degraded
//!
//! The local stand-in counts calendar quotas too, from zero for each outage and at
//! `limit / replicas` per replica: a tenant that had already spent its day may spend up to
//! about one more day's quota (across all replicas) during an outage on that day. Where
//! that is worse than refusing traffic (billing-grade quotas), build the quota policy with
//! `.with_on_store_error(FailMode::Closed)`: every request checked against it then fails
//! closed (503) while the store is down, and requests without it still fall back.
//!
//! # Admin operations
//!
//! [`Limiter::reset`] and [`Limiter::give_back`] act on the store of record only: while the
//! circuit is open they fail with [`LimiterError::CircuitOpen`] rather than change a local
//! stand-in the other replicas cannot see (an operator would believe a reset happened that
//! vanishes when the store returns). A reset that reached the primary also clears the listed
//! keys in the local stand-in, so a later outage does not resurrect what was cleared.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::{Check, Limiter, LimiterError, LocalLimiter, LocalLimiterConfig};
use crate::clock::{Clock, SystemClock};
use crate::decision::{Decision, Verdict};
use crate::metrics::{FALLBACK_ACTIVATIONS_TOTAL, FALLBACK_DECISIONS_TOTAL};
pub use crate::policy::FailMode;

/// Settings for [`FallbackLimiter`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FallbackConfig {
    /// Mode for policies that do not set their own (default [`FailMode::Open`]).
    pub mode: FailMode,
    /// Gateway replicas sharing the store; the local fallback enforces `1/replicas` of each
    /// policy's rate and burst (min 1, default 1).
    pub replicas: u32,
    /// How long to skip the primary after a failure before probing it again (default 1 s).
    pub cool_down: Duration,
    /// Bounds of the local fallback's table (its `share` is overridden by `replicas`).
    pub local: LocalLimiterConfig,
}

/// A limiter that falls back to a local share (or fails closed) while its primary is
/// unavailable. See the module docs.
#[derive(Debug)]
pub struct FallbackLimiter {
    primary: Arc<dyn Limiter>,
    local: LocalLimiter,
    mode: FailMode,
    cool_down: Duration,
    clock: Arc<dyn Clock>,
    origin: Instant,
    /// 0: closed. Otherwise 1 + the tick (ns since `origin`) at which to probe again.
    open_until: AtomicU64,
    probing: AtomicBool,
}

/// Clears the probing flag however the probe ends, including the request being dropped.
struct Probe<'a>(Option<&'a AtomicBool>);

// === impl FallbackConfig ===

impl Default for FallbackConfig {
    fn default() -> Self {
        Self {
            mode: FailMode::Open,
            replicas: 1,
            cool_down: Duration::from_secs(1),
            local: LocalLimiterConfig::default(),
        }
    }
}

// === impl FallbackLimiter ===

impl FallbackLimiter {
    /// Wraps `primary`, on the real clock.
    pub fn new(primary: Arc<dyn Limiter>, config: FallbackConfig) -> Self {
        Self::with_clock(primary, config, Arc::new(SystemClock))
    }

    /// Wraps `primary`, with an explicit clock (also used by the local fallback).
    pub fn with_clock(
        primary: Arc<dyn Limiter>,
        config: FallbackConfig,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let local = LocalLimiterConfig {
            share: config.replicas.max(1),
            ..config.local
        };
        Self {
            primary,
            local: LocalLimiter::with_config(local, clock.clone()),
            mode: config.mode,
            cool_down: config.cool_down,
            origin: clock.now(),
            clock,
            open_until: AtomicU64::new(0),
            probing: AtomicBool::new(false),
        }
    }

    /// Whether the circuit is open (decisions are being made without the primary).
    pub fn is_degraded(&self) -> bool {
        self.open_until.load(Ordering::Acquire) != 0
    }

    fn ticks(&self) -> u64 {
        let since = self.clock.now().saturating_duration_since(self.origin);
        u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
    }

    /// `Some` when this request should ask the primary.
    fn admit_to_primary(&self) -> Option<Probe<'_>> {
        let open_until = self.open_until.load(Ordering::Acquire);
        if open_until == 0 {
            return Some(Probe(None));
        }
        if self.ticks() + 1 < open_until {
            return None;
        }
        self.probing
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .ok()
            .map(|_| Probe(Some(&self.probing)))
    }

    /// Admin operations go to the primary or nowhere (see the module docs).
    fn admin_allowed(&self) -> Result<(), LimiterError> {
        if self.is_degraded() {
            return Err(LimiterError::CircuitOpen {
                retry_in: self.retry_in(),
            });
        }
        Ok(())
    }

    fn retry_in(&self) -> Duration {
        let open_until = self.open_until.load(Ordering::Acquire);
        Duration::from_nanos(open_until.saturating_sub(self.ticks() + 1))
    }

    fn trip(&self, err: &LimiterError) {
        let cool_down = u64::try_from(self.cool_down.as_nanos()).unwrap_or(u64::MAX);
        let until = self.ticks().saturating_add(cool_down).saturating_add(1);
        if self.open_until.swap(until, Ordering::AcqRel) == 0 {
            tracing::warn!(error = %err, cool_down_ms = self.cool_down.as_millis() as u64,
                "rate-limit store unavailable; deciding without it");
            metrics::counter!(FALLBACK_ACTIVATIONS_TOTAL).increment(1);
        }
    }

    fn close(&self) {
        // Load first: in the steady state this is a shared read, not a write every request
        // would contend on.
        if self.open_until.load(Ordering::Acquire) != 0
            && self.open_until.swap(0, Ordering::AcqRel) != 0
        {
            tracing::info!("rate-limit store available again; shared limiting resumed");
        }
    }

    async fn run(&self, checks: &[Check], commit: bool) -> Result<Verdict, LimiterError> {
        let err = match self.admit_to_primary() {
            Some(_probe) => {
                let result = if commit {
                    self.primary.check(checks).await
                } else {
                    self.primary.peek(checks).await
                };
                match result {
                    Ok(verdict) => {
                        self.close();
                        return Ok(verdict);
                    }
                    Err(err) if err.is_transient() => {
                        self.trip(&err);
                        err
                    }
                    Err(err) => return Err(err),
                }
            }
            None => LimiterError::CircuitOpen {
                retry_in: self.retry_in(),
            },
        };
        let closed = checks.iter().any(|c| {
            !c.policy.is_shadow()
                && c.policy.on_store_error().unwrap_or(self.mode) == FailMode::Closed
        });
        if closed {
            metrics::counter!(FALLBACK_DECISIONS_TOTAL, "mode" => "closed").increment(1);
            return Err(err);
        }
        metrics::counter!(FALLBACK_DECISIONS_TOTAL, "mode" => "open").increment(1);
        tracing::debug!(error = %err, "rate-limit decision made by the local fallback");
        if commit {
            self.local.check(checks).await
        } else {
            self.local.peek(checks).await
        }
    }
}

#[async_trait]
impl Limiter for FallbackLimiter {
    async fn check(&self, checks: &[Check]) -> Result<Verdict, LimiterError> {
        self.run(checks, true).await
    }

    async fn peek(&self, checks: &[Check]) -> Result<Verdict, LimiterError> {
        self.run(checks, false).await
    }

    async fn reset(&self, checks: &[Check]) -> Result<(), LimiterError> {
        self.admin_allowed()?;
        self.primary.reset(checks).await?;
        self.local.reset(checks).await
    }

    async fn give_back(&self, check: &Check, amount: u64) -> Result<Decision, LimiterError> {
        self.admin_allowed()?;
        self.primary.give_back(check, amount).await
    }
}

// === impl Probe ===

impl Drop for Probe<'_> {
    fn drop(&mut self) {
        if let Some(flag) = self.0 {
            flag.store(false, Ordering::Release);
        }
    }
}
