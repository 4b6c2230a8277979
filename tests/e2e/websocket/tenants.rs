//! A tenant created through the admin API (SQLite, and PostgreSQL under `scripts/test.sh`)
//! with its own WebSocket limits: its `max_websockets` refuses the handshake over it with 429
//! before the upstream sees it, and its `websocket_idle_timeout`, stricter than the route's,
//! closes its tunnels with 1001. The admin API's 422s name each invalid field.

use std::time::Duration;

use portcullis_testkit::gateway::{GatewayOptions, GatewayProcess};
use portcullis_testkit::postgres;
use reqwest::Method;
use serde_json::{json, Value};

use super::{client_as, config, ws_url, Echo};
use crate::common::{client, BIN};

const TOKEN: &str = "e2e-admin-token-websockets-0123";

async fn start(echo: &Echo, database: Option<&str>) -> GatewayProcess {
    let storage = database
        .map(|d| format!("[storage]\ndatabase = \"{d}\"\n\n"))
        .unwrap_or_default();
    // The route's own idle timeout is long; the tenant's is what closes.
    let text = format!(
        "{}\n{storage}",
        config(echo, "websocket_idle_timeout = \"60s\"", "")
    );
    let options = GatewayOptions {
        env: vec![("PORTCULLIS_ADMIN_TOKEN".to_owned(), TOKEN.to_owned())],
        ..GatewayOptions::default()
    };
    GatewayProcess::start_with(BIN, &text, options).await
}

async fn admin(gw: &GatewayProcess, method: Method, path: &str, body: Value) -> (u16, Value) {
    let response = client()
        .request(method, format!("{}/admin/v1{path}", gw.admin_url()))
        .bearer_auth(TOKEN)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// Waits (bounded) until the upstream has seen `n` handshakes.
async fn handshakes(echo: &Echo, n: usize) {
    for _ in 0..200 {
        if echo.events("request").len() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("upstream saw {:?}", echo.events("request"));
}

async fn tenant_limits_apply(database: Option<&str>) {
    let echo = Echo::start().await;
    let gw = start(&echo, database).await;
    let (status, created) = admin(
        &gw,
        Method::POST,
        "/tenants",
        json!({"id": "chat", "rate": 100, "burst": 100, "max_websockets": 1}),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["max_websockets"], 1);
    assert_eq!(created["websocket_idle_timeout"], Value::Null);
    let (status, issued) = admin(&gw, Method::POST, "/tenants/chat/keys", json!({})).await;
    assert_eq!(status, 201, "{issued}");
    let key = issued["api_key"].as_str().unwrap().to_owned();
    let url = ws_url(&gw, "/ws");
    // The key reaches the replica's directory within its refresh.
    let mut holder = None;
    for _ in 0..20 {
        let attempt = tokio::spawn({
            let (url, key) = (url.clone(), key.clone());
            async move { client_as("wait", &url, "3", Some(&key)).await }
        });
        for _ in 0..400 {
            if !echo.events("request").is_empty() || attempt.is_finished() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        if !echo.events("request").is_empty() {
            holder = Some(attempt);
            break;
        }
        let result = attempt.await.unwrap();
        assert_eq!(result["status"], 401, "not propagated yet: {result}");
    }
    let holder = holder.expect("the key works within the refresh");
    let allowed = 1;
    handshakes(&echo, allowed).await;
    let refused = client_as("echo", &url, "1", Some(&key)).await;
    assert_eq!(refused["status"], 429, "{refused}");
    assert_eq!(
        echo.events("request").len(),
        allowed,
        "the handshake over the tenant's cap never reached the upstream"
    );
    assert_eq!(holder.await.unwrap()["error"], "not closed in time");
    echo.closed(1).await;

    let (status, patched) = admin(
        &gw,
        Method::PATCH,
        "/tenants/chat",
        json!({"websocket_idle_timeout": "300ms"}),
    )
    .await;
    assert_eq!(status, 200, "{patched}");
    assert_eq!(patched["websocket_idle_timeout"], "300ms");
    // Within the refresh, the tenant's idle timeout closes its next tunnel.
    let mut last = Value::Null;
    for _ in 0..4 {
        last = client_as("wait", &url, "5", Some(&key)).await;
        if last["code"] == 1001 {
            break;
        }
    }
    assert_eq!(last["code"], 1001, "{last}");
    assert_eq!(last["reason"], "idle timeout");
    let closed = echo.events("closed");
    assert_eq!(closed.last().unwrap()["code"], 1001, "{closed:?}");
}

#[tokio::test]
async fn an_admin_api_tenant_has_its_own_websocket_cap_and_idle_timeout() {
    tenant_limits_apply(None).await;
}

#[tokio::test]
async fn an_admin_api_tenant_has_its_own_websocket_limits_on_postgres() {
    let database = postgres::fresh_database().await;
    tenant_limits_apply(Some(&database)).await;
}

#[tokio::test]
async fn invalid_websocket_limits_are_422s_naming_the_field() {
    let echo = Echo::start().await;
    let gw = start(&echo, None).await;
    let (status, problem) = admin(
        &gw,
        Method::POST,
        "/tenants",
        json!({"id": "bad", "rate": 1, "burst": 1, "max_websockets": 0,
               "websocket_idle_timeout": "-1s", "websocket_max_lifetime": 30}),
    )
    .await;
    assert_eq!(status, 422, "{problem}");
    let errors = problem["errors"].as_array().unwrap();
    for error in errors {
        let reason = error["reason"].as_str().unwrap();
        assert!(!reason.contains("unknown"), "a known field: {error}");
    }
    let mut fields: Vec<&str> = errors
        .iter()
        .map(|e| e["field"].as_str().unwrap())
        .collect();
    fields.sort_unstable();
    assert_eq!(
        fields,
        [
            "max_websockets",
            "websocket_idle_timeout",
            "websocket_max_lifetime"
        ]
    );
    let (status, _) = admin(
        &gw,
        Method::POST,
        "/tenants",
        json!({"id": "ok", "rate": 1, "burst": 1}),
    )
    .await;
    assert_eq!(status, 201);
    for (field, value) in [
        ("max_websockets", json!(-3)),
        ("max_websockets", json!("7")),
        ("websocket_idle_timeout", json!("0s")),
        ("websocket_max_lifetime", json!("8d")),
    ] {
        let (status, problem) =
            admin(&gw, Method::PATCH, "/tenants/ok", json!({ field: value })).await;
        assert_eq!(status, 422, "{field} = {value}: {problem}");
        assert_eq!(problem["errors"][0]["field"], field, "{problem}");
        let reason = problem["errors"][0]["reason"].as_str().unwrap();
        assert!(!reason.contains("unknown"), "{problem}");
    }
}
