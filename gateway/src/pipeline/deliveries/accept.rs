//! The accept step of asynchronous routes: the request, through the pipeline so far (auth,
//! rate limit, route policy, size limits, signature), is stored with `enqueue` instead of
//! being proxied, and answered `202 Accepted` only once `enqueue` has returned: the 202
//! promises durability (`portcullis_queue`, "Durability"). A queue that fails or does not
//! answer in time is a 503 with `Retry-After`: nothing is claimed as accepted.
//!
//! Deduplication comes first, in the same atomic step as the insert: a request whose dedupe
//! key (`delivery.dedupe`) was seen on this route and tenant within `dedupe_window` is
//! answered with the first request's 202 and not stored again. A request without a key is
//! stored without deduplication.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use futures_util::future::{BoxFuture, Either};
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::BodyExt;
use portcullis_problem::Problem;
use portcullis_queue::{Dedupe, DeliveryId, Enqueued, NewMessage};
use tower::{Layer, Service};

use super::{stored, Deliveries, PORTCULLIS_DELIVERY_ID, STATUS_PREFIX, STORED_CLIENT};
use crate::config::{DedupeSource, DeliverySettings};
use crate::pipeline::rescue::request_body_problem;
use crate::plumbing::context::{Caller, RequestContext};

/// Longest dedupe key accepted (the queue keeps it for the dedupe window).
const MAX_DEDUPE_KEY: usize = 512;

/// How long a client is asked to wait when the queue is unavailable.
const UNAVAILABLE_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Answers requests on asynchronous routes by storing them.
#[derive(Clone)]
pub(crate) struct AcceptLayer {
    deliveries: Option<Arc<Deliveries>>,
}

impl AcceptLayer {
    /// `None`: no route is asynchronous, every request passes.
    pub(crate) fn new(deliveries: Option<Arc<Deliveries>>) -> Self {
        Self { deliveries }
    }
}

/// The service of [`AcceptLayer`].
#[derive(Clone)]
pub(crate) struct Accept<S> {
    inner: S,
    deliveries: Option<Arc<Deliveries>>,
}

impl<S> Layer<S> for AcceptLayer {
    type Service = Accept<S>;
    fn layer(&self, inner: S) -> Accept<S> {
        Accept {
            inner,
            deliveries: self.deliveries.clone(),
        }
    }
}

impl<S> Service<Request<Body>> for Accept<S>
where
    S: Service<Request<Body>, Response = Response<Body>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = Either<S::Future, BoxFuture<'static, Result<Response<Body>, S::Error>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let context = RequestContext::of(request.extensions());
        let (Some(deliveries), Some(context)) = (&self.deliveries, context) else {
            return Either::Left(self.inner.call(request));
        };
        let Some(delivery) = context.route.settings.delivery.clone() else {
            return Either::Left(self.inner.call(request));
        };
        let deliveries = deliveries.clone();
        Either::Right(Box::pin(async move {
            let (parts, body) = request.into_parts();
            let body = match body.collect().await {
                Ok(collected) => collected.to_bytes(),
                Err(err) => return Ok(request_body_problem(&err).closing().into_response()),
            };
            Ok(accept(&deliveries, &delivery, parts, body).await)
        }))
    }
}

/// Stores the request and answers 202, or says why not.
async fn accept(
    deliveries: &Deliveries,
    delivery: &DeliverySettings,
    parts: http::request::Parts,
    body: Bytes,
) -> Response<Body> {
    let Some(context) = RequestContext::of(&parts.extensions) else {
        return Problem::internal().into_response();
    };
    let route = &context.route.settings;
    let key = match dedupe_key(&delivery.dedupe, &parts.headers, &body) {
        Ok(key) => key,
        Err(problem) => return problem.into_response(),
    };
    let mut headers: Vec<(Vec<u8>, Vec<u8>)> = parts
        .headers
        .iter()
        .filter(|(name, _)| stored(name, route))
        .map(|(name, value)| (name.as_str().as_bytes().to_vec(), value.as_bytes().to_vec()))
        .collect();
    headers.push((
        STORED_CLIENT.as_str().as_bytes().to_vec(),
        context.client.ip.to_canonical().to_string().into_bytes(),
    ));
    let tenant = match &context.caller {
        Caller::Tenant(tenant) => Some(tenant.id.to_string()),
        Caller::Anonymous => None,
    };
    let message = NewMessage {
        queue: route.name.clone(),
        tenant,
        dedupe: key.map(|key| Dedupe {
            key,
            window: delivery.dedupe_window,
        }),
        method: parts.method.as_str().to_owned(),
        path_and_query: parts
            .uri
            .path_and_query()
            .map_or_else(|| parts.uri.path().to_owned(), |pq| pq.as_str().to_owned()),
        headers,
        body,
        delay: Duration::ZERO,
    };
    match deliveries.queue.enqueue(message).await {
        Ok(enqueued) => {
            let duplicate = matches!(enqueued, Enqueued::Duplicate(_));
            if !duplicate {
                if let Some(wakeup) = deliveries.wakeup(&route.name) {
                    wakeup.notify_one();
                }
                metrics::counter!("deliveries_accepted_total", "queue" => route.name.clone())
                    .increment(1);
            }
            accepted(enqueued.id(), duplicate)
        }
        Err(err) => {
            tracing::warn!(
                route = %route.name,
                engine = deliveries.queue.engine(),
                error = %err,
                "asynchronous request not accepted: the queue is unavailable"
            );
            Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "queue-unavailable",
                "Queue unavailable",
                "the request could not be stored for delivery; nothing was accepted",
            )
            .retry_after(UNAVAILABLE_RETRY_AFTER)
            .into_response()
        }
    }
}

/// The 202: `Portcullis-Delivery-Id`, `Location` (the status URL) and a problem-style body.
/// A duplicate gets the same answer as its original, with `Portcullis-Duplicate: true`.
pub(crate) fn accepted(id: &DeliveryId, duplicate: bool) -> Response<Body> {
    let status_url = format!("{STATUS_PREFIX}{id}");
    let mut response = Problem::new(
        StatusCode::ACCEPTED,
        "delivery-accepted",
        "Accepted for delivery",
        "the request is stored and will be delivered; read its status at status_url",
    )
    .with("delivery_id", id.as_str())
    .with("status_url", status_url.clone())
    .into_response();
    let headers = response.headers_mut();
    if let Ok(value) = HeaderValue::from_str(id.as_str()) {
        headers.insert(&PORTCULLIS_DELIVERY_ID, value);
    }
    if let Ok(value) = HeaderValue::from_str(&status_url) {
        headers.insert(http::header::LOCATION, value);
    }
    if duplicate {
        headers.insert("portcullis-duplicate", HeaderValue::from_static("true"));
    }
    response
}

/// The request's dedupe key from the route's source; `None` when the request has none.
fn dedupe_key(
    source: &DedupeSource,
    headers: &http::HeaderMap,
    body: &[u8],
) -> Result<Option<String>, Problem> {
    let header_text = |name: &http::HeaderName| -> Result<Option<String>, Problem> {
        match headers.get(name) {
            None => Ok(None),
            Some(value) => value
                .to_str()
                .map(|v| Some(v.trim().to_owned()))
                .map_err(|_| bad_key(&format!("the {name} header is not visible ASCII"))),
        }
    };
    let key = match source {
        DedupeSource::IdempotencyKey => header_text(&portcullis_retry::IDEMPOTENCY_KEY)?,
        DedupeSource::Header(name) => header_text(name)?,
        DedupeSource::Json(pointer) => {
            let value: serde_json::Value = serde_json::from_slice(body)
                .map_err(|_| bad_key("the body is not JSON, so its event id cannot be read"))?;
            match value.pointer(pointer) {
                None | Some(serde_json::Value::Null) => None,
                Some(serde_json::Value::String(s)) => Some(s.clone()),
                Some(other) => Some(other.to_string()),
            }
        }
    };
    match key {
        Some(key) if key.is_empty() => Err(bad_key("the dedupe key is empty")),
        Some(key) if key.len() > MAX_DEDUPE_KEY => Err(bad_key(&format!(
            "the dedupe key is longer than {MAX_DEDUPE_KEY} bytes"
        ))),
        key => Ok(key),
    }
}

fn bad_key(detail: &str) -> Problem {
    Problem::new(
        StatusCode::BAD_REQUEST,
        "bad-dedupe-key",
        "Dedupe key not usable",
        detail.to_owned(),
    )
}
