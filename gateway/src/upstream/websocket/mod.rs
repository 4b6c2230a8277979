//! WebSocket tunnels, for routes with `websocket = true` (choices: `docs/websockets.md`).
//!
//! A handshake the edge recognised (`edge::upgrade`) has gone through the whole pipeline
//! like any request (authentication, the caps in `pipeline::websocket`, the rate limit,
//! charged once); the proxy then sends it to the upstream on a connection of its own,
//! with `Connection: upgrade` and `Upgrade: websocket` written again. A 101 answer is
//! passed to the client and both connections are handed to a [`tunnel`] task; any other
//! answer is an ordinary response, and the client connection stays HTTP/1.
//!
//! The limits of one tunnel are its route's, made stricter by its tenant's: the lower
//! idle timeout and the lower maximum lifetime of the two apply.
//!
//! Metrics: `websockets_open{route,tenant}`, `websocket_bytes_total{route,tenant,direction}`
//! (`to_upstream`, `to_client`), `websockets_closed_total{route,reason}` (`peer`, `idle`,
//! `lifetime`, `drain`). The `tenant` label follows `telemetry.tenant_labels` like every
//! per-tenant series.

pub(crate) mod caps;
mod frames;
pub(crate) mod tunnel;

use std::collections::HashSet;
use std::time::Duration;

use axum::body::Body;
use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use metrics::{Counter, Gauge, SharedString};

pub(crate) use self::caps::{Admitted, Caps, Over};
use crate::config::{Config, WebSocketSettings};
use crate::edge::hop_by_hop;
use crate::edge::upgrade::WebSocketHandshake;
use crate::plumbing::context::{Caller, RequestContext};

/// What the proxy needs for tunnels, built once.
#[derive(Debug, Default)]
pub(crate) struct WebSockets {
    /// Tenants with their own metric label.
    labelled: HashSet<String>,
}

/// A handshake the proxy forwards as one.
pub(crate) struct Handshake {
    handshake: WebSocketHandshake,
    settings: WebSocketSettings,
    admitted: Option<Admitted>,
    route: SharedString,
    tenant: SharedString,
}

/// One tunnel's series.
pub(crate) struct Meters {
    pub(crate) to_upstream: Counter,
    pub(crate) to_client: Counter,
    open: Gauge,
    route: SharedString,
}

// === impl WebSockets ===

impl WebSockets {
    pub(crate) fn new(config: &Config) -> Self {
        Self {
            labelled: config.telemetry.tenant_labels.iter().cloned().collect(),
        }
    }

    /// The handshake in `request`, when its route allows tunnels.
    pub(crate) fn handshake(
        &self,
        request: &Request<Body>,
        context: &RequestContext,
    ) -> Option<Handshake> {
        let mut settings = context.route.settings.websocket?;
        let handshake = request.extensions().get::<WebSocketHandshake>()?.clone();
        if let Caller::Tenant(t) = &context.caller {
            settings.idle_timeout = stricter(Some(settings.idle_timeout), t.websocket_idle_timeout)
                .unwrap_or(settings.idle_timeout);
            settings.max_lifetime = stricter(settings.max_lifetime, t.websocket_max_lifetime);
        }
        let tenant = match &context.caller {
            Caller::Tenant(t) if self.labelled.contains(&*t.id) => t.id.to_string(),
            Caller::Tenant(_) => crate::telemetry::series::OTHER.to_owned(),
            Caller::Anonymous => crate::telemetry::series::ANONYMOUS.to_owned(),
        };
        Some(Handshake {
            handshake,
            settings,
            admitted: request.extensions().get::<Admitted>().cloned(),
            route: SharedString::from(context.route.metrics.label().to_owned()),
            tenant: SharedString::from(tenant),
        })
    }
}

/// The lower of two optional bounds (`None`: no bound).
fn stricter(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

// === impl Handshake ===

impl Handshake {
    /// Writes the upgrade fields again on the request the proxy prepared.
    pub(crate) fn prepare(request: &mut Request<Body>) {
        let headers = request.headers_mut();
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    }

    /// The client's answer to the upstream's `response`: a 101 starts the tunnel.
    pub(crate) fn answer(self, mut response: Response<Incoming>) -> Response<Body> {
        if response.status() != StatusCode::SWITCHING_PROTOCOLS {
            hop_by_hop::strip_upstream_response(response.headers_mut());
            return response.map(Body::new);
        }
        let upstream = hyper::upgrade::on(&mut response);
        let (mut parts, _) = response.into_parts();
        hop_by_hop::strip_upstream_response(&mut parts.headers);
        // A 101 ends with its head: whatever framing it declares, the next bytes are the
        // new protocol's.
        parts.headers.remove(header::CONTENT_LENGTH);
        parts
            .headers
            .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        parts
            .headers
            .insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        let slots = self.admitted.as_ref().and_then(Admitted::take);
        let meters = Meters::new(self.route, self.tenant);
        let (settings, client, hold) = (
            self.settings,
            self.handshake.on_upgrade,
            self.handshake.hold,
        );
        tokio::spawn(async move {
            let (client, upstream) = tokio::join!(client, upstream);
            match (client, upstream) {
                (Ok(client), Ok(upstream)) => {
                    meters.open.increment(1.0);
                    tunnel::run(client, upstream, settings, hold, &meters).await;
                    meters.open.decrement(1.0);
                }
                (client, upstream) => tracing::debug!(
                    client = client.is_ok(),
                    upstream = upstream.is_ok(),
                    "a WebSocket handshake answered 101 did not switch"
                ),
            }
            drop(slots);
        });
        Response::from_parts(parts, Body::empty())
    }
}

// === impl Meters ===

impl Meters {
    fn new(route: SharedString, tenant: SharedString) -> Self {
        let bytes = |direction: &'static str| metrics::counter!("websocket_bytes_total", "route" => route.clone(), "tenant" => tenant.clone(), "direction" => direction);
        Self {
            to_upstream: bytes("to_upstream"),
            to_client: bytes("to_client"),
            open: metrics::gauge!("websockets_open", "route" => route.clone(), "tenant" => tenant.clone()),
            route,
        }
    }

    /// Counts a tunnel's end.
    pub(crate) fn closed(&self, reason: &'static str) {
        metrics::counter!("websockets_closed_total", "route" => self.route.clone(), "reason" => reason)
            .increment(1);
    }
}

/// The 429 for a handshake over a cap.
pub(crate) fn refuse(over: Over) -> Response<Body> {
    let (scope, limit, detail) = match over {
        Over::Route(n) => ("route", n, format!("This route already has {n} open WebSocket connections, its limit (max_websockets).")),
        Over::Tenant(n) => ("tenant", n, format!("This tenant already has {n} open WebSocket connections, its limit (max_websockets).")),
    };
    metrics::counter!("websockets_refused_total", "scope" => scope).increment(1);
    portcullis_problem::Problem::new(
        StatusCode::TOO_MANY_REQUESTS,
        "websocket-limited",
        "Too many open WebSocket connections",
        format!("{detail} Close one before opening another; nothing of this handshake reached the upstream."),
    )
    .with("limit", limit)
    .with("scope", scope)
    .retry_after(std::time::Duration::from_secs(1))
    .into_response()
}
