//! The one place where errors from the upstream side become problem+json responses, so no
//! error ever reaches hyper (which would just drop the connection).

use std::convert::Infallible;
use std::task::{Context, Poll};

use axum::body::Body;
use futures_util::future::{BoxFuture, FutureExt};
use http::{Request, Response, StatusCode};
use tower::{Layer, Service};

use crate::problem::Problem;
use crate::proxy::{ProxyError, ProxyErrorKind};
use portcullis_idempotency::NotForwarded;
use portcullis_retry::RetryError;

/// Errors that know which problem they are.
pub trait IntoProblem: std::error::Error {
    /// The client-facing problem; internals stay in the log.
    fn problem(&self) -> Problem;

    /// Whether the request provably never reached the backend (the idempotency layer then
    /// releases the key instead of storing this answer).
    fn provably_unprocessed(&self) -> bool;

    /// Whether the client caused the failure (its own body): logged as a client error,
    /// not as an upstream failure.
    fn is_client_fault(&self) -> bool;
}

impl IntoProblem for RetryError<ProxyError> {
    fn provably_unprocessed(&self) -> bool {
        self.is_provably_unprocessed()
    }

    fn is_client_fault(&self) -> bool {
        match self {
            RetryError::Upstream(err) => err.is_client_fault(),
            RetryError::RequestBody(_) => true,
            _ => false,
        }
    }

    fn problem(&self) -> Problem {
        if let RetryError::RequestBody(err) = self {
            if let Some(too_large) = crate::limits::body_too_large(err) {
                return Problem::body_too_large(too_large.limit);
            }
        }
        let problem = match self {
            RetryError::Upstream(err) => return err.problem(),
            RetryError::AttemptTimeout { after } => Problem::with_type(
                self.status(),
                self.problem_type(),
                self.title(),
                format!(
                    "the upstream sent no response within {} ms; the backend may have processed the request",
                    after.as_millis()
                ),
            ),
            RetryError::DeadlineExceeded => Problem::with_type(
                self.status(),
                self.problem_type(),
                self.title(),
                "the request's deadline (X-Request-Deadline or the route's total) passed before it could be sent",
            ),
            RetryError::BreakerOpen { .. } => Problem::with_type(
                self.status(),
                self.problem_type(),
                self.title(),
                "the upstream is failing and its circuit breaker is open; the request was not sent. Retry after the indicated delay with backoff and jitter",
            ),
            RetryError::RequestBody(err) if crate::body_timeout::is_body_timeout(err) => Problem::new(
                StatusCode::REQUEST_TIMEOUT,
                "body-timeout",
                "Request body timed out",
                "the request body did not arrive within the gateway's time limit",
            ),
            _ => Problem::with_type(self.status(), self.problem_type(), self.title(), "the request body could not be read"),
        };
        match self.retry_after() {
            Some(wait) => problem.retry_after(wait),
            None => problem,
        }
    }
}

impl IntoProblem for ProxyError {
    fn provably_unprocessed(&self) -> bool {
        self.is_provably_unprocessed()
    }

    fn is_client_fault(&self) -> bool {
        ProxyError::is_client_fault(self)
    }

    fn problem(&self) -> Problem {
        let endpoint_note = "the request was not processed by the backend";
        match self.kind() {
            ProxyErrorKind::ConnectRefused | ProxyErrorKind::ConnectTimeout | ProxyErrorKind::Dns => Problem::new(
                StatusCode::BAD_GATEWAY,
                "upstream-unreachable",
                "Upstream unreachable",
                format!("the gateway could not connect to the upstream; {endpoint_note}"),
            ),
            ProxyErrorKind::TlsHandshakeTimeout => Problem::with_type(
                StatusCode::GATEWAY_TIMEOUT,
                portcullis_retry::problem::UPSTREAM_TIMEOUT,
                "Upstream TLS handshake timed out",
                format!("the TLS handshake with the upstream did not finish in time; {endpoint_note}"),
            ),
            ProxyErrorKind::TlsHandshake => Problem::new(
                StatusCode::BAD_GATEWAY,
                "upstream-unreachable",
                "Upstream TLS handshake failed",
                format!("the TLS handshake with the upstream failed; {endpoint_note}"),
            ),
            ProxyErrorKind::TlsCertificate => {
                let reason = self.certificate_reason().unwrap_or_else(|| "unknown".to_owned());
                Problem::new(
                    StatusCode::BAD_GATEWAY,
                    "upstream-certificate",
                    "Upstream certificate rejected",
                    format!("upstream certificate rejected: {reason}. Certificate errors are never retried: they may be an attack or a misconfiguration"),
                )
                .with("reason", reason)
            }
            ProxyErrorKind::ResetAfterSent | ProxyErrorKind::Other => Problem::new(
                StatusCode::BAD_GATEWAY,
                "upstream-failed",
                "Upstream connection failed",
                "the connection to the upstream failed after the request was sent; the backend may have processed it",
            ),
            ProxyErrorKind::BodyTooLarge => match self.body_limit() {
                Some(limit) => Problem::body_too_large(limit),
                None => Problem::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "body-too-large",
                    "Request body too large",
                    "the streamed request body exceeded the gateway's limit",
                ),
            },
            ProxyErrorKind::BodyTimeout => Problem::new(
                StatusCode::REQUEST_TIMEOUT,
                "body-timeout",
                "Request body timed out",
                "the request body did not arrive within the gateway's time limit",
            ),
            ProxyErrorKind::BadClientBody => Problem::new(
                StatusCode::BAD_REQUEST,
                "bad-request-body",
                "Malformed request body",
                "the request body was malformed or ended early; the backend may have received part of it",
            ),
            ProxyErrorKind::NoRoute => Problem::internal(),
        }
    }
}

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
        let future = self.inner.call(request);
        async move {
            match future.await {
                Ok(response) => Ok(response),
                Err(err) => {
                    let problem = err.problem();
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
