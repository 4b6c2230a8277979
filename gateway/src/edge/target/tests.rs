use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use http::{HeaderValue, Version};
use http_body_util::BodyExt;
use tower::ServiceExt;

use super::*;
use crate::plumbing::step::{StepLayer, StepService};
use tower::{Layer, Service};

/// What the inner service saw: (uri, Host values).
type Seen = Arc<Mutex<Vec<(Uri, Vec<HeaderValue>)>>>;

fn service(
    seen: Seen,
) -> StepService<
    impl Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Clone,
    Target,
> {
    StepLayer::new(Target).layer(tower::service_fn(move |request: Request<Body>| {
        let hosts = request
            .headers()
            .get_all(header::HOST)
            .iter()
            .cloned()
            .collect();
        seen.lock().unwrap().push((request.uri().clone(), hosts));
        async { Ok::<_, Infallible>(Response::new(Body::empty())) }
    }))
}

fn request(version: Version, target: &str, hosts: &[&str]) -> Request<Body> {
    let mut builder = Request::builder().version(version).uri(target);
    for host in hosts {
        builder = builder.header(header::HOST, *host);
    }
    builder.body(Body::empty()).unwrap()
}

async fn problem(response: Response<Body>) -> serde_json::Value {
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        response.headers()[header::CONTENT_TYPE],
        "application/problem+json"
    );
    let body = response.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&body).unwrap()
}

#[tokio::test]
async fn the_inner_service_sees_the_normal_target() {
    let seen = Seen::default();
    let svc = service(seen.clone());
    for (target, expected) in [
        ("/x/../secure/a?q=%2e%2F..", "/secure/a?q=%2e%2F.."),
        ("//secure/a", "/secure/a"),
        ("/%73ecure/a", "/secure/a"),
        ("/already/normal?x", "/already/normal?x"),
    ] {
        let response = svc
            .clone()
            .oneshot(request(Version::HTTP_11, target, &["gw"]))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{target}");
        let (uri, _) = seen.lock().unwrap().pop().unwrap();
        assert_eq!(uri.to_string(), expected, "{target}");
    }
}

#[tokio::test]
async fn absolute_form_authority_becomes_the_host() {
    let seen = Seen::default();
    let svc = service(seen.clone());
    let response = svc
        .clone()
        .oneshot(request(
            Version::HTTP_11,
            "http://api.example/./a",
            &["other"],
        ))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let (uri, hosts) = seen.lock().unwrap().pop().unwrap();
    assert_eq!(uri.to_string(), "http://api.example/a");
    assert_eq!(hosts, vec![HeaderValue::from_static("api.example")]);

    let response = svc
        .oneshot(request(
            Version::HTTP_11,
            "http://api.example?q=1",
            &["api.example"],
        ))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let (uri, _) = seen.lock().unwrap().pop().unwrap();
    assert_eq!(uri.path_and_query().unwrap().as_str(), "/?q=1");
}

#[tokio::test]
async fn refusals_are_problems_with_a_reason() {
    let seen = Seen::default();
    let svc = service(seen.clone());
    let cases = [
        (
            Version::HTTP_11,
            "/a%2Fb",
            &["gw"][..],
            "invalid-path",
            "encoded-slash",
        ),
        (
            Version::HTTP_11,
            "/../a",
            &["gw"],
            "invalid-path",
            "dot-segment-above-root",
        ),
        (
            Version::HTTP_11,
            "*",
            &["gw"],
            "invalid-path",
            "asterisk-form",
        ),
        (
            Version::HTTP_11,
            "gw:443",
            &["gw"],
            "invalid-path",
            "authority-form",
        ),
        (Version::HTTP_11, "/a", &[], "invalid-host", "missing-host"),
        (
            Version::HTTP_11,
            "/a",
            &["a", "b"],
            "invalid-host",
            "duplicate-host",
        ),
        (
            Version::HTTP_2,
            "http://a/x",
            &["b"],
            "invalid-host",
            "host-authority-mismatch",
        ),
    ];
    for (version, target, hosts, slug, reason) in cases {
        let response = svc
            .clone()
            .oneshot(request(version, target, hosts))
            .await
            .unwrap();
        let body = problem(response).await;
        assert_eq!(
            body["type"],
            format!("https://portcullis.dev/problems/{slug}"),
            "{target}"
        );
        assert_eq!(body["reason"], reason, "{target}");
        assert!(body["detail"].as_str().is_some_and(|d| !d.is_empty()));
    }
    assert!(seen.lock().unwrap().is_empty(), "a refused request went on");
}
