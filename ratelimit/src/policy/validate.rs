//! Building a policy: the limits every backend computes exactly within, the validation of
//! each field against them, and the values computed once for every decision.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use super::header::{policy_header, quota_header};
use super::{Policy, PolicyError};
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
}

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
