//! The one response body wrapper that keeps something until the body ends: the listener's
//! per-connection in-flight count, the concurrency permits, the access-log line, an
//! endpoint's in-flight count for the load balancer. One generic type instead of a copy
//! per concern: one poll layer each, and the same end-of-body rule everywhere.

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use bytes::Buf;
use http::{Request, Response};
use http_body::{Frame, SizeHint};

use crate::plumbing::step::{Finish, Step};

/// What a [`HeldBody`] keeps. Its own `Drop` releases it: when the body is dropped, after
/// the last frame or when the client goes away mid-body.
pub(crate) trait Held: Send + Unpin + 'static {
    /// The body is asked for its next frame (an HTTP/2 stream's send timeout watches this:
    /// `edge::listener::stream`).
    fn polled(&mut self) {}

    /// A data frame of `len` bytes is passed on (the access log counts them).
    fn sent(&mut self, _len: usize) {}

    /// The body ended (its last frame, an empty body at once, or an error), possibly long
    /// before it is dropped: hyper stops polling a body that says it has ended and keeps it
    /// until the connection's next request, so a count that must see the end at once (the
    /// listener's idle clock) is given back here. Called at most once.
    fn ended(&mut self) {}

    /// The body failed (the connection carrying it broke). By default the same as
    /// [`ended`](Self::ended); the upstream pool closes the connection instead of reusing it.
    fn failed(&mut self) {
        self.ended();
    }
}

/// Nothing held, or one thing (the upstream pool's connection, only for pooled upstreams).
impl<T: Held> Held for Option<T> {
    fn polled(&mut self) {
        if let Some(held) = self {
            held.polled();
        }
    }

    fn sent(&mut self, len: usize) {
        if let Some(held) = self {
            held.sent(len);
        }
    }

    fn ended(&mut self) {
        if let Some(held) = self {
            held.ended();
        }
    }

    fn failed(&mut self) {
        if let Some(held) = self {
            held.failed();
        }
    }
}

/// Kept only until the body's last frame or error, not until the body is dropped.
pub(crate) struct UntilEnd<T>(pub(crate) Option<T>);

impl<T> UntilEnd<T> {
    /// Keeps `value` until the body ends.
    pub(crate) fn new(value: T) -> Self {
        Self(Some(value))
    }
}

impl<T: Send + Unpin + 'static> Held for UntilEnd<T> {
    fn ended(&mut self) {
        self.0 = None;
    }
}

/// Two adjacent steps whose finishes are both kept until the response body ends (the load
/// shedder's permit and the concurrency permits): one step and one body wrapper for both,
/// instead of a wrapper (an allocation and a poll layer) each.
#[derive(Debug, Clone)]
pub(crate) struct HoldBoth<A, B>(pub(crate) A, pub(crate) B);

/// What [`HoldBoth`] keeps: both steps' finishes.
pub(crate) struct Both<A, B>(pub(crate) A, pub(crate) B);

impl<A, B> Step for HoldBoth<A, B>
where
    A: Step,
    B: Step,
    A::Finish: Held,
    B::Finish: Held,
{
    type Finish = Both<A::Finish, B::Finish>;

    fn step(&self, request: &mut Request<Body>) -> Result<Self::Finish, Response<Body>> {
        let first = self.0.step(request)?;
        match self.1.step(request) {
            Ok(second) => Ok(Both(first, second)),
            // As if the second step's answer had passed back through the first.
            Err(answer) => Err(first.finish(answer)),
        }
    }
}

impl<A: Held, B: Held> Held for Both<A, B> {
    fn polled(&mut self) {
        self.0.polled();
        self.1.polled();
    }

    fn sent(&mut self, len: usize) {
        self.0.sent(len);
        self.1.sent(len);
    }

    fn ended(&mut self) {
        self.0.ended();
        self.1.ended();
    }

    fn failed(&mut self) {
        self.0.failed();
        self.1.failed();
    }
}

impl<A: Held, B: Held> Finish for Both<A, B> {
    fn finish(self, response: Response<Body>) -> Response<Body> {
        hold_until_body_ends(response, self)
    }
}

pin_project_lite::pin_project! {
    /// `inner`, keeping `held` until it ends or is dropped.
    pub(crate) struct HeldBody<B, H> {
        #[pin]
        inner: B,
        held: H,
        // `held` was told the body ended (or failed).
        done: bool,
    }
}

impl<B: http_body::Body, H: Held> HeldBody<B, H> {
    /// `inner`, keeping `held` (told at once when `inner` is empty: nobody polls it).
    pub(crate) fn new(inner: B, mut held: H) -> Self {
        let done = inner.is_end_stream();
        if done {
            held.ended();
        }
        Self { inner, held, done }
    }

    /// The same body keeping `more` as well, with one poll layer for both.
    pub(crate) fn and<M: Held>(self, mut more: M) -> HeldBody<B, Both<H, M>> {
        if self.done {
            more.ended();
        }
        HeldBody {
            inner: self.inner,
            held: Both(self.held, more),
            done: self.done,
        }
    }
}

impl<B: std::fmt::Debug, H> std::fmt::Debug for HeldBody<B, H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldBody")
            .field("inner", &self.inner)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

/// Moves `held` into the response body (one allocation: the body is boxed once).
pub(crate) fn hold_until_body_ends<H: Held>(response: Response<Body>, held: H) -> Response<Body> {
    response.map(|body| Body::new(HeldBody::new(body, held)))
}

impl<B, H> http_body::Body for HeldBody<B, H>
where
    B: http_body::Body,
    H: Held,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let mut this = self.project();
        this.held.polled();
        let polled = std::task::ready!(this.inner.as_mut().poll_frame(cx));
        match &polled {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    this.held.sent(data.remaining());
                }
                // The last frame: hyper will not poll again to see `None`.
                if !*this.done && this.inner.is_end_stream() {
                    *this.done = true;
                    this.held.ended();
                }
            }
            Some(Err(_)) if !*this.done => {
                *this.done = true;
                this.held.failed();
            }
            None if !*this.done => {
                *this.done = true;
                this.held.ended();
            }
            Some(Err(_)) | None => {}
        }
        Poll::Ready(polled)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use http_body_util::BodyExt;

    use super::*;

    #[derive(Default)]
    struct Log(Arc<Mutex<Vec<String>>>);

    impl Held for Log {
        fn sent(&mut self, len: usize) {
            self.0.lock().unwrap().push(format!("sent {len}"));
        }
        fn ended(&mut self) {
            self.0.lock().unwrap().push("ended".into());
        }
    }

    impl Drop for Log {
        fn drop(&mut self) {
            self.0.lock().unwrap().push("dropped".into());
        }
    }

    #[tokio::test]
    async fn the_end_is_seen_at_the_last_frame_once_and_at_once_for_an_empty_body() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut body = HeldBody::new(Body::from("hello"), Log(log.clone()));
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "hello");
        // Not polled again (as hyper does with a body that says it ended): already seen.
        assert_eq!(*log.lock().unwrap(), ["sent 5", "ended"]);
        assert!(body.frame().await.is_none());
        assert_eq!(*log.lock().unwrap(), ["sent 5", "ended"], "told once");

        log.lock().unwrap().clear();
        let body = HeldBody::new(Body::empty(), Log(log.clone()));
        assert_eq!(
            *log.lock().unwrap(),
            ["ended"],
            "nobody polls an empty body"
        );
        let _both = body.and(Log(log.clone()));
        assert_eq!(
            *log.lock().unwrap(),
            ["ended", "ended"],
            "nor one held later"
        );
    }

    #[tokio::test]
    async fn counts_frames_sees_the_end_and_releases_on_drop() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let response = hold_until_body_ends(Response::new(Body::from("hello")), Log(log.clone()));
        assert!(log.lock().unwrap().is_empty(), "held while unread");
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "hello");
        assert_eq!(*log.lock().unwrap(), ["sent 5", "ended", "dropped"]);

        log.lock().unwrap().clear();
        let response = hold_until_body_ends(Response::new(Body::from("unread")), Log(log.clone()));
        drop(response);
        assert_eq!(
            *log.lock().unwrap(),
            ["dropped"],
            "released when dropped unread"
        );
    }
}
