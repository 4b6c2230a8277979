//! A deadline on receiving the request body, so a client trickling its body (slow-body
//! "slowloris") cannot hold a connection, an in-flight permit and an upstream connection
//! for ever. Heads have their own bound (`server.header_read_timeout`, enforced by the
//! listener's connection watchdog).

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use pin_project_lite::pin_project;
use std::future::Future;

use tokio::time::{Instant, Sleep};

/// The body did not arrive within the deadline.
#[derive(Debug, thiserror::Error)]
#[error("the request body was not received within {0:?}")]
pub struct BodyTimeout(pub Duration);

pin_project! {
    /// A body that fails with [`BodyTimeout`] if it is not complete by its deadline.
    pub struct TimeoutBody {
        #[pin]
        inner: Body,
        #[pin]
        deadline: Sleep,
        limit: Duration,
    }
}

impl TimeoutBody {
    /// `inner` must be fully received within `limit` from now.
    pub fn new(inner: Body, limit: Duration) -> Self {
        Self {
            inner,
            deadline: tokio::time::sleep_until(Instant::now() + limit),
            limit,
        }
    }
}

impl http_body::Body for TimeoutBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.project();
        if let Poll::Ready(frame) = this.inner.poll_frame(cx) {
            return Poll::Ready(frame);
        }
        match this.deadline.poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(axum::Error::new(BodyTimeout(*this.limit))))),
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

/// Whether an error chain contains a [`BodyTimeout`].
pub fn is_body_timeout(error: &(dyn std::error::Error + 'static)) -> bool {
    portcullis_problem::is_caused_by::<BodyTimeout>(error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test(start_paused = true)]
    async fn a_trickling_body_fails_at_the_deadline() {
        use futures_util::StreamExt;
        // One byte, then nothing: the client stalls mid-body.
        let stalled =
            futures_util::stream::iter([Ok::<_, std::io::Error>(Bytes::from_static(b"a"))])
                .chain(futures_util::stream::pending());
        let body = TimeoutBody::new(Body::from_stream(stalled), Duration::from_secs(30));
        let err = body.collect().await.unwrap_err();
        assert!(is_body_timeout(&err), "{err}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_prompt_body_passes() {
        let body = TimeoutBody::new(Body::from("hello"), Duration::from_secs(1));
        assert_eq!(body.collect().await.unwrap().to_bytes(), "hello");
    }
}
