//! Calendar quotas: UTC day and month windows, and the fixed-window counter arithmetic.
//!
//! A calendar policy ([`Policy::calendar`](crate::Policy::calendar)) admits at most `limit`
//! cost units per current UTC day or month. Its state is one counter per window: the limiter
//! appends the window's [`Window::id`] (`20261121`, `202611`) to the policy's key, so a new
//! window starts from an absent key (zero) and an old window's counter is simply never read
//! again and expires when its window ends.
//!
//! Like [`crate::gcra`], everything here is pure arithmetic over values: the backends read a
//! counter, call [`Quota::evaluate`], and commit `new_used` if the whole request is admitted.
//!
//! Civil dates are computed with Howard Hinnant's `days_from_civil` / `civil_from_days`
//! (proleptic Gregorian calendar, exact integer arithmetic), so the crate needs no date
//! library. Unix time has no leap seconds: every UTC day is 86 400 s.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::decision::Decision;

/// Seconds in a UTC day.
pub const DAY_SECS: u64 = 86_400;

/// Latest instant windows are computed for: 9999-12-31T23:59:59Z. Later readings (a broken
/// clock) are clamped to it rather than overflowing.
const MAX_UNIX_SECS: u64 = 253_402_300_799;

/// A calendar quota period, on UTC boundaries. Serialized as `"day"` / `"month"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Period {
    /// 00:00:00 UTC to the next 00:00:00 UTC (86 400 s).
    Day,
    /// The 1st of the month 00:00:00 UTC to the 1st of the next month (28 to 31 days).
    Month,
}

/// One window of a [`Period`]: `[start_unix, end_unix)` in Unix seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Window {
    /// The window as a decimal date: `YYYYMMDD` for a day, `YYYYMM` for a month. Appended to
    /// the counter's key, so it must differ between any two windows of one period (it does:
    /// it is the calendar date).
    pub id: u64,
    /// First second of the window (inclusive).
    pub start_unix: u64,
    /// First second of the next window (exclusive): when the quota resets.
    pub end_unix: u64,
}

/// A fixed-window counter's parameters: at most `limit` cost units per window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    limit: u64,
}

/// The outcome of evaluating one request against one window counter, before deciding whether
/// to commit it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaEvaluation {
    /// The counter would admit the request.
    pub allowed: bool,
    /// Units used in the window so far.
    pub used: u64,
    /// The count to store if the request is admitted and consumed.
    pub new_used: u64,
    limit: u64,
    until_end: Duration,
}

// === impl Period ===

impl Period {
    /// The window containing `unix_secs` (seconds since the Unix epoch, UTC).
    pub fn window(self, unix_secs: u64) -> Window {
        let unix_secs = unix_secs.min(MAX_UNIX_SECS);
        let days = unix_secs / DAY_SECS;
        let (y, m, d) = civil_from_days(days);
        match self {
            Period::Day => Window {
                id: y * 10_000 + m * 100 + d,
                start_unix: days * DAY_SECS,
                end_unix: (days + 1) * DAY_SECS,
            },
            Period::Month => {
                let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
                Window {
                    id: y * 100 + m,
                    start_unix: days_from_civil(y, m, 1) * DAY_SECS,
                    end_unix: days_from_civil(ny, nm, 1) * DAY_SECS,
                }
            }
        }
    }

    /// `day` or `month`: the key suffix and the problem+json `period` member.
    pub fn as_str(self) -> &'static str {
        match self {
            Period::Day => "day",
            Period::Month => "month",
        }
    }

    /// The longest window of this period: 1 day, or 31 days for a month.
    pub fn longest(self) -> Duration {
        match self {
            Period::Day => Duration::from_secs(DAY_SECS),
            Period::Month => Duration::from_secs(31 * DAY_SECS),
        }
    }
}

impl fmt::Display for Period {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

// === impl Window ===

impl Window {
    /// Window length in seconds (86 400 for a day; 28–31 days for a month).
    pub fn len_secs(&self) -> u64 {
        self.end_unix - self.start_unix
    }

    /// Time from `unix_now` until the window ends; zero if it already has.
    pub fn until_end(&self, unix_now: Duration) -> Duration {
        Duration::from_secs(self.end_unix).saturating_sub(unix_now)
    }
}

// === impl Quota ===

impl Quota {
    /// A counter admitting `limit` units per window (clamped to at least 1).
    pub fn new(limit: u64) -> Self {
        Self {
            limit: limit.max(1),
        }
    }

    /// Units allowed per window.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Evaluates a request of `cost` units against a window in which `used` units are spent,
    /// with `until_end` left in the window. Pure: the caller commits `new_used` if it decides
    /// to.
    ///
    /// A request costing more than `limit` is never allowed (it would not fit in a fresh
    /// window either); reject such routes at configuration time.
    pub fn evaluate(&self, used: u64, cost: u64, until_end: Duration) -> QuotaEvaluation {
        let new_used = used.saturating_add(cost);
        QuotaEvaluation {
            allowed: cost <= self.limit && new_used <= self.limit,
            used,
            new_used,
            limit: self.limit,
            until_end,
        }
    }
}

// === impl QuotaEvaluation ===

impl QuotaEvaluation {
    /// The decision to report. `committed`: the request was admitted and the counter was set
    /// to `new_used`.
    ///
    /// `remaining = limit − used`; `reset_after` is the time until the window ends (when the
    /// counter starts again from zero), and so are `refill_after` and, when rejected,
    /// `retry_after`: a fixed window frees nothing before it ends.
    pub fn decision(&self, committed: bool, shadow: bool) -> Decision {
        let used = if committed { self.new_used } else { self.used };
        Decision {
            allowed: self.allowed,
            shadow,
            limit: self.limit,
            remaining: self.limit.saturating_sub(used),
            reset_after: self.until_end,
            refill_after: Some(self.until_end),
            retry_after: if self.allowed {
                Duration::ZERO
            } else {
                self.until_end
            },
        }
    }
}

/// `YYYY-MM-DDTHH:MM:SSZ` for a Unix time (for messages).
pub(crate) fn rfc3339(unix_secs: u64) -> String {
    let unix_secs = unix_secs.min(MAX_UNIX_SECS);
    let (y, m, d) = civil_from_days(unix_secs / DAY_SECS);
    let s = unix_secs % DAY_SECS;
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        s / 3600,
        s / 60 % 60,
        s % 60
    )
}

/// Days since 1970-01-01 → (year, month 1–12, day 1–31), for days ≥ 0.
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    // Shift the epoch to 0000-03-01 so leap days fall at the end of each 400-year era.
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097; // day of era, [0, 146096]
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365], from March 1st
    let mp = (5 * doy + 2) / 153; // [0, 11], March = 0
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = era * 400 + yoe + u64::from(m <= 2);
    (y, m, d)
}

/// (year ≥ 1970, month 1–12, day 1–31) → days since 1970-01-01.
fn days_from_civil(y: u64, m: u64, d: u64) -> u64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y / 400;
    let yoe = y % 400;
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests;
