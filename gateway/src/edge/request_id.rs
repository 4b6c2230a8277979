//! `X-Request-Id`: propagated when the client sent a sane one, generated (UUID v4) otherwise,
//! and echoed on the response so clients and logs can correlate.

use std::task::{Context, Poll};

use axum::body::Body;
use futures_util::future::BoxFuture;
use http::{HeaderName, HeaderValue, Request, Response};
use tower::{Layer, Service};

/// The header name.
pub static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Longest client-supplied id we propagate; longer or odd ones are replaced.
const MAX_ID_LEN: usize = 128;

/// Ensures every request and its response carry `X-Request-Id`.
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestIdLayer;

/// The service of [`RequestIdLayer`].
#[derive(Debug, Clone)]
pub struct RequestIdService<S> {
    inner: S,
}

impl<S> Layer<S> for RequestIdLayer {
    type Service = RequestIdService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        RequestIdService { inner }
    }
}

impl<S> Service<Request<Body>> for RequestIdService<S>
where
    S: Service<Request<Body>, Response = Response<Body>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Response<Body>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<Body>) -> Self::Future {
        let id = match request.headers().get(&X_REQUEST_ID) {
            Some(value) if acceptable(value) => value.clone(),
            _ => {
                let mut buf = uuid::Uuid::encode_buffer();
                let text = uuid::Uuid::new_v4().hyphenated().encode_lower(&mut buf);
                let generated = HeaderValue::from_str(text)
                    .unwrap_or_else(|_| HeaderValue::from_static("invalid"));
                request
                    .headers_mut()
                    .insert(X_REQUEST_ID.clone(), generated.clone());
                generated
            }
        };
        let future = self.inner.call(request);
        Box::pin(async move {
            let mut response = future.await?;
            response.headers_mut().insert(X_REQUEST_ID.clone(), id);
            Ok(response)
        })
    }
}

fn acceptable(value: &HeaderValue) -> bool {
    let bytes = value.as_bytes();
    !bytes.is_empty() && bytes.len() <= MAX_ID_LEN && bytes.iter().all(|b| b.is_ascii_graphic())
}
