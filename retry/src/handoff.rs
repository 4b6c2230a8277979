//! [`Handoff`]: an attempt the layer stopped waiting for, left running.
//!
//! When an attempt times out the layer normally drops its exchange. For a request whose
//! caller keeps the operation's outcome (the idempotency layer holding the key), dropping
//! it loses that outcome: the upstream may still act, and the caller can only record
//! "timed out" although the real answer lands moments later. Such a caller puts a way to
//! find a [`Handoff`] in the request ([`RetryLayer::with_handoff`](crate::RetryLayer::with_handoff));
//! when an attempt of that request times out and the timeout ends the request (the ladder
//! never retries it: a second execution is exactly what the caller must avoid), the layer
//! answers the timeout at once and moves the exchange to a task of its own, which runs until
//! the handoff's bound and delivers the response head if one arrives. An exchange that fails
//! or is still running at the bound is dropped, and the delivery end with it, which tells
//! the caller that no answer will come.

use std::fmt;

use axum::body::Body;
use futures_util::future::BoxFuture;
use http::Response;
use tokio::time::Instant;

/// Finds (and takes) a request's [`Handoff`] in its extensions, once, when it is admitted.
pub type FindHandoff = fn(&http::Extensions) -> Option<Handoff>;

/// Where a timed-out attempt's exchange, left running, delivers its response.
pub struct Handoff {
    until: Instant,
    deliver: Box<dyn FnOnce(Response<Body>) + Send>,
}

// === impl Handoff ===

impl Handoff {
    /// The exchange may run until `until`; `deliver` receives its response head (the body
    /// still streaming from the upstream).
    pub fn new(until: Instant, deliver: impl FnOnce(Response<Body>) + Send + 'static) -> Self {
        Self {
            until,
            deliver: Box::new(deliver),
        }
    }

    /// Runs `exchange` in a task of its own until the bound.
    pub(crate) fn spawn<E: Send + 'static>(
        self,
        exchange: BoxFuture<'static, Result<Response<Body>, E>>,
    ) {
        let Self { until, deliver } = self;
        tokio::spawn(async move {
            match tokio::time::timeout_at(until, exchange).await {
                Ok(Ok(response)) => deliver(response),
                Ok(Err(_)) => tracing::debug!("a timed-out attempt left running failed"),
                Err(_) => tracing::debug!("a timed-out attempt left running reached its bound"),
            }
        });
    }
}

impl fmt::Debug for Handoff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Handoff")
            .field("until", &self.until)
            .finish_non_exhaustive()
    }
}
