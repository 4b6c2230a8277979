//! The caps on open WebSocket tunnels (`max_websockets` per route and per tenant): a
//! handshake over one is answered 429 at once, before any rate-limit token is spent, like
//! the concurrency limits beside it; an admitted one carries its slots to the proxy
//! (`upstream::websocket::caps`). Other requests pay one extension lookup.

use std::sync::Arc;

use axum::body::Body;
use http::{Request, Response};

use crate::config::Config;
use crate::edge::upgrade::WebSocketHandshake;
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
        if request.extensions().get::<WebSocketHandshake>().is_none() {
            return Ok(());
        }
        let Some(context) = RequestContext::of(request.extensions()) else {
            return Ok(());
        };
        if context.route.settings.websocket.is_none() {
            return Ok(());
        }
        let slots = self.0.admit(context).map_err(refuse)?;
        request.extensions_mut().insert(Admitted::new(slots));
        Ok(())
    }
}
