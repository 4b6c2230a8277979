//! What a pooled response body holds: its connection, given back to the pool when the body
//! ends (the shared body wrapper, `plumbing::held`, says when).

use std::sync::Arc;

use axum::body::Body;
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;

use super::EndpointPool;
use crate::plumbing::held::{Held, HeldBody};

/// An upstream's response body; a pooled one gives its connection back at its end.
pub(crate) type UpstreamBody = HeldBody<Incoming, Option<Connection>>;

/// A pooled connection held by the response body it carries. At the body's end (its last
/// frame, or at once when empty) it goes back to the pool. If the body fails it closes. If
/// the body is dropped before its end it goes back only if the connection's task already
/// finished the exchange; otherwise it closes, as hyper closes it (nothing else could tell
/// where the next response starts).
pub(crate) struct Connection {
    sender: Option<SendRequest<Body>>,
    pool: Arc<EndpointPool>,
}

impl Connection {
    /// `inner`, whose end gives `sender` back to `pool`.
    pub(super) fn hold(
        inner: Incoming,
        sender: SendRequest<Body>,
        pool: Arc<EndpointPool>,
    ) -> UpstreamBody {
        let connection = Self {
            sender: Some(sender),
            pool,
        };
        HeldBody::new(inner, Some(connection))
    }

    /// A body whose connection is not this pool's (hyper-util's client keeps it).
    pub(crate) fn unpooled(inner: Incoming) -> UpstreamBody {
        HeldBody::new(inner, None)
    }

    fn release(&mut self, body_ended: bool) {
        if let Some(sender) = self.sender.take() {
            self.pool.clone().release(sender, body_ended);
        }
    }
}

impl Held for Connection {
    fn ended(&mut self) {
        self.release(true);
    }

    fn failed(&mut self) {
        // The connection broke: dropping the sender closes it.
        self.sender = None;
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.release(false);
    }
}
