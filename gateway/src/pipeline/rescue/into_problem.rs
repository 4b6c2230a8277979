//! [`IntoProblem`]: which problem+json each error from the upstream side becomes.

use http::StatusCode;

use crate::upstream::proxy::{ProxyError, ProxyErrorKind};
use portcullis_problem::Problem;
use portcullis_retry::RetryError;

/// Errors that know which problem they are.
pub trait IntoProblem: std::error::Error {
    /// The client-facing problem; internals stay in the log.
    fn problem(&self) -> Problem;

    /// Whether the request provably never reached the backend (the idempotency layer then
    /// releases the key instead of storing this answer).
    fn provably_unprocessed(&self) -> bool;

    /// Whether the client caused the failure (its own body): logged as a client error,
    /// not as an upstream failure.
    fn is_client_fault(&self) -> bool;
}

impl IntoProblem for RetryError<ProxyError> {
    fn provably_unprocessed(&self) -> bool {
        self.is_provably_unprocessed()
    }

    fn is_client_fault(&self) -> bool {
        match self {
            RetryError::Upstream(err) => err.is_client_fault(),
            RetryError::RequestBody(_) => true,
            _ => false,
        }
    }

    /// The one mapping of retry-layer errors to what clients receive; the upstream's own
    /// failures are the proxy's (below), so a connect timeout is a 502 like a refusal.
    fn problem(&self) -> Problem {
        match self {
            RetryError::Upstream(err) => err.problem(),
            RetryError::AttemptTimeout { after } => Problem::new(
                StatusCode::GATEWAY_TIMEOUT,
                "upstream-timeout",
                "Upstream response timed out",
                format!(
                    "the upstream sent no response within {} ms; the backend may have processed the request",
                    after.as_millis()
                ),
            ),
            RetryError::DeadlineExceeded => Problem::new(
                StatusCode::GATEWAY_TIMEOUT,
                "upstream-timeout",
                "Request deadline exceeded",
                "the request's deadline (X-Request-Deadline or the route's total) passed before it could be sent",
            ),
            RetryError::BreakerOpen { retry_after } => Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "circuit-open",
                "Upstream temporarily unavailable",
                "the upstream is failing and its circuit breaker is open; the request was not sent. Retry after the indicated delay with backoff and jitter",
            )
            .retry_after(*retry_after),
            RetryError::Throttled { retry_after, rate } => Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "upstream-throttled",
                "Upstream at its learned capacity",
                "the upstream has been answering 429/503 and the gateway holds requests to the rate it accepts; this one was not sent. Retry after the indicated delay with backoff and jitter",
            )
            .with("rate", (rate * 10.0).round() / 10.0)
            .retry_after(*retry_after),
            RetryError::RequestBody(err) => request_body_problem(err),
            // A kind added to the retry crate later: logged, answered without internals.
            _ => Problem::internal(),
        }
    }
}

/// The problem for a client's request body that failed while the gateway read it whole
/// (the retry layer for replay, `pipeline::buffer` before the upstream is contacted):
/// 413 over `server.max_body_bytes`, 408 past `server.body_read_timeout`, else 400.
pub(crate) fn request_body_problem(err: &(dyn std::error::Error + 'static)) -> Problem {
    match crate::edge::limits::body_too_large(err) {
        Some(too_large) => Problem::body_too_large(too_large.limit),
        None if crate::edge::body_timeout::is_body_timeout(err) => Problem::new(
            StatusCode::REQUEST_TIMEOUT,
            "body-timeout",
            "Request body timed out",
            "the request body did not arrive within the gateway's time limit",
        ),
        None => Problem::new(
            StatusCode::BAD_REQUEST,
            "bad-request-body",
            "Request body could not be read",
            "the request body could not be read",
        ),
    }
}

impl IntoProblem for ProxyError {
    fn provably_unprocessed(&self) -> bool {
        self.is_provably_unprocessed()
    }

    fn is_client_fault(&self) -> bool {
        ProxyError::is_client_fault(self)
    }

    fn problem(&self) -> Problem {
        let endpoint_note = "the request was not processed by the backend";
        match self.kind() {
            ProxyErrorKind::ConnectRefused | ProxyErrorKind::ConnectTimeout | ProxyErrorKind::Dns => Problem::new(
                StatusCode::BAD_GATEWAY,
                "upstream-unreachable",
                "Upstream unreachable",
                format!("the gateway could not connect to the upstream; {endpoint_note}"),
            ),
            ProxyErrorKind::TlsHandshakeTimeout => Problem::new(
                StatusCode::GATEWAY_TIMEOUT,
                "upstream-timeout",
                "Upstream TLS handshake timed out",
                format!("the TLS handshake with the upstream did not finish in time; {endpoint_note}"),
            ),
            ProxyErrorKind::TlsHandshake => Problem::new(
                StatusCode::BAD_GATEWAY,
                "upstream-unreachable",
                "Upstream TLS handshake failed",
                format!("the TLS handshake with the upstream failed; {endpoint_note}"),
            ),
            ProxyErrorKind::TlsCertificate => {
                let reason = self.certificate_reason().unwrap_or_else(|| "unknown".to_owned());
                Problem::new(
                    StatusCode::BAD_GATEWAY,
                    "upstream-certificate",
                    "Upstream certificate rejected",
                    format!("upstream certificate rejected: {reason}. Certificate errors are never retried: they may be an attack or a misconfiguration"),
                )
                .with("reason", reason)
            }
            ProxyErrorKind::ResetAfterSent => Problem::new(
                StatusCode::BAD_GATEWAY,
                "upstream-failed",
                "Upstream connection failed",
                "the connection to the upstream failed after the request was sent; the backend may have processed it",
            ),
            ProxyErrorKind::BodyTooLarge => match self.body_limit() {
                Some(limit) => Problem::body_too_large(limit),
                None => Problem::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "body-too-large",
                    "Request body too large",
                    "the streamed request body exceeded the gateway's limit",
                ),
            },
            ProxyErrorKind::BodyTimeout => Problem::new(
                StatusCode::REQUEST_TIMEOUT,
                "body-timeout",
                "Request body timed out",
                "the request body did not arrive within the gateway's time limit",
            ),
            ProxyErrorKind::BadClientBody => Problem::new(
                StatusCode::BAD_REQUEST,
                "bad-request-body",
                "Malformed request body",
                "the request body was malformed or ended early; the backend may have received part of it",
            ),
            ProxyErrorKind::NoRoute => Problem::internal(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http_body_util::BodyExt;

    use super::*;

    type E = RetryError<ProxyError>;

    fn upstream(kind: ProxyErrorKind) -> E {
        RetryError::Upstream(ProxyError::new(kind, Some(0)))
    }

    /// The response a client receives for `err`, as `Rescue` builds it.
    async fn answer(err: E) -> (StatusCode, serde_json::Value, bool) {
        let unprocessed = err.provably_unprocessed();
        let response = err.problem().into_response();
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        let json = serde_json::from_slice(&body).expect("problem+json");
        (status, json, unprocessed)
    }

    /// The one mapping from retry-layer errors to what clients receive: status, problem
    /// type, and whether the idempotency key is released (`NotForwarded`).
    #[tokio::test]
    async fn retry_errors_map_to_the_problems_clients_receive() {
        let cases: Vec<(E, u16, &str, bool)> = vec![
            (
                upstream(ProxyErrorKind::ConnectRefused),
                502,
                "upstream-unreachable",
                true,
            ),
            // A connect timeout is "could not connect", like a refusal: 502, not 504.
            (
                upstream(ProxyErrorKind::ConnectTimeout),
                502,
                "upstream-unreachable",
                true,
            ),
            (
                upstream(ProxyErrorKind::Dns),
                502,
                "upstream-unreachable",
                true,
            ),
            (
                upstream(ProxyErrorKind::TlsHandshakeTimeout),
                504,
                "upstream-timeout",
                true,
            ),
            (
                upstream(ProxyErrorKind::TlsHandshake),
                502,
                "upstream-unreachable",
                true,
            ),
            (
                upstream(ProxyErrorKind::TlsCertificate),
                502,
                "upstream-certificate",
                true,
            ),
            (
                upstream(ProxyErrorKind::ResetAfterSent),
                502,
                "upstream-failed",
                false,
            ),
            (
                upstream(ProxyErrorKind::BodyTimeout),
                408,
                "body-timeout",
                false,
            ),
            (
                upstream(ProxyErrorKind::BadClientBody),
                400,
                "bad-request-body",
                false,
            ),
            (
                RetryError::AttemptTimeout {
                    after: Duration::from_secs(5),
                },
                504,
                "upstream-timeout",
                false,
            ),
            (RetryError::DeadlineExceeded, 504, "upstream-timeout", true),
            (
                RetryError::BreakerOpen {
                    retry_after: Duration::from_millis(2500),
                },
                503,
                "circuit-open",
                true,
            ),
            (
                RetryError::Throttled {
                    retry_after: Duration::from_millis(20),
                    rate: 49.96,
                },
                503,
                "upstream-throttled",
                true,
            ),
            (
                RetryError::RequestBody(axum::Error::new(crate::edge::body_timeout::BodyTimeout(
                    Duration::from_secs(10),
                ))),
                408,
                "body-timeout",
                true,
            ),
            (
                RetryError::RequestBody(axum::Error::new(std::io::Error::other("reset"))),
                400,
                "bad-request-body",
                true,
            ),
        ];
        for (err, code, slug, unprocessed) in cases {
            let what = format!("{err:?}");
            let (status, json, released) = answer(err).await;
            assert_eq!(status.as_u16(), code, "{what}");
            assert_eq!(json["status"], code, "{what}");
            assert_eq!(
                json["type"],
                format!("{}{slug}", portcullis_problem::TYPE_BASE),
                "{what}"
            );
            assert!(
                json["title"].as_str().is_some_and(|t| !t.is_empty()),
                "{what}"
            );
            assert_eq!(released, unprocessed, "{what}");
        }
    }

    #[tokio::test]
    async fn an_open_breaker_tells_the_client_when_to_come_back() {
        let err: E = RetryError::BreakerOpen {
            retry_after: Duration::from_millis(2500),
        };
        let response = err.problem().into_response();
        assert_eq!(response.headers()[http::header::RETRY_AFTER], "3");
    }

    #[tokio::test]
    async fn a_throttled_request_says_when_to_come_back_and_the_rate() {
        let err: E = RetryError::Throttled {
            retry_after: Duration::from_millis(20),
            rate: 49.96,
        };
        let (_, json, _) = answer(err).await;
        assert_eq!(json["rate"], 50.0);
        let err: E = RetryError::Throttled {
            retry_after: Duration::from_millis(20),
            rate: 49.96,
        };
        // Whole seconds, never 0 (sub-second waits round up).
        assert_eq!(
            err.problem().into_response().headers()[http::header::RETRY_AFTER],
            "1"
        );
    }
}
