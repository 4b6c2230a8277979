//! Asynchronous routes on the other queue engines: the same accept, dedupe, retry schedule
//! and dead letter on PostgreSQL (the shared server of `scripts/test.sh`, a fresh database),
//! Redis and Redis Cluster; and a queue that goes away answers 503 with `Retry-After`,
//! claiming nothing as accepted.

use std::time::Duration;

use portcullis_testkit::gateway::GatewayProcess;
use portcullis_testkit::redis::RedisServer;
use portcullis_testkit::upstream::{ScriptedUpstream, Step};

use crate::async_delivery::{accept, config, header, metric, status_of, until};
use crate::common::{client, BIN};

/// On the queue at `url`: a duplicate is not stored again, a failing upstream is retried on
/// the schedule with one key, a 400 is dead at once and counted.
async fn scenario(url: &str) {
    let upstream = ScriptedUpstream::start_with_fallback(
        vec![Step::status(503), Step::status(503)],
        Step::ok("done"),
    )
    .await;
    let storage = format!("[storage]\nqueue = \"{url}\"\n");
    let delivery = ", max_retries = 3, schedule = [\"150ms\", \"300ms\"]";
    let gateway = GatewayProcess::start(BIN, &config(&upstream, delivery, &storage)).await;
    let key = format!("k-{}", std::process::id());
    let (id, _) = accept(&gateway, &[("idempotency-key", &key)], "payload").await;
    let (again, _) = accept(&gateway, &[("idempotency-key", &key)], "payload").await;
    assert_eq!(id, again, "the duplicate names the original");
    until("delivered on the third attempt", || {
        upstream.hit_count() >= 3
    })
    .await;
    let hits = upstream.hits();
    assert_eq!(hits.len(), 3, "{hits:?}");
    for hit in &hits {
        assert_eq!(header(hit, "idempotency-key"), format!("delivery-{id}"));
    }
    for (i, step) in [150u64, 300].iter().enumerate() {
        let gap = hits[i + 1].at.duration_since(hits[i].at);
        assert!(
            gap >= Duration::from_millis(*step),
            "retry {} after {gap:?}",
            i + 1
        );
    }
    // A 400 next: dead at once, counted.
    upstream.set_fallback(Step::status(400));
    let (dead, _) = accept(&gateway, &[], "refused").await;
    let mut counted = false;
    for _ in 0..300 {
        if metric(&gateway, "dlq_messages_total{queue=\"hooks\"}").await >= 1.0 {
            counted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(counted, "dlq_messages_total never rose");
    assert_eq!(status_of(&gateway, &dead, None).await.1["state"], "dead");
    assert_eq!(upstream.hit_count(), 4, "one attempt for the 400");
}

#[tokio::test]
async fn postgres_queue_accepts_dedupes_retries_and_dead_letters() {
    let url = portcullis_testkit::postgres::fresh_database().await;
    scenario(&url).await;
}

#[tokio::test]
async fn redis_queue_accepts_dedupes_retries_and_dead_letters() {
    let redis = RedisServer::start().await;
    scenario(&redis.url()).await;
}

#[tokio::test]
async fn a_queue_that_goes_away_is_a_503_and_nothing_is_accepted() {
    let mut redis = RedisServer::start().await;
    let upstream = ScriptedUpstream::start_with_fallback(vec![], Step::ok("done")).await;
    let storage = format!("[storage]\nqueue = \"{}\"\n", redis.url());
    let gateway = GatewayProcess::start(BIN, &config(&upstream, "", &storage)).await;
    accept(&gateway, &[], "before").await;
    until("the first message delivered", || upstream.hit_count() >= 1).await;
    redis.kill();
    let response = client()
        .post(gateway.url() + "/hooks/event")
        .body("after")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert!(
        response.headers().get("retry-after").is_some(),
        "{:?}",
        response.headers()
    );
    assert!(response.headers().get("portcullis-delivery-id").is_none());
    let text = response.text().await.unwrap();
    assert!(text.contains("queue-unavailable"), "{text}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        upstream.hit_count(),
        1,
        "the refused request was delivered anyway"
    );
}

#[tokio::test]
async fn redis_cluster_queue_accepts_dedupes_retries_and_dead_letters() {
    let url = portcullis_testkit::redis_cluster::shared_url()
        .unwrap_or_else(|| panic!("no Redis Cluster: run with scripts/test.sh, which starts one"));
    scenario(&url).await;
}
