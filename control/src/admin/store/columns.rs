//! Conversions between the API's values and the stored columns (integers as `BIGINT`,
//! durations in milliseconds).

use std::time::Duration;

/// A stored duration in milliseconds as the API shows it (`"1s"`, `"1m 30s"`).
pub(super) fn per_text(per_ms: i64) -> String {
    humantime::format_duration(Duration::from_millis(u64::try_from(per_ms).unwrap_or(0)))
        .to_string()
}

/// A count as a stored `BIGINT` (saturating).
pub(super) fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// A stored `BIGINT` count as the API's (a negative one reads as 0).
pub(super) fn to_u64(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

/// A duration as stored: whole milliseconds (saturating).
pub(super) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
