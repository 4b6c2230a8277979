//! A listener's service that a configuration reload replaces while the listener serves
//! ([`Swap`]), without touching the listener: the listener is handed
//! [`Swap::service`], an ordinary [`HttpService`].
//!
//! The listener clones its service once per connection and once per request (see
//! `edge::listener`), and a request runs to its end on the clone it started with. So the
//! check lives in `clone`: one atomic load of the generation, and only when it changed (a
//! reload happened) one load of the new pipeline, which the connection's own copy keeps
//! from then on. A request therefore runs entirely on the old pipeline or entirely on the
//! new one; requests in flight finish on theirs; connections stay open and their next
//! request takes the new one (an idle connection holds the old pipeline until then).

use std::cell::RefCell;
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
        HttpService::new(Swapping {
            swap: self.clone(),
            cached: RefCell::new(self.current()),
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

/// [`Swap`]'s service: the pipeline of the generation it was last cloned at, and that
/// generation. (`Send`, not `Sync`, like the boxed service it holds: one connection's.)
struct Swapping {
    swap: Arc<Swap>,
    cached: RefCell<(u64, HttpService)>,
}

impl Clone for Swapping {
    fn clone(&self) -> Self {
        let generation = self.swap.generation.load(Ordering::Acquire);
        // Nothing re-enters a clone, so the borrow is always free; if it were not, the
        // copy would just not be refreshed.
        let cached = match self.cached.try_borrow_mut() {
            Ok(mut cached) => {
                if cached.0 != generation {
                    // Refreshed in place: the connection's copy keeps the new pipeline
                    // and lets the old one go.
                    *cached = self.swap.current();
                }
                (cached.0, cached.1.clone())
            }
            Err(_) => self.swap.current(),
        };
        Self {
            swap: self.swap.clone(),
            cached: RefCell::new(cached),
        }
    }
}

impl Service<Request<Body>> for Swapping {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = <HttpService as Service<Request<Body>>>::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.cached.get_mut().1.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        self.cached.get_mut().1.call(request)
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

    #[tokio::test]
    async fn a_connection_lets_the_old_pipeline_go_at_its_next_request() {
        let marker = Arc::new(());
        let held = marker.clone();
        let old = HttpService::new(tower::service_fn(move |_req: Request<Body>| {
            let _ = &held;
            async { Ok::<_, Infallible>(Response::new(Body::from("old"))) }
        }));
        let swap = Swap::new(old);
        let connection = swap.service();
        assert_eq!(body(&connection).await, "old");
        swap.replace(answering("new"));
        assert!(
            Arc::strong_count(&marker) > 1,
            "the connection still holds it"
        );
        assert_eq!(body(&connection).await, "new");
        assert_eq!(Arc::strong_count(&marker), 1, "nothing holds the old one");
    }
}
