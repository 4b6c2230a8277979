use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::Ordering;

use http_body_util::BodyExt;
use portcullis_control::{Database, Directory, Tenant};
use tower::{Layer, ServiceExt};

use super::*;
use crate::config::Config;
use crate::pipeline::resolve::tests::context_on;
use crate::plumbing::step::StepLayer;

const CONFIG: &str = r#"
[[tenants]]
id = "acme"
api_keys = ["acme-key-0001"]
rate = 1000
per = "1s"
burst = 1000
concurrency_limit = 2

[[tenants]]
id = "other"
api_keys = ["other-key-0001"]
rate = 1000
per = "1s"
burst = 1000

[[upstreams]]
name = "u"
endpoints = ["http://127.0.0.1:9"]

[[routes]]
prefix = "/"
upstream = "u"

[[routes]]
prefix = "/export"
upstream = "u"
concurrency_per_caller = 1
"#;

/// The tenants of [`CONFIG`] as the directory builds them.
async fn tenants() -> (HashMap<&'static str, Arc<Tenant>>, tempfile::TempDir) {
    let config = Config::parse(CONFIG, &HashMap::<String, String>::new()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let db = Database::sqlite(&dir.path().join("c.db")).await.unwrap();
    db.upsert_tenants(&crate::start::tenant_seeds(&config.tenants))
        .await
        .unwrap();
    let snapshot = Directory::open(&db).await.unwrap().snapshot();
    let get = |id| snapshot.by_id(id).unwrap().clone();
    (
        HashMap::from([("acme", get("acme")), ("other", get("other"))]),
        dir,
    )
}

fn limiter() -> Concurrency {
    let config = Config::parse(CONFIG, &HashMap::<String, String>::new()).unwrap();
    Concurrency::new(&config.routes)
}

fn request(path: &str, caller: Caller, ip: [u8; 4]) -> Request<Body> {
    let mut request = Request::new(Body::empty());
    let context = context_on(CONFIG, path, caller, IpAddr::from(ip));
    request.extensions_mut().insert(context);
    request
}

async fn problem(response: Response<Body>) -> serde_json::Value {
    let body = response.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&body).unwrap()
}

#[tokio::test]
async fn a_tenant_over_its_limit_gets_429_with_the_concurrency_policy() {
    let (tenants, _dir) = tenants().await;
    let acme = || Caller::Tenant(tenants["acme"].clone());
    let limiter = limiter();
    let first = limiter
        .step(&mut request("/a", acme(), [10, 0, 0, 1]))
        .unwrap();
    let second = limiter
        .step(&mut request("/b", acme(), [10, 0, 0, 2]))
        .unwrap();
    assert_eq!(tenants["acme"].in_flight().load(Ordering::Relaxed), 2);

    let refused = limiter
        .step(&mut request("/c", acme(), [10, 0, 0, 3]))
        .unwrap_err();
    assert_eq!(refused.status(), 429);
    let headers = refused.headers();
    assert_eq!(headers["retry-after"], "1");
    assert_eq!(headers["ratelimit-policy"], "\"concurrency\";q=2");
    assert_eq!(headers["ratelimit"], "\"concurrency\";r=0;t=1");
    assert_eq!(headers["content-type"], "application/problem+json");
    let json = problem(refused).await;
    assert_eq!(
        json["type"],
        "https://portcullis.dev/problems/concurrency-limited"
    );
    assert_eq!(
        json["violated-policies"],
        serde_json::json!(["concurrency"])
    );
    assert_eq!(
        (json["limit"].as_u64(), json["scope"].as_str()),
        (Some(2), Some("tenant"))
    );
    assert_eq!(
        tenants["acme"].in_flight().load(Ordering::Relaxed),
        2,
        "a refusal holds nothing"
    );
    assert_eq!(
        tenants["acme"].rate_limited_total(),
        1,
        "counted in the usage view's rejected_total like the rate limiter's 429s"
    );

    let other = Caller::Tenant(tenants["other"].clone());
    assert!(
        limiter
            .step(&mut request("/a", other, [10, 0, 0, 1]))
            .is_ok(),
        "another tenant is unaffected (and has no limit)"
    );
    drop(first);
    let third = limiter.step(&mut request("/c", acme(), [10, 0, 0, 3]));
    assert!(third.is_ok(), "a finished request gives its slot back");
    drop((second, third));
    assert_eq!(tenants["acme"].in_flight().load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn a_route_limit_counts_each_caller_apart() {
    let (tenants, _dir) = tenants().await;
    let limiter = limiter();
    let anonymous = |ip| request("/export/x", Caller::Anonymous, ip);
    let held = limiter.step(&mut anonymous([10, 0, 0, 1])).unwrap();
    let refused = limiter.step(&mut anonymous([10, 0, 0, 1])).unwrap_err();
    assert_eq!(refused.headers()["ratelimit-policy"], "\"concurrency\";q=1");
    assert_eq!(problem(refused).await["scope"], "route");
    assert!(
        limiter.step(&mut anonymous([10, 0, 0, 2])).is_ok(),
        "another address"
    );
    assert!(
        limiter
            .step(&mut request("/other", Caller::Anonymous, [10, 0, 0, 1]))
            .is_ok(),
        "another route"
    );

    // A tenant refused by the route gives its tenant slot back at once.
    let acme = || Caller::Tenant(tenants["acme"].clone());
    let on_route = limiter
        .step(&mut request("/export/a", acme(), [10, 0, 0, 9]))
        .unwrap();
    let refused = limiter.step(&mut request("/export/b", acme(), [10, 0, 0, 8]));
    assert_eq!(refused.unwrap_err().status(), 429);
    assert_eq!(tenants["acme"].in_flight().load(Ordering::Relaxed), 1);
    drop((held, on_route));
    assert!(limiter.step(&mut anonymous([10, 0, 0, 1])).is_ok());
}

#[tokio::test]
async fn the_slot_is_held_by_the_body_and_freed_when_the_client_goes() {
    let (tenants, _dir) = tenants().await;
    let acme = || Caller::Tenant(tenants["acme"].clone());
    let count = || tenants["acme"].in_flight().load(Ordering::Relaxed);
    let answering = StepLayer::new(limiter()).layer(tower::service_fn(|_req| async {
        Ok::<_, std::convert::Infallible>(Response::new(Body::from("done")))
    }));
    let response = answering
        .clone()
        .oneshot(request("/a", acme(), [10, 0, 0, 1]))
        .await
        .unwrap();
    assert_eq!(count(), 1, "the response is out, its body not yet sent");
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!((body.as_ref(), count()), (b"done".as_ref(), 0));

    // An upstream that never answers: the client gives up, the request future is dropped.
    let stalled = StepLayer::new(limiter()).layer(tower::service_fn(|_req| {
        std::future::pending::<Result<Response<Body>, std::convert::Infallible>>()
    }));
    let pending = stalled.oneshot(request("/a", acme(), [10, 0, 0, 1]));
    let mut pending = Box::pin(pending);
    assert!(futures_util::FutureExt::now_or_never(&mut pending).is_none());
    assert_eq!(count(), 1);
    drop(pending);
    assert_eq!(count(), 0, "a dropped request frees its slot");
}
