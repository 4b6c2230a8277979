//! The adapter between hyper and the pipeline: request extensions from the connection
//! (peer address, TLS), the connection's in-flight count, and `Keep-Alive` on HTTP/1.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use http::{header, HeaderName, HeaderValue, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::upgrade::OnUpgrade;

use super::activity::{Activity, Busy};
use super::stream::SendWait;
use super::swap::{Current, Responding};
use super::ClientTls;
use crate::edge::upgrade::ConnectionHold;
use crate::plumbing::client::PeerAddr;
use crate::plumbing::held::{Both, HeldBody, UntilEnd};

/// `Keep-Alive` (not among `http`'s standard names), parsed once.
const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");

/// hyper's service for one connection.
#[derive(Clone)]
pub(crate) struct ConnectionService {
    pipeline: Current,
    peer: std::net::SocketAddr,
    tls: bool,
    activity: Arc<Activity>,
    /// `Keep-Alive: timeout=N` for HTTP/1 responses; `None` on HTTP/2, where
    /// connection-specific fields are forbidden.
    keep_alive: Option<HeaderValue>,
    /// What a tunnel opened from this connection holds (`edge::upgrade`); on HTTP/1 the
    /// requests offered a switch also report their answer to the framing guard.
    hold: Option<ConnectionHold>,
    /// HTTP/2 (extended CONNECT): each stream offered a switch holds the connection busy.
    streams: bool,
}

impl ConnectionService {
    pub(crate) fn new(
        pipeline: Current,
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
            hold: None,
            streams: false,
        }
    }

    /// An HTTP/2 connection's service with extended CONNECT: the CONNECT streams (the
    /// ones hyper offers a switch) carry `hold` and keep the connection busy while a
    /// tunnel runs on them.
    pub(crate) fn with_streams(mut self, hold: ConnectionHold) -> Self {
        self.hold = Some(hold);
        self.streams = true;
        self
    }

    /// An HTTP/1 connection's service: requests that ask to switch protocols carry `hold`,
    /// and their answer is reported to the framing guard.
    pub(crate) fn with_upgrades(mut self, hold: ConnectionHold) -> Self {
        self.hold = Some(hold);
        self
    }
}

impl hyper::service::Service<Request<Incoming>> for ConnectionService {
    type Response = Response<TrackedBody>;
    type Error = Infallible;
    type Future = Serving;

    fn call(&self, mut request: Request<Incoming>) -> Self::Future {
        // Taken before the pipeline runs, so a request abandoned mid-way still ends.
        let in_flight = self.activity.request();
        request.extensions_mut().insert(PeerAddr(self.peer));
        if self.tls {
            request.extensions_mut().insert(ClientTls);
        }
        // hyper offers a switch (and the guard waits for its answer) exactly on the requests
        // it gave an `OnUpgrade`.
        let answers_upgrade = match &self.hold {
            Some(hold) if request.extensions().get::<OnUpgrade>().is_some() => {
                if self.streams {
                    let busy = self.activity.request();
                    request.extensions_mut().insert(hold.with_busy(busy));
                    None
                } else {
                    request.extensions_mut().insert(hold.clone());
                    Some(self.activity.clone())
                }
            }
            _ => None,
        };
        // A named future rather than a boxed `async` block: the pipeline's future is boxed
        // already, a second box per request would only add an allocation and a move.
        Serving {
            response: self.pipeline.call(request.map(Body::new)),
            keep_alive: self.keep_alive.clone(),
            in_flight: Some(in_flight),
            answers_upgrade,
        }
    }
}

/// A response body that ends its request's in-flight count once fully sent (or dropped),
/// and on HTTP/2 reports its frames to the stream's send timeout (`stream`).
pub(crate) type TrackedBody = HeldBody<Body, Both<UntilEnd<Busy>, Option<SendWait>>>;

pin_project_lite::pin_project! {
    /// One request through the pipeline, answered with `Keep-Alive` (HTTP/1) and a body
    /// that holds the request's in-flight count.
    pub(crate) struct Serving {
        #[pin]
        response: Responding,
        keep_alive: Option<HeaderValue>,
        in_flight: Option<Busy>,
        answers_upgrade: Option<Arc<Activity>>,
    }
}

impl Future for Serving {
    type Output = Result<Response<TrackedBody>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let Ok(mut response) = std::task::ready!(this.response.poll(cx));
        let switching = response.status() == StatusCode::SWITCHING_PROTOCOLS;
        if let Some(activity) = this.answers_upgrade.take() {
            activity.upgrade_answered(switching);
        }
        if let Some(value) = this.keep_alive.take().filter(|_| !switching) {
            // Tell clients when the gateway closes an idle connection, so they close
            // (or stop reusing it) first and never race the close; while the listener
            // drains, that it closes after this response (hyper then does).
            if this.in_flight.as_ref().is_some_and(Busy::draining) {
                response
                    .headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            } else if !response.headers().contains_key(header::CONNECTION) {
                response.headers_mut().insert(KEEP_ALIVE, value);
            }
        }
        // Only HTTP/2 streams run under a stream clock; HTTP/1 writes are the watchdog's.
        let held = Both(UntilEnd(this.in_flight.take()), SendWait::current());
        Poll::Ready(Ok(response.map(|body| HeldBody::new(body, held))))
    }
}
