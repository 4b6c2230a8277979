//! The upstream client: one pooled keep-alive hyper client per upstream, sending each attempt
//! to the endpoint `upstream::balance` picks (and feeding the outcome back to it), bodies streamed both ways, hop-by-hop headers removed (see `edge::hop_by_hop`:
//! the client's at the edge, the upstream's here), `X-Forwarded-*` set.
//! `https://` endpoints go through [`TlsConnector`]; HTTP/2 is spoken to upstreams that
//! declare it (prior knowledge on `http://`, ALPN `h2` on `https://`).
//!
//! One call is one attempt, with no timeout of its own beyond connecting. Retries, backoff and breakers belong to the retry layer above;
//! this service only reports precisely how an attempt failed ([`ProxyError`]), because the
//! retry layer's safety decision depends on whether a byte may have reached the backend.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use arc_swap::ArcSwap;
use axum::body::Body;
use futures_util::future::{BoxFuture, FutureExt};
use http::header::{self, HeaderName, HeaderValue};
use http::uri::PathAndQuery;
use http::{Request, Response, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::Service;

use crate::config::{
    HealthCheckSettings, LoadBalancer, OutlierSettings, PathRule, UpstreamSettings,
};
use crate::edge::hop_by_hop;
use crate::edge::listener::ClientTls;
use crate::pipeline::context::RequestContext;
use crate::pipeline::held::{HeldBody, UntilEnd};
use crate::telemetry::Attempt;
use crate::upstream::balance::discovery::{self, Sources};
use crate::upstream::balance::timeout::TimeoutWitness;
use crate::upstream::balance::{
    Address, Clock, Endpoint, EndpointSet, EndpointState, InFlight, Now, Outcome,
};
use portcullis_retry::{AttemptInfo, Dependency, PickedEndpoint, ServedBy};

mod client_body;
mod connector;
mod error;
mod resolver;

use client_body::{BodyFailure, WitnessedBody};
pub use connector::TlsConnector;
pub use error::{ProxyError, ProxyErrorKind};
pub use resolver::HttpConnector;

/// Idle pooled connections are closed after this long (below common backend keep-alive
/// timeouts of 60–75 s would be safer, but backends here are configured by their owners).
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// One backend: its endpoints (replaceable at run time, see `upstream::balance`), how it
/// balances and ejects, and its connection pool.
#[derive(Debug)]
pub struct Upstream {
    name: Arc<str>,
    set: ArcSwap<EndpointSet>,
    clock: Clock,
    load_balancer: LoadBalancer,
    panic_threshold: u8,
    outlier: OutlierSettings,
    health_check: Option<HealthCheckSettings>,
    sources: Sources,
    dependency: Arc<Dependency>,
    /// Seeds each new set's random choices.
    seed: AtomicU64,
    client: Pool,
}

/// The connection pool of an upstream. Plain upstreams keep the bare `HttpConnector`
/// client, so TLS support adds nothing to their per-request path.
#[derive(Debug)]
enum Pool {
    Plain(Client<HttpConnector, Body>),
    Tls(Client<TlsConnector, Body>),
}

// === impl Upstream ===

impl Upstream {
    /// Builds the pool for validated settings.
    pub fn new(
        settings: &UpstreamSettings,
        hosts_file: Option<&std::path::Path>,
        dependency: Arc<Dependency>,
    ) -> Self {
        let mut connector = resolver::http_connector();
        connector.set_connect_timeout(Some(settings.connect_timeout));
        connector.set_nodelay(true);
        connector.enforce_http(true);
        let mut builder = Client::builder(TokioExecutor::new());
        builder
            .pool_max_idle_per_host(settings.pool_max_idle)
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            // Prior knowledge on http://; on https:// ALPN offers only h2 (see crate::tls).
            .http2_only(settings.http2);
        let client = match &settings.tls {
            None => Pool::Plain(builder.build(connector)),
            Some(tls) => Pool::Tls(builder.build(TlsConnector::new(
                connector,
                tls,
                settings.tls_handshake_timeout,
            ))),
        };
        let entries: Vec<(Uri, u32)> = settings
            .endpoints
            .iter()
            .cloned()
            .zip(settings.weights.iter().copied().chain(std::iter::repeat(1)))
            .collect();
        let sources = Sources {
            entries,
            file: settings.endpoints_file.clone(),
            interval: settings.resolve_interval,
            hosts_file: hosts_file.map(Into::into),
        };
        // Until discovery's first refresh, names stand for themselves (resolved at connect).
        let initial: Vec<Arc<Endpoint>> = sources
            .entries
            .iter()
            .filter_map(|(uri, weight)| {
                Some(Arc::new(Endpoint {
                    address: discovery::literal(uri)?,
                    weight: *weight,
                    state: Arc::new(EndpointState::new()),
                }))
            })
            .collect();
        let seed = AtomicU64::new(rand::random());
        let set = EndpointSet::new(
            initial,
            settings.load_balancer,
            settings.panic_threshold,
            seed.fetch_add(1, Ordering::Relaxed),
        );
        Self {
            name: settings.name.as_str().into(),
            set: ArcSwap::from_pointee(set),
            clock: Clock::new(),
            load_balancer: settings.load_balancer,
            panic_threshold: settings.panic_threshold,
            outlier: settings.outlier,
            health_check: settings.health_check.clone(),
            sources,
            dependency,
            seed,
            client,
        }
    }

    /// The upstream's name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The current endpoint set (a snapshot: discovery may swap in another meanwhile).
    pub(crate) fn endpoint_set(&self) -> Arc<EndpointSet> {
        self.set.load_full()
    }

    /// Where the endpoints come from.
    pub(crate) fn sources(&self) -> &Sources {
        &self.sources
    }

    /// The active health check settings, when configured.
    pub(crate) fn health_check(&self) -> Option<&HealthCheckSettings> {
        self.health_check.as_ref()
    }

    /// The retry layer's state of this upstream (budget, breaker).
    pub(crate) fn dependency(&self) -> &Arc<Dependency> {
        &self.dependency
    }

    /// The load balancer in use.
    pub(crate) fn load_balancer(&self) -> LoadBalancer {
        self.load_balancer
    }

    /// The upstream's clock (ejection times are on it).
    pub(crate) fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Whether at least one endpoint is usable now (`/readyz`).
    pub(crate) fn any_usable(&self) -> bool {
        self.set.load().any_usable(&self.clock)
    }

    /// Swaps in a new endpoint list unless it equals the current one; endpoints that stay
    /// keep their state.
    pub(crate) fn replace_endpoints(&self, next: Vec<(Address, u32)>) {
        let current = self.set.load();
        let same = current.endpoints().len() == next.len()
            && current
                .endpoints()
                .iter()
                .zip(&next)
                .all(|(e, (a, w))| e.address == *a && e.weight == *w);
        if same {
            return;
        }
        let mut carried = discovery::carried_states(&current);
        let endpoints: Vec<Arc<Endpoint>> = next
            .into_iter()
            .map(|(address, weight)| {
                let state = carried
                    .remove(&address)
                    .unwrap_or_else(|| Arc::new(EndpointState::new()));
                Arc::new(Endpoint {
                    address,
                    weight,
                    state,
                })
            })
            .collect();
        tracing::info!(
            upstream = %self.name,
            endpoints = ?endpoints.iter().map(|e| e.address.url()).collect::<Vec<_>>(),
            "endpoints changed"
        );
        self.dependency.set_endpoints(endpoints.len());
        let set = EndpointSet::new(
            endpoints,
            self.load_balancer,
            self.panic_threshold,
            self.seed.fetch_add(1, Ordering::Relaxed),
        );
        self.set.store(Arc::new(set));
    }

    /// One active health check: `GET path` to `address`; a 2xx is a pass.
    pub(crate) async fn probe(&self, address: &Address, path: &PathAndQuery) -> bool {
        let uri = Uri::from_parts({
            let mut parts = http::uri::Parts::default();
            parts.scheme = Some(address.scheme.clone());
            parts.authority = Some(address.authority.clone());
            parts.path_and_query = Some(path.clone());
            parts
        });
        let Ok(uri) = uri else { return false };
        let mut request = Request::new(Body::empty());
        *request.uri_mut() = uri;
        request
            .headers_mut()
            .insert(header::HOST, address.host.clone());
        let response = match &self.client {
            Pool::Plain(client) => client.request(request).await,
            Pool::Tls(client) => client.request(request).await,
        };
        response.is_ok_and(|r| r.status().is_success())
    }

    /// Feeds an attempt's outcome to passive health.
    fn record(&self, endpoint: &Endpoint, outcome: Outcome) {
        let set = self.set.load();
        if let Some(until) = set.record(endpoint, outcome, &self.outlier, &self.clock) {
            tracing::warn!(
                upstream = %self.name,
                endpoint = %endpoint.address.url(),
                ejected_for_ms = self.clock.until(until).as_millis() as u64,
                ejections = endpoint.state.ejections(),
                "outlier ejected"
            );
        }
    }
}

/// What an attempt's failure says about the endpoint.
fn outcome_of_error(kind: ProxyErrorKind) -> Outcome {
    match kind {
        ProxyErrorKind::ConnectRefused
        | ProxyErrorKind::ConnectTimeout
        | ProxyErrorKind::Dns
        | ProxyErrorKind::TlsHandshakeTimeout
        | ProxyErrorKind::TlsHandshake
        | ProxyErrorKind::TlsCertificate
        | ProxyErrorKind::ResetAfterSent => Outcome::Failure,
        _ => Outcome::Neutral,
    }
}

/// 502/503/504 from the endpoint are gateway failures (Envoy's `consecutive_gateway_failure`).
fn outcome_of_status(status: http::StatusCode) -> Outcome {
    match status.as_u16() {
        502..=504 => Outcome::Failure,
        _ => Outcome::Success,
    }
}

/// The proxy service: forwards a routed request to its upstream.
#[derive(Debug, Clone)]
pub struct Proxy {
    upstreams: Arc<[Arc<Upstream>]>,
}

// === impl Proxy ===

impl Proxy {
    /// A proxy over `upstreams` (indexed as in the configuration).
    pub fn new(upstreams: Vec<Arc<Upstream>>) -> Self {
        Self {
            upstreams: upstreams.into(),
        }
    }
}

impl Service<Request<Body>> for Proxy {
    type Response = Response<Body>;
    type Error = ProxyError;
    type Future = BoxFuture<'static, Result<Response<Body>, ProxyError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let Some(context) = request.extensions().get::<Arc<RequestContext>>().cloned() else {
            return std::future::ready(Err(ProxyError::new(ProxyErrorKind::NoRoute, None))).boxed();
        };
        let Some(upstream) = self.upstreams.get(context.route.settings.upstream).cloned() else {
            return std::future::ready(Err(ProxyError::new(ProxyErrorKind::NoRoute, None))).boxed();
        };
        let info = request.extensions().get::<AttemptInfo>();
        let avoid = info.and_then(|a| a.avoid_endpoint);
        let timeout_at = info.map(|a| a.timeout_at);
        let endpoint = {
            let set = upstream.set.load();
            let mut now = Now::new(&upstream.clock);
            match set.pick(avoid, &mut now) {
                Some(endpoint) => endpoint.clone(),
                None => {
                    return std::future::ready(Err(ProxyError::new(ProxyErrorKind::NoRoute, None)))
                        .boxed()
                }
            }
        };
        let id = endpoint.state.id;
        if let Some(picked) = request.extensions().get::<PickedEndpoint>() {
            picked.record(id); // a hedged attempt: its copy will avoid this endpoint
        }
        let in_flight: InFlight = endpoint.state.start();
        // Latency is only needed by peak_ewma; round robin reads no clock.
        let started =
            (upstream.load_balancer == LoadBalancer::PeakEwma).then(|| upstream.clock.now());
        // The attempt's span and trace headers (see `crate::telemetry`).
        let prepared = prepare(request, &context, &endpoint.address, id).map(Attempt::start);
        async move {
            let (request, attempt) = prepared?;
            // Bodiless requests (most GETs) need no witness and skip its allocation.
            let (request, body_failure) = if http_body::Body::is_end_stream(request.body()) {
                (request, None)
            } else {
                let (parts, body) = request.into_parts();
                let (body, failure) = WitnessedBody::wrap(body);
                (Request::from_parts(parts, body), Some(failure))
            };
            // The attempt timeout is the retry layer's: it also knows the request deadline.
            // Its timer drops this future; the witness tells passive health.
            let witness = TimeoutWitness::arm(timeout_at, || {
                upstream.record(&endpoint, Outcome::Failure);
            });
            let result = match &upstream.client {
                Pool::Plain(client) => client.request(request).await,
                Pool::Tls(client) => client.request(request).await,
            };
            if let Some(witness) = witness {
                witness.disarm();
            }
            if let Some(started) = started {
                let now = upstream.clock.now();
                endpoint
                    .state
                    .observe_latency(Duration::from_nanos(now.saturating_sub(started)), now);
            }
            attempt.end(result.as_ref().ok().map(|r| r.status().as_u16()));
            let response = result.map_err(|err| {
                // The client's own body error, when it failed, explains the attempt's
                // failure better than hyper's report of it (see `client_body`).
                let err = match body_failure.as_ref().and_then(BodyFailure::take) {
                    Some(body_err) => ProxyError::from_client_body(body_err, id),
                    None => ProxyError::from_client(err, id),
                };
                upstream.record(&endpoint, outcome_of_error(err.kind()));
                err
            })?;
            upstream.record(&endpoint, outcome_of_status(response.status()));
            let (mut parts, body) = response.into_parts();
            // Innermost, so the upstream's `Connection` cannot name away the headers the
            // outer layers add to this response.
            hop_by_hop::strip_upstream_response(&mut parts.headers);
            parts.extensions.insert(ServedBy(id));
            // The endpoint's in-flight count lasts until the body ends: least_request and
            // peak_ewma see streaming responses as load.
            let body = HeldBody::new(body, UntilEnd::new(in_flight));
            Ok(Response::from_parts(parts, Body::new(body)))
        }
        .boxed()
    }
}

/// Rewrites the request for the chosen endpoint.
fn prepare(
    request: Request<Body>,
    context: &RequestContext,
    address: &Address,
    index: usize,
) -> Result<Request<Body>, ProxyError> {
    let (mut parts, body) = request.into_parts();
    let (scheme, authority) = (address.scheme.clone(), address.authority.clone());
    let route = &context.route.settings;
    let path_and_query = upstream_path(&parts.uri, &route.path, route.rewrite.as_deref());
    let client_tls = parts.extensions.get::<ClientTls>().is_some();
    // HTTP/2 clients send :authority instead of Host.
    let original_host = parts.headers.get(header::HOST).cloned().or_else(|| {
        let authority = parts.uri.authority()?;
        HeaderValue::from_str(authority.as_str()).ok()
    });
    parts.uri = Uri::from_parts({
        let mut uri = http::uri::Parts::default();
        uri.scheme = Some(scheme);
        uri.authority = Some(authority);
        uri.path_and_query = Some(path_and_query);
        uri
    })
    .map_err(|_| ProxyError::new(ProxyErrorKind::NoRoute, Some(index)))?;
    parts.version = http::Version::HTTP_11;

    // The client's hop-by-hop fields (the fixed list, `Connection` and what it named) went
    // at the edge, and no layer since adds one: nothing to strip again on this hop.
    parts.headers.insert(header::HOST, address.host.clone());
    let client = &context.client;
    let chain = client.forwarded_for(&parts.headers);
    if let Ok(value) = HeaderValue::from_str(&chain) {
        parts.headers.insert(X_FORWARDED_FOR.clone(), value);
    }
    if !(client.peer_trusted && parts.headers.contains_key(&X_FORWARDED_PROTO)) {
        let proto = if client_tls { "https" } else { "http" };
        parts
            .headers
            .insert(X_FORWARDED_PROTO.clone(), HeaderValue::from_static(proto));
    }
    if !(client.peer_trusted && parts.headers.contains_key(&X_FORWARDED_HOST)) {
        match original_host {
            Some(host) => {
                parts.headers.insert(X_FORWARDED_HOST.clone(), host);
            }
            None => {
                parts.headers.remove(&X_FORWARDED_HOST);
            }
        }
    }
    Ok(Request::from_parts(parts, body))
}

/// The path the upstream receives: as the client sent it (normalised), or with the matched
/// prefix replaced by `rewrite` — on an `exact` route the whole path. `strip_prefix` arrives
/// here as `rewrite = "/"`. The replacement and the rest always meet at one `/`
/// (`/api` + `/v2` on `/api/x` → `/v2/x`, not `/v2//x` or `/v2x`).
fn upstream_path(uri: &Uri, path: &PathRule, rewrite: Option<&str>) -> PathAndQuery {
    let original = || {
        uri.path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/"))
    };
    let Some(rewrite) = rewrite else {
        // The common case: the original target, shared rather than re-formatted.
        return original();
    };
    let rest = match path {
        // The router matched on a segment boundary, so the rest is empty or starts with
        // `/` or `;`.
        PathRule::Prefix(prefix) => uri
            .path()
            .strip_prefix(prefix.trim_end_matches('/'))
            .unwrap_or(uri.path()),
        PathRule::Exact(_) => "",
        // Refused by validation.
        PathRule::Pattern(_) => return original(),
    };
    let mut full = if rest.is_empty() {
        rewrite.to_owned()
    } else {
        format!("{}{rest}", rewrite.trim_end_matches('/'))
    };
    if !full.starts_with('/') {
        full.insert(0, '/');
    }
    if let Some(query) = uri.query() {
        full.push('?');
        full.push_str(query);
    }
    full.parse()
        .unwrap_or_else(|_| PathAndQuery::from_static("/"))
}

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_with_and_without_stripping() {
        let prefix = PathRule::Prefix("/orders".into());
        let uri: Uri = "/orders/7?x=1".parse().unwrap();
        assert_eq!(upstream_path(&uri, &prefix, None).as_str(), "/orders/7?x=1");
        assert_eq!(upstream_path(&uri, &prefix, Some("/")).as_str(), "/7?x=1");
        let root: Uri = "/orders".parse().unwrap();
        assert_eq!(upstream_path(&root, &prefix, Some("/")).as_str(), "/");
        let matrix: Uri = "/orders;v=1/7".parse().unwrap();
        assert_eq!(
            upstream_path(&matrix, &prefix, Some("/")).as_str(),
            "/;v=1/7"
        );
    }

    #[test]
    fn rewrites_replace_the_matched_prefix_at_one_slash() {
        let prefix = PathRule::Prefix("/api".into());
        let slashed = PathRule::Prefix("/api/".into());
        for (rule, rewrite, from, to) in [
            (&prefix, "/v2", "/api/orders?a=b", "/v2/orders?a=b"),
            (&prefix, "/v2/", "/api/orders", "/v2/orders"),
            (&prefix, "/v2", "/api", "/v2"),
            (&prefix, "/v2/", "/api", "/v2/"),
            (&prefix, "/v2", "/api;k=v/x", "/v2;k=v/x"),
            (&slashed, "/v2", "/api/orders", "/v2/orders"),
            (&slashed, "/v2/", "/api/", "/v2/"),
            (&PathRule::Prefix("/".into()), "/base", "/x/y", "/base/x/y"),
            (
                &PathRule::Exact("/old".into()),
                "/new/place",
                "/old?q=1",
                "/new/place?q=1",
            ),
        ] {
            let uri: Uri = from.parse().unwrap();
            assert_eq!(
                upstream_path(&uri, rule, Some(rewrite)).as_str(),
                to,
                "{from} via {rewrite}"
            );
        }
    }
}
