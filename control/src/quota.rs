//! What the admin API may ask of rate limiting, without reaching into the limiter: a tenant's
//! current usage (read without consuming), and manual reset or top-up of a long-period quota.
//!
//! The admin API holds an `Arc<dyn QuotaAdmin>`, implemented over the configured limiter
//! (`quota_admin.rs`), so the admin code never branches on the state backend.

use async_trait::async_trait;
use serde::Serialize;

/// A long quota period, on UTC calendar boundaries (the rate-limit crate's, which enforces it).
pub(crate) use portcullis_ratelimit::Period;

/// One bucket's state as the limiter sees it now.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct BucketUsage {
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
pub(crate) struct PeriodUsage {
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
pub(crate) struct TenantUsage {
    /// Tenant id.
    pub tenant: String,
    /// Token buckets (tenant bucket and per-route overrides).
    pub buckets: Vec<BucketUsage>,
    /// Daily and monthly quotas, where configured.
    pub periods: Vec<PeriodUsage>,
    /// Rejections (429) of this tenant by this replica since it started, by the rate limiter
    /// or the concurrency limiter (`max_in_flight`); an upstream's own 429 is not counted.
    pub rejected_total: u64,
}

/// Quota operations failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum QuotaError {
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
pub(crate) trait QuotaAdmin: Send + Sync {
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
