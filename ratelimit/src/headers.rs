//! Response headers as a pure function of a decision.
//!
//! | header | value | source |
//! |---|---|---|
//! | `X-RateLimit-Limit` | bucket capacity (burst) | de-facto (GitHub, Kong) |
//! | `X-RateLimit-Remaining` | whole tokens left | de-facto |
//! | `X-RateLimit-Reset` | Unix epoch seconds when the bucket is full again | de-facto |
//! | `RateLimit-Policy` | `"tenant";q=100;w=1` | draft-ietf-httpapi-ratelimit-headers-10 |
//! | `RateLimit` | `"tenant";r=42;t=3` | same draft |
//! | `Retry-After` | whole seconds, rounded up, ≥ 1 (rejections only) | RFC 9110 |
//!
//! All fields describe **one** policy: the one that rejected the request (longest wait),
//! or on admission the most restrictive one (lowest `remaining / limit`), shadow policies
//! included. `X-RateLimit-Limit` is the burst so that `Remaining ≤ Limit` always holds;
//! `q`/`w` advertise the sustained rate as configured. With `burst > rate` a full bucket
//! therefore shows `r` above `q`, which the draft allows (`r` counts what can be sent now).
//! `X-RateLimit-Reset` and `t` are computed from the same rounded-up second count, so
//! `Reset − now == t` exactly, with `now` the whole Unix second the response was made in.
//!
//! A calendar quota reports the same fields: `Limit` = the quota, `Remaining` = quota − used,
//! `Reset` = the end of the window (next 00:00 UTC, or the 1st of next month), `q` = the
//! quota and `w` = the window length in seconds, for a month the length of the current one
//! ([`Policy::header_value_at`]).

use std::time::Duration;

use http::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};

use crate::decision::{Decision, Verdict};
use crate::limiter::Check;
use crate::policy::Policy;

/// `X-RateLimit-Limit`.
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining`.
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Reset`.
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
/// `RateLimit-Policy` (draft-ietf-httpapi-ratelimit-headers-10).
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit` (draft-ietf-httpapi-ratelimit-headers-10).
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// Writes the rate-limit headers for `decision` of `policy` into `headers`, replacing any
/// already there (an upstream's own `X-RateLimit-*` would contradict the gateway's).
///
/// `unix_now` is the wall-clock time of the response. `Retry-After` is written only when
/// the decision blocks the request.
pub fn write_headers(
    headers: &mut HeaderMap,
    policy: &Policy,
    decision: &Decision,
    unix_now: Duration,
) {
    let reset_secs = decision.reset_after_secs();
    headers.insert(X_RATELIMIT_LIMIT, HeaderValue::from(decision.limit));
    headers.insert(X_RATELIMIT_REMAINING, HeaderValue::from(decision.remaining));
    headers.insert(
        X_RATELIMIT_RESET,
        HeaderValue::from(unix_now.as_secs().saturating_add(reset_secs)),
    );
    headers.insert(RATELIMIT_POLICY, policy.header_value_at(unix_now).clone());
    let field = format!(
        "\"{}\";r={};t={}",
        policy.name(),
        decision.remaining,
        reset_secs
    );
    if let Ok(value) = HeaderValue::from_str(&field) {
        headers.insert(RATELIMIT, value);
    }
    if decision.blocks() {
        headers.insert(RETRY_AFTER, HeaderValue::from(decision.retry_after_secs()));
    }
}

/// Writes the headers for the decision of `verdict` that should be reported (see
/// [`Verdict::reported`]); `checks` are the checks the verdict answers. Returns the index of
/// the reported check, if any.
pub fn write_verdict_headers(
    headers: &mut HeaderMap,
    checks: &[Check],
    verdict: &Verdict,
    unix_now: Duration,
) -> Option<usize> {
    let index = verdict.reported()?;
    let (check, decision) = (checks.get(index)?, verdict.decisions().get(index)?);
    write_headers(headers, &check.policy, decision, unix_now);
    Some(index)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(allowed: bool, remaining: u64, reset_ms: u64, retry_ms: u64) -> Decision {
        Decision {
            allowed,
            shadow: false,
            limit: 200,
            remaining,
            reset_after: Duration::from_millis(reset_ms),
            retry_after: Duration::from_millis(retry_ms),
        }
    }

    #[test]
    fn admitted_headers() {
        let p = Policy::try_new("tenant", 100, Duration::from_secs(1), 200).unwrap();
        let mut h = HeaderMap::new();
        let now = Duration::from_millis(1_700_000_000_400);
        write_headers(&mut h, &p, &decision(true, 42, 2_500, 0), now);
        assert_eq!(h[X_RATELIMIT_LIMIT], "200");
        assert_eq!(h[X_RATELIMIT_REMAINING], "42");
        assert_eq!(h[X_RATELIMIT_RESET], "1700000003");
        assert_eq!(h[RATELIMIT_POLICY], "\"tenant\";q=100;w=1");
        assert_eq!(h[RATELIMIT], "\"tenant\";r=42;t=3");
        assert!(!h.contains_key(RETRY_AFTER));
    }

    #[test]
    fn rejected_headers_carry_retry_after() {
        let p = Policy::try_new("ip", 10, Duration::from_secs(1), 20).unwrap();
        let mut h = HeaderMap::new();
        write_headers(
            &mut h,
            &p,
            &decision(false, 0, 2_000, 100),
            Duration::from_secs(10),
        );
        assert_eq!(h[RETRY_AFTER], "1");
        assert_eq!(h[X_RATELIMIT_REMAINING], "0");
        assert_eq!(h[X_RATELIMIT_RESET], "12");
        assert_eq!(h[RATELIMIT], "\"ip\";r=0;t=2");
    }

    #[test]
    fn calendar_quota_headers_point_at_the_window_end() {
        // 2026-11-21T23:59:00.400Z: 59.6 s to midnight.
        let now = Duration::from_millis(1_795_305_540_400);
        let until_midnight = Duration::from_millis(59_600);
        let p = Policy::calendar("daily_quota", 1000, crate::Period::Day).unwrap();
        let d = Decision {
            allowed: false,
            shadow: false,
            limit: 1000,
            remaining: 0,
            reset_after: until_midnight,
            retry_after: until_midnight,
        };
        let mut h = HeaderMap::new();
        write_headers(&mut h, &p, &d, now);
        assert_eq!(h[RETRY_AFTER], "60");
        assert_eq!(h[X_RATELIMIT_LIMIT], "1000");
        assert_eq!(h[X_RATELIMIT_RESET], "1795305600");
        assert_eq!(h[RATELIMIT_POLICY], "\"daily_quota\";q=1000;w=86400");
        assert_eq!(h[RATELIMIT], "\"daily_quota\";r=0;t=60");
        let p = Policy::calendar("monthly_quota", 9, crate::Period::Month).unwrap();
        write_headers(&mut h, &p, &d, now);
        assert_eq!(h[RATELIMIT_POLICY], "\"monthly_quota\";q=9;w=2592000");
    }
}
