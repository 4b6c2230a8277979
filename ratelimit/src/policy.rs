//! A rate-limit policy: a token bucket (`rate` per `per`, bursts of `burst` tokens), or a
//! calendar quota (at most `limit` per UTC day or month).
//!
//! A policy is a value built once (from configuration or the admin API) and shared as an
//! `Arc<Policy>` by every request it applies to. Everything a decision needs that can be
//! computed ahead of time is computed in [`Policy::try_new`]: the emission interval in
//! nanoseconds (local backend) and microseconds (Redis backend) and the `RateLimit-Policy`
//! header value, so the per-request path does no division by `rate` and no formatting.
//!
//! Accuracy: the emission interval is `per / rate` rounded **up** to the tick (1 ns locally
//! and, for every bucket that refills within 2^52 ns ≈ 52 days, on Redis too; 1 µs on Redis
//! for slower buckets, see [`Policy::store_tick`]). Rounding up can only make the limiter
//! stricter, by less than one tick per token: for 100 000 000/s (10 ns per token) that is
//! exact; for 3/s it is 333 333 334 ns instead of 333 333 333.3 ns, 1 part in 10⁹; at the
//! top of the range it is coarse (300 000 000/s enforces 4 ns per token, 250 000 000/s), so
//! rates above about 10⁸/s should be round divisors of 10⁹/s.
//!
//! # Calendar quotas
//!
//! [`Policy::calendar`] builds the other kind of policy: a **fixed-window counter** of at
//! most `limit` cost units per current UTC day or month ([`Period`]), e.g. "10 000 requests
//! a day" on a tenant's plan.
//!
//! *Why fixed windows, when the buckets exist to avoid them?* Buckets shape traffic: they
//! smooth bursts so a backend never sees more than `rate`. A daily or monthly quota is a
//! billing-style allowance that clients, contracts and invoices state in calendar terms
//! ("10 000 a day, resets at 00:00 UTC", "per calendar month"). A bucket of 10 000 tokens
//! refilling over 24 h has no "today": tokens trickle back all the time (about 7 a minute),
//! so it can neither honour "resets at midnight" nor answer "how much is left this month".
//! The known weakness of fixed windows, a full window's quota at 23:59 and another at 00:00,
//! is harmless here: each day's allowance is exactly what was sold, and the instantaneous
//! rate is the buckets' job, which still apply to every request.
//!
//! *All-or-nothing with the buckets.* A calendar policy is one more check in the same
//! [`LimitRequest`](crate::LimitRequest), decided in the same lock or Lua script as the
//! buckets: a request rejected by any enforced policy consumes nothing anywhere, so a client
//! throttled by its per-second bucket does not burn its daily quota on requests that were
//! refused, and a client whose quota is exhausted does not drain its bucket either. Quota
//! `used` therefore counts exactly the admitted requests (by cost), which is what an
//! operator reconciles with billing.
//!
//! *Which clock.* The window is placed by the limiter's injected [`Clock`](crate::Clock)
//! (`unix_now`), in both backends: the Redis backend keeps GCRA on Redis server time but is
//! handed the window id and the time left in it by the gateway (see
//! [`RedisLimiter`](crate::RedisLimiter)). The trade-off: replicas disagree on the midnight
//! instant by their clock skew. For NTP-synchronised hosts (milliseconds) that means a
//! request within milliseconds of midnight may be counted in the old day by one replica and
//! the new day by another; nothing is lost or double-counted, only attributed to one day or
//! the next. Taking the window from Redis `TIME` instead would need the calendar arithmetic
//! in Lua and would make `ManualClock` tests of "exhausted until midnight" impossible.
//!
//! What a client sees: `X-RateLimit-Limit` = the quota, `X-RateLimit-Remaining` = quota −
//! used, `X-RateLimit-Reset` = the window's end, the `t` of `RateLimit` = seconds to the
//! window's end, and on rejection `Retry-After` = the same seconds to the window's end (next
//! 00:00 UTC, or the 1st of next month). `RateLimit-Policy` carries
//! `q` = the quota and `w` = the window length in seconds: 86 400 for a day and, for a
//! month, the length of the *current* month (28–31 days), since `w` describes the window the
//! client is in. The 429 problem names the quota and says when it resets.

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http::HeaderValue;

pub use error::PolicyError;
pub use header::policy_field;
pub use validate::MAX_QUOTA;

use crate::metrics::PolicyMetrics;
use crate::period::{Period, DAY_SECS};

/// What to do with a request when the shared store cannot decide it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailMode {
    /// Decide locally with this replica's share of the limit (`fail_open`).
    #[default]
    Open,
    /// Refuse with 503 + `Retry-After` (`fail_closed`).
    Closed,
}

/// A validated rate-limit policy.
///
/// Build with [`Policy::try_new`] (token bucket) or [`Policy::calendar`] (daily or monthly
/// quota), then optionally [`Policy::with_shadow`] and [`Policy::with_on_store_error`].
#[derive(Clone)]
pub struct Policy {
    name: Arc<str>,
    rate: u64,
    per: Duration,
    burst: u64,
    period: Option<Period>,
    shadow: bool,
    on_store_error: Option<FailMode>,
    interval_nanos: u64,
    interval_micros: u64,
    /// The Redis script's tick for this bucket in nanoseconds: 1, or 1 000 for buckets
    /// refilling over more than [`MAX_NANO_TOLERANCE`](validate::MAX_NANO_TOLERANCE).
    store_tick_nanos: u64,
    header: HeaderValue,
    /// Monthly quotas: the `RateLimit-Policy` value for months of 28, 29, 30 and 31 days.
    month_headers: Option<Arc<[HeaderValue; 4]>>,
    metrics: OnceLock<PolicyMetrics>,
}

// === impl Policy ===

impl Policy {
    /// Marks the policy as shadow: it is evaluated, counted and reported in headers, but
    /// never rejects a request. See the crate docs for what a shadow policy consumes.
    pub fn with_shadow(mut self, shadow: bool) -> Self {
        self.shadow = shadow;
        self
    }

    /// Overrides, for this policy only, what the fallback wrapper does when the shared
    /// store is unreachable (default: the wrapper's own mode).
    pub fn with_on_store_error(mut self, mode: FailMode) -> Self {
        self.on_store_error = Some(mode);
        self
    }

    /// The policy's name (`tenant`, `ip`, `route`, `global`, …).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Tokens added per [`Policy::per`].
    pub fn rate(&self) -> u64 {
        self.rate
    }

    /// The period over which [`Policy::rate`] tokens are added.
    pub fn per(&self) -> Duration {
        self.per
    }

    /// Bucket capacity: the most tokens a client can spend at once. For a calendar quota,
    /// the quota (units per window).
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// `Some` for a calendar quota ([`Policy::calendar`]), `None` for a token bucket.
    pub fn period(&self) -> Option<Period> {
        self.period
    }

    /// Whether this policy only observes (never rejects).
    pub fn is_shadow(&self) -> bool {
        self.shadow
    }

    /// This policy's own store-error mode, if it overrides the wrapper's.
    pub fn on_store_error(&self) -> Option<FailMode> {
        self.on_store_error
    }

    /// The `RateLimit-Policy` field value for this policy, e.g. `"tenant";q=100;w=1`,
    /// `"daily_quota";q=1000;w=86400`. A monthly quota's `w` depends on the month: this is
    /// the value for a 30-day month; responses use [`Policy::header_value_at`].
    pub fn header_value(&self) -> &HeaderValue {
        &self.header
    }

    /// The `RateLimit-Policy` field value at wall-clock time `unix_now`: for a monthly quota
    /// `w` is the length of the month containing `unix_now` (2 419 200 to 2 678 400 s);
    /// otherwise [`Policy::header_value`]. Never formats: all four month lengths are
    /// prepared when the policy is built.
    pub fn header_value_at(&self, unix_now: Duration) -> &HeaderValue {
        match &self.month_headers {
            None => &self.header,
            Some(by_length) => {
                let days = Period::Month.window(unix_now.as_secs()).len_secs() / DAY_SECS;
                let index = usize::try_from(days.clamp(28, 31) - 28).unwrap_or(2);
                &by_length[index]
            }
        }
    }

    /// Emission interval (time per token) in nanoseconds, rounded up; 0 for a calendar
    /// quota.
    pub fn interval_nanos(&self) -> u64 {
        self.interval_nanos
    }

    /// Emission interval (time per token) in microseconds, rounded up; 0 for a calendar
    /// quota.
    pub fn interval_micros(&self) -> u64 {
        self.interval_micros
    }

    /// The tick the Redis script uses for this bucket: 1 ns, or 1 µs for a bucket that
    /// takes more than 2^52 ns (about 52 days) to refill, whose nanosecond arithmetic would
    /// not be exact in Lua's doubles. 1 ns for a calendar quota (unused).
    pub fn store_tick(&self) -> Duration {
        Duration::from_nanos(self.store_tick_nanos)
    }

    /// Emission interval in [`Policy::store_tick`]s; 0 for a calendar quota.
    pub fn store_interval(&self) -> u64 {
        if self.store_tick_nanos == 1 {
            self.interval_nanos
        } else {
            self.interval_micros
        }
    }

    pub(crate) fn metrics(&self) -> &PolicyMetrics {
        // Registered on first use rather than in try_new, so a policy built before the
        // process installs its metrics recorder still reports to it.
        self.metrics.get_or_init(|| PolicyMetrics::new(&self.name))
    }
}

impl fmt::Debug for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Policy")
            .field("name", &self.name)
            .field("rate", &self.rate)
            .field("per", &self.per)
            .field("burst", &self.burst)
            .field("period", &self.period)
            .field("shadow", &self.shadow)
            .field("on_store_error", &self.on_store_error)
            .finish()
    }
}

impl PartialEq for Policy {
    fn eq(&self, other: &Self) -> bool {
        (
            &self.name,
            self.rate,
            self.per,
            self.burst,
            self.period,
            self.shadow,
            self.on_store_error,
        ) == (
            &other.name,
            other.rate,
            other.per,
            other.burst,
            other.period,
            other.shadow,
            other.on_store_error,
        )
    }
}

impl Eq for Policy {}

mod error;
mod header;
#[cfg(test)]
mod tests;
mod validate;
