//! Header names the layer reads or writes, and their pure parsers/formatters.

use std::time::{Duration, SystemTime};

use chrono::DateTime;
use http::{HeaderName, HeaderValue};

/// Attempt number (1-based) sent on every attempt, so backends and sidecars see that the
/// gateway owns retries.
pub const X_RETRY_ATTEMPT: HeaderName = HeaderName::from_static("x-retry-attempt");
/// Absolute deadline (RFC 3339, UTC, millisecond precision), read from the client and sent
/// upstream on every attempt.
pub const X_REQUEST_DEADLINE: HeaderName = HeaderName::from_static("x-request-deadline");
/// On an upstream answer returned after the layer stopped retrying it: how many attempts
/// were made and why no more (`attempts=4, reason=attempts_exhausted`; `reason=client_retry`
/// when the client retried an operation the gateway had already retried).
pub const X_RETRY_EXHAUSTED: HeaderName = HeaderName::from_static("x-retry-exhausted");
/// The correlation id (logged as `correlation_id`) and the idempotency key (logged as
/// `idempotency_key`), both forwarded unchanged on every attempt.
pub use portcullis_problem::headers::{IDEMPOTENCY_KEY, X_REQUEST_ID};

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
    // Digits written straight into a stack buffer: `core::fmt` and chrono's calendar cost
    // ~1.9k instructions per request here (callgrind), this ~150.
    const EPOCH: HeaderValue = HeaderValue::from_static("1970-01-01T00:00:00.000Z");
    let Ok(since) = at.duration_since(SystemTime::UNIX_EPOCH) else {
        return EPOCH; // before 1970: not a deadline anyone sends
    };
    let secs = since.as_secs();
    let (year, month, day) = civil_from_days(secs / 86_400);
    if year > 9999 {
        return EPOCH; // RFC 3339 has four year digits
    }
    let of_day = secs % 86_400;
    let mut text = *b"0000-00-00T00:00:00.000Z";
    put_digits(&mut text[0..4], year);
    put_digits(&mut text[5..7], month);
    put_digits(&mut text[8..10], day);
    put_digits(&mut text[11..13], of_day / 3600);
    put_digits(&mut text[14..16], of_day / 60 % 60);
    put_digits(&mut text[17..19], of_day % 60);
    put_digits(&mut text[20..23], u64::from(since.subsec_millis()));
    HeaderValue::from_bytes(&text).unwrap_or(EPOCH)
}

/// (year, month, day) of the proleptic Gregorian calendar for `days` since 1970-01-01
/// (Howard Hinnant's `civil_from_days`, unsigned: days before the epoch never reach here).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468; // days since 0000-03-01
    let era = z / 146_097;
    let doe = z - era * 146_097; // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365], from March 1st
    let mp = (5 * doy + 2) / 153; // [0, 11], March = 0
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

/// Writes the low `slot.len()` decimal digits of `n` into `slot`, zero-padded.
fn put_digits(slot: &mut [u8], mut n: u64) {
    for byte in slot.iter_mut().rev() {
        // `n % 10` is below 10, so the cast cannot truncate.
        *byte = b'0' + (n % 10) as u8;
        n /= 10;
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

/// Parses `Retry-After` (RFC 9110 §10.2.3) leniently: delta-seconds or an HTTP-date, with
/// surrounding whitespace. A date in the past is a zero wait; anything else is `None`.
/// Absurdly large delta-seconds saturate (and then exceed any deadline).
pub fn parse_retry_after(value: &HeaderValue, now: SystemTime) -> Option<Duration> {
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
    fn deadline_formatting_agrees_with_chrono_across_calendar_edges() {
        // Every day boundary that tends to break hand-written calendars, plus a sweep of one
        // day in every 97 over four centuries (bounded: ~1 500 dates).
        let edges = [
            0,
            59 * 86_400,               // 1970-03-01
            946_684_800 - 1,           // 1999-12-31T23:59:59
            946_684_800 + 59 * 86_400, // 2000-02-29 (a leap century)
            951_868_800,               // 2000-03-01
            4_107_456_000,             // 2100-02-28 (not a leap year)
            4_107_542_400,             // 2100-03-01
            253_402_300_799,           // 9999-12-31T23:59:59
        ];
        let sweep = (0..1_508_u64).map(|i| i * 97 * 86_400 + i * 3_607);
        for secs in edges.into_iter().chain(sweep) {
            let t = at(secs, secs % 1000);
            let expected = DateTime::<chrono::Utc>::from(t)
                .format("%Y-%m-%dT%H:%M:%S%.3fZ")
                .to_string();
            assert_eq!(format_deadline(t), expected.as_str(), "{secs}");
        }
    }

    #[test]
    fn deadline_past_year_9999_or_before_1970_is_the_epoch() {
        assert_eq!(
            format_deadline(at(253_402_300_800, 0)),
            "1970-01-01T00:00:00.000Z"
        );
        let before = SystemTime::UNIX_EPOCH - Duration::from_secs(1);
        assert_eq!(format_deadline(before), "1970-01-01T00:00:00.000Z");
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
