//! [`QuotaAdmin`] over the configured limiter and the tenant directory. The usage view's
//! rejection count is the tenant's own counter ([`Tenant::rate_limited_total`]), fed by the
//! rate-limit layer.
//!
//! [`Tenant::rate_limited_total`]: crate::Tenant::rate_limited_total

use std::sync::Arc;

use async_trait::async_trait;
use portcullis_ratelimit::{Check, Decision, LimitKey, Limiter, LimiterError, Policy};

use crate::directory::Directory;
use crate::quota::{BucketUsage, Period, PeriodUsage, QuotaAdmin, QuotaError, TenantUsage};

/// The admin API's [`QuotaAdmin`] over the configured limiter.
#[derive(Debug)]
pub(crate) struct LimiterQuotaAdmin {
    limiter: Arc<dyn Limiter>,
    directory: Arc<Directory>,
}

impl LimiterQuotaAdmin {
    /// Over `limiter`, resolving tenants in `directory`.
    pub(crate) fn new(limiter: Arc<dyn Limiter>, directory: Arc<Directory>) -> Self {
        Self { limiter, directory }
    }
}

#[async_trait]
impl QuotaAdmin for LimiterQuotaAdmin {
    async fn usage(&self, tenant: &str) -> Result<TenantUsage, QuotaError> {
        let snapshot = self.directory.snapshot();
        let Some(t) = snapshot.by_id(tenant) else {
            return Err(QuotaError::UnknownTenant(tenant.to_owned()));
        };
        let mut checks = Vec::new();
        let mut routes = Vec::new();
        if let Some(policy) = &t.policy {
            checks.push(Check {
                key: t.key.clone(),
                policy: policy.clone(),
                cost: 1,
            });
            routes.push(None);
        }
        for (prefix, (key, policy)) in &t.route_policies {
            checks.push(Check {
                key: key.clone(),
                policy: policy.clone(),
                cost: 1,
            });
            routes.push(Some(prefix.clone()));
        }
        let verdict = self.limiter.peek(&checks).await.map_err(store_error)?;
        let buckets = verdict
            .decisions()
            .iter()
            .zip(checks.iter().zip(routes))
            .map(|(decision, (check, route))| BucketUsage {
                policy: check.policy.name().to_owned(),
                route,
                limit: decision.limit,
                remaining: decision.remaining,
                reset_after_secs: decision.reset_after_secs(),
            })
            .collect();
        let period_checks: Vec<(Period, Check)> = t
            .period_policies
            .iter()
            .map(|(period, key, policy)| (*period, period_check(key, policy)))
            .collect();
        let mut periods = Vec::new();
        if !period_checks.is_empty() {
            let just_checks: Vec<Check> = period_checks.iter().map(|(_, c)| c.clone()).collect();
            let verdict = self.limiter.peek(&just_checks).await.map_err(store_error)?;
            for ((period, _), decision) in period_checks.iter().zip(verdict.decisions()) {
                periods.push(period_usage(*period, decision));
            }
        }
        Ok(TenantUsage {
            tenant: tenant.to_owned(),
            buckets,
            periods,
            rejected_total: t.rate_limited_total(),
        })
    }

    async fn reset_period(&self, tenant: &str, period: Period) -> Result<PeriodUsage, QuotaError> {
        let check = self.period_quota(tenant, period)?;
        self.limiter
            .reset(std::slice::from_ref(&check))
            .await
            .map_err(store_error)?;
        let verdict = self
            .limiter
            .peek(std::slice::from_ref(&check))
            .await
            .map_err(store_error)?;
        let decision = verdict
            .decisions()
            .first()
            .ok_or_else(|| QuotaError::Store("empty decision".into()))?;
        Ok(period_usage(period, decision))
    }

    async fn top_up(
        &self,
        tenant: &str,
        period: Period,
        amount: u64,
    ) -> Result<PeriodUsage, QuotaError> {
        let check = self.period_quota(tenant, period)?;
        let decision = self
            .limiter
            .give_back(&check, amount)
            .await
            .map_err(store_error)?;
        Ok(period_usage(period, &decision))
    }
}

impl LimiterQuotaAdmin {
    /// The check for `tenant`'s quota of `period`, if the tenant exists and has one.
    fn period_quota(&self, tenant: &str, period: Period) -> Result<Check, QuotaError> {
        let snapshot = self.directory.snapshot();
        let t = snapshot
            .by_id(tenant)
            .ok_or_else(|| QuotaError::UnknownTenant(tenant.to_owned()))?;
        t.period_policies
            .iter()
            .find(|(p, _, _)| *p == period)
            .map(|(_, key, policy)| period_check(key, policy))
            .ok_or(QuotaError::NoSuchQuota(period))
    }
}

/// The same key the request path charges (see `ratelimit::extractor`).
fn period_check(key: &LimitKey, policy: &Arc<Policy>) -> Check {
    Check {
        key: key.clone(),
        policy: policy.clone(),
        cost: 1,
    }
}

fn period_usage(period: Period, decision: &Decision) -> PeriodUsage {
    PeriodUsage {
        period,
        limit: decision.limit,
        used: decision.limit.saturating_sub(decision.remaining),
        resets_in_secs: decision.reset_after_secs(),
    }
}

fn store_error(err: LimiterError) -> QuotaError {
    QuotaError::Store(err.to_string())
}
