//! WebSocket tunnels, for routes with `websocket = true` (choices: `docs/websockets.md`).
//!
//! A handshake the edge recognised (`edge::upgrade`) has gone through the whole pipeline
//! like any request (authentication, the caps in `pipeline::websocket`, the rate limit,
//! charged once); the proxy then sends it to the upstream on a connection of its own,
//! with `Connection: upgrade` and `Upgrade: websocket` written again. A 101 answer is
//! passed to the client and both connections are handed to a [`tunnel`] task; any other
//! answer is an ordinary response, and the client connection stays HTTP/1.
//!
//! An HTTP/2 WebSocket (RFC 8441 extended CONNECT, `edge::upgrade`) goes to the upstream
//! as the same HTTP/1.1 handshake, as nginx and Envoy translate it: the proxy is the
//! handshake's client on that hop, so it writes a `Sec-WebSocket-Key` of its own and
//! checks the upstream's `Sec-WebSocket-Accept` (a wrong one is a 502). The upstream's 101
//! becomes the client's `200`, without `Sec-WebSocket-Accept`, and the stream's DATA
//! frames are the tunnel's client side. An upstream `2xx` that does not switch is a 502
//! too: hyper would take any `2xx` to a CONNECT for the tunnel's start.
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
use crate::edge::upgrade::{Form, WebSocketHandshake};
use crate::plumbing::context::{Caller, RequestContext};

/// RFC 6455 §1.3: appended to the key before hashing it into `Sec-WebSocket-Accept`.
const ACCEPT_GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

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
    /// HTTP/2 only: the `Sec-WebSocket-Key` the proxy wrote toward the upstream.
    key: Option<HeaderValue>,
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
            key: None,
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

/// `Sec-WebSocket-Accept` for `key` (RFC 6455 §4.2.2).
fn accept_for(key: &[u8]) -> String {
    use base64::Engine as _;
    let mut context = ring::digest::Context::new(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY);
    context.update(key);
    context.update(ACCEPT_GUID.as_bytes());
    base64::engine::general_purpose::STANDARD.encode(context.finish())
}

// === impl Handshake ===

impl Handshake {
    /// Writes the upgrade fields again on the request the proxy prepared (an HTTP/1.1
    /// `GET`); for an HTTP/2 client, a `Sec-WebSocket-Key` of the proxy's own too.
    pub(crate) fn prepare(&mut self, request: &mut Request<Body>) {
        let headers = request.headers_mut();
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        if self.handshake.form == Form::Http2 {
            use base64::Engine as _;
            let nonce = rand::random::<[u8; 16]>();
            let key = base64::engine::general_purpose::STANDARD.encode(nonce);
            if let Ok(key) = HeaderValue::from_str(&key) {
                headers.insert(header::SEC_WEBSOCKET_KEY, key.clone());
                self.key = Some(key);
            }
        }
    }

    /// The client's answer to the upstream's `response`: a 101 starts the tunnel.
    pub(crate) fn answer(self, mut response: Response<Incoming>) -> Response<Body> {
        let http2 = self.handshake.form == Form::Http2;
        if response.status() != StatusCode::SWITCHING_PROTOCOLS {
            if http2 && response.status().is_success() {
                return bad_switch(
                    "answered a WebSocket handshake 2xx without switching protocols",
                );
            }
            hop_by_hop::strip_upstream_response(response.headers_mut());
            return response.map(Body::new);
        }
        if http2 {
            let expected = self.key.as_ref().map(|k| accept_for(k.as_bytes()));
            let accept = response.headers().get(header::SEC_WEBSOCKET_ACCEPT);
            if expected.is_none()
                || accept.map(HeaderValue::as_bytes) != expected.as_deref().map(str::as_bytes)
            {
                return bad_switch(
                    "answered a WebSocket handshake with a wrong Sec-WebSocket-Accept",
                );
            }
        }
        let upstream = hyper::upgrade::on(&mut response);
        let (mut parts, _) = response.into_parts();
        hop_by_hop::strip_upstream_response(&mut parts.headers);
        // A 101 ends with its head: whatever framing it declares, the next bytes are the
        // new protocol's.
        parts.headers.remove(header::CONTENT_LENGTH);
        if http2 {
            // RFC 8441 §5: the 200 opens the stream's tunnel; the key exchange was the
            // proxy's, on its own hop.
            parts.status = StatusCode::OK;
            parts.headers.remove(header::SEC_WEBSOCKET_ACCEPT);
        } else {
            parts
                .headers
                .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
            parts
                .headers
                .insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        }
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

/// The 502 for an upstream that did not switch as a WebSocket server must (HTTP/2 clients).
fn bad_switch(what: &str) -> Response<Body> {
    tracing::debug!(what, "upstream WebSocket handshake refused");
    portcullis_problem::Problem::new(
        StatusCode::BAD_GATEWAY,
        "upstream-failed",
        "Upstream WebSocket handshake failed",
        format!("The upstream {what}; no tunnel was opened."),
    )
    .into_response()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_accept_value_is_rfc_6455s() {
        // RFC 6455 §1.3's example.
        assert_eq!(
            accept_for(b"dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }

    #[test]
    fn the_stricter_bound_wins_and_none_is_no_bound() {
        let (s, m) = (Duration::from_secs(1), Duration::from_secs(60));
        assert_eq!(stricter(Some(m), Some(s)), Some(s));
        assert_eq!(stricter(Some(s), Some(m)), Some(s));
        assert_eq!(stricter(None, Some(m)), Some(m));
        assert_eq!(stricter(Some(m), None), Some(m));
        assert_eq!(stricter(None, None), None);
    }
}
