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

pub use header::policy_field;
use header::{policy_header, quota_header};

use crate::metrics::PolicyMetrics;
use crate::period::{Period, DAY_SECS};

/// Largest bucket, as the time to refill it from empty: 2^48 µs (about 8.9 years).
///
/// The Redis script computes in Lua numbers (IEEE doubles), exact for integers below 2^53
/// µs; Unix time now is about 2^50.6 µs, so TATs up to 2^48 µs ahead stay exact for two
/// centuries. A yearly quota still fits.
const MAX_REFILL_MICROS: u128 = 1 << 48;

/// Largest bucket the Redis script keeps in nanosecond ticks, as the time to refill it from
/// empty: 2^52 ns (about 52 days). The script never handles absolute nanoseconds (Unix time
/// is about 2^60.6 ns, far beyond a double's 2^53): it splits the stored TAT into whole
/// microseconds and a 0–999 ns remainder and computes `TAT − now` in nanoseconds, which is
/// at most the tolerance plus one request's cost (≤ the burst), so below 2^53: exact.
const MAX_NANO_TOLERANCE: u128 = 1 << 52;

/// Largest calendar quota: 2^48 units per window (2.8 × 10¹⁴). The Redis script counts in
/// Lua doubles, exact below 2^53 even after adding a request's cost.
pub const MAX_QUOTA: u64 = 1 << 48;

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
    /// refilling over more than [`MAX_NANO_TOLERANCE`].
    store_tick_nanos: u64,
    header: HeaderValue,
    /// Monthly quotas: the `RateLimit-Policy` value for months of 28, 29, 30 and 31 days.
    month_headers: Option<Arc<[HeaderValue; 4]>>,
    metrics: OnceLock<PolicyMetrics>,
}

/// Why a policy was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// `rate` was 0.
    #[error("rate must be at least 1")]
    ZeroRate,
    /// `burst` was 0: such a bucket could never admit anything.
    #[error("burst must be at least 1")]
    ZeroBurst,
    /// `per` was zero.
    #[error("per must be longer than 0")]
    ZeroPeriod,
    /// More than one token per nanosecond, the finest tick of every backend.
    #[error("rate {rate} per {per:?} is more than one per nanosecond (1 000 000 000/s)")]
    RateTooHigh {
        /// The refused rate.
        rate: u64,
        /// Its period.
        per: Duration,
    },
    /// Refilling a full bucket would take longer than about 8.9 years (2^48 µs), or longer
    /// than about 52 days (2^52 ns) at more than one token per microsecond.
    #[error(
        "burst {burst} at {rate} per {per:?} takes too long to refill (max 2^48 µs, or 2^52 ns above 1 000 000/s)"
    )]
    RefillTooLong {
        /// The refused burst.
        burst: u64,
        /// The rate.
        rate: u64,
        /// Its period.
        per: Duration,
    },
    /// The name is empty, longer than 64 bytes, or has a character outside `[A-Za-z0-9._:/-]`.
    #[error("policy name {0:?} must be 1-64 characters of [A-Za-z0-9._:/-]")]
    InvalidName(String),
    /// A calendar quota of 0: it could never admit anything.
    #[error("quota limit must be at least 1")]
    ZeroQuota,
    /// A calendar quota above [`MAX_QUOTA`] (2^48) per window.
    #[error("quota limit {0} is above the maximum of 2^48 per window")]
    QuotaTooLarge(u64),
}

// === impl Policy ===

impl Policy {
    /// Validates and builds a policy admitting `rate` tokens per `per`, in bursts of up to
    /// `burst` tokens.
    ///
    /// `name` is what clients and dashboards see: the `RateLimit-Policy` item, the
    /// problem+json `policy` member and the `policy` metric label (e.g. `tenant`, `ip`,
    /// `route`, `global`). It is restricted to `[A-Za-z0-9._:/-]` so it needs no escaping
    /// in any of those places.
    pub fn try_new(
        name: impl Into<String>,
        rate: u64,
        per: Duration,
        burst: u64,
    ) -> Result<Self, PolicyError> {
        let name = valid_name(name.into())?;
        if rate == 0 {
            return Err(PolicyError::ZeroRate);
        }
        if burst == 0 {
            return Err(PolicyError::ZeroBurst);
        }
        if per.is_zero() {
            return Err(PolicyError::ZeroPeriod);
        }
        if u128::from(rate) > per.as_nanos() {
            return Err(PolicyError::RateTooHigh { rate, per });
        }
        let interval_micros = div_ceil(per.as_nanos(), u128::from(rate) * 1_000);
        let interval_nanos = div_ceil(per.as_nanos(), u128::from(rate));
        if interval_micros * u128::from(burst) > MAX_REFILL_MICROS {
            return Err(PolicyError::RefillTooLong { burst, rate, per });
        }
        // Nanosecond ticks on Redis whenever the script's arithmetic stays exact; slower
        // buckets keep microseconds, which is only correct at most one token per µs.
        let store_tick_nanos = if interval_nanos * u128::from(burst) <= MAX_NANO_TOLERANCE {
            1
        } else if u128::from(rate) <= per.as_micros() {
            1_000
        } else {
            return Err(PolicyError::RefillTooLong { burst, rate, per });
        };
        // Both fit: interval_micros × burst ≤ 2^48, so interval_nanos < 2^58.
        let interval_nanos = u64::try_from(interval_nanos).unwrap_or(u64::MAX);
        let interval_micros = u64::try_from(interval_micros).unwrap_or(u64::MAX);
        let header = policy_header(&name, rate, per);
        Ok(Self {
            name: name.into(),
            rate,
            per,
            burst,
            period: None,
            shadow: false,
            on_store_error: None,
            interval_nanos,
            interval_micros,
            store_tick_nanos,
            header,
            month_headers: None,
            metrics: OnceLock::new(),
        })
    }

    /// Validates and builds a calendar quota: at most `limit` cost units in the current UTC
    /// day or month (a fixed window; see the module docs for why, and for what clients see).
    ///
    /// Check it with the key [`LimitKey::period`](crate::LimitKey::period) in the same
    /// [`LimitRequest`](crate::LimitRequest) as the request's buckets; the limiter appends the
    /// window id to the key itself. For such a policy [`Policy::period`] is `Some`,
    /// [`Policy::burst`] and [`Policy::rate`] are `limit`, [`Policy::per`] is the period's
    /// longest window (1 day, 31 days) and the emission intervals are 0.
    pub fn calendar(
        name: impl Into<String>,
        limit: u64,
        period: Period,
    ) -> Result<Self, PolicyError> {
        let name = valid_name(name.into())?;
        if limit == 0 {
            return Err(PolicyError::ZeroQuota);
        }
        if limit > MAX_QUOTA {
            return Err(PolicyError::QuotaTooLarge(limit));
        }
        let header_for = |days: u64| quota_header(&name, limit, days * DAY_SECS);
        let (header, month_headers) = match period {
            Period::Day => (header_for(1), None),
            Period::Month => (
                header_for(30),
                Some(Arc::new([
                    header_for(28),
                    header_for(29),
                    header_for(30),
                    header_for(31),
                ])),
            ),
        };
        Ok(Self {
            name: name.into(),
            rate: limit,
            per: period.longest(),
            burst: limit,
            period: Some(period),
            shadow: false,
            on_store_error: None,
            interval_nanos: 0,
            interval_micros: 0,
            store_tick_nanos: 1,
            header,
            month_headers,
            metrics: OnceLock::new(),
        })
    }

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

fn div_ceil(a: u128, b: u128) -> u128 {
    a.div_ceil(b)
}

fn valid_name(name: String) -> Result<String, PolicyError> {
    let name_ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:/-".contains(&b));
    if name_ok {
        Ok(name)
    } else {
        Err(PolicyError::InvalidName(name))
    }
}

mod header;
#[cfg(test)]
mod tests;
