//! The request context: what the pipeline knows about a request once its route and its
//! caller are resolved, built once by [`Resolve`] and read by every later layer.
//!
//! Rate limiting (which policies and keys), idempotency (which settings and record scope),
//! the retry layer (policy, upstream state, the breaker's caller key) and the proxy (which
//! upstream, how to rewrite the path, whether the peer may speak for the client in
//! `X-Forwarded-*`) all read the same [`RequestContext`]; none of them looks the route up
//! again, re-derives the client address or turns the caller into a string of its own.
//! Whatever can be computed ahead of the request is: the route's retry target and
//! idempotency template when the route table is built, the tenant's rate-limit keys and
//! record scope when the tenant snapshot is loaded.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use axum::body::Body;
use http::{Extensions, Request, Response};
use portcullis_control::Directory;
use portcullis_problem::Problem;
use portcullis_retry::RetryTarget;

use crate::pipeline::metrics::RouteMetrics;
use crate::pipeline::router::{Route, RouteTable};
use crate::pipeline::step::{Finish, Step};
use crate::pipeline::tenant::{self, Caller};
use crate::upstream::forwarded::{Client, PeerAddr, TrustedProxies};

/// The resolved request; in request extensions (as an `Arc`) from [`Resolve`] on.
#[derive(Debug)]
pub struct RequestContext {
    /// The route the request matched.
    pub route: Arc<Route>,
    /// Who is calling.
    pub caller: Caller,
    /// The client address the gateway believes, and whether the peer is a trusted proxy.
    pub client: Client,
}

// === impl RequestContext ===

impl RequestContext {
    /// The context of a request, once [`Resolve`] has run.
    pub fn of(extensions: &Extensions) -> Option<&Self> {
        extensions.get::<Arc<Self>>().map(Arc::as_ref)
    }

    /// The retry layer's view (`RetryLayer::with_target`): the route's policy and upstream.
    pub(crate) fn retry_target(extensions: &Extensions) -> Option<&RetryTarget> {
        Self::of(extensions).map(|context| &context.route.retry)
    }

    /// The breaker's caller key (`RetryLayer::new`, see [`tenant::caller_key`]): hashed only
    /// for requests that reach the breaker. One shared key without a context (never in the
    /// gateway's stack).
    pub(crate) fn breaker_key(extensions: &Extensions) -> u64 {
        Self::of(extensions).map_or(0, |context| {
            tenant::caller_key(&context.caller, context.client.ip)
        })
    }
}

/// Matches the route (else 404), resolves the client address and the caller (a bad key is
/// 401), and inserts the [`RequestContext`] (a [`Step`]). The route's metrics ride back on
/// every response from here on, refusals included, for the observe layer outside.
#[derive(Debug, Clone)]
pub(crate) struct Resolve {
    routes: RouteTable,
    directory: Arc<Directory>,
    trusted: Arc<TrustedProxies>,
}

impl Resolve {
    /// Resolves against `routes`, the tenants of `directory`, and the `trusted` proxies.
    pub(crate) fn new(
        routes: RouteTable,
        directory: Arc<Directory>,
        trusted: Arc<TrustedProxies>,
    ) -> Self {
        Self {
            routes,
            directory,
            trusted,
        }
    }
}

/// Hands the route's metrics and the request context back on the response (for the
/// observe step outside: metrics, span attributes, the access log).
pub(crate) struct Resolved(RouteMetrics, Arc<RequestContext>);

impl Finish for Resolved {
    fn finish(self, response: Response<Body>) -> Response<Body> {
        let mut response = self.0.finish(response);
        response.extensions_mut().insert(self.1);
        response
    }
}

impl Step for Resolve {
    type Finish = Resolved;

    fn step(&self, request: &mut Request<Body>) -> Result<Resolved, Response<Body>> {
        let Some(route) = self.routes.find(request.uri().path()).cloned() else {
            return Err(Problem::no_route(request.uri().path()).into_response());
        };
        let metrics = route.metrics.clone();
        let peer = request
            .extensions()
            .get::<PeerAddr>()
            .map_or(IpAddr::V4(Ipv4Addr::LOCALHOST), |p| p.0.ip());
        let client = self.trusted.resolve(peer, request.headers());
        let caller = match tenant::resolve_caller(&self.directory, request.headers_mut()) {
            Ok(caller) => caller,
            Err(refusal) => return Err(metrics.finish(refusal)),
        };
        let context = Arc::new(RequestContext {
            route,
            caller,
            client,
        });
        request.extensions_mut().insert(context.clone());
        Ok(Resolved(metrics, context))
    }
}
