//! Key layout: where each check's state lives in Redis (the prefixed key, plus a calendar
//! quota's window id) and how long a calendar counter is kept.

use std::time::Duration;

use super::{RedisLimiter, QUOTA_TTL_MARGIN};
use crate::limiter::{window_at, Check};

/// Where one check's state lives in Redis: the full key and, for a calendar quota, the time
/// left in its window.
pub(super) struct Target {
    pub(super) key: String,
    pub(super) until_end: Option<Duration>,
}

impl RedisLimiter {
    /// The Redis key of `check`'s state now: the prefixed key, plus `:<window id>` for a
    /// calendar quota.
    pub(super) fn target(&self, check: &Check, unix_now: Option<Duration>) -> Target {
        let prefix = &self.config.key_prefix;
        match check.policy.period().zip(unix_now) {
            None => Target {
                key: format!("{prefix}{}", check.key),
                until_end: None,
            },
            Some((period, unix_now)) => {
                let (window, until_end) = window_at(period, unix_now);
                Target {
                    key: format!("{prefix}{}:{}", check.key, window.id),
                    until_end: Some(until_end),
                }
            }
        }
    }
}

/// A calendar counter's `PX`: the time left in its window plus the skew margin, in whole
/// milliseconds rounded up.
pub(super) fn counter_ttl_ms(until_end: Duration) -> u64 {
    let ttl = until_end.saturating_add(QUOTA_TTL_MARGIN);
    u64::try_from(ttl.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}
