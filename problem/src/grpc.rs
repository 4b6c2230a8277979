//! gRPC over HTTP/2, as the gateway's layers read it: a call's status travels in
//! `grpc-status` (HTTP status 200), its deadline in `grpc-timeout`, and a server's retry
//! pushback in `grpc-retry-pushback-ms` (gRFC A6). Pure parsers and formatters, shared by
//! the retry layer (classification, deadlines), the idempotency layer (what to keep) and the
//! gateway (its own answers to gRPC calls).

use std::time::Duration;

use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderName, HeaderValue};

/// The call's timeout, sent by the client and rewritten on every attempt.
pub const GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");
/// The call's status code, in a Trailers-Only response's headers or in the trailers.
pub const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
/// The status message (percent-encoded).
pub const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
/// A server's instruction when (or whether) to retry, in milliseconds (gRFC A6).
pub const GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

/// The largest value `grpc-timeout` may carry: at most 8 digits.
const TIMEOUT_MAX_VALUE: u64 = 99_999_999;

/// The gRPC status codes the gateway classifies; every other code is [`GrpcCode::Other`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrpcCode {
    /// 0: the call succeeded.
    Ok,
    /// 3: the arguments are invalid; never retried.
    InvalidArgument,
    /// 4: the deadline expired before the operation completed; it may have acted.
    DeadlineExceeded,
    /// 5: an entity was not found; never retried.
    NotFound,
    /// 7: the caller may not do this; never retried.
    PermissionDenied,
    /// 8: quota or resources exhausted (the gRPC 429), usually with a pushback.
    ResourceExhausted,
    /// 10: aborted by a concurrency conflict; it may have acted.
    Aborted,
    /// 12: the method is not implemented; never retried.
    Unimplemented,
    /// 13: an internal error of the server.
    Internal,
    /// 14: the service is unavailable (the gRPC 503).
    Unavailable,
    /// 16: the caller is not authenticated; never retried.
    Unauthenticated,
    /// Any other code (1 CANCELLED, 2 UNKNOWN, 6, 9, 11, 15) or an unparsable one.
    Other,
}

// === impl GrpcCode ===

impl GrpcCode {
    /// The code of a `grpc-status` value.
    pub fn parse(value: &HeaderValue) -> Self {
        match value.as_bytes() {
            b"0" => Self::Ok,
            b"3" => Self::InvalidArgument,
            b"4" => Self::DeadlineExceeded,
            b"5" => Self::NotFound,
            b"7" => Self::PermissionDenied,
            b"8" => Self::ResourceExhausted,
            b"10" => Self::Aborted,
            b"12" => Self::Unimplemented,
            b"13" => Self::Internal,
            b"14" => Self::Unavailable,
            b"16" => Self::Unauthenticated,
            _ => Self::Other,
        }
    }

    /// The code in `headers` (a Trailers-Only response's headers, or trailers), if any.
    pub fn in_headers(headers: &HeaderMap) -> Option<Self> {
        headers.get(GRPC_STATUS).map(Self::parse)
    }

    /// Short label for logs and metrics (`grpc_unavailable`…).
    pub fn label(self) -> &'static str {
        match self {
            Self::Ok => "grpc_ok",
            Self::InvalidArgument => "grpc_invalid_argument",
            Self::DeadlineExceeded => "grpc_deadline_exceeded",
            Self::NotFound => "grpc_not_found",
            Self::PermissionDenied => "grpc_permission_denied",
            Self::ResourceExhausted => "grpc_resource_exhausted",
            Self::Aborted => "grpc_aborted",
            Self::Unimplemented => "grpc_unimplemented",
            Self::Internal => "grpc_internal",
            Self::Unavailable => "grpc_unavailable",
            Self::Unauthenticated => "grpc_unauthenticated",
            Self::Other => "grpc_other",
        }
    }
}

/// Whether a request or response is gRPC: `application/grpc` or `application/grpc+proto`…
/// (not `application/grpc-web`, which is HTTP/1-friendly framing the gateway passes as is).
pub fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .map(HeaderValue::as_bytes)
        .and_then(|ct| ct.strip_prefix(b"application/grpc"))
        .is_some_and(|rest| rest.is_empty() || rest[0] == b'+' || rest[0] == b';')
}

/// Parses `grpc-timeout` (`TimeoutValue TimeoutUnit`: 1–8 digits and one of `H M S m u n`);
/// `None` when it is not one, which leaves the gateway's own deadline in force.
pub fn parse_timeout(value: &HeaderValue) -> Option<Duration> {
    let bytes = value.as_bytes();
    let (unit, digits) = bytes.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Formats `left` as `grpc-timeout`, in the finest unit that fits 8 digits, rounding down so
/// the backend never believes it has longer than the gateway will wait.
pub fn format_timeout(left: Duration) -> HeaderValue {
    let candidates = [
        (left.as_millis(), 'm'),
        (u128::from(left.as_secs()), 'S'),
        (u128::from(left.as_secs() / 60), 'M'),
        (u128::from(left.as_secs() / 3600), 'H'),
    ];
    let (value, unit) = candidates
        .into_iter()
        .find(|(value, _)| *value <= u128::from(TIMEOUT_MAX_VALUE))
        .unwrap_or((u128::from(TIMEOUT_MAX_VALUE), 'H'));
    HeaderValue::from_str(&format!("{value}{unit}"))
        .unwrap_or_else(|_| HeaderValue::from_static("0m"))
}

/// What a server's `grpc-retry-pushback-ms` says (gRFC A6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushback {
    /// Retry no sooner than this.
    After(Duration),
    /// A negative or malformed value: the server asks not to be retried at all.
    DoNotRetry,
}

/// The pushback in `headers`, if the server sent one.
pub fn pushback(headers: &HeaderMap) -> Option<Pushback> {
    let value = headers.get(GRPC_RETRY_PUSHBACK_MS)?;
    Some(
        std::str::from_utf8(value.as_bytes())
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .map_or(Pushback::DoNotRetry, |ms| {
                Pushback::After(Duration::from_millis(ms))
            }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hv(s: &str) -> HeaderValue {
        HeaderValue::from_str(s).unwrap()
    }

    #[test]
    fn timeouts_parse_in_every_unit_and_refuse_the_rest() {
        assert_eq!(parse_timeout(&hv("100m")), Some(Duration::from_millis(100)));
        assert_eq!(parse_timeout(&hv("2S")), Some(Duration::from_secs(2)));
        assert_eq!(parse_timeout(&hv("1H")), Some(Duration::from_secs(3600)));
        assert_eq!(parse_timeout(&hv("5M")), Some(Duration::from_secs(300)));
        assert_eq!(parse_timeout(&hv("7u")), Some(Duration::from_micros(7)));
        assert_eq!(parse_timeout(&hv("9n")), Some(Duration::from_nanos(9)));
        for bad in ["", "m", "100", "123456789m", "-1m", "1.5S", "10x", " 1S"] {
            assert_eq!(parse_timeout(&hv(bad)), None, "{bad:?}");
        }
    }

    #[test]
    fn timeouts_format_in_the_finest_unit_that_fits_rounding_down() {
        assert_eq!(format_timeout(Duration::from_micros(1_999)), "1m");
        assert_eq!(format_timeout(Duration::from_secs(30)), "30000m");
        assert_eq!(format_timeout(Duration::from_secs(200_000)), "200000S");
        assert_eq!(format_timeout(Duration::from_secs(u64::MAX)), "99999999H");
        // Round trip never lengthens the deadline.
        let left = Duration::from_millis(1234);
        assert!(parse_timeout(&format_timeout(left)).unwrap() <= left);
    }

    #[test]
    fn pushback_is_a_wait_or_a_refusal() {
        let mut headers = HeaderMap::new();
        assert_eq!(pushback(&headers), None);
        headers.insert(GRPC_RETRY_PUSHBACK_MS, hv("250"));
        assert_eq!(
            pushback(&headers),
            Some(Pushback::After(Duration::from_millis(250)))
        );
        headers.insert(GRPC_RETRY_PUSHBACK_MS, hv("-1"));
        assert_eq!(pushback(&headers), Some(Pushback::DoNotRetry));
    }

    #[test]
    fn content_types() {
        let mut headers = HeaderMap::new();
        assert!(!is_grpc(&headers));
        for (ct, grpc) in [
            ("application/grpc", true),
            ("application/grpc+proto", true),
            ("application/grpc;charset=utf-8", true),
            ("application/grpc-web", false),
            ("application/grpcx", false),
            ("application/json", false),
        ] {
            headers.insert(CONTENT_TYPE, hv(ct));
            assert_eq!(is_grpc(&headers), grpc, "{ct}");
        }
    }

    #[test]
    fn codes() {
        assert_eq!(GrpcCode::parse(&hv("14")), GrpcCode::Unavailable);
        assert_eq!(GrpcCode::parse(&hv("0")), GrpcCode::Ok);
        assert_eq!(GrpcCode::parse(&hv("014")), GrpcCode::Other);
        assert_eq!(GrpcCode::parse(&hv("2")), GrpcCode::Other);
    }
}
