//! The assembled stack in process: `assemble(config, parts, stub)` with a stub upstream
//! service, driven by `oneshot` on paused time. These pin the layer order (which answer wins
//! when several apply) and the extension contract between layers; the e2e tests cover the
//! same ground through sockets and the real binary.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use portcullis_control::{Database, Directory};
use portcullis_idempotency::IdempotencyLock;
use tower::ServiceExt;

use super::{assemble, StackParts};
use crate::config::Config;
use crate::edge::listener::HttpService;
use crate::pipeline::health::Health;
use crate::plumbing::client::{PeerAddr, TrustedProxies};
use crate::plumbing::context::Caller;
use crate::plumbing::context::RequestContext;
use crate::upstream::proxy::{ProxyError, ProxyErrorKind};

const CONFIG: &str = r#"
[server]
max_body_bytes = 1024

[rate_limit]
anonymous = { rate = 2, per = "1h", burst = 2 }

[[tenants]]
id = "acme"
api_keys = ["acme-key-0001"]
rate = 1000
per = "1s"
burst = 1000

[[tenants]]
id = "tiny"
api_keys = ["tiny-key-00001"]
rate = 1
per = "1h"
burst = 1

[[upstreams]]
name = "u"
endpoints = ["http://127.0.0.1:9"]
retry = { max_retries = 2, base = "1s", cap = "4s" }

[[routes]]
prefix = "/orders"
upstream = "u"
idempotency = { require_key = true }

[[routes]]
prefix = "/fail"
upstream = "u"

[[routes]]
prefix = "/limited"
upstream = "u"
"#;

/// What the stub upstream saw of one request.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    request_id: bool,
    connection_named_removed: bool,
    routed: bool,
    retry_target: bool,
    caller_is_tenant: bool,
    locked: bool,
}

type Log = Arc<Mutex<Vec<Seen>>>;

/// An upstream that records what reached it; `/fail…` is refused as a connection would be.
fn stub(
    log: Log,
) -> impl tower::Service<
    Request<Body>,
    Response = Response<Body>,
    Error = ProxyError,
    Future = impl std::future::Future<Output = Result<Response<Body>, ProxyError>> + Send,
> + Clone
       + Send
       + 'static {
    tower::service_fn(move |request: Request<Body>| {
        let ext = request.extensions();
        let seen = Seen {
            path: request.uri().path().to_owned(),
            request_id: request.headers().contains_key("x-request-id"),
            connection_named_removed: !request.headers().contains_key("x-secret"),
            routed: RequestContext::of(ext).is_some(),
            retry_target: RequestContext::retry_target(ext).is_some(),
            caller_is_tenant: matches!(
                RequestContext::of(ext).map(|c| &c.caller),
                Some(Caller::Tenant(_))
            ),
            locked: ext.get::<IdempotencyLock>().is_some(),
        };
        let fail = seen.path.starts_with("/fail");
        let limited = seen.path.starts_with("/limited");
        if let Ok(mut log) = log.lock() {
            log.push(seen);
        }
        async move {
            if fail {
                Err(ProxyError::new(ProxyErrorKind::ConnectRefused, Some(0)))
            } else if limited {
                let mut response = Response::new(Body::from("slow down (upstream)"));
                *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
                Ok(response)
            } else {
                Ok(Response::new(Body::from("from upstream")))
            }
        }
    })
}

/// The stack of [`CONFIG`] around a recording stub, on a fresh SQLite directory.
async fn stack() -> (HttpService, Log, tempfile::TempDir) {
    let (service, log, dir, _) = stack_with_directory().await;
    (service, log, dir)
}

/// [`stack`], with the tenant directory it resolves callers against.
async fn stack_with_directory() -> (HttpService, Log, tempfile::TempDir, Arc<Directory>) {
    let config = Config::parse(CONFIG, &HashMap::<String, String>::new()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let db = Database::sqlite(&dir.path().join("t.db")).await.unwrap();
    db.upsert_tenants(&crate::start::tenant_seeds(&config.tenants))
        .await
        .unwrap();
    let directory = Arc::new(Directory::open(&db).await.unwrap());
    let upstreams = crate::start::upstreams(&config);
    let parts = StackParts {
        upstreams,
        limiter: crate::pipeline::ratelimit::build_limiter(&config).unwrap(),
        idempotency_store: crate::pipeline::idempotency::build_store(&config, &directory)
            .await
            .unwrap(),
        directory: directory.clone(),
        health: Arc::new(Health::new(db, Vec::new())),
        deliveries: None,
    };
    let log = Log::default();
    let trusted = Arc::new(TrustedProxies::new(Vec::new()));
    let service = assemble(&config, parts, trusted, stub(log.clone()));
    // Everything after set-up runs on paused time: backoff sleeps complete at once.
    tokio::time::pause();
    (service, log, dir, directory)
}

fn request(method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Request<Body> {
    let mut builder = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "gateway.test");
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    if !body.is_empty() {
        // As hyper hands a request whose head declared its length.
        builder = builder.header("content-length", body.len());
    }
    let mut request = builder.body(Body::from(body.to_owned())).unwrap();
    let peer: SocketAddr = "203.0.113.7:4000".parse().unwrap();
    request.extensions_mut().insert(PeerAddr(peer));
    request
}

async fn send(
    service: &HttpService,
    request: Request<Body>,
) -> (StatusCode, http::HeaderMap, String) {
    let response = service.clone().oneshot(request).await.unwrap();
    let (parts, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    (
        parts.status,
        parts.headers,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

fn problem_type(body: &str) -> String {
    let json: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    json["type"]
        .as_str()
        .unwrap_or_default()
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn which_answer_wins_follows_the_layer_order() {
    let (service, log, _dir) = stack().await;
    let big = "x".repeat(2048);
    // Body limit (edge) before routing, routing before tenant resolution, tenant resolution
    // before rate limiting, rate limiting before idempotency.
    let cases = [
        (
            request(
                "POST",
                "/nowhere",
                &[("authorization", "Bearer wrong-key-0001")],
                &big,
            ),
            413,
            "body-too-large",
        ),
        (
            request(
                "GET",
                "/nowhere/../../x",
                &[("authorization", "Bearer wrong-key-0001")],
                "",
            ),
            400,
            "invalid-path",
        ),
        (
            request(
                "GET",
                "/nowhere",
                &[("authorization", "Bearer wrong-key-0001")],
                "",
            ),
            404,
            "no-route",
        ),
        (
            request(
                "POST",
                "/orders",
                &[("authorization", "Bearer wrong-key-0001")],
                "{}",
            ),
            401,
            "",
        ),
        // Anonymous: a bucket of 2. The third keyed POST is refused by the limiter before the
        // idempotency layer could lock its key.
        (
            request("POST", "/orders", &[], "{}"),
            400,
            "idempotency-key-missing",
        ),
        (
            request("POST", "/orders", &[], "{}"),
            400,
            "idempotency-key-missing",
        ),
        (
            request("POST", "/orders", &[("idempotency-key", "k-1")], "{}"),
            429,
            "quota-exceeded",
        ),
    ];
    for (request, status, problem) in cases {
        let label = format!("{} {}", request.method(), request.uri());
        let (actual, headers, body) = send(&service, request).await;
        assert_eq!(actual.as_u16(), status, "{label}: {body}");
        assert!(problem_type(&body).ends_with(problem), "{label}: {body}");
        assert!(
            headers.contains_key("x-request-id"),
            "{label}: every answer has an id"
        );
    }
    assert!(
        log.lock().unwrap().is_empty(),
        "no refused request reached the upstream"
    );
}

#[tokio::test]
async fn later_layers_see_what_earlier_layers_established() {
    let (service, log, _dir) = stack().await;
    let keyed = |key: &str| {
        request(
            "POST",
            "//orders/./7",
            &[
                ("authorization", "Bearer acme-key-0001"),
                ("idempotency-key", key),
                ("connection", "X-Secret"),
                ("x-secret", "1"),
                ("content-type", "application/json"),
            ],
            "{\"item\":1}",
        )
    };
    let (status, headers, body) = send(&service, keyed("order-1")).await;
    assert_eq!(status, 200, "{body}");
    assert!(headers.contains_key("x-ratelimit-remaining"));
    let seen = log.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    let seen = &seen[0];
    assert_eq!(
        seen.path, "/orders/7",
        "normalised before routing and forwarding"
    );
    assert!(seen.request_id && seen.connection_named_removed);
    assert!(seen.routed && seen.retry_target && seen.caller_is_tenant && seen.locked);

    // The same keyed request again: replayed by the idempotency layer, never forwarded.
    let (status, headers, body) = send(&service, keyed("order-1")).await;
    assert_eq!((status.as_u16(), body.as_str()), (200, "from upstream"));
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(log.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn upstream_failures_are_retried_then_rescued_into_problem_json() {
    let (service, log, _dir) = stack().await;
    let get = request(
        "GET",
        "/fail/x",
        &[("authorization", "Bearer acme-key-0001")],
        "",
    );
    let (status, headers, body) = send(&service, get).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert_eq!(problem_type(&body), "upstream-unreachable");
    assert_eq!(headers["content-type"], "application/problem+json");
    // A refused connection is provably unprocessed: retried (max_retries = 2) on paused time.
    assert_eq!(log.lock().unwrap().len(), 3);
}

/// Only the rate-limit layer's own 429s count against a tenant (the admin usage view): an
/// upstream answering 429 (its own limit, passed through) is not a gateway rejection. Before
/// the count moved to the rate-limit layer's observer, resolution counted every 429 status.
#[tokio::test]
async fn only_the_gateways_own_429s_count_against_a_tenant() {
    let (service, log, _dir, directory) = stack_with_directory().await;
    let counted = || {
        let snapshot = directory.snapshot();
        snapshot.by_id("tiny").map(|t| t.rate_limited_total())
    };
    let get = || request("GET", "/limited", &[("x-api-key", "tiny-key-00001")], "");

    // Admitted by the limiter (burst 1); the upstream itself answers 429.
    let (status, _, body) = send(&service, get()).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(body, "slow down (upstream)");
    assert!(!log.lock().unwrap().is_empty());
    assert_eq!(counted(), Some(0), "an upstream 429 is not a rejection");

    // The bucket is empty now: the layer answers 429 itself, and that one counts.
    let reached = log.lock().unwrap().len();
    let (status, headers, body) = send(&service, get()).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(problem_type(&body).ends_with("quota-exceeded"), "{body}");
    assert!(headers.contains_key("retry-after"));
    assert_eq!(
        log.lock().unwrap().len(),
        reached,
        "refused before the upstream"
    );
    assert_eq!(counted(), Some(1));
}
