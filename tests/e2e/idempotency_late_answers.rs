//! A keyed POST whose upstream attempt timed out: the client gets its 504 at once, the
//! exchange runs on until the record's lease ends, retries meanwhile get 409 in flight, and
//! once the upstream answers its real response is replayed. One execution throughout.

use std::time::Duration;

use portcullis_testkit::gateway::GatewayProcess;
use portcullis_testkit::upstream::{Gate, ScriptedUpstream, Step};

use crate::common::{assert_problem, client, BIN};
use crate::idempotency_replay::keyed_config;

async fn post(gateway: &GatewayProcess, key: &str) -> reqwest::Response {
    client()
        .post(gateway.url() + "/orders")
        .bearer_auth("acme-key-0001")
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body("{\"amount\":5}")
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_timed_out_keyed_post_replays_the_real_answer_once_it_lands() {
    let gate = Gate::new();
    let upstream = ScriptedUpstream::start(vec![Step::gated(
        &gate,
        Step::respond(201, &[("content-type", "application/json")], "{\"id\":7}"),
    )])
    .await;
    let config = keyed_config(&upstream.url(), "", "attempt_timeout = \"300ms\"", "");
    let gateway = GatewayProcess::start(BIN, &config).await;

    // The attempt times out: the client that waited learns it at once.
    let first = post(&gateway, "late-1").await;
    let problem = assert_problem(first, 504).await;
    assert_eq!(upstream.hit_count(), 1, "{problem}");

    // The upstream is still working on it: a retry is told to come back, not re-executed.
    let early = post(&gateway, "late-1").await;
    assert_eq!(early.status(), 409, "{:?}", early.headers());
    assert!(early.headers().contains_key("retry-after"));

    // The upstream completes; retries soon replay its real answer.
    gate.open();
    let mut replay = None;
    for _ in 0..100 {
        let response = post(&gateway, "late-1").await;
        if response.status() != 409 {
            replay = Some(response);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let replay = replay.expect("the real answer was replayed within 100 retries");
    assert_eq!(replay.status(), 201);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.text().await.unwrap(), "{\"id\":7}");

    // What the upstream received: exactly one execution, with the client's body.
    let hits = upstream.hits();
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].body, "{\"amount\":5}");
    assert_eq!(hits[0].headers["idempotency-key"], "late-1");
}
