//! The adapter between hyper and the pipeline: request extensions from the connection
//! (peer address, TLS), the connection's in-flight count, and `Keep-Alive` on HTTP/1.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use bytes::Bytes;
use http::{header, HeaderValue, Request, Response};
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use tower::ServiceExt;

use super::activity::{Activity, InFlight};
use super::{ClientTls, HttpService};
use crate::upstream::forwarded::PeerAddr;

/// hyper's service for one connection.
#[derive(Clone)]
pub(crate) struct ConnectionService {
    pipeline: HttpService,
    peer: std::net::SocketAddr,
    tls: bool,
    activity: Arc<Activity>,
    /// `Keep-Alive: timeout=N` for HTTP/1 responses; `None` on HTTP/2, where
    /// connection-specific fields are forbidden.
    keep_alive: Option<HeaderValue>,
}

impl ConnectionService {
    pub(crate) fn new(
        pipeline: HttpService,
        peer: std::net::SocketAddr,
        tls: bool,
        activity: Arc<Activity>,
        keep_alive: Option<HeaderValue>,
    ) -> Self {
        Self {
            pipeline,
            peer,
            tls,
            activity,
            keep_alive,
        }
    }
}

impl hyper::service::Service<Request<Incoming>> for ConnectionService {
    type Response = Response<TrackedBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn call(&self, mut request: Request<Incoming>) -> Self::Future {
        // Taken before the pipeline runs, so a request abandoned mid-way still ends.
        let in_flight = self.activity.request();
        request.extensions_mut().insert(PeerAddr(self.peer));
        if self.tls {
            request.extensions_mut().insert(ClientTls);
        }
        let response = self.pipeline.clone().oneshot(request.map(Body::new));
        let keep_alive = self.keep_alive.clone();
        Box::pin(async move {
            let Ok(mut response) = response.await;
            if let Some(value) = keep_alive {
                // Tell clients when the gateway closes an idle connection, so they close
                // (or stop reusing it) first and never race the close.
                if !response.headers().contains_key(header::CONNECTION) {
                    response.headers_mut().insert("keep-alive", value);
                }
            }
            Ok(response.map(|body| TrackedBody {
                inner: body,
                in_flight: Some(in_flight),
            }))
        })
    }
}

/// A response body that ends its request's in-flight count once fully sent (or dropped).
pub(crate) struct TrackedBody {
    inner: Body,
    in_flight: Option<InFlight>,
}

impl http_body::Body for TrackedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        let frame = Pin::new(&mut this.inner).poll_frame(cx);
        if matches!(frame, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            this.in_flight = None;
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
