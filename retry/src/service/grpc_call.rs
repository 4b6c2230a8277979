//! What the attempt loop reads from a gRPC call: the deadline the client sent, and how an
//! attempt's response ended (`grpc-status` behind HTTP 200, and the server's pushback).

use std::time::SystemTime;

use axum::body::Body;
use http::{HeaderMap, Response};
use portcullis_problem::grpc::{self, GrpcCode, Pushback, GRPC_TIMEOUT};
use tokio::time::{timeout_at, Instant};

use crate::body;
use crate::classify::AttemptOutcome;
use crate::headers::{parse_deadline, X_REQUEST_DEADLINE};

/// How an attempt's response ended, when its head tells: its status, or for a gRPC call the
/// `grpc-status` of a Trailers-Only response, with the server's retry pushback. `None` for a
/// gRPC 200 without `grpc-status`, whose outcome only its trailers can tell ([`peek`]).
pub(super) fn head_outcome(rsp: &Response<Body>) -> Option<(AttemptOutcome, Option<Pushback>)> {
    if rsp.status() != http::StatusCode::OK || !grpc::is_grpc(rsp.headers()) {
        return Some((AttemptOutcome::Status(rsp.status()), None));
    }
    let code = GrpcCode::in_headers(rsp.headers())?;
    Some((AttemptOutcome::Grpc(code), grpc::pushback(rsp.headers())))
}

/// The outcome of a gRPC 200 whose head did not tell ([`head_outcome`]): the `grpc-status`
/// of trailers that arrive before any message and before `until`, with the server's
/// pushback. A peeked frame is put back in front of the body, so the client receives
/// exactly what the backend sent.
pub(super) async fn peek(
    rsp: Response<Body>,
    until: Instant,
) -> (AttemptOutcome, Response<Body>, Option<Pushback>) {
    let status = AttemptOutcome::Status(rsp.status());
    let (head, mut rest) = rsp.into_parts();
    match timeout_at(until, http_body_util::BodyExt::frame(&mut rest)).await {
        Ok(Some(Ok(frame))) => {
            let (outcome, pushback) = match frame.trailers_ref() {
                Some(trailers) => (
                    GrpcCode::in_headers(trailers).map_or(status, AttemptOutcome::Grpc),
                    grpc::pushback(trailers),
                ),
                None => (status, None),
            };
            let body = body::prefixed(frame, rest);
            (outcome, Response::from_parts(head, body), pushback)
        }
        Ok(Some(Err(error))) => (
            status,
            Response::from_parts(head, body::failed(error)),
            None,
        ),
        // The body ended, or no frame came in time: the client gets it as it is.
        Ok(None) | Err(_) => (status, Response::from_parts(head, rest), None),
    }
}

/// The deadline a client sent: the earlier of `X-Request-Deadline` and a gRPC call's
/// `grpc-timeout` (counted from now). Unparsable values are ignored.
pub(super) fn incoming_deadline(headers: &HeaderMap, now: SystemTime) -> Option<SystemTime> {
    let stated = headers.get(X_REQUEST_DEADLINE).and_then(parse_deadline);
    let grpc = headers
        .get(GRPC_TIMEOUT)
        .and_then(grpc::parse_timeout)
        .and_then(|left| now.checked_add(left));
    match (stated, grpc) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
