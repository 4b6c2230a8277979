//! Response headers as a pure function of a decision.
//!
//! | header | value | source |
//! |---|---|---|
//! | `X-RateLimit-Limit` | bucket capacity (burst), or the calendar quota | de-facto (GitHub, Kong) |
//! | `X-RateLimit-Remaining` | whole tokens (quota units) left | de-facto |
//! | `X-RateLimit-Reset` | Unix epoch seconds when the bucket is full again: ⌊now⌋ + ⌈time to full⌉, so within 1 s of that instant; ⌊now⌋ for a full bucket; exactly the window's end for a calendar quota | de-facto |
//! | `RateLimit-Policy` | `"tenant";q=100;w=1` | draft-ietf-httpapi-ratelimit-headers-10 |
//! | `RateLimit` | `"tenant";r=42;t=1`: `t` = seconds until more quota is available | same draft |
//! | `Retry-After` | whole seconds, rounded up, ≥ 1 (rejections only) | RFC 9110 |
//!
//! All fields describe **one** policy: the one that rejected the request (longest wait),
//! or on admission the most restrictive one (lowest `remaining / limit`), shadow policies
//! included. `X-RateLimit-Limit` is the burst so that `Remaining ≤ Limit` always holds;
//! `q`/`w` advertise the sustained rate as configured. With `burst > rate` a full bucket
//! therefore shows `r` above `q`, which the draft allows (`r` counts what can be sent now).
//!
//! `t` follows the draft's §4.1.2, "the number of seconds until additional quota […] is
//! made available" ([`Decision::t_secs`]), rounded like `Retry-After`:
//!
//! - a bucket that has room to refill: the wait for its **next** token (≤ 1 s on a 1/s
//!   bucket, whatever its burst), not for a full bucket, which is what `X-RateLimit-Reset`
//!   tells;
//! - a policy that refuses the request: the wait until it holds enough tokens for this
//!   request's cost, so on a 429 `t` **equals** `Retry-After` (the draft's §6: Retry-After
//!   SHOULD NOT point earlier than `t`);
//! - a calendar quota: the time until the window resets;
//! - a full bucket: `t` is omitted (the draft makes it optional and shows it absent when
//!   there is no reset to announce); no more quota can be made available.
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

/// Re-exported here, beside [`ratelimit_field`], for callers that format both fields.
pub use crate::policy::policy_field;

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
    if let Some(value) = ratelimit_field(policy.name(), decision.remaining, decision.t_secs()) {
        headers.insert(RATELIMIT, value);
    }
    if decision.blocks() {
        headers.insert(RETRY_AFTER, HeaderValue::from(decision.retry_after_secs()));
    }
}

/// The `RateLimit` field value of one policy, `"name";r=R;t=T` (`t` omitted when `None`),
/// draft-ietf-httpapi-ratelimit-headers-10 §4.1. The one formatter of this field: the
/// limiter's decisions and other limits that speak the draft (the gateway's concurrency
/// limit) go through it. `None` only for a name that is not header-safe.
pub fn ratelimit_field(name: &str, remaining: u64, t_secs: Option<u64>) -> Option<HeaderValue> {
    // Written on every limited response: bytes and `itoa`, not `format!`.
    let mut digits = itoa::Buffer::new();
    let mut field = Vec::with_capacity(name.len() + 48);
    field.push(b'"');
    field.extend_from_slice(name.as_bytes());
    field.extend_from_slice(b"\";r=");
    field.extend_from_slice(digits.format(remaining).as_bytes());
    if let Some(t) = t_secs {
        field.extend_from_slice(b";t=");
        field.extend_from_slice(digits.format(t).as_bytes());
    }
    HeaderValue::from_maybe_shared(bytes::Bytes::from(field)).ok()
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
mod tests;
