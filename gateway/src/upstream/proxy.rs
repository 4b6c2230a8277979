//! The upstream client: one pooled keep-alive hyper client per upstream, round-robin over its
//! endpoints, bodies streamed both ways, hop-by-hop headers removed (see `edge::hop_by_hop`:
//! the client's at the edge, the upstream's here), `X-Forwarded-*` set.
//! `https://` endpoints go through [`TlsConnector`]; HTTP/2 is spoken to upstreams that
//! declare it (prior knowledge on `http://`, ALPN `h2` on `https://`).
//!
//! One call is one attempt, with no timeout of its own beyond connecting. Retries, backoff and breakers belong to the retry layer above;
//! this service only reports precisely how an attempt failed ([`ProxyError`]), because the
//! retry layer's safety decision depends on whether a byte may have reached the backend.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use futures_util::future::{BoxFuture, FutureExt};
use http::header::{self, HeaderName, HeaderValue};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Request, Response, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::Service;

use crate::config::UpstreamSettings;
use crate::edge::hop_by_hop;
use crate::edge::listener::ClientTls;
use crate::pipeline::context::RequestContext;
use crate::telemetry::Attempt;
use portcullis_retry::{AttemptInfo, ServedBy};

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

/// One backend with its endpoints and connection pool.
#[derive(Debug)]
pub struct Upstream {
    endpoints: Vec<(Scheme, Authority)>,
    next: AtomicUsize,
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
    pub fn new(settings: &UpstreamSettings) -> Self {
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
        let endpoints = settings
            .endpoints
            .iter()
            .filter_map(|uri| Some((uri.scheme()?.clone(), uri.authority()?.clone())))
            .collect();
        Self {
            endpoints,
            next: AtomicUsize::new(0),
            client,
        }
    }

    /// Round robin, skipping `avoid` when there is another endpoint.
    fn pick(&self, avoid: Option<usize>) -> usize {
        let count = self.endpoints.len().max(1);
        let mut index = self.next.fetch_add(1, Ordering::Relaxed) % count;
        if count > 1 && Some(index) == avoid {
            index = (index + 1) % count;
        }
        index
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
        let avoid = request
            .extensions()
            .get::<AttemptInfo>()
            .and_then(|a| a.avoid_endpoint);
        let index = upstream.pick(avoid);
        // The attempt's span and trace headers (see `crate::telemetry`).
        let prepared = prepare(request, &context, &upstream, index).map(Attempt::start);
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
            let response = match &upstream.client {
                Pool::Plain(client) => client.request(request).await,
                Pool::Tls(client) => client.request(request).await,
            };
            attempt.end(response.as_ref().ok().map(|r| r.status().as_u16()));
            let response = response.map_err(|err| {
                // The client's own body error, when it failed, explains the attempt's
                // failure better than hyper's report of it (see `client_body`).
                match body_failure.as_ref().and_then(BodyFailure::take) {
                    Some(body_err) => ProxyError::from_client_body(body_err, index),
                    None => ProxyError::from_client(err, index),
                }
            })?;
            let (mut parts, body) = response.into_parts();
            // Innermost, so the upstream's `Connection` cannot name away the headers the
            // outer layers add to this response.
            hop_by_hop::strip_upstream_response(&mut parts.headers);
            parts.extensions.insert(ServedBy(index));
            Ok(Response::from_parts(parts, Body::new(body)))
        }
        .boxed()
    }
}

/// Rewrites the request for the chosen endpoint.
fn prepare(
    request: Request<Body>,
    context: &RequestContext,
    upstream: &Upstream,
    index: usize,
) -> Result<Request<Body>, ProxyError> {
    let (mut parts, body) = request.into_parts();
    let Some((scheme, authority)) = upstream.endpoints.get(index).cloned() else {
        return Err(ProxyError::new(ProxyErrorKind::NoRoute, None));
    };
    let route = &context.route.settings;
    let path_and_query = upstream_path(&parts.uri, &route.prefix, route.strip_prefix);
    let client_tls = parts.extensions.get::<ClientTls>().is_some();
    // HTTP/2 clients send :authority instead of Host.
    let original_host = parts.headers.get(header::HOST).cloned().or_else(|| {
        let authority = parts.uri.authority()?;
        HeaderValue::from_str(authority.as_str()).ok()
    });
    parts.uri = Uri::from_parts({
        let mut uri = http::uri::Parts::default();
        uri.scheme = Some(scheme);
        uri.authority = Some(authority.clone());
        uri.path_and_query = Some(path_and_query);
        uri
    })
    .map_err(|_| ProxyError::new(ProxyErrorKind::NoRoute, Some(index)))?;
    parts.version = http::Version::HTTP_11;

    // The client's hop-by-hop fields (the fixed list, `Connection` and what it named) went
    // at the edge, and no layer since adds one: nothing to strip again on this hop.
    if let Ok(host) = HeaderValue::from_str(authority.as_str()) {
        parts.headers.insert(header::HOST, host);
    }
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

fn upstream_path(uri: &Uri, prefix: &str, strip: bool) -> PathAndQuery {
    if !strip {
        // The common case: the original target, shared rather than re-formatted.
        return uri
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/"));
    }
    let rest = uri
        .path()
        .strip_prefix(prefix.trim_end_matches('/'))
        .unwrap_or(uri.path());
    let path = if rest.starts_with('/') {
        rest.to_owned()
    } else {
        format!("/{rest}")
    };
    let full = match uri.query() {
        Some(query) => format!("{path}?{query}"),
        None => path,
    };
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
        let uri: Uri = "/orders/7?x=1".parse().unwrap();
        assert_eq!(
            upstream_path(&uri, "/orders", false).as_str(),
            "/orders/7?x=1"
        );
        assert_eq!(upstream_path(&uri, "/orders", true).as_str(), "/7?x=1");
        let root: Uri = "/orders".parse().unwrap();
        assert_eq!(upstream_path(&root, "/orders", true).as_str(), "/");
    }
}
