//! The one tower scaffold for the gateway's small request layers.
//!
//! Most layers in front of the proxy do the same thing: look at the request (and maybe
//! change it), then either answer at once — a refusal, a 404, a 503 — or let it through and
//! perhaps touch the response on the way back. Each such concern implements [`Step`]; the
//! single [`StepLayer`]/[`StepService`] pair turns any step into a tower layer, so the
//! `Layer` + `Service` boilerplate is written once.
//!
//! The service keeps the contract every layer here relies on (habit 3): `poll_ready` only
//! delegates, the error is the inner service's, an answer given at once never calls the
//! inner service, and nothing is boxed: the future is an `Either` of a ready answer and
//! the inner future with the step's [`Finish`] applied to its response.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use futures_util::future::Either;
use http::{Request, Response};
use tower::{Layer, Service};

/// One request-path concern without a scaffold of its own.
pub trait Step {
    /// What is done to the inner service's response; `()` leaves it alone.
    type Finish: Finish;

    /// Looks at (and may change) the request. `Err` is the answer, sent at once without
    /// calling the inner service; `Ok` lets the request through.
    // The answer moves straight into the ready future: boxing it to shrink the `Result`
    // would add an allocation to every refusal.
    #[allow(clippy::result_large_err)]
    fn step(&self, request: &mut Request<Body>) -> Result<Self::Finish, Response<Body>>;
}

/// Finishes a response that the inner service produced for a request a [`Step`] let through.
/// A named type rather than a closure, so that the service's future is nameable and unboxed.
pub trait Finish {
    /// The response as it goes back to the client.
    fn finish(self, response: Response<Body>) -> Response<Body>;
}

impl Finish for () {
    fn finish(self, response: Response<Body>) -> Response<Body> {
        response
    }
}

/// The tower layer of a [`Step`]; each service it builds holds a clone of the step.
#[derive(Debug, Clone)]
pub struct StepLayer<T>(T);

impl<T> StepLayer<T> {
    /// A layer running `step` on every request.
    pub fn new(step: T) -> Self {
        Self(step)
    }
}

impl<S, T: Clone> Layer<S> for StepLayer<T> {
    type Service = StepService<S, T>;
    fn layer(&self, inner: S) -> Self::Service {
        StepService {
            inner,
            step: self.0.clone(),
        }
    }
}

/// The service of [`StepLayer`].
#[derive(Debug, Clone)]
pub struct StepService<S, T> {
    inner: S,
    step: T,
}

impl<S, T> Service<Request<Body>> for StepService<S, T>
where
    S: Service<Request<Body>, Response = Response<Body>>,
    T: Step,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = Either<
        std::future::Ready<Result<Response<Body>, S::Error>>,
        Finishing<S::Future, T::Finish>,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<Body>) -> Self::Future {
        match self.step.step(&mut request) {
            Ok(finish) => Either::Right(Finishing {
                inner: self.inner.call(request),
                finish: Some(finish),
            }),
            Err(answer) => Either::Left(std::future::ready(Ok(answer))),
        }
    }
}

pin_project_lite::pin_project! {
    /// The inner service's future, with the step's [`Finish`] applied to its response.
    /// An inner error passes through untouched.
    pub struct Finishing<F, Fin> {
        #[pin]
        inner: F,
        finish: Option<Fin>,
    }
}

impl<F, Fin, E> Future for Finishing<F, Fin>
where
    F: Future<Output = Result<Response<Body>, E>>,
    Fin: Finish,
{
    type Output = Result<Response<Body>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = std::task::ready!(this.inner.poll(cx))?;
        // `finish` is only gone if the future is polled again after completing, which the
        // `Future` contract leaves open; the response is then passed on as it is.
        Poll::Ready(Ok(match this.finish.take() {
            Some(finish) => finish.finish(response),
            None => response,
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use http::{HeaderValue, StatusCode};
    use tower::ServiceExt;

    use super::*;

    /// Refuses `/no`, tags every other request and its response.
    #[derive(Clone)]
    struct Tag;

    struct Stamp;

    impl Finish for Stamp {
        fn finish(self, mut response: Response<Body>) -> Response<Body> {
            response
                .headers_mut()
                .insert("x-stamp", HeaderValue::from_static("yes"));
            response
        }
    }

    impl Step for Tag {
        type Finish = Stamp;
        fn step(&self, request: &mut Request<Body>) -> Result<Stamp, Response<Body>> {
            if request.uri().path() == "/no" {
                let mut refused = Response::new(Body::empty());
                *refused.status_mut() = StatusCode::FORBIDDEN;
                return Err(refused);
            }
            request
                .headers_mut()
                .insert("x-tagged", HeaderValue::from_static("1"));
            Ok(Stamp)
        }
    }

    #[tokio::test]
    async fn answers_at_once_or_passes_through_and_finishes() {
        let calls = Arc::new(AtomicUsize::new(0));
        let seen = calls.clone();
        let service = StepLayer::new(Tag).layer(tower::service_fn(move |req: Request<Body>| {
            seen.fetch_add(1, Ordering::SeqCst);
            let tagged = req.headers().contains_key("x-tagged");
            async move {
                let mut response = Response::new(Body::empty());
                if !tagged {
                    *response.status_mut() = StatusCode::BAD_REQUEST;
                }
                Ok::<_, Infallible>(response)
            }
        }));

        let refused = service
            .clone()
            .oneshot(Request::builder().uri("/no").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(refused.status(), StatusCode::FORBIDDEN);
        assert!(!refused.headers().contains_key("x-stamp"));
        assert_eq!(
            calls.load(Ordering::SeqCst),
            0,
            "an answer never calls inner"
        );

        let passed = service
            .oneshot(Request::builder().uri("/yes").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(
            passed.status(),
            StatusCode::OK,
            "the step changed the request"
        );
        assert_eq!(passed.headers()["x-stamp"], "yes");
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn inner_errors_pass_through_unfinished() {
        let service = StepLayer::new(Tag).layer(tower::service_fn(|_req: Request<Body>| async {
            Err::<Response<Body>, _>("inner failed")
        }));
        let err = service
            .oneshot(Request::new(Body::empty()))
            .await
            .unwrap_err();
        assert_eq!(err, "inner failed");
    }
}
