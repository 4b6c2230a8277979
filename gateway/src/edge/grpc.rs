//! The gateway's own answers to gRPC calls, spoken as gRPC.
//!
//! A gRPC client does not read problem+json: it reads `grpc-status`. When a request is a
//! gRPC call (`content-type: application/grpc…`) and the answer is one of the gateway's
//! problems (rate limited, shed, breaker open, deadline passed, bad key…), the answer is
//! rewritten as a Trailers-Only response: HTTP 200, `content-type: application/grpc`,
//! `grpc-status`, `grpc-message`, no body, with `Retry-After` kept and mirrored as
//! `grpc-retry-pushback-ms` so a client with a gRPC retry policy waits as told (gRFC A6).
//! Metrics and the access log, inside this layer, still record the HTTP status decided.
//! A backend's own gRPC answers pass untouched.

use axum::body::Body;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Request, Response, StatusCode};
use portcullis_problem::grpc::{is_grpc, GRPC_MESSAGE, GRPC_RETRY_PUSHBACK_MS, GRPC_STATUS};

use crate::plumbing::step::{Finish, Step};

/// Marks gRPC calls so their refusals are answered as gRPC statuses (a [`Step`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct GrpcAnswers;

/// The [`Finish`] of a request: whether it is a gRPC call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GrpcCall(bool);

impl Step for GrpcAnswers {
    type Finish = GrpcCall;

    fn step(&self, request: &mut Request<Body>) -> Result<GrpcCall, Response<Body>> {
        Ok(GrpcCall(is_grpc(request.headers())))
    }
}

impl Finish for GrpcCall {
    fn finish(self, response: Response<Body>) -> Response<Body> {
        let problem = || {
            response
                .headers()
                .get(CONTENT_TYPE)
                .is_some_and(|ct| ct.as_bytes() == portcullis_problem::CONTENT_TYPE.as_bytes())
        };
        if self.0 && problem() {
            as_grpc(response)
        } else {
            response
        }
    }
}

/// The Trailers-Only form of a gateway problem.
fn as_grpc(response: Response<Body>) -> Response<Body> {
    let (mut parts, _problem_body) = response.into_parts();
    let status = parts.status;
    parts.status = StatusCode::OK;
    let headers = &mut parts.headers;
    headers.remove(CONTENT_LENGTH);
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert(GRPC_STATUS, HeaderValue::from(grpc_code(status)));
    let message = format!(
        "portcullis: {} {}",
        status.as_u16(),
        status.canonical_reason().unwrap_or("error")
    );
    if let Ok(value) = HeaderValue::from_str(&percent_encode(&message)) {
        headers.insert(GRPC_MESSAGE, value);
    }
    let pushback = headers
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.parse::<u64>().ok())
        .map(|secs| HeaderValue::from(secs.saturating_mul(1000)));
    if let Some(ms) = pushback {
        headers.insert(GRPC_RETRY_PUSHBACK_MS, ms);
    }
    Response::from_parts(parts, Body::empty())
}

/// The gRPC status code for the gateway's HTTP answer. gRPC's own HTTP mapping is followed
/// where the gateway knows more: 429 is RESOURCE_EXHAUSTED (quota), not UNAVAILABLE; a
/// timeout is DEADLINE_EXCEEDED; a request the gateway refused as malformed is
/// INVALID_ARGUMENT; an Idempotency-Key still in progress (409) is ABORTED.
fn grpc_code(status: StatusCode) -> u16 {
    match status.as_u16() {
        400 | 422 | 431 => 3,  // INVALID_ARGUMENT
        408 | 504 => 4,        // DEADLINE_EXCEEDED
        403 => 7,              // PERMISSION_DENIED
        413 | 429 => 8,        // RESOURCE_EXHAUSTED
        409 => 10,             // ABORTED
        404 | 405 | 501 => 12, // UNIMPLEMENTED
        500 => 13,             // INTERNAL
        502 | 503 => 14,       // UNAVAILABLE
        401 => 16,             // UNAUTHENTICATED
        _ => 2,                // UNKNOWN
    }
}

/// `grpc-message` is percent-encoded: printable ASCII except `%` passes as is.
fn percent_encode(text: &str) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if (0x20..=0x7e).contains(&byte) && byte != b'%' {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use portcullis_problem::Problem;
    use std::time::Duration;

    #[test]
    fn problems_become_trailers_only_statuses() {
        let rsp = Problem::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate-limited",
            "Too many",
            "x",
        )
        .retry_after(Duration::from_secs(3))
        .into_response();
        let rsp = GrpcCall(true).finish(rsp);
        assert_eq!(rsp.status(), StatusCode::OK);
        assert_eq!(rsp.headers()[CONTENT_TYPE], "application/grpc");
        assert_eq!(rsp.headers()[GRPC_STATUS], "8");
        assert_eq!(rsp.headers()[GRPC_RETRY_PUSHBACK_MS], "3000");
        assert_eq!(rsp.headers()[RETRY_AFTER], "3");
        assert_eq!(
            rsp.headers()[GRPC_MESSAGE],
            "portcullis: 429 Too Many Requests"
        );
        assert!(http_body::Body::is_end_stream(rsp.body()));
    }

    #[test]
    fn other_answers_and_other_calls_pass_untouched() {
        let problem = || Problem::internal().into_response();
        assert_eq!(
            GrpcCall(false).finish(problem()).status(),
            StatusCode::INTERNAL_SERVER_ERROR
        );
        let mut backend = Response::new(Body::empty());
        backend
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        backend
            .headers_mut()
            .insert(GRPC_STATUS, HeaderValue::from_static("5"));
        let rsp = GrpcCall(true).finish(backend);
        assert_eq!(rsp.headers()[GRPC_STATUS], "5");
    }

    #[test]
    fn statuses_map_as_documented() {
        for (http, grpc) in [
            (429, 8),
            (503, 14),
            (502, 14),
            (504, 4),
            (401, 16),
            (404, 12),
        ] {
            assert_eq!(grpc_code(StatusCode::from_u16(http).unwrap()), grpc);
        }
        assert_eq!(percent_encode("a%b\u{e9}"), "a%25b%C3%A9");
    }
}
