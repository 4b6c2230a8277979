//! Idempotency across processes: shared Redis and Postgres stores, a gateway killed while it
//! holds a key, and the store going away.

use std::time::Duration;

use portcullis_testkit::gateway::GatewayProcess;
use portcullis_testkit::redis::RedisServer;
use portcullis_testkit::upstream::{ScriptedUpstream, Step};
use portcullis_testkit::{postgres, redis};

use crate::common::{assert_problem, client, BIN};
use crate::idempotency_replay::keyed_config;

async fn keyed_post(gateway: &GatewayProcess, key: &str) -> reqwest::Response {
    client()
        .post(gateway.url() + "/pay")
        .bearer_auth("acme-key-0001")
        .header("idempotency-key", key)
        .body("{\"amount\":100}")
        .send()
        .await
        .unwrap()
}

async fn two_gateways_dedupe(storage: &str) {
    let upstream =
        ScriptedUpstream::start_with_fallback(vec![], Step::respond(201, &[], "charged")).await;
    let config = keyed_config(&upstream.url(), storage, "", "");
    let a = GatewayProcess::start(BIN, &config).await;
    let b = GatewayProcess::start(BIN, &config).await;
    let key = format!("shared-{}", rand_suffix());
    assert_eq!(keyed_post(&a, &key).await.status(), 201);
    let replay = keyed_post(&b, &key).await;
    assert_eq!(replay.status(), 201);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(upstream.hit_count(), 1);
}

fn rand_suffix() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u8(0);
    hasher.finish()
}

#[tokio::test]
async fn two_gateways_sharing_redis_dedupe() {
    two_gateways_dedupe(&format!("[storage]\nstate = \"{}\"\n", redis::shared_url())).await;
}

#[tokio::test]
async fn two_gateways_sharing_postgres_dedupe() {
    let database = postgres::fresh_database().await;
    two_gateways_dedupe(&format!(
        "[storage]\nidempotency = \"{database}\"\ndatabase = \"{database}\"\n"
    ))
    .await;
}

/// Starts a gateway on shared Redis, sends a keyed POST the upstream stalls on, kills the
/// gateway with SIGKILL while it holds the key, and starts a second one. Returns the second
/// gateway, the key and the upstream.
async fn kill_while_holding(dedupes: bool) -> (GatewayProcess, String, ScriptedUpstream) {
    let upstream = ScriptedUpstream::start(vec![Step::stall(
        Duration::from_secs(20),
        Step::respond(201, &[], "never seen"),
    )])
    .await;
    upstream.set_fallback(Step::respond(201, &[], "second holder"));
    let storage = format!("[storage]\nstate = \"{}\"\n", redis::shared_url());
    let dedupe_line = if dedupes {
        "dedupes_idempotency_keys = true"
    } else {
        ""
    };
    let config = keyed_config(&upstream.url(), &storage, dedupe_line, "lease = \"2s\"").replace(
        "retry = { max_retries = 0, base = \"10ms\", cap = \"50ms\" }",
        "retry = { max_retries = 0, base = \"10ms\", cap = \"50ms\", total = \"1s\" }\nattempt_timeout = \"30s\"",
    );
    let mut first = GatewayProcess::start(BIN, &config).await;
    let key = format!("crash-{}", rand_suffix());
    let (url, key_clone) = (first.url(), key.clone());
    let stalled = tokio::spawn(async move {
        client()
            .post(url + "/pay")
            .bearer_auth("acme-key-0001")
            .header("idempotency-key", key_clone)
            .body("{\"amount\":100}")
            .send()
            .await
    });
    for _ in 0..100 {
        if upstream.hit_count() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(upstream.hit_count(), 1);
    first.guard().kill(); // SIGKILL while holding the key
    let _ = stalled.await;
    let second = GatewayProcess::start(BIN, &config).await;
    let busy = keyed_post(&second, &key).await;
    assert_eq!(busy.status(), 409, "the lease is still held");
    assert!(busy.headers().contains_key("retry-after"));
    (second, key, upstream)
}

/// Retries `key` every 250 ms (bounded) until it is no longer 409; returns that response.
async fn after_lease(gateway: &GatewayProcess, key: &str) -> reqwest::Response {
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let response = keyed_post(gateway, key).await;
        if response.status() != 409 {
            return response;
        }
    }
    panic!("the key stayed locked past its lease");
}

#[tokio::test]
async fn a_killed_holder_lease_expires_and_the_takeover_reports_the_ambiguous_outcome() {
    let (second, key, upstream) = kill_while_holding(false).await;
    // The killed holder had already sent the request: executing it again could charge twice.
    // The new holder takes the key over and stores "outcome unknown" instead.
    let taken_over = after_lease(&second, &key).await;
    let body = assert_problem(taken_over, 502).await;
    assert!(
        body["type"]
            .as_str()
            .unwrap()
            .ends_with("idempotency-previous-attempt-interrupted"),
        "{body}"
    );
    let replay = keyed_post(&second, &key).await;
    assert_eq!(replay.status(), 502);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(upstream.hit_count(), 1, "never executed twice");
}

#[tokio::test]
async fn a_killed_holder_lease_expires_and_a_deduping_upstream_gets_the_retry() {
    let (second, key, upstream) = kill_while_holding(true).await;
    // The backend dedupes on the forwarded key, so re-sending is safe.
    let taken_over = after_lease(&second, &key).await;
    assert_eq!(taken_over.status(), 201);
    assert_eq!(taken_over.text().await.unwrap(), "second holder");
    assert_eq!(upstream.hit_count(), 2);
    assert!(upstream
        .hits()
        .iter()
        .all(|h| h.headers["idempotency-key"] == key.as_str()));
}

#[tokio::test]
async fn store_down_refuses_keyed_requests_but_unkeyed_ones_flow() {
    let mut server = RedisServer::start().await;
    let upstream =
        ScriptedUpstream::start_with_fallback(vec![], Step::respond(201, &[], "ok")).await;
    let config = keyed_config(
        &upstream.url(),
        &format!("[storage]\nidempotency = \"{}\"\n", server.url()),
        "",
        "",
    );
    let gateway = GatewayProcess::start(BIN, &config).await;
    assert_eq!(keyed_post(&gateway, "before").await.status(), 201);
    server.kill();
    let refused = keyed_post(&gateway, "during").await;
    assert!(refused.headers().contains_key("retry-after"));
    assert_problem(refused, 503).await;
    let unkeyed = client()
        .post(gateway.url() + "/pay")
        .bearer_auth("acme-key-0001")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(unkeyed.status(), 201);
    assert_eq!(
        upstream.hit_count(),
        2,
        "the keyed request was never forwarded unprotected"
    );
}
