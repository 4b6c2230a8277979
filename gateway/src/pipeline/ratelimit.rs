//! Wiring of the `portcullis-ratelimit` crate: the limiter chosen by `storage.state` (the only
//! `match` on it), the extractor that lists every policy applying to a request, and the
//! observer that counts the layer's own rejections per tenant.
//!
//! Policies per request, all checked in one all-or-nothing decision:
//! - the caller: the tenant's bucket, or the anonymous per-IP bucket;
//! - the route's own limit for that caller (the tenant's override for the route, else the
//!   route's `limit`), when there is one;
//! - the tenant's daily and monthly request quotas (UTC calendar windows), when set;
//! - the global ceiling.
//!
//! Every policy is charged the route's `cost`. Everything is read from the request context;
//! a tenant's keys were encoded with its snapshot.

use std::sync::Arc;

use http::request::Parts;
use portcullis_ratelimit::{
    BatchedConfig, BatchedLimiter, FailMode, FallbackConfig, FallbackLimiter, LimitKey,
    LimitRequest, Limiter, LimiterError, LocalLimiter, Policy, Principal, RedisLimiter,
    RedisLimiterConfig, Rejection,
};

use crate::config::{Bucket, Config, StateBackend, StoreErrorMode, SyncMode};
use crate::plumbing::context::Caller;
use crate::plumbing::context::RequestContext;

/// Builds the configured limiter. Redis (a server or a cluster) is wrapped in the fallback
/// that applies `rate_limit.on_store_error` when Redis fails or is slow, and with
/// `rate_limit.sync = "batched"` that in the batched limiter, which leases tokens through it
/// (so a lease top-up during an outage is decided by the fallback like any request).
/// `sync` does not apply to `memory`: there is no shared store to batch.
pub fn build_limiter(config: &Config) -> Result<Arc<dyn Limiter>, LimiterError> {
    let redis_config = RedisLimiterConfig {
        timeout: config.storage.state_timeout,
        ..RedisLimiterConfig::default()
    };
    let redis = match &config.storage.state {
        StateBackend::Memory => return Ok(Arc::new(LocalLimiter::new())),
        StateBackend::Redis(url) => RedisLimiter::open(url, redis_config)?,
        StateBackend::RedisCluster(nodes) => RedisLimiter::open_cluster(nodes, redis_config)?,
    };
    let fallback = FallbackConfig {
        mode: match config.rate_limit.on_store_error {
            StoreErrorMode::FailOpen => FailMode::Open,
            StoreErrorMode::FailClosed => FailMode::Closed,
        },
        replicas: config.rate_limit.replicas,
        ..FallbackConfig::default()
    };
    let shared = Arc::new(FallbackLimiter::new(Arc::new(redis), fallback));
    match config.rate_limit.sync {
        SyncMode::Exact => Ok(shared),
        SyncMode::Batched { max_overshoot } => {
            let batched = BatchedConfig {
                max_overshoot,
                replicas: config.rate_limit.replicas,
                ..BatchedConfig::default()
            };
            Ok(Arc::new(BatchedLimiter::new(shared, batched)?))
        }
    }
}

/// The policies that are not per tenant, built once.
#[derive(Debug, Clone)]
struct StaticPolicies {
    anonymous: Option<Arc<Policy>>,
    global: Option<Arc<Policy>>,
    /// By route index.
    routes: Vec<Option<Arc<Policy>>>,
}

fn static_policy(name: &str, bucket: Option<&Bucket>) -> Option<Arc<Policy>> {
    let b = bucket?;
    portcullis_control::build_policy(name, b.rate, b.per, b.burst, b.shadow, "-")
}

/// The extractor for `RateLimitLayer`: `None` (no policy at all) passes the request through.
pub fn extractor(
    config: &Config,
) -> impl Fn(&Parts) -> Option<LimitRequest> + Send + Sync + 'static {
    let policies = StaticPolicies {
        anonymous: static_policy("ip", config.rate_limit.anonymous.as_ref()),
        global: static_policy("global", config.rate_limit.global.as_ref()),
        routes: config
            .routes
            .iter()
            .map(|r| static_policy("route", r.limit.as_ref()))
            .collect(),
    };
    move |parts: &Parts| {
        let context = RequestContext::of(&parts.extensions)?;
        let route = &context.route;
        let cost = route.settings.cost;
        let name = route.settings.name.as_str();
        let route_default = policies.routes.get(route.index).and_then(Option::as_ref);
        let mut request = LimitRequest::new();
        match &context.caller {
            Caller::Tenant(tenant) => {
                // The tenant's keys were encoded with its snapshot: cloning them is an
                // `Arc` increment, not a formatted string per request.
                if let Some(policy) = &tenant.policy {
                    request.push(tenant.key.clone(), policy.clone(), cost);
                }
                match (tenant.route_policies.get(name), route_default) {
                    (Some((key, policy)), _) => request.push(key.clone(), policy.clone(), cost),
                    (None, Some(policy)) => request.push(
                        LimitKey::route(Principal::Tenant(&tenant.id), name),
                        policy.clone(),
                        cost,
                    ),
                    (None, None) => {}
                }
                for (_, key, policy) in &tenant.period_policies {
                    request.push(key.clone(), policy.clone(), cost);
                }
            }
            Caller::Anonymous => {
                let ip = context.client.ip;
                if let Some(policy) = &policies.anonymous {
                    request.push(LimitKey::ip(ip), policy.clone(), cost);
                }
                if let Some(policy) = route_default {
                    request.push(
                        LimitKey::route(Principal::Ip(ip), name),
                        policy.clone(),
                        cost,
                    );
                }
            }
        }
        if let Some(policy) = &policies.global {
            request.push(LimitKey::global(), policy.clone(), cost);
        }
        (!request.is_empty()).then_some(request)
    }
}

/// The rate-limit layer's observer (`RateLimitLayer::with_observer`): counts a 429 the layer
/// answered itself against the resolved tenant, for the admin usage view. Nothing else is a
/// rate-limit rejection — an upstream's own 429 passes through uncounted — and anonymous
/// callers have no per-tenant count.
pub fn count_rate_limited(extensions: &http::Extensions, rejection: &Rejection) {
    let caller = RequestContext::of(extensions).map(|context| &context.caller);
    if let (Rejection::RateLimited { .. }, Some(Caller::Tenant(tenant))) = (rejection, caller) {
        tenant.record_rate_limited();
    }
}
