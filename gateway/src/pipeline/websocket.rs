//! The caps on open WebSocket tunnels (`max_websockets` per route and per tenant): a
//! handshake over one is answered 429 at once, before any rate-limit token is spent, like
//! the concurrency limits beside it; an admitted one carries its slots to the proxy
//! (`upstream::websocket::caps`). Other requests pay one extension lookup and one method
//! comparison.
//!
//! CONNECT is refused here too, before the rate limit (`docs/websockets.md`): the edge has
//! turned an HTTP/2 WebSocket (RFC 8441) into a `GET` already (`edge::upgrade`), so a
//! CONNECT still standing asks for another protocol or a generic tunnel: 501. An HTTP/2
//! WebSocket on a route without `websocket = true` cannot be served as a plain request
//! (its client awaits a tunnel): 403, as Envoy answers an upgrade its route does not allow.

use std::sync::Arc;

use axum::body::Body;
use http::{Method, Request, Response, StatusCode};
use portcullis_problem::Problem;

use crate::config::Config;
use crate::edge::upgrade::{Form, WebSocketHandshake};
use crate::plumbing::context::RequestContext;
use crate::plumbing::step::Step;
use crate::upstream::websocket::{refuse, Admitted, Caps};

/// Admits WebSocket handshakes under their caps (a [`Step`]).
#[derive(Debug, Clone)]
pub(crate) struct WebSocketCaps(Arc<Caps>);

impl WebSocketCaps {
    pub(crate) fn new(config: &Config) -> Self {
        Self(Arc::new(Caps::new(config)))
    }
}

impl Step for WebSocketCaps {
    type Finish = ();

    fn step(&self, request: &mut Request<Body>) -> Result<(), Response<Body>> {
        let Some(handshake) = request.extensions().get::<WebSocketHandshake>() else {
            if request.method() == Method::CONNECT {
                return Err(no_tunnel());
            }
            return Ok(());
        };
        let form = handshake.form;
        let Some(context) = RequestContext::of(request.extensions()) else {
            return Ok(());
        };
        if context.route.settings.websocket.is_none() {
            return match form {
                Form::Http1 => Ok(()),
                Form::Http2 => Err(not_allowed()),
            };
        }
        let slots = self.0.admit(context).map_err(refuse)?;
        request.extensions_mut().insert(Admitted::new(slots));
        Ok(())
    }
}

/// The 501 for a CONNECT that is not an RFC 8441 WebSocket.
fn no_tunnel() -> Response<Body> {
    Problem::new(
        StatusCode::NOT_IMPLEMENTED,
        "connect-not-supported",
        "CONNECT is not supported",
        "The gateway opens no CONNECT tunnels except WebSockets over HTTP/2 (:protocol = websocket, with Sec-WebSocket-Version); nothing reached the upstream.",
    )
    .into_response()
}

/// The 403 for an HTTP/2 WebSocket on a route without `websocket = true`.
fn not_allowed() -> Response<Body> {
    Problem::new(
        StatusCode::FORBIDDEN,
        "websocket-not-allowed",
        "WebSockets are not allowed on this route",
        "This route does not forward WebSocket handshakes (websocket = true); nothing reached the upstream.",
    )
    .into_response()
}
