//! What the admin API may ask of rate limiting, without reaching into the limiter: a tenant's
//! current usage (read without consuming), and manual reset or top-up of a long-period quota.
//!
//! The admin API holds an `Arc<dyn QuotaAdmin>`; the gateway implements it over the configured
//! limiter, so the admin code never branches on the state backend.

use std::time::Duration;

use async_trait::async_trait;
use serde::Serialize;

/// A long quota period, on UTC calendar boundaries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Period {
    /// From 00:00 UTC to the next 00:00 UTC.
    Day,
    /// From the 1st 00:00 UTC to the next month's 1st.
    Month,
}

/// One bucket's state as the limiter sees it now.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BucketUsage {
    /// Policy name (`tenant`, `route`, …).
    pub policy: String,
    /// Route prefix for per-route policies.
    pub route: Option<String>,
    /// Capacity (burst).
    pub limit: u64,
    /// Tokens left now.
    pub remaining: u64,
    /// Seconds until the bucket is full again.
    pub reset_after_secs: u64,
}

/// A long-period quota's state.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PeriodUsage {
    /// Day or month.
    pub period: Period,
    /// Requests allowed in the period.
    pub limit: u64,
    /// Requests counted so far in this period.
    pub used: u64,
    /// Seconds until the period resets.
    pub resets_in_secs: u64,
}

/// A tenant's usage, read without consuming anything.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TenantUsage {
    /// Tenant id.
    pub tenant: String,
    /// Token buckets (tenant bucket and per-route overrides).
    pub buckets: Vec<BucketUsage>,
    /// Daily and monthly quotas, where configured.
    pub periods: Vec<PeriodUsage>,
    /// 429 answers given to this tenant by this replica since it started.
    pub rejected_total: u64,
}

/// Quota operations failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QuotaError {
    /// No such tenant.
    #[error("unknown tenant {0:?}")]
    UnknownTenant(String),
    /// The tenant has no quota for this period.
    #[error("tenant has no {0:?} quota")]
    NoSuchQuota(Period),
    /// The state store failed.
    #[error("rate-limit store unavailable: {0}")]
    Store(String),
}

/// Rate-limit operations for the admin API.
#[async_trait]
pub trait QuotaAdmin: Send + Sync {
    /// Current usage of `tenant`; consumes nothing.
    async fn usage(&self, tenant: &str) -> Result<TenantUsage, QuotaError>;
    /// Sets the used count of the current period back to 0.
    async fn reset_period(&self, tenant: &str, period: Period) -> Result<PeriodUsage, QuotaError>;
    /// Gives back `amount` requests in the current period (used count decreases, not below 0).
    async fn top_up(
        &self,
        tenant: &str,
        period: Period,
        amount: u64,
    ) -> Result<PeriodUsage, QuotaError>;
}

/// How long until the end of the current `period` for a Unix time in seconds (UTC).
pub fn until_period_end(period: Period, unix_secs: u64) -> Duration {
    use chrono::{Datelike, TimeZone, Utc};
    let Some(now) = Utc
        .timestamp_opt(i64::try_from(unix_secs).unwrap_or(i64::MAX), 0)
        .single()
    else {
        return Duration::from_secs(1);
    };
    let next = match period {
        Period::Day => now
            .date_naive()
            .succ_opt()
            .and_then(|d| d.and_hms_opt(0, 0, 0)),
        Period::Month => {
            let (year, month) = if now.month() == 12 {
                (now.year() + 1, 1)
            } else {
                (now.year(), now.month() + 1)
            };
            chrono::NaiveDate::from_ymd_opt(year, month, 1).and_then(|d| d.and_hms_opt(0, 0, 0))
        }
    };
    match next {
        Some(next) => {
            let secs = next.and_utc().timestamp() - now.timestamp();
            Duration::from_secs(u64::try_from(secs).unwrap_or(1).max(1))
        }
        None => Duration::from_secs(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn period_ends_on_utc_calendar_boundaries() {
        // 2026-11-21T23:59:00Z → 60 s to midnight; 10 days + 60 s to December 1st.
        let t = 1_795_305_540;
        assert_eq!(until_period_end(Period::Day, t), Duration::from_secs(60));
        assert_eq!(
            until_period_end(Period::Month, t),
            Duration::from_secs(9 * 86_400 + 60)
        );
        // 2026-12-31T12:00:00Z → month rolls into the next year.
        assert_eq!(
            until_period_end(Period::Month, 1_798_718_400),
            Duration::from_secs(12 * 3600)
        );
    }
}
