//! The request context: what every layer after route and caller resolution knows about a
//! request, built once by the pipeline's `Resolve` step (`pipeline::resolve`) and read by the
//! rate-limit and idempotency extractors, the retry layer, the proxy and telemetry.
//!
//! Whatever can be computed ahead of the request is: the route's retry target and
//! idempotency template when the route table is built, the tenant's rate-limit keys and
//! record scope when the tenant snapshot is loaded.

use std::net::IpAddr;
use std::sync::Arc;

use http::Extensions;
use portcullis_control::Tenant;
use portcullis_retry::RetryTarget;

use crate::plumbing::client::Client;
use crate::plumbing::route::Route;

/// The resolved request; in request extensions (as an `Arc`) from the `Resolve` step on.
#[derive(Debug)]
pub struct RequestContext {
    /// The route the request matched.
    pub route: Arc<Route>,
    /// Who is calling.
    pub caller: Caller,
    /// The client address the gateway believes, and whether the peer is a trusted proxy.
    pub client: Client,
    /// [`caller_key`] of `caller` and `client`, hashed once for every layer that counts
    /// per caller.
    caller_key: u64,
}

// === impl RequestContext ===

impl RequestContext {
    /// The context of a request on `route` by `caller` from `client`.
    pub(crate) fn new(route: Arc<Route>, caller: Caller, client: Client) -> Self {
        let caller_key = caller_key(&caller, client.ip);
        Self {
            route,
            caller,
            client,
            caller_key,
        }
    }

    /// The caller's key for per-caller counts (see [`caller_key`]).
    pub(crate) fn caller_key(&self) -> u64 {
        self.caller_key
    }

    /// The context of a request, once the `Resolve` step has run.
    pub fn of(extensions: &Extensions) -> Option<&Self> {
        extensions.get::<Arc<Self>>().map(Arc::as_ref)
    }

    /// The retry layer's view (`RetryLayer::with_target`): the route's policy and upstream.
    pub(crate) fn retry_target(extensions: &Extensions) -> Option<&RetryTarget> {
        Self::of(extensions).map(|context| &context.route.retry)
    }

    /// The breaker's caller key (`RetryLayer::new`): the tenant's [`caller_key`], and one
    /// key, [`ANONYMOUS_BREAKER_KEY`], for every anonymous caller together — and for a
    /// request without a context (never in the gateway's stack). Client addresses are
    /// cheap (an IPv4 address each, an IPv6 /64 by the billion), so counting each as a
    /// caller, as [`caller_key`] does for concurrency, would let one attacker pose as the
    /// `min_callers` distinct callers that open a breaker for every tenant; counted
    /// together, anonymous traffic is one caller and an outage must be seen by several
    /// tenants.
    pub(crate) fn breaker_key(extensions: &Extensions) -> u64 {
        match Self::of(extensions) {
            Some(context) if matches!(context.caller, Caller::Tenant(_)) => context.caller_key,
            _ => ANONYMOUS_BREAKER_KEY,
        }
    }
}

/// The resolved caller, part of the request context.
#[derive(Debug, Clone)]
pub enum Caller {
    /// An authenticated tenant.
    Tenant(Arc<Tenant>),
    /// No API key: limited by client IP.
    Anonymous,
}

/// The caller's key for per-caller counts (the caller share of load shedding, a route's
/// `concurrency_per_caller`, the breaker's tenants): the tenant, else the client address.
/// An IPv6 client counts by its /64, the block one subscriber usually holds, so one host
/// cannot pose as many callers by rotating addresses; an IPv4-mapped address counts as the
/// IPv4 address. Hashed once per request, in [`RequestContext::new`].
pub(crate) fn caller_key(caller: &Caller, client_ip: IpAddr) -> u64 {
    use std::hash::{BuildHasher, Hash, Hasher};
    // Keyed at random once per process: the per-caller tables use the key as their hash
    // (`pipeline::in_flight`), so a client must not be able to choose addresses that collide.
    static KEYS: std::sync::LazyLock<std::collections::hash_map::RandomState> =
        std::sync::LazyLock::new(std::collections::hash_map::RandomState::new);
    let mut hasher = KEYS.build_hasher();
    match (caller, client_ip.to_canonical()) {
        (Caller::Tenant(tenant), _) => ("tenant", &tenant.id).hash(&mut hasher),
        (Caller::Anonymous, IpAddr::V4(v4)) => ("ip4", v4).hash(&mut hasher),
        (Caller::Anonymous, IpAddr::V6(v6)) => ("ip6/64", &v6.octets()[..8]).hash(&mut hasher),
    }
    hasher.finish()
}

/// The breaker's key for all anonymous callers (see [`RequestContext::breaker_key`]); a
/// tenant's hashed key equals it with a chance of 2^-64.
pub(crate) const ANONYMOUS_BREAKER_KEY: u64 = 0;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caller_keys_tell_tenants_and_addresses_apart() {
        let ip = |s: &str| caller_key(&Caller::Anonymous, s.parse().unwrap());
        assert_eq!(ip("192.0.2.1"), ip("192.0.2.1"));
        assert_ne!(ip("192.0.2.1"), ip("192.0.2.2"));
        assert_eq!(ip("192.0.2.1"), ip("::ffff:192.0.2.1"), "mapped IPv4");
        assert_eq!(
            ip("2001:db8:1:2::1"),
            ip("2001:db8:1:2:ffff::9"),
            "same /64"
        );
        assert_ne!(ip("2001:db8:1:2::1"), ip("2001:db8:1:3::1"));
    }
}
