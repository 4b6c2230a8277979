//! A listener's service that a configuration reload replaces while the listener serves
//! ([`Swap`]), without touching the listener: the listener is handed
//! [`Swap::service`], an ordinary [`HttpService`].
//!
//! The listener clones its service once per connection and once per request (see
//! `edge::listener`), and a request runs to its end on the clone it started with. So the
//! check lives in `clone`: one atomic load of the generation, and only when it changed (a
//! reload happened) one load of the new pipeline. A request therefore runs entirely on the
//! old pipeline or entirely on the new one; requests in flight finish on theirs; connections
//! stay open and their next request takes the new one.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use arc_swap::ArcSwap;
use axum::body::Body;
use http::{Request, Response};
use tower::Service;

use crate::edge::listener::HttpService;

/// The current service of one listener and its generation (bumped by each replacement).
pub(crate) struct Swap {
    /// A boxed service is `Send` but not `Sync`: the lock makes it shareable across worker
    /// threads. It is taken only to clone a new generation, never per request.
    current: ArcSwap<Mutex<HttpService>>,
    generation: AtomicU64,
}

impl Swap {
    pub(crate) fn new(service: HttpService) -> Arc<Self> {
        Arc::new(Self {
            current: ArcSwap::from_pointee(Mutex::new(service)),
            generation: AtomicU64::new(0),
        })
    }

    /// Requests that start from now on run on `service`.
    pub(crate) fn replace(&self, service: HttpService) {
        self.current.store(Arc::new(Mutex::new(service)));
        // After the store: a reader that sees the new generation finds the new service.
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// The service to hand to the listener.
    pub(crate) fn service(self: &Arc<Self>) -> HttpService {
        let (generation, service) = self.current();
        HttpService::new(Swapping {
            swap: self.clone(),
            generation,
            service,
        })
    }

    fn current(&self) -> (u64, HttpService) {
        // Generation first: if a replacement lands in between, the service is newer than
        // the generation says and the next clone loads it again (never the reverse).
        let generation = self.generation.load(Ordering::Acquire);
        let current = self.current.load();
        let service = current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        (generation, service)
    }
}

/// [`Swap`]'s service: the pipeline of the generation it was cloned at.
struct Swapping {
    swap: Arc<Swap>,
    generation: u64,
    service: HttpService,
}

impl Clone for Swapping {
    fn clone(&self) -> Self {
        let (generation, service) =
            if self.swap.generation.load(Ordering::Acquire) == self.generation {
                (self.generation, self.service.clone())
            } else {
                self.swap.current()
            };
        Self {
            swap: self.swap.clone(),
            generation,
            service,
        }
    }
}

impl Service<Request<Body>> for Swapping {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = <HttpService as Service<Request<Body>>>::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.service.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        self.service.call(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt;

    fn answering(text: &'static str) -> HttpService {
        HttpService::new(tower::service_fn(move |_req: Request<Body>| async move {
            Ok::<_, Infallible>(Response::new(Body::from(text)))
        }))
    }

    async fn body(service: &HttpService) -> String {
        let response = service
            .clone()
            .oneshot(Request::new(Body::empty()))
            .await
            .unwrap();
        let bytes = axum::body::to_bytes(response.into_body(), 1024)
            .await
            .unwrap();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn a_connection_takes_the_new_service_at_its_next_request() {
        let swap = Swap::new(answering("old"));
        // A connection's copy, made before the replacement.
        let connection = swap.service();
        let in_flight = connection.clone();
        assert_eq!(body(&connection).await, "old");
        swap.replace(answering("new"));
        assert_eq!(body(&connection).await, "new");
        assert_eq!(body(&swap.service()).await, "new");
        // A request cloned before the replacement finishes on the old one.
        let response = in_flight
            .oneshot(Request::new(Body::empty()))
            .await
            .unwrap();
        let bytes = axum::body::to_bytes(response.into_body(), 1024)
            .await
            .unwrap();
        assert_eq!(&bytes[..], b"old");
    }
}
