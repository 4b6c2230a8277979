//! The layer as a service, without sockets: `oneshot` requests through `RateLimit<S>`.

// Test helpers outside #[test] fns panic on purpose, like the tests themselves.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::CompositeKey;
use portcullis_ratelimit::headers::{
    RATELIMIT, RATELIMIT_POLICY, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET,
};
use portcullis_ratelimit::{
    FailMode, FallbackConfig, FallbackLimiter, LimitKey, LimitRequest, Limiter, LocalLimiter,
    LocalLimiterConfig, ManualClock, Period, Policy, Principal, RateLimitLayer, RedisLimiter,
    RedisLimiterConfig,
};
use tower::{Layer, ServiceExt};

const UNIX_NOW: u64 = 1_700_000_000;

struct App {
    layer: RateLimitLayer,
}

/// Requests name their tenant in `x-tenant` and their cost in `x-cost`; no tenant → no
/// limits. `x-shadow: 1` adds a shadow policy of burst 1.
fn app(limiter: Arc<dyn Limiter>, clock: Arc<ManualClock>) -> App {
    let tenant = Arc::new(Policy::try_new("tenant", 1, Duration::from_secs(10), 5).unwrap());
    let shadow = Arc::new(
        Policy::try_new("shadow", 1, Duration::from_secs(10), 1)
            .unwrap()
            .with_shadow(true),
    );
    let layer = RateLimitLayer::new(limiter, move |req: &http::request::Parts| {
        let id = req.headers.get("x-tenant")?.to_str().ok()?;
        let cost = req
            .headers
            .get("x-cost")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(1);
        let mut limits = LimitRequest::new().with(LimitKey::tenant(id), tenant.clone(), cost);
        if req.headers.contains_key("x-shadow") {
            limits.push(LimitKey::custom(id, "shadow"), shadow.clone(), 1);
        }
        Some(limits)
    })
    .with_clock(clock);
    App { layer }
}

fn local(clock: &Arc<ManualClock>) -> Arc<dyn Limiter> {
    Arc::new(LocalLimiter::with_config(
        LocalLimiterConfig::default(),
        clock.clone(),
    ))
}

impl App {
    async fn send(&self, headers: &[(&str, &str)]) -> Response<Body> {
        let upstream = tower::service_fn(|_req: Request<Body>| async {
            Ok::<_, Infallible>(Response::new(Body::from("upstream")))
        });
        let mut request = Request::builder().uri("/orders");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request.body(Body::empty()).unwrap();
        self.layer.layer(upstream).oneshot(request).await.unwrap()
    }
}

fn header(r: &Response<Body>, name: impl http::header::AsHeaderName) -> &str {
    r.headers()
        .get(name)
        .map(|v| v.to_str().unwrap())
        .unwrap_or("")
}

async fn json(r: Response<Body>) -> serde_json::Value {
    let body = r.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&body).unwrap()
}

#[tokio::test]
async fn admitted_responses_carry_the_headers() {
    let clock = Arc::new(ManualClock::new(Duration::from_secs(UNIX_NOW)));
    let app = app(local(&clock), clock.clone());
    let r = app.send(&[("x-tenant", "acme")]).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, X_RATELIMIT_LIMIT), "5");
    assert_eq!(header(&r, X_RATELIMIT_REMAINING), "4");
    // One token used, refilled in 10 s: that next token is also the last one missing, so
    // here the draft's t (next unit) and Reset (full bucket) name the same second.
    assert_eq!(header(&r, X_RATELIMIT_RESET), (UNIX_NOW + 10).to_string());
    assert_eq!(header(&r, RATELIMIT), "\"tenant\";r=4;t=10");
    assert_eq!(header(&r, RATELIMIT_POLICY), "\"tenant\";q=1;w=10");
    assert!(r.headers().get(RETRY_AFTER).is_none());
}

#[tokio::test]
async fn remaining_decreases_by_the_cost() {
    let clock = Arc::new(ManualClock::default());
    let app = app(local(&clock), clock.clone());
    let r = app.send(&[("x-tenant", "acme"), ("x-cost", "2")]).await;
    assert_eq!(header(&r, X_RATELIMIT_REMAINING), "3");
    let r = app.send(&[("x-tenant", "acme"), ("x-cost", "2")]).await;
    assert_eq!(header(&r, X_RATELIMIT_REMAINING), "1");
    let r = app.send(&[("x-tenant", "acme"), ("x-cost", "2")]).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn burst_then_429_problem_json() {
    let clock = Arc::new(ManualClock::new(Duration::from_secs(UNIX_NOW)));
    let app = app(local(&clock), clock.clone());
    for _ in 0..5 {
        assert_eq!(
            app.send(&[("x-tenant", "acme")]).await.status(),
            StatusCode::OK
        );
    }
    let r = app.send(&[("x-tenant", "acme")]).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&r, CONTENT_TYPE), "application/problem+json");
    assert_eq!(header(&r, RETRY_AFTER), "10");
    assert_eq!(header(&r, X_RATELIMIT_REMAINING), "0");
    // Full again in 50 s, but t is the violated policy's Retry-After.
    assert_eq!(header(&r, X_RATELIMIT_RESET), (UNIX_NOW + 50).to_string());
    assert_eq!(header(&r, RATELIMIT), "\"tenant\";r=0;t=10");
    let body = json(r).await;
    assert_eq!(
        body["type"],
        "https://iana.org/assignments/http-problem-types#quota-exceeded"
    );
    assert_eq!(body["status"], 429);
    assert_eq!(body["policy"], "tenant");
    assert_eq!(body["violated-policies"], serde_json::json!(["tenant"]));
    assert_eq!(body["limit"], 5);
    assert_eq!(body["remaining"], 0);
    assert_eq!(body["retry_after"], 10);
    assert_eq!(body["reset"], UNIX_NOW + 50);

    // After Retry-After the next request is admitted; another tenant was never affected.
    clock.advance(Duration::from_secs(10));
    assert_eq!(
        app.send(&[("x-tenant", "acme")]).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        app.send(&[("x-tenant", "other")]).await.status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn daily_quota_429_names_the_quota_and_waits_until_midnight() {
    // 2026-11-21T23:59:00Z; midnight is 60 s away.
    const START: u64 = 1_795_305_540;
    const MIDNIGHT: u64 = 1_795_305_600;
    let clock = Arc::new(ManualClock::new(Duration::from_secs(START)));
    let tenant = Arc::new(Policy::try_new("tenant", 100, Duration::from_secs(1), 100).unwrap());
    let daily = Arc::new(Policy::calendar("daily_quota", 3, Period::Day).unwrap());
    let layer = RateLimitLayer::new(local(&clock), move |req: &http::request::Parts| {
        let id = req.headers.get("x-tenant")?.to_str().ok()?;
        let principal = Principal::Tenant(id);
        Some(
            LimitRequest::new()
                .with(LimitKey::tenant(id), tenant.clone(), 1)
                .with(LimitKey::period(principal, Period::Day), daily.clone(), 1),
        )
    })
    .with_clock(clock.clone());
    let app = App { layer };

    for remaining in ["2", "1", "0"] {
        let r = app.send(&[("x-tenant", "acme")]).await;
        assert_eq!(r.status(), StatusCode::OK);
        // The quota is the most restrictive policy, so it is the one in the headers.
        assert_eq!(header(&r, X_RATELIMIT_REMAINING), remaining);
        assert_eq!(header(&r, X_RATELIMIT_LIMIT), "3");
        assert_eq!(header(&r, X_RATELIMIT_RESET), MIDNIGHT.to_string());
        assert_eq!(header(&r, RATELIMIT_POLICY), "\"daily_quota\";q=3;w=86400");
    }
    let r = app.send(&[("x-tenant", "acme")]).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&r, RETRY_AFTER), "60");
    assert_eq!(header(&r, X_RATELIMIT_RESET), MIDNIGHT.to_string());
    assert_eq!(header(&r, RATELIMIT), "\"daily_quota\";r=0;t=60");
    let body = json(r).await;
    assert_eq!(body["policy"], "daily_quota");
    assert_eq!(
        body["violated-policies"],
        serde_json::json!(["daily_quota"])
    );
    assert_eq!(body["period"], "day");
    assert_eq!(body["retry_after"], 60);
    assert_eq!(body["reset"], MIDNIGHT);
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail.contains("resets at 2026-11-22T00:00:00Z"),
        "{detail}"
    );

    // 30.5 s later, 29.5 s are left: Retry-After still reaches midnight, rounded up.
    clock.advance(Duration::from_millis(30_500));
    let r = app.send(&[("x-tenant", "acme")]).await;
    assert_eq!(header(&r, RETRY_AFTER), "30");
    // Another tenant has its own quota; at midnight acme has a new one.
    assert_eq!(
        app.send(&[("x-tenant", "other")]).await.status(),
        StatusCode::OK
    );
    clock.advance(Duration::from_millis(29_500));
    let r = app.send(&[("x-tenant", "acme")]).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, X_RATELIMIT_REMAINING), "2");
}

#[tokio::test]
async fn shadow_policy_never_rejects_but_reports() {
    let clock = Arc::new(ManualClock::default());
    let app = app(local(&clock), clock.clone());
    for i in 0..4 {
        let r = app.send(&[("x-tenant", "acme"), ("x-shadow", "1")]).await;
        assert_eq!(r.status(), StatusCode::OK, "request {i}");
        // The exhausted shadow bucket is the most restrictive, so it is reported.
        assert_eq!(header(&r, RATELIMIT), "\"shadow\";r=0;t=10");
        assert!(r.headers().get(RETRY_AFTER).is_none());
    }
    // Once the tenant bucket refuses too, only the enforced policy is named as violated:
    // the shadow one refused nothing.
    let fifth = app.send(&[("x-tenant", "acme"), ("x-shadow", "1")]).await;
    assert_eq!(fifth.status(), StatusCode::OK, "the tenant's burst is 5");
    let r = app.send(&[("x-tenant", "acme"), ("x-shadow", "1")]).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        json(r).await["violated-policies"],
        serde_json::json!(["tenant"])
    );
}

#[tokio::test]
async fn requests_without_limits_pass_untouched() {
    let clock = Arc::new(ManualClock::default());
    let app = app(local(&clock), clock.clone());
    let r = app.send(&[]).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.headers().get(X_RATELIMIT_LIMIT).is_none());
    assert_eq!(
        r.into_body().collect().await.unwrap().to_bytes(),
        "upstream"
    );
}

#[tokio::test]
async fn store_down_fail_closed_is_503_with_retry_after() {
    let clock = Arc::new(ManualClock::default());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = RedisLimiterConfig {
        timeout: Duration::from_millis(50),
        key_prefix: String::new(),
    };
    let redis = RedisLimiter::open(&format!("redis://127.0.0.1:{port}"), config).unwrap();
    let fallback = FallbackConfig {
        mode: FailMode::Closed,
        ..FallbackConfig::default()
    };
    let limiter = FallbackLimiter::with_clock(Arc::new(redis), fallback, clock.clone());
    let app = app(Arc::new(limiter), clock);
    let r = app.send(&[("x-tenant", "acme")]).await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(header(&r, RETRY_AFTER), "1");
    assert_eq!(header(&r, CONTENT_TYPE), "application/problem+json");
    let body = json(r).await;
    assert_eq!(body["status"], 503);
    assert_eq!(body["retry_after"], 1);
}

#[test]
fn layer_fits_an_axum_router() {
    let clock = Arc::new(ManualClock::default());
    let app = app(local(&clock), clock);
    let _router: axum::Router = axum::Router::new()
        .route("/", axum::routing::get(|| async { "ok" }))
        .layer(app.layer);
}

/// The value of counter `name` with exactly `labels`, from the debugging recorder.
fn counter(snapshot: &[(CompositeKey, DebugValue)], name: &str, labels: &[(&str, &str)]) -> u64 {
    snapshot
        .iter()
        .find(|(key, _)| {
            let key = key.key();
            key.name() == name
                && labels
                    .iter()
                    .all(|(k, v)| key.labels().any(|l| l.key() == *k && l.value() == *v))
        })
        .map(|(_, value)| match value {
            DebugValue::Counter(n) => *n,
            _ => 0,
        })
        .unwrap_or(0)
}

#[tokio::test]
async fn decisions_and_shadow_rejections_are_counted() {
    // The only test in this binary that installs a global recorder; its policy names are
    // unique so other tests' decisions cannot leak into the asserted series.
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().unwrap();

    let clock = Arc::new(ManualClock::default());
    let enforced = Arc::new(Policy::try_new("metered", 1, Duration::from_secs(10), 2).unwrap());
    let shadow = Arc::new(
        Policy::try_new("metered-shadow", 1, Duration::from_secs(10), 1)
            .unwrap()
            .with_shadow(true),
    );
    let layer = RateLimitLayer::new(local(&clock), move |_: &http::request::Parts| {
        Some(
            LimitRequest::new()
                .with(LimitKey::tenant("m"), enforced.clone(), 1)
                .with(LimitKey::custom("m", "shadow"), shadow.clone(), 1),
        )
    });
    let app = App { layer };
    let statuses: Vec<StatusCode> = [
        app.send(&[]).await.status(),
        app.send(&[]).await.status(),
        app.send(&[]).await.status(),
    ]
    .into();
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );

    let snapshot: Vec<(CompositeKey, DebugValue)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(k, _, _, v)| (k, v))
        .collect();
    let decisions = "ratelimit_decisions_total";
    assert_eq!(
        counter(
            &snapshot,
            decisions,
            &[("policy", "metered"), ("outcome", "allowed")]
        ),
        2
    );
    assert_eq!(
        counter(
            &snapshot,
            decisions,
            &[("policy", "metered"), ("outcome", "rejected")]
        ),
        1
    );
    let shadow_labels = [("policy", "metered-shadow"), ("outcome", "shadow_rejected")];
    assert_eq!(counter(&snapshot, decisions, &shadow_labels), 2);
    let shadow_total = "ratelimit_shadow_rejections_total";
    assert_eq!(
        counter(&snapshot, shadow_total, &[("policy", "metered-shadow")]),
        2
    );
}
