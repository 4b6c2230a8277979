//! [`PolicyError`]: why a policy's fields were refused.

use std::time::Duration;

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
    /// A calendar quota above [`MAX_QUOTA`](super::MAX_QUOTA) (2^48) per window.
    #[error("quota limit {0} is above the maximum of 2^48 per window")]
    QuotaTooLarge(u64),
}
