//! Responses the layer produces itself, as RFC 9457 `application/problem+json`.
//!
//! Each kind has a stable `type` URI (clients switch on it, never on `detail`), a status and,
//! where waiting helps, `Retry-After` plus a `retry_after` member in seconds.

use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderMap, Response, StatusCode};
use portcullis_problem::{retry_after_secs, Problem, TYPE_BASE};

use crate::key::KeyError;

/// A request the idempotency layer answers without forwarding it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Rejection {
    /// 400: the key is missing (on a route requiring it), repeated or malformed.
    InvalidKey(KeyError),
    /// 413: the body is larger than the layer may buffer to fingerprint it.
    BodyTooLarge {
        /// The buffering limit in bytes.
        limit: usize,
    },
    /// 409: another request with this key is still being processed.
    InFlight {
        /// Suggested wait before retrying.
        retry_after: Duration,
    },
    /// 409: the request already ran, but its response was too large to keep for replay.
    TooLargeToReplay {
        /// Status of the original response.
        status: StatusCode,
    },
    /// 422: the key was already used with a different request.
    Mismatch,
    /// 503: the idempotency store is unavailable; the request was not forwarded.
    StoreUnavailable {
        /// Suggested wait before retrying.
        retry_after: Duration,
    },
    /// 503: the bounded store holds as much as the caller's tenant may keep (or as much as
    /// it may keep at all); the request was not forwarded. Other tenants are unaffected.
    StoreFull {
        /// Suggested wait before retrying.
        retry_after: Duration,
    },
    /// 400: the request body could not be read (the client aborted or sent bad framing).
    BodyUnreadable,
    /// 413: a limit below this layer (the server's body limit) cut the body off while the
    /// layer read it: the same problem the server gives for an oversized body.
    BodyLimitExceeded,
    /// 502: the upstream call failed after the request may have been sent, so its outcome
    /// is unknown. Stored as the key's result and replayed: re-executing could duplicate.
    OutcomeUnknown,
    /// 502: an earlier request with this key took the lock and then stopped (its gateway
    /// crashed or was killed) before recording an outcome; it may have reached the upstream.
    /// Stored as the key's result: re-executing could duplicate.
    Interrupted,
    /// 500: the layer's own processing failed unexpectedly (e.g. a panicked task).
    Internal,
}

// === impl Rejection ===

impl Rejection {
    /// HTTP status of the response.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::InvalidKey(_) | Self::BodyUnreadable => StatusCode::BAD_REQUEST,
            Self::BodyTooLarge { .. } | Self::BodyLimitExceeded => StatusCode::PAYLOAD_TOO_LARGE,
            Self::InFlight { .. } | Self::TooLargeToReplay { .. } => StatusCode::CONFLICT,
            Self::Mismatch => StatusCode::UNPROCESSABLE_ENTITY,
            Self::StoreUnavailable { .. } | Self::StoreFull { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Self::OutcomeUnknown | Self::Interrupted => StatusCode::BAD_GATEWAY,
            Self::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The last segment of the problem `type` URI.
    pub fn problem_slug(&self) -> &'static str {
        match self {
            Self::InvalidKey(KeyError::Missing) => "idempotency-key-missing",
            Self::InvalidKey(_) => "idempotency-key-invalid",
            Self::BodyTooLarge { .. } => "idempotency-body-too-large",
            Self::InFlight { .. } => "idempotency-request-in-flight",
            Self::TooLargeToReplay { .. } => "idempotency-response-not-stored",
            Self::Mismatch => "idempotency-key-reused",
            Self::StoreUnavailable { .. } => "idempotency-store-unavailable",
            Self::StoreFull { .. } => "idempotency-store-full",
            Self::BodyUnreadable => "request-body-unreadable",
            Self::BodyLimitExceeded => "body-too-large",
            Self::OutcomeUnknown => "idempotency-outcome-unknown",
            Self::Interrupted => "idempotency-previous-attempt-interrupted",
            Self::Internal => "idempotency-internal-error",
        }
    }

    /// The stable problem `type` URI, e.g.
    /// `https://portcullis.dev/problems/idempotency-key-invalid`.
    pub fn problem_type(&self) -> String {
        format!("{TYPE_BASE}{}", self.problem_slug())
    }

    /// `Retry-After` in whole seconds (rounded up, at least 1), when waiting may help.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            Self::InFlight { retry_after }
            | Self::StoreUnavailable { retry_after }
            | Self::StoreFull { retry_after } => Some(retry_after_secs(*retry_after)),
            _ => None,
        }
    }

    fn title(&self) -> &'static str {
        match self {
            Self::InvalidKey(KeyError::Missing) => "Idempotency-Key required",
            Self::InvalidKey(_) => "Invalid Idempotency-Key",
            Self::BodyTooLarge { .. } => "Request body too large for an idempotent request",
            Self::InFlight { .. } => "Request with this Idempotency-Key is in progress",
            Self::TooLargeToReplay { .. } => "Response for this Idempotency-Key cannot be replayed",
            Self::Mismatch => "Idempotency-Key reused with a different request",
            Self::StoreUnavailable { .. } => "Idempotency store unavailable",
            Self::StoreFull { .. } => "Idempotency store full for this tenant",
            Self::BodyUnreadable => "Request body could not be read",
            Self::BodyLimitExceeded => "Request body too large",
            Self::OutcomeUnknown => "Upstream outcome unknown",
            Self::Interrupted => "Earlier attempt interrupted; outcome unknown",
            Self::Internal => "Internal error",
        }
    }

    fn detail(&self) -> String {
        match self {
            Self::InvalidKey(e) => format!(
                "{e}. Send one Idempotency-Key of 1 to the allowed number of visible ASCII \
                 characters, as a bare token or a quoted string; a UUID v4 per operation is \
                 recommended."
            ),
            Self::BodyTooLarge { limit } => {
                format!("Requests carrying an Idempotency-Key may have at most {limit} body bytes.")
            }
            Self::InFlight { .. } => "A request with this Idempotency-Key is still being \
                processed. Retry after the indicated time with the same key to get its result."
                .to_owned(),
            Self::TooLargeToReplay { status } => format!(
                "The request with this Idempotency-Key was already executed (status {}), but \
                 its response was too large to store, so it cannot be replayed. It will not \
                 be executed again; use a new key for a new operation.",
                status.as_u16()
            ),
            Self::Mismatch => "This Idempotency-Key was already used with a different method, \
                path, content type or body. Use a new key for a different request."
                .to_owned(),
            Self::StoreUnavailable { .. } => "The request was not forwarded because its \
                Idempotency-Key could not be recorded. Retry later with the same key."
                .to_owned(),
            Self::StoreFull { .. } => "The request was not forwarded because the \
                Idempotency-Key records this tenant may keep take all of its share of the \
                store until some of them expire. Retry later with the same key."
                .to_owned(),
            Self::BodyUnreadable => "The request body ended early or was malformed.".to_owned(),
            Self::BodyLimitExceeded => {
                "The request body exceeds the server's size limit.".to_owned()
            }
            Self::OutcomeUnknown => "The upstream failed after the request may have reached \
                it, so whether it was executed is unknown. This result is kept for the \
                Idempotency-Key so the request is not executed twice; check the resource's \
                state before retrying with a new key."
                .to_owned(),
            Self::Interrupted => "An earlier request with this Idempotency-Key was interrupted \
                after it may have reached the upstream: the gateway handling it stopped before \
                recording the outcome. It is not executed again, so it cannot happen twice; \
                check the resource's state before retrying with a new key."
                .to_owned(),
            Self::Internal => "The request could not be processed.".to_owned(),
        }
    }

    /// Builds the problem+json response.
    pub fn into_response(self) -> Response<Body> {
        self.problem().into_response()
    }

    /// Status, headers and body of the problem response (for storing it as well as sending).
    pub fn to_parts(&self) -> (StatusCode, HeaderMap, Bytes) {
        self.problem().to_parts()
    }

    fn problem(&self) -> Problem {
        let problem = Problem::new(
            self.status(),
            self.problem_slug(),
            self.title(),
            self.detail(),
        );
        let problem = match self.retry_after() {
            Some(secs) => problem.retry_after_whole_secs(secs),
            None => problem,
        };
        match self {
            // The rest of the body is never read: close after answering.
            Self::BodyTooLarge { .. } | Self::BodyLimitExceeded => problem.closing(),
            _ => problem,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    async fn json(r: Response<Body>) -> serde_json::Value {
        let bytes = r.into_body().collect().await.unwrap().to_bytes();
        serde_json::from_slice(&bytes).unwrap()
    }

    #[tokio::test]
    async fn in_flight_has_retry_after_header_and_member() {
        let r = Rejection::InFlight {
            retry_after: Duration::from_millis(1500),
        }
        .into_response();
        assert_eq!(r.status(), 409);
        assert_eq!(r.headers()["content-type"], "application/problem+json");
        assert_eq!(r.headers()["retry-after"], "2");
        let v = json(r).await;
        assert_eq!(
            v["type"],
            "https://portcullis.dev/problems/idempotency-request-in-flight"
        );
        assert_eq!(v["retry_after"], 2);
        assert_eq!(v["status"], 409);
    }

    #[test]
    fn statuses_and_rounding() {
        assert_eq!(Rejection::Mismatch.status(), 422);
        assert_eq!(Rejection::BodyLimitExceeded.status(), 413);
        assert_eq!(
            Rejection::BodyLimitExceeded.problem_type(),
            "https://portcullis.dev/problems/body-too-large",
            "the same problem the gateway gives for an oversized body"
        );
        assert_eq!(Rejection::InvalidKey(KeyError::Empty).status(), 400);
        assert_eq!(
            Rejection::TooLargeToReplay {
                status: StatusCode::OK
            }
            .status(),
            409
        );
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_secs(3)), 3);
        assert_eq!(retry_after_secs(Duration::from_millis(3001)), 4);
        assert!(Rejection::Mismatch.retry_after().is_none());
    }
}
