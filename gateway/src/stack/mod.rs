//! The request path, in order, one commented line per layer ([`assemble`]): the one place it
//! is described; docs and other modules link here.
//!
//! - **Before the layers**: the listener (`edge::listener`) accepts the connection, serves the
//!   protocol TLS negotiated, inserts the peer address (`plumbing::client::PeerAddr`) and
//!   bounds every silent phase; for HTTP/1.x the framing guard reads each head before hyper.
//!   Its pipeline is the reloadable one (`edge::listener::Swap`): each request runs wholly on the
//!   pipeline built from the configuration current when it starts (one atomic load).
//! - **What travels with a request**: the observe step opens the per-request telemetry
//!   record (`telemetry::Exchange`: trace context, attempts, bytes, the route's metrics), and
//!   `Resolve` builds the one [`RequestContext`] (route, caller, client address) that every
//!   later layer reads from the extensions; nothing re-derives the route or the client.
//!   Policy travels in extensions too (the idempotency lock, a late-answer offer); no layer
//!   reaches into another's state.
//! - **Fused layers**: load shedding and the concurrency limits run as one step
//!   (`HoldBoth`) so that both permits ride on one response-body wrapper until its last
//!   byte.
//! - **After the layers**: the retry layer drives the pooled upstream client (`Proxy`), one
//!   attempt at a time.
//!
//! The gateway's own small layers are `plumbing::step::Step`s, made tower layers by the one
//! generic `StepLayer`.

use std::sync::Arc;

use tower::util::BoxCloneService;
use tower::ServiceBuilder;

use crate::config::{Config, Priority};
use crate::edge::framing::Smuggling;
use crate::edge::grpc::GrpcAnswers;
use crate::edge::limits::Limits;
use crate::edge::listener::HttpService;
use crate::edge::request_id::RequestId;
use crate::edge::target::Target;
use crate::pipeline::auth_failures::AuthFailures;
use crate::pipeline::buffer::BufferLayer;
use crate::pipeline::concurrency::Concurrency;
use crate::pipeline::deliveries::accept::AcceptLayer;
use crate::pipeline::deliveries::status::StatusLayer;
use crate::pipeline::deliveries::worker::DeliveryService;
use crate::pipeline::deliveries::Deliveries;
use crate::pipeline::health::{Health, HealthRoutesLayer};
use crate::pipeline::jwt::{JwtAuth, JwtKeysLayer};
use crate::pipeline::rescue::RescueLayer;
use crate::pipeline::resolve::Resolve;
use crate::pipeline::router::RouteTable;
use crate::pipeline::shed::LoadShed;
use crate::pipeline::signature::SignatureLayer;
use crate::pipeline::websocket::WebSocketCaps;
use crate::plumbing::client::TrustedProxies;
use crate::plumbing::context::RequestContext;
use crate::plumbing::held::HoldBoth;
use crate::plumbing::step::StepLayer;
use crate::telemetry::observe::Observe;
use crate::telemetry::Telemetry;
use crate::upstream::proxy::{Proxy, ProxyError, Upstream};
use crate::upstream::websocket::WebSockets;
use axum::body::Body;
use http::{Request, Response};
use portcullis_control::Directory;
use portcullis_idempotency::{IdempotencyLayer, IdempotencyLock, LateAnswer, Store};
use portcullis_ratelimit::{Limiter, RateLimitLayer};
use portcullis_retry::{Handoff, RetryLayer, SystemWallClock};

/// Everything the pipeline is built from.
#[derive(Clone)]
pub struct StackParts {
    /// Upstreams (pools, balancers and their retry state), indexed as in the configuration.
    pub upstreams: Vec<Arc<Upstream>>,
    /// Rate-limit decisions.
    pub limiter: Arc<dyn Limiter>,
    /// Idempotency records.
    pub idempotency_store: Arc<dyn Store>,
    /// Tenants and API keys, kept fresh from the database.
    pub directory: Arc<Directory>,
    /// Readiness state for `/healthz` and `/readyz` on the proxy listener.
    pub health: Arc<Health>,
    /// The queue of asynchronous routes; `None` when no route is asynchronous.
    pub(crate) deliveries: Option<Arc<Deliveries>>,
}

/// Builds the proxy listener's service.
pub fn build(config: &Config, parts: StackParts) -> HttpService {
    let trusted = Arc::new(TrustedProxies::new(config.server.trusted_proxies.clone()));
    let proxy = Proxy::new(parts.upstreams.clone()).with_websockets(WebSockets::new(config));
    assemble(config, parts, trusted, proxy)
}

/// The pipeline around `upstream`, the innermost service: the pooled [`Proxy`] in
/// production, a stub in the in-process tests of the assembled stack.
pub(crate) fn assemble<P>(
    config: &Config,
    parts: StackParts,
    trusted: Arc<TrustedProxies>,
    upstream: P,
) -> HttpService
where
    P: tower::Service<Request<Body>, Response = Response<Body>, Error = ProxyError>
        + Clone
        + Send
        + 'static,
    P::Future: Send + 'static,
{
    // `[auth.jwt]`: the verifier; its key refresher stops when the stack is dropped.
    let jwt = config.auth.jwt.clone().map(JwtAuth::start);
    let states: Vec<_> = parts.upstreams.iter().map(|u| u.state().clone()).collect();
    // `auth.failure_limit`: failed authentications per client address, per replica.
    let failures =
        AuthFailures::new(config.auth.failure_limit, config.auth.failure_window).map(Arc::new);
    let telemetry = Arc::new(Telemetry::new(config, trusted.clone()));
    let websockets = config.routes.iter().any(|r| r.websocket.is_some());
    // Layers only some routes need are in the stack only when some route does: a request
    // pays for each layer it passes, even one that lets it through untouched.
    let verifies = config.routes.iter().any(|r| r.verify.is_some());
    let pipeline = ServiceBuilder::new()
        .layer(StepLayer::new(Smuggling)) // ambiguous framing / malformed heads refused by the connection guard → 400, connection closed
        .layer(StepLayer::new(GrpcAnswers)) // the gateway's problems to a gRPC call answered as grpc-status (Trailers-Only)
        .layer(HealthRoutesLayer::new(parts.health)) // /healthz and /readyz for load balancers
        .map_request(crate::edge::hop_by_hop::strip_client_request::<axum::body::Body>) // client's hop-by-hop fields, before any layer adds or reads one; ours cannot be named away
        .layer(StepLayer::new(Observe::new(telemetry))) // trace context (trusted peers only), server span, metrics per route and tenant, access log for every routed answer (refusals above count in requests_refused_total)
        .layer(StepLayer::new(RequestId)) // X-Request-Id in and out
        .layer(StepLayer::new(Limits::new(
            config.server.max_body_bytes,
            config.server.max_header_bytes,
            config.server.body_read_timeout,
        ))) // 413 / 431 / 408 for a body that does not arrive in time
        .layer(StepLayer::new(Target)) // path normalised in place (nginx rules), Host / :authority checked → 400
        .option_layer(jwt.clone().map(JwtKeysLayer::new)) // a bearer JWT naming an unknown kid waits for one rate-limited JWKS refresh
        .option_layer(parts.deliveries.is_some().then(|| {
            StatusLayer::new(
                parts.deliveries.clone(),
                parts.directory.clone(),
                jwt.clone(),
                trusted.clone(),
                failures.clone(),
            )
        })) // GET /_portcullis/deliveries/{id}: an accepted request's status, to the caller who sent it (else 404)
        .layer(StepLayer::new(
            Resolve::new(
                RouteTable::new(&config.routes, &states),
                parts.directory.clone(),
                trusted,
            )
            .with_jwt(jwt)
            .with_failures(failures),
        )) // bearer JWT → tenant (bad token → 401); most specific route by host, path, headers, method (else 405/404), client address, credentials of an address past auth.failure_limit → 429 unchecked, API key → tenant (bad key → 401, counted per address), else anonymous: the one RequestContext every later layer reads
        .layer(StepLayer::new(HoldBoth(
            LoadShed::new(
                config.server.load_shed_limit,
                config.server.critical_reserve,
                config
                    .routes
                    .iter()
                    .any(|r| r.priority == Priority::Critical),
            )
            .with_caller_share(config.server.load_shed_limit, config.server.caller_share), // one caller over its share of the cap → 429 concurrency-limited; over the cap → 503 at once; normal routes already at the cap less the critical reserve
            Concurrency::new(&config.routes), // tenant concurrency_limit, route concurrency_per_caller → 429 concurrency-limited at once, before any rate-limit token is spent
        ))) // both permits held by one response body wrapper until its last byte
        .option_layer(websockets.then(|| StepLayer::new(WebSocketCaps::new(config)))) // only when some route has websocket = true: route and tenant max_websockets → 429 at once, the slots ride to the tunnel; any other CONNECT → 501, an HTTP/2 WebSocket on a route without websocket → 403
        .option_layer(verifies.then(|| SignatureLayer::new(Arc::new(SystemWallClock)))) // routes with verify: body read whole (max_body_bytes), HMAC checked in constant time; missing, forged or stale → 401 before any rate-limit token is spent
        .layer(
            RateLimitLayer::new(
                parts.limiter.clone(),
                crate::pipeline::ratelimit::extractor(config),
            )
            .with_observer(crate::pipeline::ratelimit::count_rate_limited),
        ) // all policies at once; 429 + Retry-After, headers on every response; its own 429s counted per tenant
        .layer(BufferLayer::new(config.server.request_buffer_bytes)) // bodies up to request_buffer_bytes read whole before any upstream contact; stalled → 408, nothing sent
        .option_layer(
            parts
                .deliveries
                .is_some()
                .then(|| AcceptLayer::new(parts.deliveries.clone())),
        ) // asynchronous routes: deduped and stored with enqueue, then 202 + Portcullis-Delivery-Id + Location; queue down → 503; nothing below runs (the worker delivers later through `delivery`)
        .layer(IdempotencyLayer::new(
            parts.idempotency_store.clone(),
            crate::pipeline::idempotency::extractor(config),
        )) // keyed POST/PATCH: lock, replay, 409/422
        .layer(RescueLayer) // retry/upstream errors → problem+json (502/503/504/413)
        .layer(
            RetryLayer::new(
                |ext| ext.get::<IdempotencyLock>().is_some(),
                RequestContext::breaker_key, // the breaker attributes failures to callers
                Arc::new(SystemWallClock),
            )
            .with_target(RequestContext::retry_target)
            .with_handoff(late_answer),
        ) // the one retry layer: ladder, backoff, budget, breaker, deadline; a keyed request's timed-out attempt left running for the idempotency layer
        .service(upstream); // pooled client, one attempt; a WebSocket handshake on its own connection, a 101 → tunnel (upstream::websocket)
    BoxCloneService::new(pipeline)
}

/// What asynchronous routes deliver through: the same retry layer (breaker, adaptive
/// throttling, budget, attempt timeout) and pooled upstream client as the synchronous path
/// above, with its errors turned into problems by the same rescue. No delivery counts as
/// protected by an Idempotency-Key lock, so the retry layer does not re-send a POST within
/// one delivery attempt: the route's delivery schedule does (`pipeline::deliveries::worker`).
pub(crate) fn delivery(upstreams: Vec<Arc<Upstream>>) -> DeliveryService {
    let service = ServiceBuilder::new()
        .layer(RescueLayer)
        .layer(
            RetryLayer::new(
                |_: &http::Extensions| false,
                RequestContext::breaker_key,
                Arc::new(SystemWallClock),
            )
            .with_target(RequestContext::retry_target),
        )
        .service(Proxy::new(upstreams));
    tower::util::BoxCloneSyncService::new(service)
}

/// The idempotency layer's offer to receive a timed-out attempt's answer late, as the retry
/// layer's [`Handoff`] (the two crates do not know each other).
fn late_answer(extensions: &http::Extensions) -> Option<Handoff> {
    let answer = extensions.get::<LateAnswer>()?;
    let sender = answer.take()?;
    Some(Handoff::new(answer.until(), move |response| {
        sender.deliver(response)
    }))
}

#[doc(hidden)]
pub mod bench;
#[cfg(test)]
mod tests;
