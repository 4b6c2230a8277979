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
use http::{header, HeaderValue, Request, Response, StatusCode};
use portcullis_control::Directory;
use portcullis_problem::Problem;

use crate::pipeline::auth_failures::{self, AuthFailures};
use crate::pipeline::cors::{self, CorsAnswer};
use crate::pipeline::jwt::JwtAuth;
use crate::pipeline::router::{Lookup, RouteRequest, RouteTable};
use crate::pipeline::tenant;
use crate::plumbing::client::{PeerAddr, TrustedProxies};
use crate::plumbing::context::RequestContext;
use crate::plumbing::step::{Finish, Step};
use crate::telemetry::{Exchange, Resolution};

/// 405: a route matches everything but the method. `Allow` lists the methods that would
/// (RFC 9110 §15.5.6), also as the problem's `allow` member.
fn method_not_allowed(on: &RouteRequest<'_>, allowed: Vec<http::Method>) -> Response<Body> {
    let allow = allowed
        .iter()
        .map(http::Method::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    let mut response = Problem::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method-not-allowed",
        "Method not allowed",
        format!(
            "{} is not allowed on {:?}; allowed: {allow}",
            on.method, on.path
        ),
    )
    .with("allow", allow.clone())
    .into_response();
    if let Ok(value) = HeaderValue::from_str(&allow) {
        response.headers_mut().insert(header::ALLOW, value);
    }
    response
}

/// Matches the route (else 405 or 404), resolves the client address and the caller (a bad key is
/// 401), and inserts the [`RequestContext`] (a [`Step`]). The route's metrics and the
/// context are left in the request's [`Exchange`] for the observe layer outside, refusals
/// from here on included.
#[derive(Debug, Clone)]
pub(crate) struct Resolve {
    routes: RouteTable,
    directory: Arc<Directory>,
    trusted: Arc<TrustedProxies>,
    jwt: Option<Arc<JwtAuth>>,
    failures: Option<Arc<AuthFailures>>,
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
            jwt: None,
            failures: None,
        }
    }

    /// Also identifies tenants from bearer JWTs (`[auth.jwt]`).
    pub(crate) fn with_jwt(mut self, jwt: Option<Arc<JwtAuth>>) -> Self {
        self.jwt = jwt;
        self
    }

    /// Also limits failed authentications per client address (`auth.failure_limit`).
    pub(crate) fn with_failures(mut self, failures: Option<Arc<AuthFailures>>) -> Self {
        self.failures = failures;
        self
    }
}

impl Step for Resolve {
    type Finish = CorsAnswer;

    fn step(&self, request: &mut Request<Body>) -> Result<CorsAnswer, Response<Body>> {
        // A CORS preflight is answered for the route of the method it asks about, before any
        // caller is resolved: no credential, no charge, nothing upstream.
        if let Some(method) = cors::preflight_method(request) {
            let on = RouteRequest {
                method: &method,
                ..RouteRequest::of(request)
            };
            if let Lookup::Route(route) = self.routes.find(&on) {
                if let Some(cors) = &route.settings.cors {
                    return Err(cors::answer_preflight(cors, request.headers(), &method));
                }
            }
        }
        let on = RouteRequest::of(request);
        let route = match self.routes.find(&on) {
            Lookup::Route(route) => route.clone(),
            Lookup::MethodNotAllowed => {
                return Err(method_not_allowed(&on, self.routes.allowed_methods(&on)))
            }
            Lookup::NotFound => return Err(Problem::no_route(on.path).into_response()),
        };
        // The observe step outside reads the route's metrics and the context from the
        // request's exchange (refusals from here on included).
        let exchange = request.extensions().get::<Arc<Exchange>>().cloned();
        let peer = request
            .extensions()
            .get::<PeerAddr>()
            .map_or(IpAddr::V4(Ipv4Addr::LOCALHOST), |p| p.0.ip());
        let client = self.trusted.resolve(peer, request.headers());
        // An address past its failure budget has its credentials refused unchecked.
        let blocked = self.failures.as_ref().and_then(|failures| {
            failures
                .blocked(client.ip)
                .filter(|_| tenant::presents_credential(request.headers()))
        });
        let resolved = match blocked {
            Some(wait) => Err(auth_failures::refusal(wait)),
            None => {
                let resolved = tenant::resolve_caller(
                    &self.directory,
                    self.jwt.as_deref(),
                    request.headers_mut(),
                );
                if let (Err(_), Some(failures)) = (&resolved, &self.failures) {
                    failures.failed(client.ip);
                }
                resolved
            }
        };
        let answer = CorsAnswer::of(request, route.settings.cors.as_ref());
        let caller = match resolved {
            Ok(caller) => caller,
            Err(refusal) => {
                if let Some(exchange) = exchange {
                    exchange.resolved(Resolution {
                        metrics: route.metrics.clone(),
                        context: None,
                    });
                }
                // A page reads why it was refused too.
                return Err(answer.finish(refusal));
            }
        };
        let context = Arc::new(RequestContext::new(route, caller, client));
        if let Some(exchange) = exchange {
            exchange.resolved(Resolution {
                metrics: context.route.metrics.clone(),
                context: Some(context.clone()),
            });
        }
        request.extensions_mut().insert(context);
        Ok(answer)
    }
}

/// Request contexts for the unit tests of the layers that read them.
#[cfg(test)]
pub(crate) mod tests {
    use std::collections::HashMap;
    use std::net::IpAddr;
    use std::sync::Arc;

    use super::RequestContext;
    use crate::config::{Config, Priority};
    use crate::pipeline::router::RouteTable;
    use crate::plumbing::client::Client;
    use crate::plumbing::context::Caller;

    /// A context on the route of `config` (TOML) that `path` matches, for `caller` at `ip`.
    pub(crate) fn context_on(
        config: &str,
        path: &str,
        caller: Caller,
        ip: IpAddr,
    ) -> Arc<RequestContext> {
        let config = Config::parse(config, &HashMap::<String, String>::new()).unwrap();
        let states: Vec<_> = crate::start::upstreams(&config)
            .iter()
            .map(|u| u.state().clone())
            .collect();
        let table = RouteTable::new(&config.routes, &states);
        let method = http::Method::GET;
        let headers = http::HeaderMap::new();
        let request = crate::pipeline::router::RouteRequest {
            method: &method,
            authority: None,
            path,
            headers: &headers,
        };
        let crate::pipeline::router::Lookup::Route(route) = table.find(&request) else {
            panic!("no route for {path}");
        };
        let route = route.clone();
        let client = Client {
            ip,
            peer: ip,
            peer_trusted: false,
        };
        Arc::new(RequestContext::new(route, caller, client))
    }

    /// An anonymous caller's context on a route of `priority`.
    pub(crate) fn context_for(priority: Priority) -> Arc<RequestContext> {
        let priority = match priority {
            Priority::Normal => "normal",
            Priority::Critical => "critical",
        };
        let config = format!(
            "[[upstreams]]\nname = \"u\"\nendpoints = [\"http://127.0.0.1:9\"]\n\n\
             [[routes]]\nprefix = \"/\"\nupstream = \"u\"\npriority = \"{priority}\"\n"
        );
        context_on(
            &config,
            "/",
            Caller::Anonymous,
            IpAddr::from([127, 0, 0, 1]),
        )
    }
}
