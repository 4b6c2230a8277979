//! Validated circuit-breaker settings.

use std::time::Duration;

use crate::policy::InvalidRetryConfig;

/// Validated breaker settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BreakerConfig {
    failure_rate: f64,
    min_requests: u32,
    window: Duration,
    open_for: Duration,
    half_open_probes: u32,
    min_callers: u32,
}

/// Default of [`BreakerConfig::min_callers`].
pub const DEFAULT_MIN_CALLERS: u32 = 3;
/// Largest allowed [`BreakerConfig::min_callers`]: the attribution tables track 32 callers
/// per bucket, and setting aside more than 9 of them would make their estimation error
/// (see `callers.rs`) matter.
pub(super) const MAX_MIN_CALLERS: u32 = 10;

// === impl BreakerConfig ===

impl BreakerConfig {
    /// Validates: `failure_rate` in (0, 1], `min_requests` ≥ 1, `window` 1 s..=10 min,
    /// `open_for` > 0 (≤ 10 min), `half_open_probes` 1..=100, `min_callers` 1..=10.
    pub fn try_new(
        failure_rate: f64,
        min_requests: u32,
        window: Duration,
        open_for: Duration,
        half_open_probes: u32,
        min_callers: u32,
    ) -> Result<Self, InvalidRetryConfig> {
        let bad = |field, value: String, allowed: &str| InvalidRetryConfig {
            field,
            value,
            allowed: allowed.to_owned(),
        };
        // Written so that NaN is refused too.
        if !(failure_rate > 0.0 && failure_rate <= 1.0) {
            return Err(bad("failure_rate", failure_rate.to_string(), "(0, 1]"));
        }
        if min_requests == 0 {
            return Err(bad("min_requests", "0".to_owned(), ">= 1"));
        }
        if window < Duration::from_secs(1) || window > Duration::from_secs(600) {
            return Err(bad("window", format!("{window:?}"), "1s..=600s"));
        }
        if open_for.is_zero() || open_for > Duration::from_secs(600) {
            return Err(bad("open_for", format!("{open_for:?}"), "(0s, 600s]"));
        }
        if !(1..=100).contains(&half_open_probes) {
            return Err(bad(
                "half_open_probes",
                half_open_probes.to_string(),
                "1..=100",
            ));
        }
        if !(1..=MAX_MIN_CALLERS).contains(&min_callers) {
            return Err(bad("min_callers", min_callers.to_string(), "1..=10"));
        }
        Ok(Self {
            failure_rate,
            min_requests,
            window,
            open_for,
            half_open_probes,
            min_callers,
        })
    }

    /// Failure share that opens the breaker.
    pub(crate) fn failure_rate(&self) -> f64 {
        self.failure_rate
    }
    /// Requests needed in the window before the rate is judged.
    pub(crate) fn min_requests(&self) -> u32 {
        self.min_requests
    }
    /// Rolling window of the failure rate.
    pub(crate) fn window(&self) -> Duration {
        self.window
    }
    /// How long the breaker stays open before probing.
    pub(crate) fn open_for(&self) -> Duration {
        self.open_for
    }
    /// Concurrent probes in half-open, and successes needed to close.
    pub(crate) fn half_open_probes(&self) -> u32 {
        self.half_open_probes
    }
    /// Distinct callers whose failed requests it takes to open the breaker (and to reopen
    /// it from half-open): the failure rate is judged without the failures of the
    /// `min_callers - 1` callers with the most. 1 turns attribution off.
    pub(crate) fn min_callers(&self) -> u32 {
        self.min_callers
    }
}

impl Default for BreakerConfig {
    /// 50 % failed requests over 30 s with at least 20 requests, from at least 3 callers;
    /// open 10 s; 3 probes.
    fn default() -> Self {
        Self {
            failure_rate: 0.5,
            min_requests: 20,
            window: Duration::from_secs(30),
            open_for: Duration::from_secs(10),
            half_open_probes: 3,
            min_callers: DEFAULT_MIN_CALLERS,
        }
    }
}
