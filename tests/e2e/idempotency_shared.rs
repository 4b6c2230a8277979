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

#[tokio::test]
async fn a_killed_holder_leaves_a_lease_that_expires_and_is_taken_over() {
    let upstream = ScriptedUpstream::start(vec![Step::stall(
        Duration::from_secs(20),
        Step::respond(201, &[], "never seen"),
    )])
    .await;
    upstream.set_fallback(Step::respond(201, &[], "second holder"));
    let storage = format!("[storage]\nstate = \"{}\"\n", redis::shared_url());
    let retry_and_lease = "lease = \"2s\"";
    let config = keyed_config(&upstream.url(), &storage, "", retry_and_lease).replace(
        "retry = { max_retries = 0, base = \"10ms\", cap = \"50ms\" }",
        "retry = { max_retries = 0, base = \"10ms\", cap = \"50ms\", total = \"1s\" }\nattempt_timeout = \"30s\"",
    );
    let mut first = GatewayProcess::start(BIN, &config).await;
    let key = format!("crash-{}", rand_suffix());
    let url = first.url();
    let key_clone = key.clone();
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
    let mut taken_over = false;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let response = keyed_post(&second, &key).await;
        if response.status() == 201 {
            assert_eq!(response.text().await.unwrap(), "second holder");
            taken_over = true;
            break;
        }
    }
    assert!(
        taken_over,
        "after the lease expired a retry took the key over"
    );
    assert_eq!(upstream.hit_count(), 2);
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
