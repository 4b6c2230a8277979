//! Harness for the layer tests: a scripted, counting upstream and request helpers.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::body::Body;
use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::BodyExt;
use portcullis_idempotency::{
    Completion, Fingerprint, Idempotency, IdempotencyLayer, IdempotencySettings, LockOutcome,
    MemoryStore, RecordInfo, RecordKey, Store, StoreError,
};
use tower::util::BoxCloneService;
use tower::{Layer, ServiceExt};

pub type Inner = BoxCloneService<Request<Body>, Response<Body>, Infallible>;
pub type Svc = Idempotency<Inner>;
type Respond = dyn Fn(&Request<Body>) -> Response<Body> + Send + Sync;

/// Installs a test-scoped tracing subscriber (output shown only for failing tests).
pub fn trace_init() -> tracing::subscriber::DefaultGuard {
    let sub = tracing_subscriber::fmt()
        .with_test_writer()
        .with_max_level(tracing::Level::DEBUG)
        .finish();
    tracing::subscriber::set_default(sub)
}

/// An upstream that counts executions, waits `delay`, then answers `respond(req)`.
#[derive(Clone)]
pub struct Upstream {
    pub hits: Arc<AtomicUsize>,
    delay: Duration,
    respond: Arc<Respond>,
}

impl Upstream {
    pub fn new(
        delay: Duration,
        respond: impl Fn(&Request<Body>) -> Response<Body> + Send + Sync + 'static,
    ) -> Self {
        Self {
            hits: Arc::default(),
            delay,
            respond: Arc::new(respond),
        }
    }

    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    pub fn service(&self) -> Inner {
        let this = self.clone();
        BoxCloneService::new(tower::service_fn(move |req: Request<Body>| {
            let this = this.clone();
            async move {
                this.hits.fetch_add(1, Ordering::SeqCst);
                let resp = (this.respond)(&req);
                tokio::time::sleep(this.delay).await;
                Ok::<_, Infallible>(resp)
            }
        }))
    }
}

pub fn reply(status: u16, body: &str) -> Response<Body> {
    let mut r = Response::new(Body::from(body.to_owned()));
    *r.status_mut() = StatusCode::from_u16(status).unwrap();
    r.headers_mut()
        .insert("content-type", "text/plain".parse().unwrap());
    r.headers_mut().insert("x-upstream", "1".parse().unwrap());
    r
}

pub fn settings() -> IdempotencySettings {
    IdempotencySettings::new("acme", "/orders")
}

pub fn memory_store() -> Arc<dyn Store> {
    Arc::new(MemoryStore::new(16 << 20))
}

pub fn stack(up: &Upstream, settings: IdempotencySettings) -> Svc {
    IdempotencyLayer::new(memory_store(), Arc::new(move |_| Some(settings.clone())))
        .layer(up.service())
}

pub fn post(key: &str, body: &str) -> Request<Body> {
    let mut r = unkeyed_post(body);
    r.headers_mut()
        .insert("idempotency-key", key.parse().unwrap());
    r
}

pub fn unkeyed_post(body: &str) -> Request<Body> {
    Request::post("/orders?source=test")
        .header("content-type", "application/json")
        .body(Body::from(body.to_owned()))
        .unwrap()
}

/// A fully read response.
#[derive(Debug)]
pub struct Collected {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub bytes: Bytes,
    pub body: String,
}

impl Collected {
    pub fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }

    /// The problem `type` without its `https://portcullis.dev/problems/` prefix.
    pub fn problem_type(&self) -> String {
        let v: serde_json::Value = serde_json::from_slice(&self.bytes).unwrap();
        let t = v["type"].as_str().unwrap();
        t.trim_start_matches("https://portcullis.dev/problems/")
            .to_owned()
    }
}

pub async fn collect(r: Response<Body>) -> Collected {
    let (parts, body) = r.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    Collected {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8_lossy(&bytes).into_owned(),
        bytes,
    }
}

pub async fn send<S>(svc: &S, req: Request<Body>) -> Collected
where
    S: tower::Service<Request<Body>, Response = Response<Body>> + Clone,
    S::Error: std::fmt::Debug,
{
    collect(svc.clone().oneshot(req).await.unwrap()).await
}

/// A store that is down: every call fails with the given error.
pub struct FailingStore(pub fn() -> StoreError);

#[async_trait]
impl Store for FailingStore {
    async fn try_lock(
        &self,
        _: &RecordKey,
        _: &Fingerprint,
        _: Duration,
        _: Duration,
    ) -> Result<LockOutcome, StoreError> {
        Err((self.0)())
    }
    async fn complete(
        &self,
        _: &RecordKey,
        _: u64,
        _: Completion,
        _: Duration,
    ) -> Result<(), StoreError> {
        Err((self.0)())
    }
    async fn release(&self, _: &RecordKey, _: u64) -> Result<(), StoreError> {
        Err((self.0)())
    }
    async fn get(&self, _: &RecordKey) -> Result<Option<RecordInfo>, StoreError> {
        Err((self.0)())
    }
    async fn delete(&self, _: &RecordKey) -> Result<bool, StoreError> {
        Err((self.0)())
    }
}
