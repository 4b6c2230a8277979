//! The admin API through the real binary: CRUD on SQLite and PostgreSQL, authentication,
//! keys issued/used/revoked, plaintext never stored or logged, live propagation across two
//! replicas, audit before/after, 422s naming fields, idempotency records, and the CLI.

use std::time::Duration;

use portcullis_testkit::gateway::{GatewayOptions, GatewayProcess};
use portcullis_testkit::upstream::ScriptedUpstream;
use reqwest::Method;
use serde_json::{json, Value};

use crate::common::{assert_problem, client, single_route_config, BIN};

// Full CRUD round trip with audit before/after, on SQLite and PostgreSQL.
mod crud;
// Keys used and revoked, plaintext nowhere, two replicas, idempotency records, the CLI.
mod live;

const TOKEN: &str = "e2e-admin-token-0123456789";
/// Propagation promise of the contract; polls below are bounded by it.
const WITHIN: Duration = Duration::from_secs(1);

fn config(upstream: &ScriptedUpstream, database: Option<&str>, route_extra: &str) -> String {
    let storage = database
        .map(|d| format!("[storage]\ndatabase = \"{d}\"\n\n"))
        .unwrap_or_default();
    // The polls below retry a key that has not propagated yet 40 times a second, which the
    // failed-authentication limit would rightly take for guessing.
    format!(
        "{storage}[auth]\nfailure_limit = 0\n\n{}{route_extra}\n",
        single_route_config(&upstream.url(), "")
    )
}

fn with_token(extra: &[(&str, &str)]) -> GatewayOptions {
    let mut env = vec![("PORTCULLIS_ADMIN_TOKEN".to_owned(), TOKEN.to_owned())];
    env.extend(
        extra
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    GatewayOptions {
        env,
        ..GatewayOptions::default()
    }
}

async fn start(upstream: &ScriptedUpstream, database: Option<&str>) -> GatewayProcess {
    GatewayProcess::start_with(BIN, &config(upstream, database, ""), with_token(&[])).await
}

/// `method path` on the admin API with the token; the raw response.
async fn send(
    gw: &GatewayProcess,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> reqwest::Response {
    let mut request = client()
        .request(method, format!("{}/admin/v1{path}", gw.admin_url()))
        .bearer_auth(TOKEN)
        .header("x-admin-actor", "e2e");
    if let Some(body) = body {
        request = request.json(&body);
    }
    request.send().await.unwrap()
}

/// Like [`send`], expecting `status`; the JSON body (problem bodies are checked too).
async fn admin(
    gw: &GatewayProcess,
    method: Method,
    path: &str,
    body: Option<Value>,
    status: u16,
) -> Value {
    let response = send(gw, method.clone(), path, body).await;
    if status >= 400 {
        return assert_problem(response, status).await;
    }
    let actual = response.status().as_u16();
    let text = response.text().await.unwrap();
    assert_eq!(actual, status, "{method} {path}: {text}");
    serde_json::from_str(&text).unwrap_or(Value::Null)
}

async fn proxied_status(gw: &GatewayProcess, key: &str) -> u16 {
    let response = client()
        .get(gw.url() + "/x")
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    response.status().as_u16()
}

/// Polls every 25 ms until `proxied_status` is `want`, for at most [`WITHIN`] from `since`.
async fn wait_status(
    gw: &GatewayProcess,
    key: &str,
    want: u16,
    since: tokio::time::Instant,
) -> bool {
    while since.elapsed() < WITHIN {
        if proxied_status(gw, key).await == want {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    false
}

fn actions(audit: &Value) -> Vec<&str> {
    audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect()
}

#[tokio::test]
async fn admin_calls_without_or_with_a_wrong_token_get_401() {
    let upstream = ScriptedUpstream::start(vec![]).await;
    let gw = start(&upstream, None).await;
    let url = format!("{}/admin/v1/tenants", gw.admin_url());
    for auth in [
        None,
        Some("Bearer not-the-admin-token"),
        Some(&*format!("Basic {TOKEN}")),
    ] {
        let mut request = client()
            .post(&url)
            .json(&json!({"id": "x", "rate": 1, "burst": 1}));
        if let Some(auth) = auth {
            request = request.header("authorization", auth);
        }
        let response = request.send().await.unwrap();
        assert_eq!(
            response.headers()["www-authenticate"],
            "Bearer realm=\"portcullis-admin\""
        );
        assert_problem(response, 401).await;
    }
    assert_eq!(
        admin(&gw, Method::GET, "/tenants", None, 200).await["items"],
        json!([]),
        "nothing was created"
    );
    let openapi = admin(&gw, Method::GET, "/openapi.json", None, 200).await;
    assert_eq!(openapi["openapi"], "3.1.0");
    assert!(openapi["paths"]["/admin/v1/tenants/{id}/keys"]["post"].is_object());
    assert!(
        !gw.logs().contains("not-the-admin-token"),
        "refused tokens are not logged"
    );
}

#[tokio::test]
async fn without_a_token_the_admin_api_is_not_served() {
    let upstream = ScriptedUpstream::start(vec![]).await;
    let gw = GatewayProcess::start(BIN, &config(&upstream, None, "")).await;
    for auth in [None, Some(TOKEN)] {
        let mut request = client().get(format!("{}/admin/v1/tenants", gw.admin_url()));
        if let Some(token) = auth {
            request = request.bearer_auth(token);
        }
        let body = assert_problem(request.send().await.unwrap(), 404).await;
        assert!(body["detail"]
            .as_str()
            .unwrap()
            .contains("PORTCULLIS_ADMIN_TOKEN"));
    }
    let metrics = client()
        .get(format!("{}/metrics", gw.admin_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(metrics.status(), 200, "operations endpoints stay up");
    assert!(gw.logs().contains("admin API disabled"), "{}", gw.logs());
}

#[tokio::test]
async fn invalid_input_is_422_naming_the_field_and_writes_nothing() {
    let upstream = ScriptedUpstream::start(vec![]).await;
    let gw = start(&upstream, None).await;
    let fields = |problem: &Value| -> Vec<String> {
        problem["errors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["field"].as_str().unwrap().to_owned())
            .collect()
    };
    let bad = json!({"id": "no spaces", "rate": 0, "per": 5, "burst": 10, "extra": true});
    let problem = admin(&gw, Method::POST, "/tenants", Some(bad), 422).await;
    assert_eq!(fields(&problem), ["id", "rate", "per", "extra"]);
    assert_eq!(
        problem["errors"][1],
        json!({"field": "rate", "reason": "must be ≥ 1"})
    );
    let response = client()
        .post(format!("{}/admin/v1/tenants", gw.admin_url()))
        .bearer_auth(TOKEN)
        .body("{\"id\":")
        .send()
        .await
        .unwrap();
    assert_eq!(fields(&assert_problem(response, 422).await), ["body"]);

    admin(
        &gw,
        Method::POST,
        "/tenants",
        Some(json!({"id": "acme", "rate": 10, "burst": 10})),
        201,
    )
    .await;
    let problem = admin(
        &gw,
        Method::PATCH,
        "/tenants/acme/quota",
        Some(json!({"burst": -1, "rate": "fast"})),
        422,
    )
    .await;
    assert_eq!(fields(&problem), ["rate", "burst"]);
    let problem = admin(
        &gw,
        Method::PUT,
        "/tenants/acme/route-quotas",
        Some(json!({"route": "/nope", "rate": 1, "burst": 1})),
        422,
    )
    .await;
    assert_eq!(fields(&problem), ["route"]);
    admin(
        &gw,
        Method::PATCH,
        "/tenants/nope/quota",
        Some(json!({"burst": 5})),
        404,
    )
    .await;
    assert_eq!(
        admin(&gw, Method::GET, "/tenants/acme", None, 200).await["burst"],
        10
    );
    assert_eq!(
        actions(&admin(&gw, Method::GET, "/audit", None, 200).await),
        ["tenant.create"]
    );
}
