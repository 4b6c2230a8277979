//! The one place where errors from the upstream side become problem+json responses, so no
//! error ever reaches hyper (which would just drop the connection).

use std::convert::Infallible;
use std::task::{Context, Poll};

use axum::body::Body;
use futures_util::future::{BoxFuture, FutureExt};
use http::{Request, Response};
use tower::{Layer, Service};

use std::sync::Arc;

use crate::telemetry::Exchange;
use portcullis_idempotency::NotForwarded;

mod into_problem;

pub(crate) use self::into_problem::request_body_problem;
pub use self::into_problem::IntoProblem;

/// Turns `Err(E)` into the error's problem response.
#[derive(Debug, Clone, Copy, Default)]
pub struct RescueLayer;

/// The service of [`RescueLayer`].
#[derive(Debug, Clone)]
pub struct Rescue<S> {
    inner: S,
}

impl<S> Layer<S> for RescueLayer {
    type Service = Rescue<S>;
    fn layer(&self, inner: S) -> Self::Service {
        Rescue { inner }
    }
}

impl<S> Service<Request<Body>> for Rescue<S>
where
    S: Service<Request<Body>, Response = Response<Body>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: IntoProblem + Send + 'static,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response<Body>, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // The proxy is always ready; an inner error here is reported on the call instead.
        match self.inner.poll_ready(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(_) => Poll::Ready(Ok(())),
        }
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        // The request's record counts its upstream attempts: a problem answered after the
        // gateway retried says so (`attempts`), so a client does not start a new round.
        let exchange = request.extensions().get::<Arc<Exchange>>().cloned();
        let future = self.inner.call(request);
        async move {
            match future.await {
                Ok(response) => Ok(response),
                Err(err) => {
                    let mut problem = err.problem();
                    let attempts = exchange.as_ref().map_or(0, |e| e.attempts());
                    if attempts > 1 {
                        problem = problem.with("attempts", attempts);
                    }
                    let status = problem.status().as_u16();
                    if err.is_client_fault() {
                        // The client's own body: its 4xx is in the access log; no upstream failed.
                        tracing::debug!(error = %err, status, "client request body refused");
                    } else {
                        tracing::warn!(error = %err, status, "upstream request failed");
                    }
                    let mut response = problem.into_response();
                    if err.provably_unprocessed() {
                        response.extensions_mut().insert(NotForwarded);
                    }
                    Ok(response)
                }
            }
        }
        .boxed()
    }
}
