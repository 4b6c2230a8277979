//! The admin router as a service (no sockets): authentication, problem shapes, routing of
//! every documented operation, and the mapping of quota errors.

use std::sync::Arc;

use async_trait::async_trait;
use axum::body::Body;
use http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

use super::*;
use crate::quota::{Period, PeriodUsage, QuotaError, TenantUsage};

const TOKEN: &str = "test-admin-token-0123456789";

/// Reset fails like a tenant without the quota; top-up succeeds; usage is empty.
struct FakeQuota;

#[async_trait]
impl QuotaAdmin for FakeQuota {
    async fn usage(&self, tenant: &str) -> Result<TenantUsage, QuotaError> {
        Ok(TenantUsage {
            tenant: tenant.into(),
            buckets: Vec::new(),
            periods: Vec::new(),
            rejected_total: 0,
        })
    }
    async fn reset_period(&self, _: &str, period: Period) -> Result<PeriodUsage, QuotaError> {
        Err(QuotaError::NoSuchQuota(period))
    }
    async fn top_up(&self, _: &str, period: Period, _: u64) -> Result<PeriodUsage, QuotaError> {
        Err(QuotaError::Store(format!("{period:?}: connection refused")))
    }
}

async fn app() -> (Router, tempfile::TempDir) {
    app_with(Arc::new(FakeUpstreams)).await
}

/// One upstream with an ejected endpoint, as the gateway would report it.
struct FakeUpstreams;

impl UpstreamsView for FakeUpstreams {
    fn upstreams(&self) -> Vec<UpstreamStatus> {
        vec![UpstreamStatus {
            name: "orders".into(),
            load_balancer: "least_request".into(),
            circuit_breaker: "closed".into(),
            healthy_endpoints: 1,
            panic: false,
            endpoints: vec![EndpointStatus {
                url: "http://127.0.0.1:9001".into(),
                host: "orders.internal:9001".into(),
                weight: 2,
                state: EndpointHealth::Ejected,
                ejected_for_ms: Some(29_000),
                ejections: 1,
                consecutive_failures: 0,
                in_flight: 0,
            }],
            attempt_timeout_ms: 5000,
            latency: Some(LatencyStatus {
                samples: 1200,
                p50_ms: 4.1,
                p99_ms: 41.0,
                p999_ms: 120.0,
                recommended_attempt_timeout_ms: 123,
            }),
            routes: vec![RouteLatencyStatus {
                route: "/orders".into(),
                latency: None,
            }],
            retry_amplification: Some(1.25),
        }]
    }
}

async fn app_with(upstreams: Arc<dyn UpstreamsView>) -> (Router, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::sqlite(&dir.path().join("a.db")).await.unwrap();
    let directory = Arc::new(Directory::open(&db).await.unwrap());
    let ctx = AdminContext {
        db,
        directory,
        limiter: Arc::new(portcullis_ratelimit::LocalLimiter::new()),
        idempotency: Arc::new(portcullis_idempotency::MemoryStore::new(1 << 20)),
        token: Arc::from(TOKEN),
        routes: Arc::from(vec![ConfiguredRoute {
            name: "/".into(),
            cost: 1,
        }]),
        upstreams,
        throttled_board: None,
        deliveries: None,
    };
    (router_with_quota(ctx, Arc::new(FakeQuota)), dir)
}

async fn call(app: &Router, method: Method, uri: &str, body: Option<Value>) -> (StatusCode, Value) {
    let request = Request::builder()
        .method(method)
        .uri(uri)
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(body.map_or_else(Body::empty, |b| Body::from(b.to_string())))
        .unwrap();
    send(app, request).await
}

async fn send(app: &Router, request: Request<Body>) -> (StatusCode, Value) {
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let is_error = status.is_client_error() || status.is_server_error();
    let content_type = response.headers().get("content-type").cloned();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    if is_error {
        assert_eq!(
            content_type.as_ref().and_then(|v| v.to_str().ok()),
            Some(CONTENT_TYPE),
            "{status}: every admin error is problem+json"
        );
    }
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

#[tokio::test]
async fn requests_without_the_right_token_get_401() {
    let (app, _dir) = app().await;
    for auth in [
        None,
        Some("Bearer wrong-token-of-some-length"),
        Some("Basic dGVzdA=="),
    ] {
        let mut request = Request::get("/admin/v1/tenants");
        if let Some(auth) = auth {
            request = request.header("authorization", auth);
        }
        let response = app
            .clone()
            .oneshot(request.body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(response.status(), 401, "{auth:?}");
        assert!(response.headers().contains_key("www-authenticate"));
    }
    // Unknown admin paths do not reveal themselves before authentication either.
    let response = app
        .clone()
        .oneshot(Request::get("/admin/v1/nope").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), 401);
    let (status, body) = call(&app, Method::GET, "/admin/v1/nope", None).await;
    assert_eq!(status, 404);
    assert!(body["detail"].as_str().unwrap().contains("openapi.json"));
}

#[tokio::test]
async fn every_documented_operation_is_routed() {
    let (app, _dir) = app().await;
    let document = openapi::document();
    assert_eq!(document["openapi"], "3.1.0");
    let paths = document["paths"].as_object().unwrap();
    assert!(paths.len() >= 14);
    for (path, item) in paths {
        for method in item.as_object().unwrap().keys() {
            let mut uri = path
                .replace("{id}", "acme")
                .replace("{key_id}", "1")
                .replace("{period}", "day");
            let needs = |p: &str| {
                item[method]["parameters"]
                    .as_array()
                    .is_some_and(|ps| ps.iter().any(|x| x["$ref"].as_str().unwrap().ends_with(p)))
            };
            if needs("/Route") {
                uri.push_str("?route=/&key=k1");
            }
            let method = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let (status, body) = call(&app, method.clone(), &uri, Some(json!({}))).await;
            assert_ne!(status, 405, "{method} {uri}");
            let unrouted = body["detail"]
                .as_str()
                .is_some_and(|d| d.contains("no admin endpoint"));
            assert!(!unrouted, "{method} {uri} is documented but not routed");
        }
    }
}

#[tokio::test]
async fn invalid_input_is_422_naming_every_field() {
    let (app, _dir) = app().await;
    let body = json!({"id": "bad id!", "rate": 0, "per": "soon", "burst": "5", "colour": "red"});
    let (status, problem) = call(&app, Method::POST, "/admin/v1/tenants", Some(body)).await;
    assert_eq!(status, 422);
    let fields: Vec<&str> = problem["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["field"].as_str().unwrap())
        .collect();
    assert_eq!(fields, ["id", "rate", "per", "burst", "colour"]);
    assert_eq!(problem["errors"][1]["reason"], "must be ≥ 1");

    let request = Request::post("/admin/v1/tenants")
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(Body::from("{\"id\": "))
        .unwrap();
    let (status, problem) = send(&app, request).await;
    assert_eq!(status, 422);
    assert_eq!(problem["errors"][0]["field"], "body");

    let (status, problem) = call(&app, Method::GET, "/admin/v1/tenants?limit=0&x=1", None).await;
    assert_eq!(status, 422);
    assert_eq!(problem["errors"][0]["field"], "limit");
    assert_eq!(problem["errors"][1]["field"], "x");
    // Nothing was written.
    let (_, page) = call(&app, Method::GET, "/admin/v1/tenants", None).await;
    assert_eq!(page["items"], json!([]));
}

#[tokio::test]
async fn max_in_flight_is_validated_set_cleared_and_shown_in_the_quota() {
    let (app, _dir) = app().await;
    let tenants = "/admin/v1/tenants";
    for (value, reason) in [
        (json!(0), "must be ≥ 1"),
        (json!(100_001), "must be ≤ 100000"),
        (json!("2"), "integer"),
    ] {
        let body = json!({"id": "acme", "rate": 1, "burst": 1, "max_in_flight": value});
        let (status, problem) = call(&app, Method::POST, tenants, Some(body)).await;
        assert_eq!(status, 422, "{value}");
        assert_eq!(problem["errors"][0]["field"], "max_in_flight");
        let said = problem["errors"][0]["reason"].as_str().unwrap();
        assert!(said.contains(reason), "{value}: {said}");
    }
    let body = json!({"id": "acme", "rate": 1, "burst": 1, "max_in_flight": 2});
    let (status, created) = call(&app, Method::POST, tenants, Some(body)).await;
    assert_eq!(status, 201);
    assert_eq!(created["max_in_flight"], 2);

    let quota = "/admin/v1/tenants/acme/quota";
    let (status, view) = call(
        &app,
        Method::PATCH,
        quota,
        Some(json!({"max_in_flight": 7})),
    )
    .await;
    assert_eq!(
        (status, &view["max_in_flight"]),
        (StatusCode::OK, &json!(7))
    );
    let (_, problem) = call(
        &app,
        Method::PATCH,
        quota,
        Some(json!({"max_in_flight": -1})),
    )
    .await;
    assert_eq!(problem["errors"][0]["field"], "max_in_flight");
    let (_, view) = call(&app, Method::GET, quota, None).await;
    assert_eq!(view["max_in_flight"], 7, "a refused patch changes nothing");

    let cleared = json!({"max_in_flight": null});
    let (status, tenant) = call(&app, Method::PATCH, "/admin/v1/tenants/acme", Some(cleared)).await;
    assert_eq!(
        (status, &tenant["max_in_flight"]),
        (StatusCode::OK, &json!(null))
    );
}

#[tokio::test]
async fn framework_rejections_become_problems() {
    let (app, _dir) = app().await;
    let (status, problem) = call(&app, Method::PUT, "/admin/v1/tenants", None).await;
    assert_eq!(status, 405);
    assert!(problem["type"]
        .as_str()
        .unwrap()
        .ends_with("method-not-allowed"));
    let request = Request::put("/admin/v1/tenants")
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(Body::empty())
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let allow = response.headers()["allow"].to_str().unwrap();
    assert!(allow.contains("GET") && allow.contains("POST"), "{allow}");
}

#[tokio::test]
async fn quota_errors_map_to_404_409_503() {
    let (app, _dir) = app().await;
    let (status, _) = call(
        &app,
        Method::POST,
        "/admin/v1/tenants/acme/periods/day/reset",
        None,
    )
    .await;
    assert_eq!(status, 404, "unknown tenant");
    let tenant = json!({"id": "acme", "rate": 10, "burst": 10});
    let (status, _) = call(&app, Method::POST, "/admin/v1/tenants", Some(tenant)).await;
    assert_eq!(status, 201);
    let (status, problem) = call(
        &app,
        Method::POST,
        "/admin/v1/tenants/acme/periods/day/reset",
        None,
    )
    .await;
    assert_eq!(status, 409);
    assert!(problem["detail"].as_str().unwrap().contains("daily"));
    let top_up = json!({"amount": 5});
    let (status, problem) = call(
        &app,
        Method::POST,
        "/admin/v1/tenants/acme/periods/month/top-up",
        Some(top_up),
    )
    .await;
    assert_eq!(status, 503);
    assert_eq!(problem["retry_after"], 1);
    assert!(
        !problem["detail"].as_str().unwrap().contains("refused"),
        "no internals"
    );
    let (status, problem) = call(
        &app,
        Method::POST,
        "/admin/v1/tenants/acme/periods/week/reset",
        None,
    )
    .await;
    assert_eq!(
        (status.as_u16(), &problem["errors"][0]["field"]),
        (422, &json!("period"))
    );
    let (status, usage) = call(&app, Method::GET, "/admin/v1/tenants/acme/usage", None).await;
    assert_eq!((status.as_u16(), &usage["tenant"]), (200, &json!("acme")));
}

#[tokio::test]
async fn idempotency_lookup_validates_and_misses_cleanly() {
    let (app, _dir) = app().await;
    let (status, problem) = call(
        &app,
        Method::GET,
        "/admin/v1/tenants/acme/idempotency?route=",
        None,
    )
    .await;
    assert_eq!(status, 422);
    let fields: Vec<&str> = problem["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["field"].as_str().unwrap())
        .collect();
    assert_eq!(fields, ["key", "route"]);
    let (status, _) = call(
        &app,
        Method::GET,
        "/admin/v1/tenants/acme/idempotency?route=/&key=k1",
        None,
    )
    .await;
    assert_eq!(status, 404);
    let (status, _) = call(
        &app,
        Method::DELETE,
        "/admin/v1/tenants/acme/idempotency?route=/&key=k1",
        None,
    )
    .await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn without_a_token_the_admin_paths_say_why() {
    let app = disabled_router();
    let (status, problem) = send(
        &app,
        Request::get("/admin/v1/tenants")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(status, 404);
    assert!(problem["detail"]
        .as_str()
        .unwrap()
        .contains("PORTCULLIS_ADMIN_TOKEN"));
}

#[tokio::test]
async fn upstreams_lists_endpoint_health_and_needs_the_token() {
    let (app, _dir) = app().await;
    let (status, body) = call(&app, Method::GET, "/admin/v1/upstreams", None).await;
    assert_eq!(status, StatusCode::OK);
    let endpoint = &body["upstreams"][0]["endpoints"][0];
    assert_eq!(body["upstreams"][0]["name"], "orders");
    let latency = &body["upstreams"][0]["latency"];
    assert_eq!(latency["p99_ms"], 41.0);
    assert_eq!(latency["recommended_attempt_timeout_ms"], 123);
    assert_eq!(body["upstreams"][0]["attempt_timeout_ms"], 5000);
    assert_eq!(body["upstreams"][0]["routes"][0]["route"], "/orders");
    assert_eq!(endpoint["state"], "ejected");
    assert_eq!(endpoint["ejected_for_ms"], 29_000);
    let (app, _dir) = app_with(Arc::new(NoUpstreams)).await;
    let (_, body) = call(&app, Method::GET, "/admin/v1/upstreams", None).await;
    assert_eq!(body, json!({ "upstreams": [] }));
    let unauthenticated = Request::get("/admin/v1/upstreams")
        .body(Body::empty())
        .unwrap();
    assert_eq!(
        send(&app, unauthenticated).await.0,
        StatusCode::UNAUTHORIZED
    );
}

/// The app and the directory it reads (to count 429s as the request path would).
async fn app_and_directory() -> (Router, Arc<Directory>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::sqlite(&dir.path().join("a.db")).await.unwrap();
    let directory = Arc::new(Directory::open(&db).await.unwrap());
    let ctx = AdminContext {
        db,
        directory: directory.clone(),
        limiter: Arc::new(portcullis_ratelimit::LocalLimiter::new()),
        idempotency: Arc::new(portcullis_idempotency::MemoryStore::new(1 << 20)),
        token: Arc::from(TOKEN),
        routes: Arc::from(vec![ConfiguredRoute {
            name: "/".into(),
            cost: 1,
        }]),
        upstreams: Arc::new(NoUpstreams),
        throttled_board: None,
        deliveries: None,
    };
    (router_with_quota(ctx, Arc::new(FakeQuota)), directory, dir)
}

#[tokio::test]
async fn history_and_top_throttled_show_the_tenants_429s() {
    let (app, directory, _dir) = app_and_directory().await;
    for id in ["acme", "globex", "quiet"] {
        let body = json!({ "id": id, "rate": 1, "burst": 1 });
        let (status, _) = call(&app, Method::POST, "/admin/v1/tenants", Some(body)).await;
        assert_eq!(status, StatusCode::CREATED);
    }
    let snapshot = directory.snapshot();
    for (id, n) in [("acme", 3), ("globex", 5)] {
        for _ in 0..n {
            snapshot.by_id(id).unwrap().record_rate_limited();
        }
    }

    let (status, history) = call(
        &app,
        Method::GET,
        "/admin/v1/tenants/acme/usage/history",
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(history["interval_secs"], 10);
    let points = history["points"].as_array().unwrap();
    assert_eq!(points.len(), 60);
    // The new 429s are in the newest points: the current bucket, or the one before if the
    // background sampler ran as a 10 s boundary passed (the test runs on the wall clock).
    let recent =
        points[58]["rejected"].as_u64().unwrap() + points[59]["rejected"].as_u64().unwrap();
    let all: u64 = points.iter().map(|p| p["rejected"].as_u64().unwrap()).sum();
    assert_eq!((recent, all), (3, 3), "the newest points hold the new 429s");
    assert_eq!(
        points[59]["start"].as_u64().unwrap() - points[58]["start"].as_u64().unwrap(),
        10
    );
    assert_eq!(history["rejected_total"], 3);

    let (status, top) = call(&app, Method::GET, "/admin/v1/usage/throttled?limit=1", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(top["scope"], "replica");
    assert_eq!(top["window_secs"], 600);
    assert_eq!(top["items"], json!([{ "tenant": "globex", "rejected": 5 }]));
    let (_, top) = call(&app, Method::GET, "/admin/v1/usage/throttled", None).await;
    assert_eq!(
        top["items"],
        json!([{ "tenant": "globex", "rejected": 5 }, { "tenant": "acme", "rejected": 3 }]),
        "tenants without 429s are not listed"
    );

    let (status, problem) = call(
        &app,
        Method::GET,
        "/admin/v1/tenants/nobody/usage/history",
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(problem["detail"].as_str().unwrap().contains("nobody"));
    for bad in ["0", "101", "ten"] {
        let uri = format!("/admin/v1/usage/throttled?limit={bad}");
        let (status, problem) = call(&app, Method::GET, &uri, None).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{bad}");
        assert_eq!(problem["errors"][0]["field"], "limit");
    }
}

#[tokio::test]
async fn tenant_search_and_audit_filters_through_the_router() {
    let (app, _dir) = app().await;
    for id in ["acme", "globex"] {
        let body = json!({ "id": id, "rate": 1, "burst": 1 });
        call(&app, Method::POST, "/admin/v1/tenants", Some(body)).await;
    }
    call(&app, Method::POST, "/admin/v1/tenants/acme/disable", None).await;
    let (status, page) = call(&app, Method::GET, "/admin/v1/tenants?q=GLOB", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(page["items"].as_array().unwrap().len(), 1);
    assert_eq!(page["items"][0]["id"], "globex");
    let long = "x".repeat(201);
    let (status, problem) = call(
        &app,
        Method::GET,
        &format!("/admin/v1/tenants?q={long}"),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(problem["errors"][0]["field"], "q");

    let (_, page) = call(
        &app,
        Method::GET,
        "/admin/v1/audit?action=tenant.disable",
        None,
    )
    .await;
    let items = page["items"].as_array().unwrap();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["tenant"], "acme");
    let (_, page) = call(
        &app,
        Method::GET,
        "/admin/v1/audit?actor=admin-token&tenant=globex",
        None,
    )
    .await;
    assert_eq!(page["items"].as_array().unwrap().len(), 1);
    let (_, page) = call(
        &app,
        Method::GET,
        "/admin/v1/audit?actor=someone-else",
        None,
    )
    .await;
    assert_eq!(page["items"], json!([]));
}
