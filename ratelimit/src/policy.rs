//! A rate-limit policy: `rate` per `per`, with a bucket of `burst` tokens.
//!
//! A policy is a value built once (from configuration or the admin API) and shared as an
//! `Arc<Policy>` by every request it applies to. Everything a decision needs that can be
//! computed ahead of time is computed in [`Policy::try_new`]: the emission interval in
//! nanoseconds (local backend) and microseconds (Redis backend) and the `RateLimit-Policy`
//! header value, so the per-request path does no division by `rate` and no formatting.
//!
//! Accuracy: the emission interval is `per / rate` rounded **up** to the tick (1 ns locally,
//! 1 µs on Redis). Rounding up can only make the limiter stricter, by less than one tick per
//! token: for 50 000/s on Redis (20 µs per token) that is exact; for 3/s locally it is
//! 333 333 334 ns instead of 333 333 333.3 ns, 1 part in 10⁹.

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http::HeaderValue;

use crate::limiter::FailMode;
use crate::metrics::PolicyMetrics;

/// Largest bucket, as the time to refill it from empty: 2^48 µs (about 8.9 years).
///
/// The Redis script computes in Lua numbers (IEEE doubles), exact for integers below 2^53
/// µs; Unix time now is about 2^50.6 µs, so TATs up to 2^48 µs ahead stay exact for two
/// centuries. A yearly quota still fits.
const MAX_REFILL_MICROS: u128 = 1 << 48;

/// A validated rate-limit policy.
///
/// Build with [`Policy::try_new`], then optionally [`Policy::with_shadow`] and
/// [`Policy::with_on_store_error`].
#[derive(Clone)]
pub struct Policy {
    name: Arc<str>,
    rate: u64,
    per: Duration,
    burst: u64,
    shadow: bool,
    on_store_error: Option<FailMode>,
    interval_nanos: u64,
    interval_micros: u64,
    header: HeaderValue,
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
    /// More than one token per microsecond: the Redis backend keeps microseconds.
    #[error("rate {rate} per {per:?} is more than one per microsecond (1 000 000/s)")]
    RateTooHigh {
        /// The refused rate.
        rate: u64,
        /// Its period.
        per: Duration,
    },
    /// Refilling a full bucket would take longer than about 8.9 years (2^48 µs).
    #[error("burst {burst} at {rate} per {per:?} takes too long to refill (max 2^48 µs)")]
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
        let name: String = name.into();
        let name_ok = !name.is_empty()
            && name.len() <= 64
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._:/-".contains(&b));
        if !name_ok {
            return Err(PolicyError::InvalidName(name));
        }
        if rate == 0 {
            return Err(PolicyError::ZeroRate);
        }
        if burst == 0 {
            return Err(PolicyError::ZeroBurst);
        }
        if per.is_zero() {
            return Err(PolicyError::ZeroPeriod);
        }
        let interval_micros = div_ceil(per.as_nanos(), u128::from(rate) * 1_000);
        if u128::from(rate) > per.as_micros() {
            return Err(PolicyError::RateTooHigh { rate, per });
        }
        if interval_micros * u128::from(burst) > MAX_REFILL_MICROS {
            return Err(PolicyError::RefillTooLong { burst, rate, per });
        }
        let interval_nanos = div_ceil(per.as_nanos(), u128::from(rate));
        // Both fit: interval_micros × burst ≤ 2^48, so interval_nanos < 2^58.
        let interval_nanos = u64::try_from(interval_nanos).unwrap_or(u64::MAX);
        let interval_micros = u64::try_from(interval_micros).unwrap_or(u64::MAX);
        let header = policy_header(&name, rate, per);
        Ok(Self {
            name: name.into(),
            rate,
            per,
            burst,
            shadow: false,
            on_store_error: None,
            interval_nanos,
            interval_micros,
            header,
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

    /// Bucket capacity: the most tokens a client can spend at once.
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// Whether this policy only observes (never rejects).
    pub fn is_shadow(&self) -> bool {
        self.shadow
    }

    /// This policy's own store-error mode, if it overrides the wrapper's.
    pub fn on_store_error(&self) -> Option<FailMode> {
        self.on_store_error
    }

    /// The `RateLimit-Policy` field value for this policy, e.g. `"tenant";q=100;w=1`.
    pub fn header_value(&self) -> &HeaderValue {
        &self.header
    }

    /// Emission interval (time per token) in nanoseconds, rounded up.
    pub fn interval_nanos(&self) -> u64 {
        self.interval_nanos
    }

    /// Emission interval (time per token) in microseconds, rounded up.
    pub fn interval_micros(&self) -> u64 {
        self.interval_micros
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
            self.shadow,
            self.on_store_error,
        ) == (
            &other.name,
            other.rate,
            other.per,
            other.burst,
            other.shadow,
            other.on_store_error,
        )
    }
}

impl Eq for Policy {}

fn div_ceil(a: u128, b: u128) -> u128 {
    a.div_ceil(b)
}

/// `"name";q=Q;w=W` (draft-ietf-httpapi-ratelimit-headers-10 §5.1).
///
/// `w` must be whole seconds. A whole-second period is advertised as configured
/// (`100 per 1s` → `q=100;w=1`); a sub-second or fractional one is widened to the next
/// whole second and `q` scaled down (rounded down), so the advertised quota is never more
/// than what is enforced (`10 per 100ms` → `q=100;w=1`).
fn policy_header(name: &str, rate: u64, per: Duration) -> HeaderValue {
    let (q, w) = if per.subsec_nanos() == 0 {
        (u128::from(rate), u128::from(per.as_secs()))
    } else {
        let per_nanos = per.as_nanos();
        let w = per_nanos.div_ceil(1_000_000_000);
        (u128::from(rate) * w * 1_000_000_000 / per_nanos, w)
    };
    let value = format!("\"{name}\";q={q};w={w}");
    // The name is validated to a header-safe alphabet, so this cannot fail.
    HeaderValue::from_str(&value).unwrap_or_else(|_| HeaderValue::from_static("\"policy\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn validates_fields() {
        assert_eq!(
            Policy::try_new("t", 0, secs(1), 1),
            Err(PolicyError::ZeroRate)
        );
        assert_eq!(
            Policy::try_new("t", 1, secs(1), 0),
            Err(PolicyError::ZeroBurst)
        );
        assert_eq!(
            Policy::try_new("t", 1, Duration::ZERO, 1),
            Err(PolicyError::ZeroPeriod)
        );
        assert!(matches!(
            Policy::try_new("", 1, secs(1), 1),
            Err(PolicyError::InvalidName(_))
        ));
        assert!(matches!(
            Policy::try_new("a\"b", 1, secs(1), 1),
            Err(PolicyError::InvalidName(_))
        ));
        assert!(matches!(
            Policy::try_new("t", 2_000_000, secs(1), 1),
            Err(PolicyError::RateTooHigh { .. })
        ));
        assert!(matches!(
            Policy::try_new("t", 1, secs(86_400), u64::MAX / 2),
            Err(PolicyError::RefillTooLong { .. })
        ));
        assert!(Policy::try_new("route:/orders", 1_000_000, secs(1), 1).is_ok());
    }

    #[test]
    fn interval_rounds_up() {
        let p = Policy::try_new("t", 3, secs(1), 1).unwrap();
        assert_eq!(p.interval_nanos(), 333_333_334);
        assert_eq!(p.interval_micros(), 333_334);
        let p = Policy::try_new("t", 50_000, secs(1), 1).unwrap();
        assert_eq!(p.interval_micros(), 20);
    }

    #[test]
    fn header_value_matches_the_draft() {
        let p = Policy::try_new("tenant", 100, secs(1), 200).unwrap();
        assert_eq!(p.header_value(), "\"tenant\";q=100;w=1");
        let p = Policy::try_new("ip", 10, Duration::from_millis(100), 20).unwrap();
        assert_eq!(p.header_value(), "\"ip\";q=100;w=1");
        let p = Policy::try_new("day", 1000, secs(86_400), 1000).unwrap();
        assert_eq!(p.header_value(), "\"day\";q=1000;w=86400");
        let p = Policy::try_new("odd", 3, Duration::from_millis(1500), 3).unwrap();
        assert_eq!(p.header_value(), "\"odd\";q=4;w=2");
    }
}
