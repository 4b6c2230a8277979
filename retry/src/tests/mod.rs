//! Service-level tests of the retry layer: a scripted upstream records every attempt's
//! time (paused tokio clock), headers, extensions and body.

mod adaptive;
mod client_retries;
mod grpc;
mod hedge;
mod load;
mod observability;
mod safety;
mod timing;

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use axum::body::Body;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};

use super::*;
use crate::clock::ManualWallClock;

/// 2026-03-06T12:00:00Z.
pub(super) const EPOCH_SECS: u64 = 1_772_798_400;

/// The scripted upstream's error.
#[derive(Debug, thiserror::Error)]
#[error("scripted failure {kind:?}")]
pub(super) struct TestFailure {
    kind: FailureKind,
    endpoint: Option<usize>,
}

impl UpstreamFailure for TestFailure {
    fn kind(&self) -> FailureKind {
        self.kind
    }
    fn endpoint(&self) -> Option<usize> {
        self.endpoint
    }
}

/// One scripted answer.
#[derive(Debug, Clone)]
pub(super) enum Step {
    Status(u16, Vec<(&'static str, String)>, usize),
    /// Answer with this status after this long.
    After(Duration, u16),
    /// A 200 whose body is only trailers (a gRPC status sent after the headers).
    Trailers(Vec<(&'static str, String)>, Vec<(&'static str, String)>),
    Fail(FailureKind, Option<usize>),
    Stall,
}

pub(super) fn st(code: u16) -> Step {
    Step::Status(code, vec![], 0)
}

pub(super) fn st_with(code: u16, name: &'static str, value: impl Into<String>) -> Step {
    Step::Status(code, vec![(name, value.into())], 0)
}

/// What the upstream saw of one attempt.
#[derive(Debug, Clone)]
pub(super) struct Seen {
    pub(super) at: Instant,
    pub(super) method: Method,
    pub(super) headers: HeaderMap,
    pub(super) info: Option<AttemptInfo>,
    pub(super) body: Bytes,
}

/// Scripted upstream: answers with the script, then with `fallback`.
#[derive(Clone)]
pub(super) struct Upstream {
    script: Arc<Mutex<VecDeque<Step>>>,
    fallback: Arc<Mutex<Step>>,
    pub(super) seen: Arc<Mutex<Vec<Seen>>>,
}

impl Upstream {
    pub(super) fn new(script: impl IntoIterator<Item = Step>) -> Self {
        Self {
            script: Arc::new(Mutex::new(script.into_iter().collect())),
            fallback: Arc::new(Mutex::new(st(200))),
            seen: Arc::default(),
        }
    }

    pub(super) fn push(&self, step: Step) {
        self.script.lock().expect("lock").push_back(step);
    }

    pub(super) fn set_fallback(&self, step: Step) {
        *self.fallback.lock().expect("lock") = step;
    }

    pub(super) fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("lock").clone()
    }

    pub(super) fn hits(&self) -> usize {
        self.seen.lock().expect("lock").len()
    }
}

impl Service<Request<Body>> for Upstream {
    type Response = Response<Body>;
    type Error = TestFailure;
    type Future = BoxFuture<'static, Result<Response<Body>, TestFailure>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), TestFailure>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let step = self
            .script
            .lock()
            .expect("lock")
            .pop_front()
            .unwrap_or_else(|| self.fallback.lock().expect("lock").clone());
        let seen = self.seen.clone();
        let at = Instant::now();
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let body = body.collect().await.expect("request body").to_bytes();
            seen.lock().expect("lock").push(Seen {
                at,
                method: parts.method,
                headers: parts.headers,
                info: parts.extensions.get::<AttemptInfo>().copied(),
                body,
            });
            match step {
                Step::Stall => std::future::pending().await,
                Step::Fail(kind, endpoint) => Err(TestFailure { kind, endpoint }),
                Step::Status(code, headers, endpoint) => {
                    let mut rsp = Response::new(Body::from(format!("status {code}")));
                    *rsp.status_mut() = StatusCode::from_u16(code).expect("status");
                    for (name, value) in headers {
                        rsp.headers_mut()
                            .insert(name, HeaderValue::from_str(&value).expect("value"));
                    }
                    rsp.extensions_mut().insert(ServedBy(endpoint));
                    Ok(rsp)
                }
                Step::After(delay, code) => {
                    tokio::time::sleep(delay).await;
                    let mut rsp = Response::new(Body::from(format!("status {code}")));
                    *rsp.status_mut() = StatusCode::from_u16(code).expect("status");
                    rsp.extensions_mut().insert(ServedBy(0));
                    Ok(rsp)
                }
                Step::Trailers(headers, trailers) => {
                    let trailers: HeaderMap = trailers
                        .into_iter()
                        .map(|(name, value)| {
                            (
                                http::HeaderName::from_static(name),
                                HeaderValue::from_str(&value).expect("value"),
                            )
                        })
                        .collect();
                    let frames = [Ok::<_, std::convert::Infallible>(
                        http_body::Frame::trailers(trailers),
                    )];
                    let body = http_body_util::StreamBody::new(futures_util::stream::iter(frames));
                    let mut rsp = Response::new(Body::new(body));
                    for (name, value) in headers {
                        rsp.headers_mut()
                            .insert(name, HeaderValue::from_str(&value).expect("value"));
                    }
                    rsp.extensions_mut().insert(ServedBy(0));
                    Ok(rsp)
                }
            }
        })
    }
}

/// Marker standing in for the idempotency crate's `IdempotencyLock`.
#[derive(Debug, Clone)]
pub(super) struct Lock;

fn is_locked(e: &http::Extensions) -> bool {
    e.get::<Lock>().is_some()
}

/// Stands in for the gateway's caller (tenant or client address) as the breaker sees it.
#[derive(Debug, Clone, Copy)]
pub(super) struct CallerId(pub(super) u64);

fn caller_id(e: &http::Extensions) -> u64 {
    e.get::<CallerId>().map_or(0, |c| c.0)
}

pub(super) type Svc = Retry<Upstream>;
pub(super) type Res = Result<Response<Body>, RetryError<TestFailure>>;

/// Everything a test needs.
pub(super) struct Fixture {
    pub(super) upstream: Upstream,
    pub(super) svc: Svc,
    pub(super) target: RetryTarget,
    pub(super) clock: Arc<ManualWallClock>,
}

pub(super) fn dependency(endpoints: usize, dedupes: bool) -> Arc<UpstreamState> {
    Arc::new(UpstreamState::new(
        "orders",
        endpoints,
        dedupes,
        BudgetConfig::default(),
        BreakerConfig::default(),
    ))
}

pub(super) fn fixture(script: impl IntoIterator<Item = Step>) -> Fixture {
    fixture_with(script, RetryParams::default(), dependency(1, false))
}

pub(super) fn fixture_with(
    script: impl IntoIterator<Item = Step>,
    params: RetryParams,
    dep: Arc<UpstreamState>,
) -> Fixture {
    let upstream = Upstream::new(script);
    let clock = Arc::new(ManualWallClock::new(
        SystemTime::UNIX_EPOCH + Duration::from_secs(EPOCH_SECS),
    ));
    let layer = RetryLayer::new(is_locked, caller_id, clock.clone()).with_rng_seed(7);
    Fixture {
        svc: layer.layer(upstream.clone()),
        upstream,
        target: RetryTarget {
            policy: Arc::new(RetryPolicy::try_new(params).expect("valid policy")),
            upstream: dep,
            idempotent_route: false,
            route_latency: None,
        },
        clock,
    }
}

impl Fixture {
    /// A request carrying this fixture's `RetryTarget` and `X-Request-Id: req-1`, from a
    /// caller of its own (the fleet: many callers), unless [`CallerId`] is set on it.
    pub(super) fn request(&self, method: Method, body: impl Into<Body>) -> Request<Body> {
        static NEXT_CALLER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let caller = NEXT_CALLER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut req = Request::builder()
            .method(method)
            .uri("http://orders.internal/orders")
            .header("x-request-id", "req-1")
            .body(body.into())
            .expect("request");
        req.extensions_mut().insert(self.target.clone());
        req.extensions_mut().insert(CallerId(caller));
        req
    }

    /// [`Fixture::request`] from caller `id`.
    pub(super) fn request_from(&self, id: u64, method: Method) -> Request<Body> {
        let mut req = self.request(method, Body::empty());
        req.extensions_mut().insert(CallerId(id));
        req
    }

    /// A POST/PATCH holding the idempotency lock, with `Idempotency-Key: key-1`.
    pub(super) fn locked(&self, method: Method, body: impl Into<Body>) -> Request<Body> {
        let mut req = self.request(method, body);
        req.extensions_mut().insert(Lock);
        req.headers_mut()
            .insert("idempotency-key", HeaderValue::from_static("key-1"));
        req
    }

    pub(super) async fn send(&self, req: Request<Body>) -> Res {
        self.svc.clone().oneshot(req).await
    }
}

pub(super) fn trace_init() -> tracing::subscriber::DefaultGuard {
    let subscriber = tracing_subscriber::fmt()
        .with_test_writer()
        .with_max_level(tracing::Level::DEBUG)
        .finish();
    tracing::subscriber::set_default(subscriber)
}

pub(super) fn header<'a>(seen: &'a Seen, name: &str) -> &'a str {
    seen.headers
        .get(name)
        .map(|v| v.to_str().expect("ascii"))
        .unwrap_or("")
}

pub(super) fn status(res: &Res) -> u16 {
    match res {
        Ok(rsp) => rsp.status().as_u16(),
        Err(e) => panic!("expected a response, got {e:?}"),
    }
}

/// Which failures release an idempotency key. The client-facing status and problem of
/// each error are the gateway's (its rescue layer) and are tested there.
#[test]
fn provably_unprocessed_errors() {
    type E = RetryError<TestFailure>;
    let up = |kind| {
        E::Upstream(TestFailure {
            kind,
            endpoint: None,
        })
    };
    let cases: Vec<(E, bool)> = vec![
        (up(FailureKind::ConnectRefused), true),
        (up(FailureKind::ConnectTimeout), true),
        (up(FailureKind::Dns), true),
        (up(FailureKind::ResetBeforeSent), true),
        (up(FailureKind::ResetAfterSent), false),
        (up(FailureKind::TlsHandshakeTimeout), true),
        // The handshake failed before any request byte: the key may be released.
        (up(FailureKind::TlsCertificate), true),
        (up(FailureKind::Other), false),
        (
            E::AttemptTimeout {
                after: Duration::from_secs(5),
            },
            false,
        ),
        (E::DeadlineExceeded, true),
        (
            E::BreakerOpen {
                retry_after: Duration::from_secs(3),
            },
            true,
        ),
        (
            E::RequestBody(axum::Error::new(std::io::Error::other("reset"))),
            true,
        ),
    ];
    for (e, unprocessed) in cases {
        assert_eq!(e.is_provably_unprocessed(), unprocessed, "{e:?}");
    }
}
