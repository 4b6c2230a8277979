//! Request bodies kept for replay.
//!
//! A body can be retried only if the layer still has every byte of it. Bodies up to the
//! policy's `body_replay_limit` are read fully before the first attempt and replayed from
//! memory; a larger body (known from `Content-Length`, or discovered while reading a
//! chunked one) is sent exactly once: the prefix already read is put back in front of the
//! unread rest, so the backend receives it intact, and that request is never retried. An
//! empty or truncated body is never replayed in place of the real one.
//!
//! Bodies are buffered whenever the policy allows retries at all, whatever the method:
//! even a bare POST is retried after a provably-unprocessed failure (connection refused),
//! and by then the body must still be at hand. The cost is at most `body_replay_limit`
//! bytes per in-flight request.

use std::{
    collections::VecDeque,
    pin::Pin,
    task::{Context, Poll},
};

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use http_body::{Frame, SizeHint};
use http_body_util::BodyExt;

mod tee;

use tee::{Recording, TeeBody};

/// The request body, either buffered for replay or to be sent once.
#[derive(Debug)]
pub(super) enum Prepared {
    /// Complete body in memory: can be sent any number of times.
    Replayable(Bytes),
    /// Too large (or carries trailers): can be sent once. `None` once it was taken.
    Once(Option<Body>),
    /// A gRPC call's body, sent at once and recorded on the way (see [`tee`]).
    Teed(Teed),
}

/// [`Prepared::Teed`]: the client's body until the first attempt takes it, then what that
/// attempt's copy recorded.
#[derive(Debug)]
pub(super) struct Teed {
    first: Option<Body>,
    limit: usize,
    seen: Option<tokio::sync::watch::Receiver<Recording>>,
    /// The rest of the client's stream, if the first attempt dropped its copy unread.
    rest: Option<tokio::sync::oneshot::Receiver<TeeBody>>,
}

/// Frames already read from a body, followed by the rest of it: what a layer that had to
/// look at the start of a body hands on. Shared with the gateway's request buffering.
pub struct PrefixedBody {
    prefix: VecDeque<Frame<Bytes>>,
    rest: Body,
}

impl PrefixedBody {
    /// `prefix`, then whatever `rest` still yields.
    pub fn new(prefix: VecDeque<Frame<Bytes>>, rest: Body) -> Self {
        Self { prefix, rest }
    }
}

// === impl Prepared ===

impl Prepared {
    /// Reads `body` if it fits in `limit` bytes. Errors are the client's body errors.
    pub(super) async fn read(mut body: Body, limit: usize) -> Result<Self, axum::Error> {
        // The server turned a declared Content-Length into the body's exact size.
        let declared = http_body::Body::size_hint(&body).exact();
        if declared.is_some_and(|len| len > limit as u64) {
            return Ok(Self::Once(Some(body)));
        }
        let mut frames: VecDeque<Frame<Bytes>> = VecDeque::new();
        let mut len = 0usize;
        while let Some(frame) = body.frame().await {
            let frame = frame?;
            let trailers = frame.is_trailers();
            len = len.saturating_add(frame.data_ref().map_or(0, Bytes::len));
            frames.push_back(frame);
            if len > limit || trailers {
                // Forward once; trailers are rare on requests and not worth a replay format.
                let rest = PrefixedBody {
                    prefix: frames,
                    rest: body,
                };
                return Ok(Self::Once(Some(Body::new(rest))));
            }
        }
        Ok(Self::Replayable(concat(frames, len)))
    }

    /// A gRPC call's body: sent with the first attempt, kept for another only if it proves
    /// replayable (at most `limit` bytes, one message; see [`tee`]).
    pub(super) fn teed(body: Body, limit: usize) -> Self {
        Self::Teed(Teed {
            first: Some(body),
            limit,
            seen: None,
            rest: None,
        })
    }

    /// The whole body, when it is kept for replay.
    pub(super) fn bytes(&self) -> Option<&Bytes> {
        match self {
            Self::Replayable(bytes) => Some(bytes),
            Self::Once(_) | Self::Teed(_) => None,
        }
    }

    /// Whether another attempt could still get the body. A teed body must be settled first
    /// ([`Prepared::settle`]) for this to say yes.
    pub(super) fn is_replayable(&self) -> bool {
        match self {
            Self::Replayable(_) => true,
            Self::Once(_) => false,
            Self::Teed(teed) => teed
                .seen
                .as_ref()
                .is_some_and(|seen| seen.borrow().replay().is_some()),
        }
    }

    /// Whether [`Prepared::settle`] has anything to wait for.
    pub(super) fn is_unsettled(&self) -> bool {
        match self {
            Self::Teed(Teed {
                seen: Some(seen), ..
            }) => !seen.borrow().settled(),
            _ => false,
        }
    }

    /// After the first attempt of a teed body failed: waits until the client's stream has
    /// ended or can no longer be replayed, or `until`. If the attempt dropped its copy before
    /// that (the upstream answered first), the rest of the client's stream is read here.
    pub(super) async fn settle(&mut self, until: tokio::time::Instant) {
        if let Self::Teed(Teed {
            seen: Some(seen),
            rest,
            ..
        }) = self
        {
            let settled = async {
                match rest.as_mut() {
                    Some(rest) => tokio::select! {
                        _ = async { seen.wait_for(Recording::settled).await.is_ok() } => {}
                        handed = rest => if let Ok(tee) = handed { tee.finish().await },
                    },
                    None => {
                        let _ = seen.wait_for(Recording::settled).await;
                    }
                }
            };
            // The recording's last state stays readable whatever ended the wait.
            let _ = tokio::time::timeout_at(until, settled).await;
        }
    }

    /// The body for the next attempt (`Body::empty()` only if a once-body was already
    /// taken, which the caller prevents by checking [`Prepared::is_replayable`]).
    pub(super) fn take(&mut self) -> Body {
        match self {
            // An empty body stays the allocation-free `Body::empty()` (most GETs).
            Self::Replayable(bytes) if bytes.is_empty() => Body::empty(),
            Self::Replayable(bytes) => Body::from(bytes.clone()),
            Self::Once(body) => body.take().unwrap_or_else(Body::empty),
            Self::Teed(teed) => match teed.first.take() {
                Some(body) => {
                    let (tee, seen, rest) = TeeBody::new(body, teed.limit);
                    teed.seen = Some(seen);
                    teed.rest = Some(rest);
                    Body::new(tee)
                }
                None => teed
                    .seen
                    .as_ref()
                    .and_then(|seen| seen.borrow().replay())
                    .map_or_else(Body::empty, Body::from),
            },
        }
    }
}

/// `frame`, already read from a response body, followed by the `rest` of that body.
pub(super) fn prefixed(frame: Frame<Bytes>, rest: Body) -> Body {
    Body::new(PrefixedBody {
        prefix: VecDeque::from([frame]),
        rest,
    })
}

/// A body that fails with `error` at once: the error met while reading what was `rest`.
pub(super) fn failed(error: axum::Error) -> Body {
    let frame: Result<Frame<Bytes>, axum::Error> = Err(error);
    Body::new(http_body_util::StreamBody::new(futures_util::stream::iter(
        [frame],
    )))
}

fn concat(frames: VecDeque<Frame<Bytes>>, len: usize) -> Bytes {
    let mut data = frames.into_iter().filter_map(|f| f.into_data().ok());
    match (data.next(), len) {
        (None, _) => Bytes::new(),
        (Some(first), n) if first.len() == n => first,
        (Some(first), n) => {
            let mut buf = BytesMut::with_capacity(n);
            buf.extend_from_slice(&first);
            data.for_each(|chunk| buf.extend_from_slice(&chunk));
            buf.freeze()
        }
    }
}

// === impl PrefixedBody ===

impl http_body::Body for PrefixedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        if let Some(frame) = self.prefix.pop_front() {
            return Poll::Ready(Some(Ok(frame)));
        }
        Pin::new(&mut self.rest).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.prefix.is_empty() && self.rest.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let buffered: u64 = self
            .prefix
            .iter()
            .filter_map(|f| f.data_ref().map(|d| d.len() as u64))
            .sum();
        let rest = self.rest.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(rest.lower().saturating_add(buffered));
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper.saturating_add(buffered));
        }
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::stream;

    fn chunked(chunks: &[&'static [u8]]) -> Body {
        let items: Vec<Result<Bytes, std::io::Error>> =
            chunks.iter().map(|c| Ok(Bytes::from_static(c))).collect();
        Body::from_stream(stream::iter(items))
    }

    async fn bytes_of(body: Body) -> Bytes {
        body.collect().await.expect("body").to_bytes()
    }

    #[tokio::test]
    async fn small_chunked_body_is_buffered() {
        let mut p = Prepared::read(chunked(&[b"ab", b"cd"]), 4)
            .await
            .expect("read");
        assert!(p.is_replayable());
        assert_eq!(bytes_of(p.take()).await, "abcd");
        assert_eq!(bytes_of(p.take()).await, "abcd");
    }

    #[tokio::test]
    async fn large_chunked_body_is_sent_once_intact() {
        let mut p = Prepared::read(chunked(&[b"ab", b"cd", b"ef", b"gh"]), 5)
            .await
            .expect("read");
        assert!(!p.is_replayable());
        assert_eq!(bytes_of(p.take()).await, "abcdefgh");
    }

    #[tokio::test]
    async fn declared_length_over_the_limit_is_not_read() {
        let mut p = Prepared::read(Body::from("0123456789"), 9)
            .await
            .expect("read");
        assert!(matches!(p, Prepared::Once(Some(_))));
        assert_eq!(bytes_of(p.take()).await, "0123456789");
    }

    #[tokio::test]
    async fn empty_body_is_replayable() {
        let mut p = Prepared::read(Body::empty(), 0).await.expect("read");
        assert!(p.is_replayable());
        assert_eq!(bytes_of(p.take()).await, "");
    }

    #[tokio::test]
    async fn body_errors_are_reported() {
        let items: Vec<Result<Bytes, std::io::Error>> = vec![
            Ok(Bytes::from_static(b"ab")),
            Err(std::io::Error::other("client went away")),
        ];
        let err = Prepared::read(Body::from_stream(stream::iter(items)), 100)
            .await
            .expect_err("error");
        assert!(err.to_string().contains("client went away"), "{err}");
    }
}
