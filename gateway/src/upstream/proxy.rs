//! The upstream client: one pooled keep-alive hyper client per upstream, sending each attempt
//! to the endpoint `upstream::balance` picks (and feeding the outcome back to it), bodies streamed both ways, hop-by-hop headers removed (see `edge::hop_by_hop`:
//! the client's at the edge, the upstream's here), `X-Forwarded-*` set.
//! Plain HTTP/1.1 upstreams (`http://`, not `http2`) keep their connections in [`pool`]
//! (per endpoint, LIFO, a task per connection); the others use hyper-util's client:
//! `https://` endpoints go through [`TlsConnector`], and HTTP/2 is spoken to upstreams that
//! declare it (prior knowledge on `http://`, ALPN `h2` on `https://`). Either way each worker
//! thread has pools of its own ([`PerWorker`]).
//!
//! One call is one attempt, with no timeout of its own beyond connecting. Retries, backoff and breakers belong to the retry layer above;
//! this service only reports precisely how an attempt failed ([`ProxyError`]), because the
//! retry layer's safety decision depends on whether a byte may have reached the backend.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use futures_util::future::{BoxFuture, FutureExt};
use http::header;
use http::uri::PathAndQuery;
use http::{Request, Response, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::Service;

use crate::config::{LoadBalancer, UpstreamSettings};
use crate::edge::hop_by_hop;
use crate::plumbing::context::RequestContext;
use crate::plumbing::held::UntilEnd;
use crate::plumbing::worker;
use crate::telemetry::Attempt;
use crate::upstream::balance::timeout::TimeoutWitness;
use crate::upstream::balance::{Address, Balancer, Endpoint, EndpointLoad, Outcome, Picked, Probe};
use crate::upstream::websocket::WebSockets;
use portcullis_retry::{AttemptInfo, PickedEndpoint, ServedBy, UpstreamState};

mod client_body;
mod connector;
mod error;
mod pool;
mod request;
mod resolver;

use client_body::{BodyFailure, WitnessedBody};
pub use connector::TlsConnector;
pub use error::{ProxyError, ProxyErrorKind};
use pool::{Connection, Pools, UpstreamBody};
use request::prepare;
pub use resolver::HttpConnector;

/// Idle pooled connections are closed after this long (below common backend keep-alive
/// timeouts of 60–75 s would be safer, but backends here are configured by their owners).
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// One backend: its endpoints and how it balances over them (see `upstream::balance`),
/// and its connection pool.
#[derive(Debug)]
pub struct Upstream {
    balancer: Balancer,
    client: Pool,
    /// `http2`: requests go out as HTTP/2 (see [`prepare`]).
    http2: bool,
}

/// The connection pool of an upstream: plain HTTP/1.1 upstreams use [`Pools`]; plain HTTP/2
/// ones keep hyper-util's client with the bare `HttpConnector`, so TLS support adds nothing
/// to their per-request path.
#[derive(Debug)]
enum Pool {
    Http1(PerWorker<Pools>),
    Plain(PerWorker<Client<HttpConnector, Body>>),
    Tls(PerWorker<Client<TlsConnector, Body>>),
}

/// An upstream's pools, one per worker thread (`upstream::worker`), as nginx's `keepalive`
/// caches are per worker process: a connection's task runs on the runtime that opened it, so
/// the requests it carries come from that thread too and never wake another. (A shared
/// hyper-util client would hand one worker's HTTP/2 connection to every worker.)
#[derive(Debug)]
struct PerWorker<T> {
    first: T,
    rest: Box<[T]>,
}

impl<T> PerWorker<T> {
    /// One `make()` per worker.
    fn new(mut make: impl FnMut() -> T) -> Self {
        Self {
            first: make(),
            rest: (1..worker::count()).map(|_| make()).collect(),
        }
    }

    /// The pools of the worker this thread is (worker 0's for any other thread).
    fn current(&self) -> &T {
        match worker::index() {
            0 => &self.first,
            i => self.rest.get(i - 1).unwrap_or(&self.first),
        }
    }
}

/// How an attempt failed, by the client that carried it.
enum SendFailure {
    Legacy(hyper_util::client::legacy::Error),
    Pool(pool::SendError),
}

impl SendFailure {
    /// The failure as the attempt `id` reports it.
    fn into_proxy_error(self, id: usize) -> ProxyError {
        match self {
            Self::Legacy(err) => ProxyError::from_client(err, id),
            Self::Pool(err) => ProxyError::from_pool(err, id),
        }
    }
}

// === impl Upstream ===

impl Upstream {
    /// The retry layer's state of this upstream: budget, breaker, adaptive rate, latency.
    pub fn state(&self) -> &Arc<UpstreamState> {
        self.balancer.state()
    }

    /// Builds the pool for validated settings.
    ///
    /// `response_buffer` (`server.response_buffer_bytes`) bounds what one response reads
    /// ahead of a slow client: HTTP/1 reads at most that much at once, an HTTP/2 stream's
    /// receive window is that size; the rest waits in the upstream's flow control.
    pub fn new(
        settings: &UpstreamSettings,
        hosts_file: Option<&std::path::Path>,
        state: Arc<UpstreamState>,
        response_buffer: usize,
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
            .http2_only(settings.http2)
            .http1_max_buf_size(response_buffer.max(8 * 1024))
            .http2_initial_stream_window_size(u32::try_from(response_buffer).unwrap_or(u32::MAX));
        let client = match &settings.tls {
            None if !settings.http2 => Pool::Http1(PerWorker::new(|| {
                Pools::new(connector.clone(), settings.pool_max_idle, POOL_IDLE_TIMEOUT)
                    .with_read_buffer(response_buffer)
            })),
            None => Pool::Plain(PerWorker::new(|| builder.build(connector.clone()))),
            Some(tls) => {
                // One TLS configuration (roots, client certificate) shared by every worker's
                // client; each client has its own pool.
                let tls = TlsConnector::new(connector, tls, settings.tls_handshake_timeout);
                Pool::Tls(PerWorker::new(|| builder.build(tls.clone())))
            }
        };
        Self {
            balancer: Balancer::new(settings, hosts_file, state),
            client,
            http2: settings.http2,
        }
    }

    /// The upstream's endpoints and balancing state.
    pub(crate) fn balancer(&self) -> &Balancer {
        &self.balancer
    }

    /// Sends a WebSocket handshake to `endpoint` on a connection of its own (see
    /// `pool::EndpointPool::send_upgrade`). Configuration allows tunnels only toward plain
    /// HTTP/1.1 upstreams.
    async fn send_upgrade(
        &self,
        endpoint: &Endpoint,
        request: Request<Body>,
    ) -> Result<Response<hyper::body::Incoming>, SendFailure> {
        let Pool::Http1(per_worker) = &self.client else {
            let refused = "WebSocket tunnels need a plain HTTP/1.1 upstream";
            return Err(SendFailure::Pool(pool::SendError::Connect(refused.into())));
        };
        let pool = per_worker.current().get(endpoint, &self.balancer);
        pool.send_upgrade(request).await.map_err(SendFailure::Pool)
    }

    /// Sends `request` (absolute target, `Host` set) to `endpoint`.
    async fn send(
        &self,
        endpoint: &Endpoint,
        request: Request<Body>,
    ) -> Result<Response<UpstreamBody>, SendFailure> {
        let legacy = match &self.client {
            Pool::Http1(per_worker) => {
                let pool = per_worker.current().get(endpoint, &self.balancer);
                return pool.send(request).await.map_err(SendFailure::Pool);
            }
            Pool::Plain(clients) => clients.current().request(request).await,
            Pool::Tls(clients) => clients.current().request(request).await,
        };
        legacy
            .map(|response| response.map(Connection::unpooled))
            .map_err(SendFailure::Legacy)
    }
}

impl Probe for Upstream {
    fn balancer(&self) -> &Balancer {
        &self.balancer
    }

    /// One active health check: `GET path` to `address`; a 2xx is a pass.
    fn probe<'a>(&'a self, address: &'a Address, path: &'a PathAndQuery) -> BoxFuture<'a, bool> {
        let uri = Uri::from_parts({
            let mut parts = http::uri::Parts::default();
            parts.scheme = Some(address.scheme.clone());
            parts.authority = Some(address.authority.clone());
            parts.path_and_query = Some(path.clone());
            parts
        });
        let Ok(uri) = uri else {
            return std::future::ready(false).boxed();
        };
        let mut request = Request::new(Body::empty());
        *request.uri_mut() = uri;
        request
            .headers_mut()
            .insert(header::HOST, address.host.clone());
        async move {
            // Through the endpoint's own pool when it has one (a probe may reuse a warm
            // connection, as with hyper-util's client). The checker took `address` from the
            // current set; one that discovery removed meanwhile has nothing left to check.
            let set = self.balancer.endpoint_set();
            let Some(endpoint) = set.endpoints().iter().find(|e| &e.address == address) else {
                return false;
            };
            let response = self.send(endpoint, request).await;
            response.is_ok_and(|r| r.status().is_success())
        }
        .boxed()
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

/// The answer to an upstream's 101 to a request that did not ask to switch (or was not
/// forwarded as a handshake): 502, the upstream's connection closed with its response.
fn unexpected_switch() -> Response<Body> {
    portcullis_problem::Problem::new(
        http::StatusCode::BAD_GATEWAY,
        "upstream-failed",
        "Upstream switched protocols unasked",
        "The upstream switched protocols on a request that did not ask to.",
    )
    .into_response()
}

/// The proxy service: forwards a routed request to its upstream.
#[derive(Debug, Clone)]
pub struct Proxy {
    upstreams: Arc<[Arc<Upstream>]>,
    websockets: Arc<WebSockets>,
}

// === impl Proxy ===

impl Proxy {
    /// A proxy over `upstreams` (indexed as in the configuration).
    pub fn new(upstreams: Vec<Arc<Upstream>>) -> Self {
        Self {
            upstreams: upstreams.into(),
            websockets: Arc::default(),
        }
    }

    /// Forwards WebSocket handshakes on the routes that allow them (`upstream::websocket`).
    pub(crate) fn with_websockets(mut self, websockets: WebSockets) -> Self {
        self.websockets = Arc::new(websockets);
        self
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
        let timeout_at = info.and_then(|a| a.timeout_at);
        let balancer = &upstream.balancer;
        let Some(Picked {
            endpoint,
            among_several,
        }) = balancer.pick(avoid)
        else {
            return std::future::ready(Err(ProxyError::new(ProxyErrorKind::NoRoute, None))).boxed();
        };
        let id = endpoint.state.id;
        if let Some(picked) = request.extensions().get::<PickedEndpoint>() {
            picked.record(id); // a hedged attempt: its copy will avoid this endpoint
        }
        let in_flight: EndpointLoad = endpoint.state.start();
        // Latency is only needed by peak_ewma; round robin reads no clock.
        let started =
            (balancer.load_balancer() == LoadBalancer::PeakEwma).then(|| balancer.clock().now());
        // `response_headers` name `${request_id}` from the request, gone by then.
        let response_rules = context.route.settings.response_headers.is_some().then(|| {
            request
                .headers()
                .get(&crate::edge::request_id::X_REQUEST_ID)
                .cloned()
        });
        let tunnel = self.websockets.handshake(&request, &context);
        // The attempt's span and trace headers (see `crate::telemetry`).
        let (mut request, attempt) =
            match prepare(request, &context, &endpoint.address, id, upstream.http2) {
                Ok(request) => Attempt::start(request),
                Err(err) => return std::future::ready(Err(err)).boxed(),
            };
        if let Some(mut tunnel) = tunnel {
            tunnel.prepare(&mut request);
            return async move {
                let result = upstream.send_upgrade(&endpoint, request).await;
                attempt.end(result.as_ref().ok().map(|r| r.status().as_u16()));
                let response = result.map_err(|err| {
                    let err = err.into_proxy_error(id);
                    upstream
                        .balancer
                        .record(&endpoint, outcome_of_error(err.kind()));
                    err
                })?;
                upstream
                    .balancer
                    .record(&endpoint, outcome_of_status(response.status()));
                drop(in_flight);
                Ok(tunnel.answer(response))
            }
            .boxed();
        }
        async move {
            // Bodiless requests (most GETs) need no witness and skip its allocation.
            let (request, body_failure) = if http_body::Body::is_end_stream(request.body()) {
                (request, None)
            } else {
                let (parts, body) = request.into_parts();
                let (body, failure) = WitnessedBody::wrap(body);
                (Request::from_parts(parts, body), Some(failure))
            };
            // The attempt timeout is the retry layer's: it also knows the request deadline.
            // Its timer drops this future; the witness tells passive health, unless the
            // client was still sending its body (then the wait was the client's).
            let witness = TimeoutWitness::arm(timeout_at, || {
                if body_failure.as_ref().is_none_or(BodyFailure::fully_sent) {
                    upstream.balancer.record(&endpoint, Outcome::Failure);
                }
            });
            let result = upstream.send(&endpoint, request).await;
            if let Some(witness) = witness {
                witness.disarm();
            }
            if let Some(started) = started {
                let now = upstream.balancer.clock().now();
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
                    None => err.into_proxy_error(id),
                };
                upstream
                    .balancer
                    .record(&endpoint, outcome_of_error(err.kind()));
                err
            })?;
            upstream
                .balancer
                .record(&endpoint, outcome_of_status(response.status()));
            let (mut parts, body) = response.into_parts();
            if parts.status == http::StatusCode::SWITCHING_PROTOCOLS {
                // Only a forwarded WebSocket handshake may switch (above): a 101 to any
                // other request would leave the client's connection half-switched.
                return Ok(unexpected_switch());
            }
            // Innermost, so the upstream's `Connection` cannot name away the headers the
            // outer layers add to this response.
            hop_by_hop::strip_upstream_response(&mut parts.headers);
            // The route's rules, before the outer layers add the gateway's own fields
            // (which no rule may name).
            if let (Some(rules), Some(request_id)) =
                (&context.route.settings.response_headers, &response_rules)
            {
                let vars = request::header_vars(&context, request_id.as_ref());
                rules.apply(&mut parts.headers, &vars);
            }
            // The one extension of the response (the map's allocation): only the retry
            // layer reads it, to avoid this endpoint next time, which needs another.
            if among_several {
                parts.extensions.insert(ServedBy(id));
            }
            // The endpoint's in-flight count lasts until the body ends: least_request and
            // peak_ewma see streaming responses as load. Held by the same wrapper as the
            // pooled connection: one poll layer for both.
            let body = body.and(UntilEnd::new(in_flight));
            Ok(Response::from_parts(parts, Body::new(body)))
        }
        .boxed()
    }
}
