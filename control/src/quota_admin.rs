//! [`QuotaAdmin`] over the configured limiter and the tenant directory, plus the per-tenant
//! rejection counters the usage view reports.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use portcullis_ratelimit::{Check, Decision, LimitKey, Limiter, LimiterError, Policy, Principal};

use crate::quota::{BucketUsage, Period, PeriodUsage, QuotaAdmin, QuotaError, TenantUsage};
use crate::tenant::Directory;

/// 429s given per tenant by this replica. Bounded by the number of tenants in the directory.
#[derive(Debug, Default)]
pub struct RejectionCounters {
    by_tenant: Mutex<HashMap<Arc<str>, Arc<AtomicU64>>>,
}

// === impl RejectionCounters ===

impl RejectionCounters {
    /// Counts one 429 for `tenant`.
    pub fn record(&self, tenant: &Arc<str>) {
        let counter = match self.by_tenant.lock() {
            Ok(mut map) => map.entry(tenant.clone()).or_default().clone(),
            Err(_) => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// 429s counted for `tenant`.
    pub fn get(&self, tenant: &str) -> u64 {
        self.by_tenant
            .lock()
            .ok()
            .and_then(|map| map.get(tenant).map(|c| c.load(Ordering::Relaxed)))
            .unwrap_or(0)
    }
}

/// The gateway's [`QuotaAdmin`].
#[derive(Debug)]
pub struct LimiterQuotaAdmin {
    limiter: Arc<dyn Limiter>,
    directory: Arc<Directory>,
    rejections: Arc<RejectionCounters>,
}

impl LimiterQuotaAdmin {
    /// Over `limiter`, resolving tenants in `directory`.
    pub fn new(
        limiter: Arc<dyn Limiter>,
        directory: Arc<Directory>,
        rejections: Arc<RejectionCounters>,
    ) -> Self {
        Self {
            limiter,
            directory,
            rejections,
        }
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
                key: LimitKey::tenant(&t.id),
                policy: policy.clone(),
                cost: 1,
            });
            routes.push(None);
        }
        for (prefix, policy) in &t.route_policies {
            checks.push(Check {
                key: LimitKey::route(Principal::Tenant(&t.id), prefix),
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
            .map(|(period, policy)| (*period, period_check(&t.id, *period, policy)))
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
            rejected_total: self.rejections.get(tenant),
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
            .find(|(p, _)| *p == period)
            .map(|(_, policy)| period_check(&t.id, period, policy))
            .ok_or(QuotaError::NoSuchQuota(period))
    }
}

/// The same key the request path charges (see `ratelimit::extractor`).
fn period_check(tenant: &str, period: Period, policy: &Arc<Policy>) -> Check {
    Check {
        key: LimitKey::period(Principal::Tenant(tenant), period),
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
