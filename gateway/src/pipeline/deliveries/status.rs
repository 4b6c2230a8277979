//! `GET /_portcullis/deliveries/{id}` on the proxy listener: the status of an accepted
//! request, for the caller who sent it. The caller is resolved as for any request (API key,
//! bearer JWT; a bad credential is the usual 401, counted against the address's
//! `auth.failure_limit`, past which credentials are refused unchecked); a tenant reads its own tenant's messages,
//! an anonymous caller those it sent from the same client address. Anything else, like an
//! unknown id, is a 404, so ids cannot be probed. No payload and no header is shown.
//!
//! The prefix is reserved: it runs before the router, so no route can shadow it.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use futures_util::future::{BoxFuture, Either};
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use portcullis_control::Directory;
use portcullis_problem::Problem;
use portcullis_queue::{AttemptOutcome, DeliveryId, Message};
use tower::{Layer, Service};

use super::{Deliveries, STATUS_PREFIX, STORED_CLIENT};
use crate::pipeline::auth_failures::{self, AuthFailures};
use crate::pipeline::jwt::JwtAuth;
use crate::pipeline::tenant;
use crate::plumbing::client::{PeerAddr, TrustedProxies};
use crate::plumbing::context::Caller;

/// Answers the status URLs of accepted requests.
#[derive(Clone)]
pub(crate) struct StatusLayer {
    shared: Option<Arc<Shared>>,
}

struct Shared {
    deliveries: Arc<Deliveries>,
    directory: Arc<Directory>,
    jwt: Option<Arc<JwtAuth>>,
    trusted: Arc<TrustedProxies>,
    failures: Option<Arc<AuthFailures>>,
}

impl StatusLayer {
    /// `deliveries` `None`: no asynchronous route, the prefix is not reserved.
    pub(crate) fn new(
        deliveries: Option<Arc<Deliveries>>,
        directory: Arc<Directory>,
        jwt: Option<Arc<JwtAuth>>,
        trusted: Arc<TrustedProxies>,
        failures: Option<Arc<AuthFailures>>,
    ) -> Self {
        Self {
            shared: deliveries.map(|deliveries| {
                Arc::new(Shared {
                    deliveries,
                    directory,
                    jwt,
                    trusted,
                    failures,
                })
            }),
        }
    }
}

/// The service of [`StatusLayer`].
#[derive(Clone)]
pub(crate) struct Status<S> {
    inner: S,
    shared: Option<Arc<Shared>>,
}

impl<S> Layer<S> for StatusLayer {
    type Service = Status<S>;
    fn layer(&self, inner: S) -> Status<S> {
        Status {
            inner,
            shared: self.shared.clone(),
        }
    }
}

impl<S> Service<Request<Body>> for Status<S>
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

    fn call(&mut self, mut request: Request<Body>) -> Self::Future {
        let Some(shared) = &self.shared else {
            return Either::Left(self.inner.call(request));
        };
        let Some(id) = request.uri().path().strip_prefix(STATUS_PREFIX) else {
            return Either::Left(self.inner.call(request));
        };
        if request.method() != Method::GET && request.method() != Method::HEAD {
            let mut response = Problem::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method-not-allowed",
                "Method not allowed",
                "a delivery status is read with GET",
            )
            .into_response();
            response
                .headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
            return Either::Right(Box::pin(std::future::ready(Ok(response))));
        }
        let id = DeliveryId::parse(id);
        let peer = request
            .extensions()
            .get::<PeerAddr>()
            .map_or(IpAddr::V4(Ipv4Addr::LOCALHOST), |p| p.0.ip());
        let client = shared.trusted.resolve(peer, request.headers());
        // As `Resolve` does: an address past its failure budget has its credentials refused
        // unchecked, and a bad credential counts against it.
        let blocked = shared.failures.as_ref().and_then(|failures| {
            failures
                .blocked(client.ip)
                .filter(|_| tenant::presents_credential(request.headers()))
        });
        let caller = match blocked {
            Some(wait) => Err(auth_failures::refusal(wait)),
            None => {
                let caller = tenant::resolve_caller(
                    &shared.directory,
                    shared.jwt.as_deref(),
                    request.headers_mut(),
                );
                if let (Err(_), Some(failures)) = (&caller, &shared.failures) {
                    failures.failed(client.ip);
                }
                caller
            }
        };
        let shared = shared.clone();
        Either::Right(Box::pin(async move {
            let caller = match caller {
                Ok(caller) => caller,
                Err(refusal) => return Ok(refusal),
            };
            let Some(id) = id else {
                return Ok(not_found());
            };
            let message = match shared.deliveries.queue.get(&id).await {
                Ok(message) => message,
                Err(err) => {
                    tracing::warn!(error = %err, "delivery status not read: the queue is unavailable");
                    return Ok(Problem::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "queue-unavailable",
                        "Queue unavailable",
                        "the delivery status cannot be read now",
                    )
                    .retry_after(std::time::Duration::from_secs(1))
                    .into_response());
                }
            };
            match message.filter(|m| owned_by(m, &caller, client.ip)) {
                Some(message) => Ok(status(&message)),
                None => Ok(not_found()),
            }
        }))
    }
}

/// The caller sent `message`: its tenant, or anonymous from the same address.
fn owned_by(message: &Message, caller: &Caller, ip: IpAddr) -> bool {
    match (caller, &message.tenant) {
        (Caller::Tenant(tenant), Some(owner)) => *tenant.id == **owner,
        (Caller::Anonymous, None) => message.headers.iter().any(|(name, value)| {
            name.as_slice() == STORED_CLIENT.as_str().as_bytes()
                && value.as_slice() == ip.to_canonical().to_string().as_bytes()
        }),
        _ => false,
    }
}

fn not_found() -> Response<Body> {
    Problem::new(
        StatusCode::NOT_FOUND,
        "delivery-not-found",
        "Delivery not found",
        "no delivery with this id was accepted from this caller",
    )
    .into_response()
}

/// The status document: state, attempts and the last outcome; no payload, no headers.
fn status(message: &Message) -> Response<Body> {
    let last = message.attempts.last().map(|a| match &a.outcome {
        AttemptOutcome::Status(status) => serde_json::json!({ "at_ms": a.at_ms, "status": status }),
        AttemptOutcome::Error(error) => serde_json::json!({ "at_ms": a.at_ms, "error": error }),
    });
    let body = serde_json::json!({
        "delivery_id": message.id.as_str(),
        "state": message.state.as_str(),
        "attempts": message.attempts.len(),
        "last_attempt": last,
        "reason": message.reason,
        "enqueued_at_ms": message.enqueued_at_ms,
        "due_at_ms": message.due_at_ms,
    });
    let mut response = Response::new(Body::from(body.to_string()));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}
