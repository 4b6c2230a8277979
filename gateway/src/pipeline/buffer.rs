//! Request buffering (nginx's `proxy_request_buffering on`): a request body of up to
//! `server.request_buffer_bytes` is read completely, under `server.body_read_timeout`, before
//! anything below contacts the upstream. A client that trickles its body and stops half-way
//! gets a 408 and the upstream sees nothing, instead of a partial request it might act on.
//!
//! A body larger than the buffer (declared by `Content-Length`, or discovered while reading
//! a chunked one) is streamed as it arrives, still under `server.body_read_timeout`: nginx
//! spools such bodies to a temporary file, which this gateway does not do. gRPC calls are
//! never buffered (as nginx's `grpc_pass`): a streaming call's request stays open while
//! responses flow. Memory: at most `request_buffer_bytes × server.load_shed_limit` bytes of
//! request bodies are held at once (1 MiB × 10 000 by default in the worst case).

use std::collections::VecDeque;

use std::task::{Context, Poll};

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use futures_util::future::{BoxFuture, Either};
use http::{Request, Response};
use http_body::{Body as _, Frame};
use http_body_util::BodyExt;
use portcullis_idempotency::NotForwarded;
use portcullis_retry::PrefixedBody;
use tower::{Layer, Service};

use crate::pipeline::rescue::request_body_problem;

/// Reads request bodies of up to `limit` bytes before the request goes on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BufferLayer {
    limit: usize,
}

/// The service of [`BufferLayer`].
#[derive(Debug, Clone)]
pub(crate) struct Buffer<S> {
    inner: S,
    limit: usize,
}

/// A body as read by [`read`].
enum Read {
    /// Complete: every frame is in memory.
    Whole(Body),
    /// Over the limit: the frames read so far, followed by the unread rest.
    Streamed(Body),
}

// === impl BufferLayer ===

impl BufferLayer {
    /// `limit` is `server.request_buffer_bytes`; 0 turns buffering off.
    pub(crate) fn new(limit: u64) -> Self {
        Self {
            limit: usize::try_from(limit).unwrap_or(usize::MAX),
        }
    }
}

impl<S> Layer<S> for BufferLayer {
    type Service = Buffer<S>;
    fn layer(&self, inner: S) -> Buffer<S> {
        Buffer {
            inner,
            limit: self.limit,
        }
    }
}

// === impl Buffer ===

impl<S> Service<Request<Body>> for Buffer<S>
where
    S: Service<Request<Body>, Response = Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = Either<S::Future, BoxFuture<'static, Result<Response<Body>, S::Error>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let body = request.body();
        // Most GETs have no body; a declared length over the buffer is streamed unread.
        let skip = self.limit == 0
            || body.is_end_stream()
            || body
                .size_hint()
                .exact()
                .is_some_and(|n| n > self.limit as u64)
            || portcullis_problem::grpc::is_grpc(request.headers());
        if skip {
            return Either::Left(self.inner.call(request));
        }
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let limit = self.limit;
        Either::Right(Box::pin(async move {
            let (parts, body) = request.into_parts();
            let body = match read(body, limit).await {
                Ok(Read::Whole(body) | Read::Streamed(body)) => body,
                Err(err) => {
                    // Nothing was sent: the idempotency layer must not keep this as the
                    // key's outcome (it releases the key instead).
                    let mut response = request_body_problem(&err).closing().into_response();
                    response.extensions_mut().insert(NotForwarded);
                    return Ok(response);
                }
            };
            inner.call(Request::from_parts(parts, body)).await
        }))
    }
}

/// Reads `body` whole if it holds at most `limit` bytes. The body's own errors (the
/// client's: timeout, size limit, reset) are returned.
async fn read(mut body: Body, limit: usize) -> Result<Read, axum::Error> {
    let mut frames: VecDeque<Frame<Bytes>> = VecDeque::new();
    let mut len = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame?;
        len = len.saturating_add(frame.data_ref().map_or(0, Bytes::len));
        frames.push_back(frame);
        if len > limit {
            return Ok(Read::Streamed(Body::new(PrefixedBody::new(frames, body))));
        }
    }
    Ok(Read::Whole(whole(frames, len)))
}

/// One body of the frames read: a single buffer when there are no trailers (the common
/// case, which also gives the body its exact size for `Content-Length`).
fn whole(frames: VecDeque<Frame<Bytes>>, len: usize) -> Body {
    if frames.iter().any(Frame::is_trailers) {
        return Body::new(PrefixedBody::new(frames, Body::empty()));
    }
    let mut data = frames.into_iter().filter_map(|f| f.into_data().ok());
    match data.next() {
        None => Body::empty(),
        Some(first) if first.len() == len => Body::from(first),
        Some(first) => {
            let mut buf = BytesMut::with_capacity(len);
            buf.extend_from_slice(&first);
            data.for_each(|chunk| buf.extend_from_slice(&chunk));
            Body::from(buf.freeze())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::{stream, StreamExt};

    fn chunked(chunks: &[&'static [u8]]) -> Body {
        let items: Vec<Result<Bytes, std::io::Error>> =
            chunks.iter().map(|c| Ok(Bytes::from_static(c))).collect();
        Body::from_stream(stream::iter(items))
    }

    #[tokio::test]
    async fn a_body_within_the_buffer_is_read_whole() {
        let Ok(Read::Whole(body)) = read(chunked(&[b"ab", b"cd"]), 4).await else {
            panic!("not read whole");
        };
        assert_eq!(body.size_hint().exact(), Some(4));
        assert_eq!(body.collect().await.unwrap().to_bytes(), "abcd");
    }

    #[tokio::test]
    async fn a_body_over_the_buffer_streams_intact() {
        let Ok(Read::Streamed(body)) = read(chunked(&[b"ab", b"cd", b"ef"]), 3).await else {
            panic!("not streamed");
        };
        assert_eq!(body.collect().await.unwrap().to_bytes(), "abcdef");
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_body_is_a_408_and_nothing_goes_on() {
        use crate::edge::body_timeout::TimeoutBody;
        use std::time::Duration;
        let stalled = stream::iter([Ok::<_, std::io::Error>(Bytes::from_static(b"a"))])
            .chain(stream::pending());
        let body = Body::new(TimeoutBody::new(
            Body::from_stream(stalled),
            Duration::from_secs(5),
        ));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
        let inner = tower::service_fn(move |_req: Request<Body>| {
            let tx = tx.clone();
            async move {
                let _ = tx.send(());
                Ok::<_, std::convert::Infallible>(Response::new(Body::empty()))
            }
        });
        let mut svc = BufferLayer::new(1024).layer(inner);
        let response = svc.call(Request::new(body)).await.unwrap();
        assert_eq!(response.status(), http::StatusCode::REQUEST_TIMEOUT);
        assert!(response.extensions().get::<NotForwarded>().is_some());
        assert!(rx.try_recv().is_err(), "the inner service was called");
    }
}
