//! A listener's pipeline that a configuration reload replaces while the listener serves
//! ([`Swap`]), without touching the listener or its connections.
//!
//! Each connection keeps its own copy of the current pipeline ([`Current`]) and, per
//! request, one atomic load of the generation: only when it changed (a reload happened)
//! does it load the new pipeline, which the connection keeps from then on. A request
//! therefore runs entirely on the old pipeline or entirely on the new one; requests in
//! flight finish on theirs; connections stay open and their next request takes the new one
//! (an idle connection holds the old pipeline until then).
//!
//! The request is called on the connection's copy itself, not on a clone of it: every
//! layer of the pipeline keeps the instance it drove ready and leaves a clone behind (tower's
//! "clone in call"), so nothing is cloned per request here that the pipeline does not need.

use std::cell::RefCell;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use arc_swap::ArcSwap;
use axum::body::Body;
use futures_util::future::BoxFuture;
use http::{Request, Response};
use tower::{Service, ServiceExt};

use super::HttpService;

/// A response on its way from the pipeline.
pub(crate) type Responding = BoxFuture<'static, Result<Response<Body>, Infallible>>;

/// The current pipeline of one listener and its generation (bumped by each replacement).
pub struct Swap {
    /// A boxed service is `Send` but not `Sync`: the lock makes it shareable across worker
    /// threads. It is taken only when a connection starts or sees a new generation, never
    /// otherwise per request.
    current: ArcSwap<Mutex<HttpService>>,
    generation: AtomicU64,
}

impl Swap {
    /// A listener's pipeline that starts as `service`.
    pub fn new(service: HttpService) -> Arc<Self> {
        Arc::new(Self {
            current: ArcSwap::from_pointee(Mutex::new(service)),
            generation: AtomicU64::new(0),
        })
    }

    /// Requests that start from now on run on `service`.
    pub fn replace(&self, service: HttpService) {
        self.current.store(Arc::new(Mutex::new(service)));
        // After the store: a reader that sees the new generation finds the new service.
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    fn current(&self) -> (u64, HttpService) {
        // Generation first: if a replacement lands in between, the service is newer than
        // the generation says and the next request loads it again (never the reverse).
        let generation = self.generation.load(Ordering::Acquire);
        let current = self.current.load();
        let service = current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        (generation, service)
    }
}

/// One connection's copy of its listener's pipeline, and the generation it was loaded at.
/// (`Send`, not `Sync`, like the boxed service it holds.)
pub(crate) struct Current {
    swap: Arc<Swap>,
    cached: RefCell<(u64, HttpService)>,
}

impl Current {
    pub(crate) fn new(swap: &Arc<Swap>) -> Self {
        Self {
            swap: swap.clone(),
            cached: RefCell::new(swap.current()),
        }
    }

    /// Runs `request` on the current pipeline.
    pub(crate) fn call(&self, request: Request<Body>) -> Responding {
        let generation = self.swap.generation.load(Ordering::Acquire);
        // Nothing re-enters a call, so the borrow is always free; if it were not, the
        // request would run on a fresh copy.
        let Ok(mut cached) = self.cached.try_borrow_mut() else {
            return Box::pin(self.swap.current().1.oneshot(request));
        };
        if cached.0 != generation {
            // Refreshed in place: the connection keeps the new pipeline and lets the old
            // one go.
            *cached = self.swap.current();
        }
        let service = &mut cached.1;
        // The pipeline's layers are ready at once (none holds requests back in
        // `poll_ready`); should one not be, the request waits on a clone of its own.
        match service.poll_ready(&mut Context::from_waker(
            futures_util::task::noop_waker_ref(),
        )) {
            Poll::Ready(Ok(())) => service.call(request),
            Poll::Pending => Box::pin(service.clone().oneshot(request)),
        }
    }
}

impl Clone for Current {
    fn clone(&self) -> Self {
        Self::new(&self.swap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answering(text: &'static str) -> HttpService {
        HttpService::new(tower::service_fn(move |_req: Request<Body>| async move {
            Ok::<_, Infallible>(Response::new(Body::from(text)))
        }))
    }

    async fn body(connection: &Current) -> String {
        let response = connection.call(Request::new(Body::empty())).await.unwrap();
        let bytes = axum::body::to_bytes(response.into_body(), 1024)
            .await
            .unwrap();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn a_connection_takes_the_new_service_at_its_next_request() {
        let swap = Swap::new(answering("old"));
        // A connection's copy, made before the replacement.
        let connection = Current::new(&swap);
        assert_eq!(body(&connection).await, "old");
        // A request started before the replacement finishes on the old one.
        let in_flight = connection.call(Request::new(Body::empty()));
        swap.replace(answering("new"));
        assert_eq!(body(&connection).await, "new");
        assert_eq!(body(&Current::new(&swap)).await, "new");
        let response = in_flight.await.unwrap();
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
        let connection = Current::new(&swap);
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
