//! The outcome table: what happens to the key once the upstream answered.
//!
//! | response | decision | why |
//! |---|---|---|
//! | carries [`NotForwarded`] | release | the gateway proves the upstream never saw it |
//! | 429, 408 | release | the upstream refused before processing |
//! | 503 **with** `Retry-After` | release | an explicit "not now" (overload, maintenance) |
//! | 500, 502, 504, other 5xx, 503 without `Retry-After` | store | ambiguous: the upstream may have acted; replaying the failure is safe, re-executing is not |
//! | … the same, upstream dedupes on the key | release | a re-execution is deduplicated downstream |
//! | 2xx, 3xx, other 4xx | store | definitive |
//!
//! A gRPC call answers HTTP 200 with its status in `grpc-status`; a Trailers-Only answer
//! (the status in the headers) is read as its HTTP analogue: RESOURCE_EXHAUSTED as 429,
//! UNAVAILABLE as 503 (`grpc-retry-pushback-ms` standing for `Retry-After`),
//! DEADLINE_EXCEEDED as 504, INTERNAL, UNKNOWN and ABORTED as 500; every other code is
//! definitive.
//!
//! A pure function of status, headers and the two flags, so it is tested exhaustively
//! without I/O.

use http::{header, HeaderMap, StatusCode};
use portcullis_problem::grpc::{self, GrpcCode, Pushback};

use crate::extensions::NotForwarded;

/// What to do with the key after the response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Delete the in-flight record: the client may retry with the same key.
    Release,
    /// Complete the record with this response: duplicates get it replayed.
    Store,
}

/// Applies the outcome table.
pub fn classify(
    status: StatusCode,
    headers: &HeaderMap,
    extensions: &http::Extensions,
    upstream_dedupes_keys: bool,
) -> Outcome {
    if extensions.get::<NotForwarded>().is_some() {
        return Outcome::Release;
    }
    let (status, retry_after) = match grpc_analogue(status, headers) {
        Some(analogue) => analogue,
        None => (status.as_u16(), headers.contains_key(header::RETRY_AFTER)),
    };
    match status {
        429 | 408 => Outcome::Release,
        503 if retry_after => Outcome::Release,
        500..=599 if upstream_dedupes_keys => Outcome::Release,
        _ => Outcome::Store,
    }
}

/// The HTTP status a Trailers-Only gRPC answer stands for, and whether it says when to
/// come back; `None` for anything else.
fn grpc_analogue(status: StatusCode, headers: &HeaderMap) -> Option<(u16, bool)> {
    if status != StatusCode::OK || !grpc::is_grpc(headers) {
        return None;
    }
    let pushback = matches!(grpc::pushback(headers), Some(Pushback::After(_)));
    Some(match GrpcCode::in_headers(headers)? {
        GrpcCode::ResourceExhausted => (429, pushback),
        GrpcCode::Unavailable => (503, pushback),
        GrpcCode::DeadlineExceeded => (504, false),
        GrpcCode::Internal | GrpcCode::Aborted | GrpcCode::Other => (500, false),
        _ => (200, false),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(status: u16, retry_after: bool, not_forwarded: bool, dedupes: bool) -> Outcome {
        let mut h = HeaderMap::new();
        if retry_after {
            h.insert(header::RETRY_AFTER, "3".parse().unwrap());
        }
        let mut ext = http::Extensions::new();
        if not_forwarded {
            ext.insert(NotForwarded);
        }
        classify(StatusCode::from_u16(status).unwrap(), &h, &ext, dedupes)
    }

    #[test]
    fn table() {
        use Outcome::*;
        for (status, ra, nf, dedupes, want) in [
            (201, false, false, false, Store),
            (302, false, false, false, Store),
            (400, false, false, false, Store),
            (404, false, false, true, Store),
            (409, false, false, false, Store),
            (422, false, false, false, Store),
            (429, false, false, false, Release),
            (429, true, false, false, Release),
            (408, false, false, false, Release),
            (503, true, false, false, Release),
            (503, false, false, false, Store),
            (503, false, false, true, Release),
            (500, false, false, false, Store),
            (500, true, false, false, Store),
            (500, false, false, true, Release),
            (502, false, false, false, Store),
            (504, false, false, false, Store),
            (504, false, false, true, Release),
            (507, false, false, false, Store),
            (200, false, true, false, Release),
            (502, false, true, false, Release),
            (503, false, true, false, Release),
        ] {
            assert_eq!(
                run(status, ra, nf, dedupes),
                want,
                "{status} ra={ra} nf={nf} d={dedupes}"
            );
        }
    }

    fn grpc(code: &str, pushback: Option<&str>, dedupes: bool) -> Outcome {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, "application/grpc".parse().unwrap());
        h.insert(grpc::GRPC_STATUS, code.parse().unwrap());
        if let Some(ms) = pushback {
            h.insert(grpc::GRPC_RETRY_PUSHBACK_MS, ms.parse().unwrap());
        }
        classify(StatusCode::OK, &h, &http::Extensions::new(), dedupes)
    }

    #[test]
    fn grpc_statuses_read_as_their_http_analogues() {
        use Outcome::*;
        assert_eq!(grpc("0", None, false), Store);
        assert_eq!(grpc("8", None, false), Release); // RESOURCE_EXHAUSTED ~ 429
        assert_eq!(grpc("14", Some("200"), false), Release); // UNAVAILABLE + pushback
        assert_eq!(grpc("14", None, false), Store); // UNAVAILABLE ~ bare 503
        assert_eq!(grpc("14", Some("-1"), false), Store); // "do not retry" is no wait
        assert_eq!(grpc("4", None, false), Store); // DEADLINE_EXCEEDED ~ 504
        assert_eq!(grpc("4", None, true), Release);
        assert_eq!(grpc("13", None, true), Release);
        assert_eq!(grpc("5", None, true), Store); // NOT_FOUND: definitive
    }
}
