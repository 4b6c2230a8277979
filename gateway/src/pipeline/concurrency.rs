//! Concurrency limits (Stripe's concurrent-requests limiter): how many requests one caller
//! may have in flight at once, apart from how many it may start per second.
//!
//! - A tenant's `concurrency_limit` (database, admin API, `[[tenants]]`) counts all its requests
//!   on every route. The counter lives with the tenant in the directory snapshot and
//!   survives reloads, so admission is one compare-and-swap on a tenant the request already
//!   holds: no map, no lock. Every tenant request is counted, limited or not, so a limit set
//!   through the admin API counts the requests already running when it arrives.
//! - A route's `concurrency_per_caller` counts one caller's requests on that route: the tenant, else
//!   the anonymous client address (an IPv6 client by its /64, as the breaker counts
//!   callers). Callers are kept in a sharded table whose entries exist only while they have
//!   requests in flight.
//!
//! Over either limit the answer is 429 problem+json of type `concurrency-limited` at once,
//! with `Retry-After: 1`, `violated-policies: ["concurrency"]` like the rate limiter's 429s,
//! and the draft's fields `RateLimit-Policy: "concurrency";q=N` (no `w`: the limit has no
//! window) and `RateLimit: "concurrency";r=0;t=1`, written by the rate-limit crate's own
//! formatters. A slot is given back when the response body ends or is dropped, or with the
//! request if the client goes away first.
//!
//! # Where this runs
//!
//! After load shedding, which protects the process and stays the cheapest check, and before
//! the rate limiter, so a request refused for concurrency spends no rate-limit token and no
//! quota: it was never started, and the client may retry it as it is.
//!
//! These counts are per replica, like the load shedder's: a limit of N across R replicas
//! admits up to N × R at once. Stripe's limiter is per fleet (Redis); a per-replica count
//! needs no round trip on the request path and forgets nothing when a replica dies.

use std::sync::Arc;

use axum::body::Body;
use http::{Request, Response, StatusCode};
use portcullis_problem::Problem;
use portcullis_ratelimit::headers::{policy_field, ratelimit_field, RATELIMIT, RATELIMIT_POLICY};

use crate::config::RouteSettings;
use crate::pipeline::in_flight::{CountPermit, KeyedCounts, KeyedPermit};
use crate::pipeline::shed::SHED_RETRY_AFTER;
use crate::plumbing::context::Caller;
use crate::plumbing::context::RequestContext;
use crate::plumbing::held::{hold_until_body_ends, Held};
use crate::plumbing::step::{Finish, Step};

/// The policy name in the problem and the headers.
pub const CONCURRENCY_POLICY: &str = "concurrency";

/// Enforces tenants' `concurrency_limit` and routes' `concurrency_per_caller` (a [`Step`]; clones share the route tables).
#[derive(Debug, Clone)]
pub(crate) struct Concurrency {
    /// Per-caller tables of the routes that have a `concurrency_per_caller`, by route index.
    routes: Arc<[Option<Arc<KeyedCounts>>]>,
}

/// Which limit refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    Tenant,
    Route,
    /// The caller's fair share of `server.load_shed_limit` (`pipeline::fair_share`).
    Caller,
}

impl Concurrency {
    /// The limits of `routes` (indexed as configured); tenants bring their own.
    pub(crate) fn new(routes: &[RouteSettings]) -> Self {
        Self {
            routes: routes
                .iter()
                .map(|r| {
                    r.concurrency_per_caller
                        .map(|n| Arc::new(KeyedCounts::new(n)))
                })
                .collect(),
        }
    }
}

impl Step for Concurrency {
    type Finish = Permits;

    fn step(&self, request: &mut Request<Body>) -> Result<Permits, Response<Body>> {
        let Some(context) = RequestContext::of(request.extensions()) else {
            return Ok(Permits::default());
        };
        let mut permits = Permits::default();
        if let Caller::Tenant(tenant) = &context.caller {
            // Counted even without a limit, so a limit set later through the admin API
            // applies to the requests already running, not only to those admitted after it.
            let limit = tenant.max_in_flight.unwrap_or(u64::MAX);
            match CountPermit::try_acquire(tenant.in_flight(), limit) {
                Some(permit) => permits.tenant = Some(permit),
                None => {
                    // A 429 of the gateway's own, shown in the usage view like the limiter's.
                    tenant.record_rate_limited();
                    return Err(refuse(Scope::Tenant, limit));
                }
            }
        }
        if let Some(table) = self
            .routes
            .get(context.route.index)
            .and_then(Option::as_ref)
        {
            let key = context.caller_key();
            match table.try_acquire(key) {
                Some(permit) => permits.route = Some(permit),
                // The tenant's slot, if taken, goes back as `permits` drops.
                None => {
                    if let Caller::Tenant(tenant) = &context.caller {
                        tenant.record_rate_limited();
                    }
                    return Err(refuse(Scope::Route, u64::from(table.limit())));
                }
            }
        }
        Ok(permits)
    }
}

/// The 429 for a request over `limit` (see the module docs).
pub(crate) fn refuse(scope: Scope, limit: u64) -> Response<Body> {
    let (scope, detail) = match scope {
        Scope::Tenant => (
            "tenant",
            format!("This tenant already has {limit} requests in flight, its limit (concurrency_limit)."),
        ),
        Scope::Route => (
            "route",
            format!("You already have {limit} requests in flight on this route, its limit per caller (concurrency_per_caller)."),
        ),
        Scope::Caller => (
            "caller",
            format!("You already have {limit} requests in flight, your share of this gateway's capacity."),
        ),
    };
    metrics::counter!("concurrency_limited_total", "scope" => scope).increment(1);
    let mut response = Problem::new(
        StatusCode::TOO_MANY_REQUESTS,
        "concurrency-limited",
        "Too many concurrent requests",
        format!(
            "{detail} Wait for one of them to finish, or {} s (Retry-After), before sending \
             another; nothing of this request was processed.",
            SHED_RETRY_AFTER.as_secs()
        ),
    )
    .with("policy", CONCURRENCY_POLICY)
    .with("violated-policies", vec![CONCURRENCY_POLICY])
    .with("limit", limit)
    .with("scope", scope)
    .retry_after(SHED_RETRY_AFTER)
    .into_response();
    let headers = response.headers_mut();
    if let Some(value) = policy_field(CONCURRENCY_POLICY, limit, None) {
        headers.insert(RATELIMIT_POLICY, value);
    }
    let t = Some(SHED_RETRY_AFTER.as_secs());
    if let Some(value) = ratelimit_field(CONCURRENCY_POLICY, 0, t) {
        headers.insert(RATELIMIT, value);
    }
    response
}

/// The slots a request holds; handed on to its response body.
#[derive(Debug, Default)]
pub(crate) struct Permits {
    tenant: Option<CountPermit>,
    route: Option<KeyedPermit>,
}

/// Given back when dropped (each permit's own `Drop`).
impl Held for Permits {}

impl Finish for Permits {
    fn finish(self, response: Response<Body>) -> Response<Body> {
        if self.tenant.is_none() && self.route.is_none() {
            // Nothing to hold: the body is not wrapped.
            return response;
        }
        hold_until_body_ends(response, self)
    }
}

#[cfg(test)]
mod tests;
