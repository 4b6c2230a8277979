//! Header names the layer reads or writes, and their pure parsers/formatters.

use std::time::{Duration, SystemTime};

use chrono::{DateTime, Datelike, Timelike, Utc};
use http::{HeaderName, HeaderValue};

/// Attempt number (1-based) sent on every attempt, so backends and sidecars see that the
/// gateway owns retries.
pub const X_RETRY_ATTEMPT: HeaderName = HeaderName::from_static("x-retry-attempt");
/// Absolute deadline (RFC 3339, UTC, millisecond precision), read from the client and sent
/// upstream on every attempt.
pub const X_REQUEST_DEADLINE: HeaderName = HeaderName::from_static("x-request-deadline");
/// Correlation id, logged as `correlation_id`; forwarded unchanged.
pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
/// On an upstream answer returned after the layer stopped retrying it: how many attempts
/// were made and why no more (`attempts=4, reason=attempts_exhausted`; `reason=client_retry`
/// when the client retried an operation the gateway had already retried).
pub const X_RETRY_EXHAUSTED: HeaderName = HeaderName::from_static("x-retry-exhausted");
/// Idempotency key, logged as `idempotency_key`; forwarded unchanged on every attempt.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// Parses an RFC 3339 timestamp; `None` when it is not one.
pub(crate) fn parse_deadline(value: &HeaderValue) -> Option<SystemTime> {
    let s = value.to_str().ok()?;
    DateTime::parse_from_rfc3339(s.trim())
        .ok()
        .map(SystemTime::from)
}

/// Formats `at` as RFC 3339 UTC with milliseconds (`2026-03-06T12:00:00.800Z`), truncating
/// so the forwarded deadline is never later than the real one.
pub(crate) fn format_deadline(at: SystemTime) -> HeaderValue {
    use std::fmt::Write;
    // Formatted on the stack: the header value's own copy is the request's one allocation.
    // Integer formatting only: chrono's `format` allocates per field.
    let t = DateTime::<Utc>::from(at);
    let mut text = StackText::default();
    let formatted = write!(
        text,
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        t.year(),
        t.month(),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.timestamp_subsec_millis().min(999),
    );
    // RFC 3339 output is ASCII and fits (years past 9999 do not): fall back to the epoch.
    match formatted
        .ok()
        .and_then(|()| HeaderValue::from_bytes(text.as_bytes()).ok())
    {
        Some(value) => value,
        None => HeaderValue::from_static("1970-01-01T00:00:00.000Z"),
    }
}

/// The `X-Retry-Attempt` value of attempt `number`; the usual ones are static.
pub(crate) fn attempt_value(number: u32) -> HeaderValue {
    const STATIC: [HeaderValue; 6] = [
        HeaderValue::from_static("1"),
        HeaderValue::from_static("2"),
        HeaderValue::from_static("3"),
        HeaderValue::from_static("4"),
        HeaderValue::from_static("5"),
        HeaderValue::from_static("6"),
    ];
    usize::try_from(number)
        .ok()
        .and_then(|n| n.checked_sub(1))
        .and_then(|i| STATIC.get(i).cloned())
        .unwrap_or_else(|| HeaderValue::from(number))
}

/// A fixed buffer for one RFC 3339 timestamp; writing past its end is an error.
#[derive(Default)]
struct StackText {
    bytes: [u8; 32],
    len: usize,
}

impl StackText {
    fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

impl std::fmt::Write for StackText {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = self.len.checked_add(s.len()).ok_or(std::fmt::Error)?;
        let slot = self.bytes.get_mut(self.len..end).ok_or(std::fmt::Error)?;
        slot.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// Parses `Retry-After` (RFC 9110 §10.2.3) leniently: delta-seconds or an HTTP-date, with
/// surrounding whitespace. A date in the past is a zero wait; anything else is `None`.
/// Absurdly large delta-seconds saturate (and then exceed any deadline).
pub(crate) fn parse_retry_after(value: &HeaderValue, now: SystemTime) -> Option<Duration> {
    let s = value.to_str().ok()?.trim();
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        return Some(Duration::from_secs(s.parse::<u64>().unwrap_or(u64::MAX)));
    }
    let at = httpdate::parse_http_date(s).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hv(s: &str) -> HeaderValue {
        HeaderValue::from_str(s).expect("header")
    }

    fn at(secs: u64, ms: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_millis(ms)
    }

    #[test]
    fn deadline_round_trips_at_millisecond_precision() {
        let t = at(1_772_798_400, 800) + Duration::from_micros(999);
        let v = format_deadline(t);
        assert_eq!(v, "2026-03-06T12:00:00.800Z");
        assert_eq!(parse_deadline(&v), Some(at(1_772_798_400, 800)));
    }

    #[test]
    fn deadline_accepts_offsets_and_rejects_garbage() {
        assert_eq!(
            parse_deadline(&hv("2026-03-06T13:00:00.800+01:00")),
            Some(at(1_772_798_400, 800))
        );
        for bad in [
            "",
            "tomorrow",
            "1772798400",
            "2026-03-06 12:00:00",
            "Fri, 06 Mar 2026 12:00:00 GMT",
        ] {
            assert_eq!(parse_deadline(&hv(bad)), None, "{bad:?}");
        }
    }

    #[test]
    fn retry_after_seconds_and_dates() {
        let now = at(1_772_798_400, 0);
        assert_eq!(
            parse_retry_after(&hv("2"), now),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            parse_retry_after(&hv(" 120 "), now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(parse_retry_after(&hv("0"), now), Some(Duration::ZERO));
        assert_eq!(
            parse_retry_after(&hv("99999999999999999999999"), now),
            Some(Duration::from_secs(u64::MAX))
        );
        assert_eq!(
            parse_retry_after(&hv("Fri, 06 Mar 2026 12:00:05 GMT"), now),
            Some(Duration::from_secs(5))
        );
        assert_eq!(
            parse_retry_after(&hv("Fri, 06 Mar 2026 11:00:00 GMT"), now),
            Some(Duration::ZERO),
            "a past date means no extra wait"
        );
        for bad in ["", "-1", "1.5", "soon", "2s"] {
            assert_eq!(parse_retry_after(&hv(bad), now), None, "{bad:?}");
        }
    }

    proptest::proptest! {
        // Client- and upstream-controlled header values never panic the parsers.
        #[test]
        fn parsers_never_panic_on_arbitrary_bytes(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..64)) {
            if let Ok(value) = HeaderValue::from_bytes(&bytes) {
                let _ = parse_deadline(&value);
                let _ = parse_retry_after(&value, std::time::UNIX_EPOCH + Duration::from_secs(1_800_000_000));
            }
        }

        #[test]
        fn delta_seconds_round_trip(secs in 0u64..1_000_000) {
            let value = HeaderValue::from(secs);
            let now = std::time::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
            proptest::prop_assert_eq!(parse_retry_after(&value, now), Some(Duration::from_secs(secs)));
        }
    }
}
