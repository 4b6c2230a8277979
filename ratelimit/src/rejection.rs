//! The responses this layer answers with instead of calling the service: RFC 9457
//! problem+json 429 (quota exceeded) and 503 (store unavailable, fail closed).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::IntoResponse;
use http::{Response, StatusCode};
use portcullis_problem::{retry_after_secs, Problem};

use crate::decision::Decision;
use crate::headers::write_headers;
use crate::period::rfc3339;
use crate::policy::Policy;

/// `type` of a 429: the "quota-exceeded" problem type that
/// draft-ietf-httpapi-ratelimit-headers-10 (§5.1) asks IANA to register.
pub const QUOTA_EXCEEDED_TYPE: &str =
    "https://iana.org/assignments/http-problem-types#quota-exceeded";
/// `type` of the 503 answered when the store is unavailable and the policy fails closed.
pub const STORE_UNAVAILABLE_TYPE: &str =
    "https://portcullis.dev/problems/rate-limit-store-unavailable";
/// `application/problem+json`.
pub use portcullis_problem::CONTENT_TYPE as PROBLEM_JSON;

/// A request the layer refuses, and everything needed to tell the client what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Rejection {
    /// 429: a policy has no capacity for this request.
    RateLimited {
        /// The violated policy with the longest wait: the one `Retry-After`, the headers and
        /// the `policy` member describe.
        policy: Arc<Policy>,
        /// Its decision.
        decision: Decision,
        /// Names of every enforced policy that refused the request, in check order, each
        /// once: the draft's `violated-policies` member. Empty reads as `[policy]`.
        violated_policies: Vec<String>,
        /// Wall-clock time of the decision, for `reset`.
        unix_now: Duration,
    },
    /// 503: the shared store cannot decide and the request's policy fails closed.
    StoreUnavailable {
        /// When to try again.
        retry_after: Duration,
    },
}

const RETRY_HOW: &str = "If the retry fails too, back off exponentially with random jitter \
     instead of retrying in a loop, and send the same Idempotency-Key on every retry so the \
     request is never executed twice.";

// === impl Rejection ===

impl Rejection {
    /// HTTP status: 429 or 503.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::StoreUnavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// `Retry-After` in whole seconds, rounded up, at least 1.
    pub fn retry_after(&self) -> u64 {
        match self {
            Self::RateLimited { decision, .. } => decision.retry_after_secs(),
            Self::StoreUnavailable { retry_after } => retry_after_secs(*retry_after),
        }
    }

    /// The problem `type` URI.
    pub fn problem_type(&self) -> &'static str {
        match self {
            Self::RateLimited { .. } => QUOTA_EXCEEDED_TYPE,
            Self::StoreUnavailable { .. } => STORE_UNAVAILABLE_TYPE,
        }
    }

    /// The problem+json response, with `Retry-After` (and, for 429, the rate-limit headers).
    pub fn to_response(&self) -> Response<Body> {
        let retry_after = self.retry_after();
        let problem = match self {
            Self::RateLimited {
                policy,
                decision,
                violated_policies,
                unix_now,
            } => {
                let violated: Vec<&str> = if violated_policies.is_empty() {
                    vec![policy.name()]
                } else {
                    violated_policies.iter().map(String::as_str).collect()
                };
                let reset = unix_now.as_secs() + decision.reset_after_secs();
                let detail = match policy.period() {
                    None => format!(
                        "Rate limit policy \"{}\" ({} per {:?}, bursts up to {}) has no \
                         capacity left for this request. Wait {retry_after} s (Retry-After) \
                         before retrying. {RETRY_HOW}",
                        policy.name(),
                        policy.rate(),
                        policy.per(),
                        policy.burst(),
                    ),
                    Some(period) => format!(
                        "Quota \"{}\" ({} per UTC calendar {period}) has {} left, not enough \
                         for this request. It resets at {} (in {retry_after} s, Retry-After). \
                         {RETRY_HOW}",
                        policy.name(),
                        policy.burst(),
                        decision.remaining,
                        rfc3339(reset),
                    ),
                };
                let problem = Problem::with_type(
                    self.status(),
                    QUOTA_EXCEEDED_TYPE,
                    "Request cannot be satisfied as assigned quota has been exceeded",
                    detail,
                )
                // `policy` is kept beside the draft's `violated-policies` for clients
                // written before it.
                .with("policy", policy.name())
                .with("violated-policies", violated)
                .with("limit", decision.limit)
                .with("remaining", decision.remaining)
                .with("reset", reset);
                match policy.period() {
                    Some(period) => problem.with("period", period.as_str()),
                    None => problem,
                }
            }
            Self::StoreUnavailable { .. } => Problem::with_type(
                self.status(),
                STORE_UNAVAILABLE_TYPE,
                "Rate limiting is temporarily unavailable",
                format!(
                    "The rate-limit store cannot be reached and this request's policy fails \
                     closed. Wait {retry_after} s (Retry-After) before retrying. {RETRY_HOW}"
                ),
            ),
        };
        let mut response = problem.retry_after_whole_secs(retry_after).into_response();
        if let Self::RateLimited {
            policy,
            decision,
            unix_now,
            ..
        } = self
        {
            write_headers(response.headers_mut(), policy, decision, *unix_now);
        }
        response
    }
}

impl IntoResponse for Rejection {
    fn into_response(self) -> axum::response::Response {
        self.to_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::{CONTENT_TYPE, RETRY_AFTER};

    #[tokio::test]
    async fn quota_exceeded_problem() {
        let policy = Policy::try_new("tenant", 100, Duration::from_secs(1), 200).unwrap();
        let decision = Decision {
            allowed: false,
            shadow: false,
            limit: 200,
            remaining: 0,
            reset_after: Duration::from_millis(1_990),
            refill_after: Some(Duration::from_millis(10)),
            retry_after: Duration::from_millis(10),
        };
        let rejection = Rejection::RateLimited {
            policy: Arc::new(policy),
            decision,
            violated_policies: vec!["tenant".into(), "daily_quota".into()],
            unix_now: Duration::from_secs(1_700_000_000),
        };
        let response = rejection.to_response();
        assert_eq!(response.status(), 429);
        assert_eq!(response.headers()[CONTENT_TYPE], PROBLEM_JSON);
        assert_eq!(response.headers()[RETRY_AFTER], "1");
        // The violated policy's t is the Retry-After moment, not the 2 s to a full bucket.
        assert_eq!(
            response.headers()[crate::headers::RATELIMIT],
            "\"tenant\";r=0;t=1"
        );
        let body = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap();
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["type"], QUOTA_EXCEEDED_TYPE);
        assert_eq!(json["status"], 429);
        assert_eq!(json["policy"], "tenant");
        assert_eq!(
            json["violated-policies"],
            serde_json::json!(["tenant", "daily_quota"])
        );
        assert_eq!(json["limit"], 200);
        assert_eq!(json["remaining"], 0);
        assert_eq!(json["reset"], 1_700_000_002u64);
        assert_eq!(json["retry_after"], 1);
        let detail = json["detail"].as_str().unwrap();
        assert!(detail.contains("Retry-After") && detail.contains("jitter"));
        assert!(detail.contains("Idempotency-Key"));
    }

    #[tokio::test]
    async fn calendar_quota_problem_says_when_it_resets() {
        let policy = Policy::calendar("daily_quota", 1000, crate::Period::Day).unwrap();
        let decision = Decision {
            allowed: false,
            shadow: false,
            limit: 1000,
            remaining: 0,
            reset_after: Duration::from_secs(60),
            refill_after: Some(Duration::from_secs(60)),
            retry_after: Duration::from_secs(60),
        };
        let rejection = Rejection::RateLimited {
            policy: Arc::new(policy),
            decision,
            violated_policies: Vec::new(),
            // 2026-11-21T23:59:00Z
            unix_now: Duration::from_secs(1_795_305_540),
        };
        let response = rejection.to_response();
        assert_eq!(response.headers()[RETRY_AFTER], "60");
        let body = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap();
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["policy"], "daily_quota");
        assert_eq!(
            json["violated-policies"],
            serde_json::json!(["daily_quota"]),
            "an empty list reads as the reported policy"
        );
        assert_eq!(json["period"], "day");
        assert_eq!(json["reset"], 1_795_305_600u64);
        assert_eq!(json["retry_after"], 60);
        let detail = json["detail"].as_str().unwrap();
        assert!(
            detail.contains("\"daily_quota\" (1000 per UTC calendar day)"),
            "{detail}"
        );
        assert!(
            detail.contains("resets at 2026-11-22T00:00:00Z"),
            "{detail}"
        );
    }

    #[test]
    fn store_unavailable_problem() {
        let r = Rejection::StoreUnavailable {
            retry_after: Duration::from_millis(200),
        };
        assert_eq!(r.status(), 503);
        assert_eq!(r.retry_after(), 1);
        let response = r.to_response();
        assert_eq!(response.headers()[RETRY_AFTER], "1");
        assert_eq!(response.headers()[CONTENT_TYPE], PROBLEM_JSON);
    }
}
