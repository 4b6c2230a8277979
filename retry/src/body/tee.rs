//! A gRPC call's request body, kept for replay without holding the call back.
//!
//! Reading a body whole before the first attempt (as [`Prepared::read`](super::Prepared::read)
//! does) would stall every streaming call whose client waits for an answer before it sends
//! more, so a gRPC body goes upstream at once, as the client sends it, and is recorded on
//! the way (Envoy's retry buffer). Another attempt may have it only if the client's stream
//! ended within the limit, carried at most one message (a unary or server-streaming call:
//! a client- or bidi-streaming call with more is never replayed) and no trailers. Whether a
//! message came back is the attempt loop's business: a response that began with one is the
//! client's answer, never retried.
//!
//! An upstream may answer before the client's stream has ended (a unary call's `END_STREAM`
//! can arrive just after its message), and the attempt then drops its copy unread. The rest
//! of the client's stream is then handed back ([`TeeBody::new`]'s leftover) so the layer can
//! finish recording it before it decides on another attempt.

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use http_body::{Frame, SizeHint};
use tokio::sync::{oneshot, watch};

/// What the first attempt's body has passed on so far.
#[derive(Debug, Default)]
pub(super) struct Recording {
    data: BytesMut,
    /// The client's stream ended (every byte of it is in `data`).
    ended: bool,
    /// No replay: over the limit, a second message, trailers, or the client's error.
    spoiled: bool,
}

/// The first attempt's body: the client's, recording what it yields.
pub(super) struct TeeBody {
    inner: Body,
    record: watch::Sender<Recording>,
    limit: usize,
    /// Where the unread rest goes if this copy is dropped before the recording settled.
    leftover: Option<oneshot::Sender<TeeBody>>,
}

// === impl Recording ===

impl Recording {
    /// Settled: nothing the first attempt sends can change whether it replays.
    pub(super) fn settled(&self) -> bool {
        self.ended || self.spoiled
    }

    /// The whole body, if another attempt may send it.
    pub(super) fn replay(&self) -> Option<Bytes> {
        (self.ended && !self.spoiled).then(|| Bytes::copy_from_slice(&self.data))
    }

    fn push(&mut self, chunk: &[u8], limit: usize) {
        if self.spoiled {
            return;
        }
        if self.data.len() + chunk.len() > limit {
            self.spoil();
            return;
        }
        self.data.extend_from_slice(chunk);
        if more_than_one_message(&self.data) {
            self.spoil();
        }
    }

    fn spoil(&mut self) {
        self.spoiled = true;
        self.data = BytesMut::new();
    }
}

/// Whether `data`, gRPC's length-prefixed messages (a flag byte, a 4-byte big-endian
/// length, the message), holds more than the first message.
fn more_than_one_message(data: &[u8]) -> bool {
    let Some(prefix) = data.get(1..5) else {
        return false;
    };
    let len = u32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) as usize;
    data.len() > len.saturating_add(5)
}

// === impl TeeBody ===

impl TeeBody {
    /// `inner`, recorded up to `limit` bytes; the watch receiver sees the recording, and the
    /// oneshot receiver gets the unread rest (recording into the same watch) should this copy
    /// be dropped before the recording settled.
    pub(super) fn new(
        inner: Body,
        limit: usize,
    ) -> (Self, watch::Receiver<Recording>, oneshot::Receiver<TeeBody>) {
        let (record, seen) = watch::channel(Recording::default());
        let (leftover, rest) = oneshot::channel();
        (
            Self {
                inner,
                record,
                limit,
                leftover: Some(leftover),
            },
            seen,
            rest,
        )
    }

    /// Reads (and records) what is left of the client's stream until the recording settles.
    pub(super) async fn finish(mut self) {
        use http_body_util::BodyExt;
        while !self.record.borrow().settled() {
            match self.frame().await {
                Some(Ok(_)) => {}
                Some(Err(_)) | None => break,
            }
        }
    }
}

impl std::fmt::Debug for TeeBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TeeBody")
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

impl Drop for TeeBody {
    fn drop(&mut self) {
        let Some(leftover) = self.leftover.take() else {
            return;
        };
        if self.record.borrow().settled() || leftover.is_closed() {
            return;
        }
        let rest = TeeBody {
            inner: std::mem::replace(&mut self.inner, Body::empty()),
            record: std::mem::replace(&mut self.record, watch::channel(Recording::default()).0),
            limit: self.limit,
            leftover: None,
        };
        let _ = leftover.send(rest);
    }
}

impl http_body::Body for TeeBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        let limit = self.limit;
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                let ended = self.inner.is_end_stream();
                self.record.send_modify(|r| {
                    match frame.data_ref() {
                        Some(chunk) => r.push(chunk, limit),
                        None => r.spoil(),
                    }
                    r.ended |= ended;
                });
            }
            Poll::Ready(Some(Err(_))) => self.record.send_modify(Recording::spoil),
            Poll::Ready(None) => self.record.send_modify(|r| r.ended = true),
            Poll::Pending => {}
        }
        polled
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

    fn message(payload: &[u8]) -> Vec<u8> {
        let mut framed = vec![0];
        framed.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        framed.extend_from_slice(payload);
        framed
    }

    fn stream(chunks: Vec<Vec<u8>>) -> Body {
        let items: Vec<Result<Bytes, std::io::Error>> =
            chunks.into_iter().map(|c| Ok(Bytes::from(c))).collect();
        Body::from_stream(futures_util::stream::iter(items))
    }

    async fn pass(chunks: Vec<Vec<u8>>, limit: usize) -> watch::Receiver<Recording> {
        let (tee, seen, _rest) = TeeBody::new(stream(chunks), limit);
        Body::new(tee).collect().await.expect("body");
        seen
    }

    #[tokio::test]
    async fn one_message_in_any_chunks_is_replayed() {
        let framed = message(b"hello");
        let (a, b) = framed.split_at(3);
        let seen = pass(vec![a.to_vec(), b.to_vec()], 64).await;
        assert_eq!(seen.borrow().replay().as_deref(), Some(&framed[..]));
        assert_eq!(
            pass(vec![], 64).await.borrow().replay().as_deref(),
            Some(&[][..])
        );
    }

    #[tokio::test]
    async fn two_messages_or_too_many_bytes_are_never_replayed() {
        let two = [message(b"a"), message(b"b")].concat();
        let seen = pass(vec![two], 64).await;
        assert!(seen.borrow().settled() && seen.borrow().replay().is_none());
        let seen = pass(vec![message(&[7; 100])], 64).await;
        assert!(seen.borrow().replay().is_none());
    }

    #[tokio::test]
    async fn an_unfinished_stream_is_not_settled() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
        let body = Body::from_stream(tokio_stream_from(rx));
        let (tee, seen, _rest) = TeeBody::new(body, 64);
        let mut body = Body::new(tee);
        tx.send(Ok(Bytes::from(message(b"x")))).await.unwrap();
        body.frame().await.unwrap().unwrap();
        assert!(!seen.borrow().settled(), "the client may still send more");
        drop(tx);
        assert!(body.frame().await.is_none());
        assert!(seen.borrow().replay().is_some());
    }

    #[tokio::test]
    async fn a_copy_dropped_before_the_client_ended_hands_back_the_rest() {
        // The upstream answered after the message but before the client's END_STREAM:
        // the attempt drops its copy, and the rest is recorded from the hand-back.
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
        let body = Body::from_stream(tokio_stream_from(rx));
        let (tee, seen, rest) = TeeBody::new(body, 64);
        let mut body = Body::new(tee);
        tx.send(Ok(Bytes::from(message(b"x")))).await.unwrap();
        body.frame().await.unwrap().unwrap();
        drop(body);
        assert!(seen.borrow().replay().is_none(), "not ended yet");
        let rest = rest.await.expect("the unread rest is handed back");
        drop(tx);
        rest.finish().await;
        assert_eq!(seen.borrow().replay().as_deref(), Some(&message(b"x")[..]));
    }

    #[tokio::test]
    async fn a_settled_copy_hands_nothing_back() {
        let (tee, _seen, rest) = TeeBody::new(stream(vec![message(b"x")]), 64);
        Body::new(tee).collect().await.expect("body");
        assert!(rest.await.is_err());
    }

    fn tokio_stream_from<T: Send + 'static>(
        mut rx: tokio::sync::mpsc::Receiver<T>,
    ) -> impl futures_util::Stream<Item = T> + Send {
        futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
    }
}
