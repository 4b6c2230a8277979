//! Executing a locked request and settling its record per the outcome table.
//!
//! Runs to completion even if the client disconnects and hyper drops the response future
//! (the service wraps it in `detach::Detached`), so once the request may have reached the
//! upstream, the record is always settled.
//!
//! The response body is buffered (up to `max_stored_response_bytes`) and the record is
//! completed **before** the response is returned: a client that received a response and
//! retries must find it replayable, never "in flight". The cost is time-to-first-byte for
//! large or slow bodies; a response over the limit is recorded as too large as soon as the
//! limit is crossed, and the buffered prefix plus the rest of the stream flow through.

use std::sync::Arc;

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use futures_util::{stream, StreamExt};
use http::{HeaderMap, Request, Response};
use http_body_util::{BodyExt, Limited, StreamBody};
use tower::Service;

use crate::late::{Late, Pending};
use crate::outcome::{classify, Outcome};
use crate::record::{Completion, StoredResponse};
use crate::rejection::Rejection;
use crate::settings::IdempotencySettings;
use crate::store::{RecordKey, Store, StoreError};

/// A lock held for one request.
pub(crate) struct Held {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) record: RecordKey,
    pub(crate) fencing: u64,
    pub(crate) settings: IdempotencySettings,
}

/// What to record when a timed-out exchange left running brings no answer (`late`).
enum Fallback {
    /// The answer the client got.
    Store(StoredResponse),
    /// The inner service failed without a response: the ambiguous row.
    Ambiguous,
}

/// Calls `inner` with the locked request and completes or releases the record. `late` is
/// the request's [`LateAnswer`](crate::LateAnswer), when it carries one.
pub(crate) async fn execute<S>(
    mut inner: S,
    req: Request<Body>,
    held: Held,
    late: Option<Pending>,
) -> Result<Response<Body>, S::Error>
where
    S: Service<Request<Body>, Response = Response<Body>>,
{
    let resp = match inner.call(req).await {
        Ok(resp) => resp,
        Err(e) => {
            // The inner service failed without a response. Whether the upstream acted is
            // unknown (the gateway maps provable non-delivery to a `NotForwarded` response),
            // so this is the ambiguous row of the table.
            match late.and_then(Pending::after_return) {
                Some(late) => finish_late(held, late, Fallback::Ambiguous),
                None => held.ambiguous().await,
            }
            return Err(e);
        }
    };
    let dedupes = held.settings.upstream_dedupes_keys;
    let store =
        classify(resp.status(), resp.headers(), resp.extensions(), dedupes) == Outcome::Store;
    match late.and_then(Pending::after_return) {
        // The attempt timed out and its exchange runs on: the client gets this answer now,
        // the record waits for the real one.
        Some(late) if store => Ok(answer_now(held, late, resp).await),
        _ => Ok(settle(&held, resp).await),
    }
}

/// Settles the record per the outcome table with `resp` and returns it for the client.
async fn settle(held: &Held, resp: Response<Body>) -> Response<Body> {
    let (parts, mut body) = resp.into_parts();
    let dedupes = held.settings.upstream_dedupes_keys;
    if classify(parts.status, &parts.headers, &parts.extensions, dedupes) == Outcome::Release {
        held.release().await;
        return Response::from_parts(parts, body);
    }

    let limit = held.settings.max_stored_response_bytes;
    let mut chunks: Vec<Bytes> = Vec::new();
    let mut total = 0usize;
    let mut trailers: Option<HeaderMap> = None;
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(frame) => frame,
            Err(e) => {
                // The upstream answered, then the body broke: it acted, but there is no
                // complete response to replay. Ambiguous; the client sees the break.
                held.ambiguous().await;
                let prefix = stream::iter(chunks.into_iter().map(Ok));
                let failed = prefix.chain(stream::once(async move { Err(e) }));
                return Response::from_parts(parts, Body::from_stream(failed));
            }
        };
        match frame.into_data() {
            Ok(data) => {
                total += data.len();
                chunks.push(data);
                if total > limit {
                    held.complete(Completion::TooLarge(parts.status)).await;
                    let prefix = stream::iter(chunks.into_iter().map(Ok));
                    let rest = prefix.chain(body.into_data_stream());
                    return Response::from_parts(parts, Body::from_stream(rest));
                }
            }
            // Trailers are passed to this client but not stored: replays carry none.
            Err(frame) => trailers = frame.into_trailers().ok(),
        }
    }

    let bytes = concat(chunks, total);
    let stored = held.stored(parts.status, &parts.headers, bytes.clone());
    held.complete(Completion::Response(stored)).await;
    let body = match trailers {
        None => Body::from(bytes),
        Some(t) => {
            let frames = [http_body::Frame::data(bytes), http_body::Frame::trailers(t)];
            let frames = stream::iter(frames.into_iter().map(Ok::<_, axum::Error>));
            Body::new(StreamBody::new(frames))
        }
    };
    Response::from_parts(parts, body)
}

/// The client's answer to a request whose timed-out exchange runs on (the layer below's
/// 504): returned at once, while a task of its own settles the record with the real answer
/// when it lands, or with this one if none lands before the lease ends.
async fn answer_now(held: Held, late: Late, resp: Response<Body>) -> Response<Body> {
    let (parts, body) = resp.into_parts();
    // The gateway's own answer: a small problem document, read whole to be kept.
    let limit = held.settings.max_stored_response_bytes;
    let bytes = match Limited::new(body, limit).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => Bytes::new(),
    };
    let stored = held.stored(parts.status, &parts.headers, bytes.clone());
    finish_late(held, late, Fallback::Store(stored));
    Response::from_parts(parts, Body::from(bytes))
}

/// Settles the record with the late answer in a task of its own, bounded by the lease.
fn finish_late(held: Held, late: Late, fallback: Fallback) {
    tokio::spawn(async move {
        let until = late.until();
        let settled = match late.answer().await {
            // The body too must arrive while the lease still holds the key.
            Some(response) => tokio::time::timeout_at(until, settle(&held, response))
                .await
                .is_ok(),
            None => false,
        };
        let result = if settled { "landed" } else { "none" };
        metrics::counter!("idempotency_late_answers_total", "result" => result).increment(1);
        tracing::debug!(tenant = %held.record.tenant, route = %held.record.route, result,
            "a timed-out keyed request's exchange finished in the background");
        if !settled {
            match fallback {
                Fallback::Store(stored) => held.complete(Completion::Response(stored)).await,
                Fallback::Ambiguous => held.ambiguous().await,
            }
        }
    });
}

/// Copies the chunks into one exactly-sized buffer. Even a single chunk is copied: it is a
/// slice of the connection's read buffer, and keeping it would pin that whole buffer (KiBs)
/// for the record's 24 h, far beyond what the store's byte accounting sees.
fn concat(chunks: Vec<Bytes>, total: usize) -> Bytes {
    let mut buf = BytesMut::with_capacity(total);
    for c in chunks {
        buf.extend_from_slice(&c);
    }
    buf.freeze()
}

/// Answers a request that took the key over from a holder whose lease expired, on an
/// upstream that does not dedupe: the holder stopped after taking the lock, which is taken
/// right before forwarding, so its request may have been executed. Forwarding again could
/// execute it twice; the stored answer is the ambiguous one, like a 502 after sending.
pub(crate) async fn interrupted(held: Held) -> Response<Body> {
    let (status, headers, body) = Rejection::Interrupted.to_parts();
    let stored = StoredResponse::new(status, &headers, body.clone());
    held.complete(Completion::Response(stored)).await;
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
}

// === impl Held ===

impl Held {
    /// The outcome is unknown: keep a 502 "outcome unknown" as the key's result, unless the
    /// upstream dedupes on the key, in which case a retry is safe and the key is released.
    async fn ambiguous(&self) {
        if self.settings.upstream_dedupes_keys {
            self.release().await;
        } else {
            let (status, headers, body) = Rejection::OutcomeUnknown.to_parts();
            let stored = StoredResponse::new(status, &headers, body);
            self.complete(Completion::Response(stored)).await;
        }
    }

    /// `StoredResponse::new`, without `Set-Cookie` where the scope is shared
    /// (`IdempotencySettings::replay_set_cookie`).
    fn stored(&self, status: http::StatusCode, headers: &HeaderMap, body: Bytes) -> StoredResponse {
        let mut stored = StoredResponse::new(status, headers, body);
        if !self.settings.replay_set_cookie {
            stored.headers.remove(http::header::SET_COOKIE);
        }
        stored
    }

    async fn release(&self) {
        if let Err(e) = self.store.release(&self.record, self.fencing).await {
            self.report("release", &e);
        }
    }

    async fn complete(&self, completion: Completion) {
        let ttl = self.settings.ttl;
        if let Err(e) = self
            .store
            .complete(&self.record, self.fencing, completion, ttl)
            .await
        {
            self.report("complete", &e);
        }
    }

    /// A failed complete/release never changes what the client gets: the upstream already
    /// answered. Log and count it; the record's lease expires on its own.
    fn report(&self, op: &'static str, e: &StoreError) {
        metrics::counter!("idempotency_store_errors_total", "op" => op, "kind" => e.kind())
            .increment(1);
        if e.is_fenced() {
            tracing::warn!(op, error = %e, tenant = %self.record.tenant, route = %self.record.route,
                fencing = self.fencing, "idempotency lease lost before the request finished; outcome not recorded");
        } else {
            tracing::warn!(op, error = %e, tenant = %self.record.tenant, route = %self.record.route,
                fencing = self.fencing, "could not record idempotency outcome");
        }
    }
}
