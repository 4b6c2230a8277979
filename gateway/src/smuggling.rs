//! Request-smuggling defence: a request whose framing headers disagree is answered 400
//! problem+json with `Connection: close`, before anything else reads its body.
//!
//! # Who catches what
//!
//! hyper's HTTP/1.1 parser already refuses, with a bare 400 and a closed connection, before
//! any layer runs: two `Content-Length` values that differ (as separate lines or as a list),
//! a `Content-Length` that is not a number, `Transfer-Encoding` whose last coding is not
//! `chunked`, and `Transfer-Encoding` on HTTP/1.0. When a request carries both
//! `Transfer-Encoding: chunked` and `Content-Length`, hyper follows RFC 9112 §6.3: it frames
//! the body by `Transfer-Encoding` alone, *removes* `Content-Length` from the headers and
//! closes the connection after the response — so no desynchronisation is possible on the
//! client side, and the upstream gets one freshly framed body. Because hyper drops the
//! header, no layer can tell such a request from an ordinary chunked one.
//!
//! The h2 library (0.4.20) resets the stream (PROTOCOL_ERROR) on `Transfer-Encoding` and
//! other connection-specific headers, on `content-length` fields that differ, and on a body
//! longer or shorter than its `content-length`.
//!
//! So with today's hyper and h2 every conflicting request is stopped below this layer, and
//! the e2e tests (`tests/e2e/tls_edge.rs`) pin that down. This layer is the defence in
//! depth the pipeline does not delegate: it refuses `Content-Length` together with
//! `Transfer-Encoding`, and differing `Content-Length` values, whatever server library sits
//! underneath — both are the classic vectors for desynchronising an HTTP/1.1 upstream.
//!
//! Cost on the common path: two header-map lookups; no allocation (the future is an
//! `Either`, not a box).

use std::task::{Context, Poll};

use axum::body::Body;
use futures_util::future::Either;
use http::{header, HeaderMap, HeaderValue, Request, Response, StatusCode};
use tower::{Layer, Service};

use crate::problem::Problem;

/// Refuses requests with conflicting framing headers.
#[derive(Debug, Clone, Copy, Default)]
pub struct SmugglingLayer;

/// The service of [`SmugglingLayer`].
#[derive(Debug, Clone)]
pub struct Smuggling<S> {
    inner: S,
}

// === impl SmugglingLayer ===

impl<S> Layer<S> for SmugglingLayer {
    type Service = Smuggling<S>;
    fn layer(&self, inner: S) -> Self::Service {
        Smuggling { inner }
    }
}

// === impl Smuggling ===

impl<S> Service<Request<Body>> for Smuggling<S>
where
    S: Service<Request<Body>, Response = Response<Body>>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = Either<std::future::Ready<Result<Response<Body>, S::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        if let Some(reason) = conflict(request.headers()) {
            tracing::info!(reason, "conflicting request framing refused");
            let mut response = Problem::new(
                StatusCode::BAD_REQUEST,
                "conflicting-framing",
                "Conflicting message framing",
                format!("{reason}; the request was refused and the connection is closed"),
            )
            .into_response();
            // HTTP/1.1: hyper closes the connection after this response, so no byte left
            // behind by the ambiguous framing is ever read as a next request. (HTTP/2 strips
            // the header; there the refusal concerns this stream only.)
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            return Either::Left(std::future::ready(Ok(response)));
        }
        Either::Right(self.inner.call(request))
    }
}

/// Why the framing headers conflict, if they do.
pub fn conflict(headers: &HeaderMap) -> Option<&'static str> {
    let mut lengths = headers.get_all(header::CONTENT_LENGTH).iter();
    let first = lengths.next()?;
    if headers.contains_key(header::TRANSFER_ENCODING) {
        return Some("both Content-Length and Transfer-Encoding were sent");
    }
    // Each field may itself be a list ("5, 5"); every element must be the same number.
    let mut seen: Option<&[u8]> = None;
    for value in std::iter::once(first).chain(lengths) {
        for element in value.as_bytes().split(|b| *b == b',') {
            let element = element.trim_ascii();
            match seen {
                None => seen = Some(element),
                Some(previous) if previous == element => {}
                Some(_) => return Some("conflicting Content-Length values were sent"),
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    #[test]
    fn agreeing_or_absent_framing_passes() {
        assert_eq!(conflict(&headers(&[])), None);
        assert_eq!(conflict(&headers(&[("content-length", "5")])), None);
        assert_eq!(
            conflict(&headers(&[
                ("content-length", "5"),
                ("content-length", "5")
            ])),
            None
        );
        assert_eq!(conflict(&headers(&[("content-length", "5, 5")])), None);
        assert_eq!(
            conflict(&headers(&[("transfer-encoding", "chunked")])),
            None
        );
    }

    #[test]
    fn conflicting_framing_is_named() {
        let both = headers(&[("content-length", "5"), ("transfer-encoding", "chunked")]);
        assert!(conflict(&both).unwrap().contains("Transfer-Encoding"));
        let two = headers(&[("content-length", "5"), ("content-length", "6")]);
        assert!(conflict(&two).unwrap().contains("conflicting"));
        let listed = headers(&[("content-length", "5, 6")]);
        assert!(conflict(&listed).is_some());
    }

    #[tokio::test]
    async fn the_layer_answers_400_and_closes() {
        use tower::ServiceExt;
        let inner = tower::service_fn(|_req: Request<Body>| async {
            Ok::<_, std::convert::Infallible>(Response::new(Body::empty()))
        });
        let service = SmugglingLayer.layer(inner);
        let mut request = Request::new(Body::empty());
        *request.headers_mut() = headers(&[("content-length", "1"), ("content-length", "2")]);
        let response = service.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        assert_eq!(response.headers()[header::CONNECTION], "close");
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            "application/problem+json"
        );
        let ok = service.oneshot(Request::new(Body::empty())).await.unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
    }
}
