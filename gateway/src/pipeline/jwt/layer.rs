//! The one asynchronous part of JWT tenants: before `context::Resolve` verifies a token
//! synchronously, a token whose `kid` the key cache does not hold waits here for the
//! (rate-limited, single-flight) refresh. Every other request goes straight to the inner
//! service's own future, unboxed.

use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use futures_util::future::{BoxFuture, Either};
use http::{Request, Response};
use tower::{Layer, Service};

use super::JwtAuth;

/// Refreshes the key set for tokens with an unknown `kid` before the request goes on.
#[derive(Debug, Clone)]
pub(crate) struct JwtKeysLayer(Arc<JwtAuth>);

/// The service of [`JwtKeysLayer`].
#[derive(Debug, Clone)]
pub(crate) struct JwtKeys<S> {
    inner: S,
    auth: Arc<JwtAuth>,
}

// === impl JwtKeysLayer ===

impl JwtKeysLayer {
    pub(crate) fn new(auth: Arc<JwtAuth>) -> Self {
        Self(auth)
    }
}

impl<S> Layer<S> for JwtKeysLayer {
    type Service = JwtKeys<S>;
    fn layer(&self, inner: S) -> JwtKeys<S> {
        JwtKeys {
            inner,
            auth: self.0.clone(),
        }
    }
}

// === impl JwtKeys ===

impl<S> Service<Request<Body>> for JwtKeys<S>
where
    S: Service<Request<Body>, Response = Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = Either<S::Future, BoxFuture<'static, Result<Response<Body>, S::Error>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let Some(kid) = self.auth.unknown_kid(request.headers()) else {
            return Either::Left(self.inner.call(request));
        };
        // The ready service goes into the future; a fresh clone stays for the next call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let auth = self.auth.clone();
        Either::Right(Box::pin(async move {
            auth.keys.refresh_for_kid(&kid).await;
            inner.call(request).await
        }))
    }
}
