//! A token bucket table, `{ rate, per, burst, shadow }`: as written in the file, and checked
//! against the limiter's own bounds. Shared by `[rate_limit]`, tenants and routes.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::duration::HumanDuration;
use super::error::Issues;
use super::settings::Bucket;

/// A token bucket: `rate` tokens every `per`, holding at most `burst`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawBucket {
    /// Tokens added per period.
    pub rate: u64,
    /// The period.
    pub per: HumanDuration,
    /// Bucket capacity.
    pub burst: u64,
    /// Evaluate and emit headers but never reject.
    #[serde(default)]
    pub shadow: bool,
}

/// The validated bucket at `path`; every problem is pushed to `issues` with its field path.
pub(super) fn bucket(path: &str, raw: &RawBucket, issues: &mut Issues) -> Bucket {
    issues.range(format!("{path}.rate"), raw.rate, 1, u32::MAX as u64);
    issues.range(format!("{path}.burst"), raw.burst, 1, u32::MAX as u64);
    issues.duration_range(
        &format!("{path}.per"),
        raw.per.get(),
        Duration::from_millis(1),
        Duration::from_secs(366 * 86_400),
    );
    // The limiter's own limits (at most one token per nanosecond, a full refill within
    // 2^48 µs, or 2^52 ns above one token per µs): refused here rather than dropped with a warning at start-up.
    if raw.rate >= 1 && raw.burst >= 1 && !raw.per.get().is_zero() {
        if let Err(err) =
            portcullis_ratelimit::Policy::try_new("check", raw.rate, raw.per.get(), raw.burst)
        {
            issues.push(
                path.to_owned(),
                format!(
                    "= {{ rate = {}, per = {}, burst = {} }}: {err}",
                    raw.rate, raw.per, raw.burst
                ),
            );
        }
    }
    Bucket {
        rate: raw.rate,
        per: raw.per.get(),
        burst: raw.burst,
        shadow: raw.shadow,
    }
}
