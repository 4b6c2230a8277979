//! The client's request body as handed to the upstream client, keeping its error.
//!
//! When the body fails while it is being sent (over `server.max_body_bytes`, too slow,
//! malformed chunks), the failure is the client's, and its typed cause decides the answer
//! (413 / 408 / 400) and that no upstream is blamed for it. hyper does not always pass that
//! cause on: over HTTP/2 it only logs the body error, resets the stream and fails the
//! response with a bare `RST_STREAM`, which looked like an upstream reset (502, a breaker
//! failure provoked by one client). So the body keeps its own error here, and the proxy
//! prefers it to whatever hyper reports.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use axum::body::Body;
use bytes::Bytes;
use http_body::{Frame, SizeHint};

/// What hyper gets instead of the client's body error (which stays in [`BodyFailure`]).
#[derive(Debug, thiserror::Error)]
#[error("the client's request body failed while being sent upstream")]
pub(crate) struct ClientBodyAborted;

/// Where a [`WitnessedBody`] leaves its error for the proxy, and whether it was all sent.
#[derive(Debug, Clone, Default)]
pub(crate) struct BodyFailure(Arc<Witnessed>);

#[derive(Debug, Default)]
struct Witnessed {
    error: Mutex<Option<axum::Error>>,
    /// The last frame went out: an attempt still waiting afterwards waits for the upstream,
    /// not for the client.
    sent: AtomicBool,
}

/// A request body that records its first error in a [`BodyFailure`].
pub(crate) struct WitnessedBody {
    inner: Body,
    failure: BodyFailure,
}

// === impl BodyFailure ===

impl BodyFailure {
    /// The body's error, if it failed.
    pub(crate) fn take(&self) -> Option<axum::Error> {
        // A poisoned lock still holds a valid `Option`.
        self.0
            .error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// Whether the whole body was handed to the upstream client.
    pub(crate) fn fully_sent(&self) -> bool {
        self.0.sent.load(Ordering::Acquire)
    }

    fn record(&self, err: axum::Error) {
        let mut slot = self.0.error.lock().unwrap_or_else(|e| e.into_inner());
        slot.get_or_insert(err);
    }

    fn sent(&self) {
        self.0.sent.store(true, Ordering::Release);
    }
}

// === impl WitnessedBody ===

impl WitnessedBody {
    /// Wraps `inner`; its error will be found in the returned [`BodyFailure`].
    pub(crate) fn wrap(inner: Body) -> (Body, BodyFailure) {
        let failure = BodyFailure::default();
        let body = Body::new(Self {
            inner,
            failure: failure.clone(),
        });
        (body, failure)
    }
}

impl http_body::Body for WitnessedBody {
    type Data = Bytes;
    type Error = ClientBodyAborted;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ClientBodyAborted>>> {
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Err(err))) => {
                // Recorded before hyper sees the failure, so before the response fails.
                self.failure.record(err);
                Poll::Ready(Some(Err(ClientBodyAborted)))
            }
            Poll::Ready(Some(Ok(frame))) => {
                // hyper stops polling a body that says it ended (a known length reached).
                if self.inner.is_end_stream() {
                    self.failure.sent();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None) => {
                self.failure.sent();
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
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
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn keeps_the_clients_error_and_passes_frames_through() {
        let items = [
            Ok(Bytes::from_static(b"ab")),
            Err(std::io::Error::other("client went away")),
        ];
        let (body, failure) =
            WitnessedBody::wrap(Body::from_stream(futures_util::stream::iter(items)));
        assert!(failure.take().is_none());
        let err = body.collect().await.unwrap_err();
        assert!(super::super::error::find::<ClientBodyAborted>(&err).is_some());
        let kept = failure.take().expect("the body's error is kept");
        assert!(
            super::super::error::find::<std::io::Error>(&kept).is_some(),
            "{kept:?}"
        );
    }

    #[tokio::test]
    async fn a_complete_body_leaves_no_failure() {
        let (body, failure) = WitnessedBody::wrap(Body::from("hello"));
        assert!(!failure.fully_sent());
        assert_eq!(body.collect().await.unwrap().to_bytes(), "hello");
        assert!(failure.take().is_none());
        assert!(failure.fully_sent());
    }

    #[tokio::test]
    async fn a_body_still_streaming_is_not_fully_sent() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
        let stream = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        });
        let (mut body, failure) = WitnessedBody::wrap(Body::from_stream(stream));
        tx.send(Ok(Bytes::from_static(b"a"))).await.unwrap();
        let first = body.frame().await.unwrap().unwrap();
        assert_eq!(first.into_data().unwrap(), "a");
        assert!(!failure.fully_sent(), "more may come");
        drop(tx);
        assert!(body.frame().await.is_none());
        assert!(failure.fully_sent());
    }
}
