//! The upstream's response body, which returns a pooled connection when it ends.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use axum::body::Body;
use bytes::Bytes;
use http::Response;
use http_body::{Body as _, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;

use super::EndpointPool;

/// A response body from an upstream. One from the pool ([`UpstreamBody::pooled`]) gives
/// its connection back at its end: on the last frame, or when it is dropped having reached
/// its end (hyper stops polling a body that says it ended). Dropped before its end, it
/// gives the connection back only if the connection's task already finished the exchange;
/// otherwise the connection closes, as hyper closes it (nothing else could tell where the
/// next response starts).
pub(crate) struct UpstreamBody {
    inner: Incoming,
    connection: Option<(SendRequest<Body>, Arc<EndpointPool>)>,
}

// === impl UpstreamBody ===

impl UpstreamBody {
    /// A body whose connection is not this pool's (hyper-util's client keeps it).
    pub(crate) fn unpooled(inner: Incoming) -> Self {
        Self {
            inner,
            connection: None,
        }
    }

    /// `response`, whose body gives `sender` back to `pool` when it ends.
    pub(super) fn pooled(
        response: Response<Incoming>,
        sender: SendRequest<Body>,
        pool: Arc<EndpointPool>,
    ) -> Response<Self> {
        response.map(|inner| Self {
            inner,
            connection: Some((sender, pool)),
        })
    }

    fn release(&mut self, body_ended: bool) {
        if let Some((sender, pool)) = self.connection.take() {
            pool.release(sender, body_ended);
        }
    }
}

impl http_body::Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        // Every field is `Unpin`.
        let this = self.get_mut();
        let polled = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        match &polled {
            None => this.release(true),
            Some(Ok(_)) if this.inner.is_end_stream() => this.release(true),
            Some(Ok(_)) => {}
            // The connection failed: it closes.
            Some(Err(_)) => this.connection = None,
        }
        Poll::Ready(polled)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl std::fmt::Debug for UpstreamBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamBody")
            .field("inner", &self.inner)
            .field("pooled", &self.connection.is_some())
            .finish()
    }
}

impl Drop for UpstreamBody {
    fn drop(&mut self) {
        let ended = self.inner.is_end_stream();
        self.release(ended);
    }
}
