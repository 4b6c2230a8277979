//! The `RateLimit-Policy` field of a policy (draft-ietf-httpapi-ratelimit-headers-10 §3.1),
//! formatted once when the policy is built.

use std::time::Duration;

use http::HeaderValue;

/// The `RateLimit-Policy` field value of one policy, `"name";q=Q;w=W` (`w` omitted when
/// `None`: a limit with no time window, such as a concurrency limit), draft §3.1. The one
/// formatter of this field (see [`ratelimit_field`](crate::headers::ratelimit_field)). `None` only for a name that is not
/// header-safe.
pub fn policy_field(name: &str, quota: u64, window_secs: Option<u64>) -> Option<HeaderValue> {
    let field = match window_secs {
        Some(w) => format!("\"{name}\";q={quota};w={w}"),
        None => format!("\"{name}\";q={quota}"),
    };
    HeaderValue::from_str(&field).ok()
}

/// `"name";q=LIMIT;w=WINDOW_SECS` for a calendar quota.
pub(super) fn quota_header(name: &str, limit: u64, window_secs: u64) -> HeaderValue {
    policy_field(name, limit, Some(window_secs))
        .unwrap_or_else(|| HeaderValue::from_static("\"policy\""))
}

/// `"name";q=Q;w=W` (draft-ietf-httpapi-ratelimit-headers-10 §3.1).
///
/// `w` must be whole seconds. A whole-second period is advertised as configured
/// (`100 per 1s` → `q=100;w=1`); a sub-second or fractional one is widened to the next
/// whole second and `q` scaled down (rounded down), so the advertised quota is never more
/// than what is enforced (`10 per 100ms` → `q=100;w=1`).
pub(super) fn policy_header(name: &str, rate: u64, per: Duration) -> HeaderValue {
    let (q, w) = if per.subsec_nanos() == 0 {
        (u128::from(rate), u128::from(per.as_secs()))
    } else {
        let per_nanos = per.as_nanos();
        let w = per_nanos.div_ceil(1_000_000_000);
        (u128::from(rate) * w * 1_000_000_000 / per_nanos, w)
    };
    let saturate = |v: u128| u64::try_from(v).unwrap_or(u64::MAX);
    // The name is validated to a header-safe alphabet, so this cannot fail.
    policy_field(name, saturate(q), Some(saturate(w)))
        .unwrap_or_else(|| HeaderValue::from_static("\"policy\""))
}
