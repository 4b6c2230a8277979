//! Stores failing under load: Redis paused and killed, PostgreSQL restarted. No request may
//! hang past its deadline, the configured failure mode must hold, and everything recovers
//! without restarting the gateway.

use std::time::Duration;

use portcullis_testkit::gateway::GatewayProcess;
use portcullis_testkit::postgres::PostgresServer;
use portcullis_testkit::redis::RedisServer;
use portcullis_testkit::upstream::ScriptedUpstream;

use crate::common::{client, BIN};

/// A request may take this long at most while a store misbehaves (state timeout 100 ms,
/// retry total 2 s, plus scheduling slack on a loaded 2-core machine).
const NO_HANG: Duration = Duration::from_secs(5);

fn config(upstream: &str, storage: &str, mode: &str) -> String {
    format!(
        "{storage}state_timeout = \"100ms\"\n\n[rate_limit]\non_store_error = \"{mode}\"\nreplicas = 1\n\n[[tenants]]\nid = \"acme\"\napi_keys = [\"acme-key-0001\"]\nrate = 100000\nper = \"1s\"\nburst = 100000\n\n[[upstreams]]\nname = \"u\"\nendpoints = [\"{upstream}\"]\nretry = {{ max_retries = 0, total = \"2s\" }}\n\n[[routes]]\nprefix = \"/\"\nupstream = \"u\"\nidempotency = {{ lease = \"2s\" }}\n"
    )
}

/// Sends `count` requests (every third one keyed) and returns the statuses; panics if any
/// takes longer than [`NO_HANG`].
async fn load(gateway: &GatewayProcess, count: usize, tag: &str) -> Vec<u16> {
    let http = client();
    let mut statuses = Vec::with_capacity(count);
    for i in 0..count {
        let mut request = http
            .post(gateway.url() + "/load")
            .bearer_auth("acme-key-0001")
            .body("{}");
        if i % 3 == 0 {
            request = request.header("idempotency-key", format!("{tag}-{i}"));
        }
        let response = tokio::time::timeout(NO_HANG, request.send())
            .await
            .unwrap_or_else(|_| panic!("request {i} ({tag}) hung past {NO_HANG:?}"))
            .unwrap();
        statuses.push(response.status().as_u16());
    }
    statuses
}

#[tokio::test]
async fn redis_paused_then_killed_under_load_fail_open_keeps_serving_and_recovers() {
    let mut redis = RedisServer::start().await;
    let upstream = ScriptedUpstream::start(vec![]).await;
    let storage = format!("[storage]\nstate = \"{}\"\n", redis.url());
    let gateway = GatewayProcess::start(BIN, &config(&upstream.url(), &storage, "fail_open")).await;
    assert!(load(&gateway, 30, "before").await.iter().all(|s| *s == 200));

    // SIGSTOP: Redis accepts nothing but the connection stays open — the nastiest failure.
    redis.guard().expect("redis child").signal("STOP");
    let paused = load(&gateway, 30, "paused").await;
    redis.guard().expect("redis child").signal("CONT");
    // Unkeyed requests fail open (admitted by the local limiter); keyed ones are never
    // forwarded unprotected: 503 while the idempotency store is unreachable.
    for (i, status) in paused.iter().enumerate() {
        let expected = if i % 3 == 0 { [503, 503] } else { [200, 200] };
        assert!(expected.contains(status), "paused request {i}: {status}");
    }

    redis.kill();
    let killed = load(&gateway, 30, "killed").await;
    assert!(
        killed
            .iter()
            .enumerate()
            .all(|(i, s)| if i % 3 == 0 { *s == 503 } else { *s == 200 }),
        "{killed:?}"
    );

    redis.restart().await;
    let mut recovered = false;
    for round in 0..20 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        if load(&gateway, 3, &format!("after-{round}"))
            .await
            .iter()
            .all(|s| *s == 200)
        {
            recovered = true;
            break;
        }
    }
    assert!(
        recovered,
        "keyed and unkeyed traffic recovered once Redis was back"
    );
}

#[tokio::test]
async fn redis_killed_under_load_fail_closed_answers_503_with_retry_after() {
    let mut redis = RedisServer::start().await;
    let upstream = ScriptedUpstream::start(vec![]).await;
    let storage = format!("[storage]\nstate = \"{}\"\n", redis.url());
    let gateway =
        GatewayProcess::start(BIN, &config(&upstream.url(), &storage, "fail_closed")).await;
    redis.kill();
    let before = upstream.hit_count();
    for i in 0..20 {
        let response = tokio::time::timeout(
            NO_HANG,
            client()
                .get(gateway.url() + "/x")
                .bearer_auth("acme-key-0001")
                .send(),
        )
        .await
        .unwrap_or_else(|_| panic!("request {i} hung"))
        .unwrap();
        assert_eq!(response.status(), 503);
        assert!(response.headers().contains_key("retry-after"));
    }
    assert_eq!(upstream.hit_count(), before, "fail_closed forwards nothing");
    redis.restart().await;
    let mut recovered = false;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let response = client()
            .get(gateway.url() + "/x")
            .bearer_auth("acme-key-0001")
            .send()
            .await
            .unwrap();
        if response.status() == 200 {
            recovered = true;
            break;
        }
    }
    assert!(recovered);
}

#[tokio::test]
async fn postgres_restart_under_load_is_served_from_the_cached_tenant_snapshot() {
    let postgres = PostgresServer::start().await;
    let database = portcullis_testkit::postgres::fresh_database_on(&postgres.url()).await;
    let upstream = ScriptedUpstream::start(vec![]).await;
    let storage = format!("[storage]\ndatabase = \"{database}\"\n");
    let gateway = GatewayProcess::start(BIN, &config(&upstream.url(), &storage, "fail_open")).await;
    assert!(load(&gateway, 10, "pg-before")
        .await
        .iter()
        .all(|s| *s == 200));

    postgres.stop();
    // Tenants and keys come from the in-memory snapshot: authenticated traffic keeps flowing.
    assert!(load(&gateway, 30, "pg-down")
        .await
        .iter()
        .all(|s| *s == 200));
    let ready = client()
        .get(gateway.admin_url() + "/readyz")
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 503, "readiness reports the database outage");

    postgres.start_again().await;
    assert!(load(&gateway, 10, "pg-back")
        .await
        .iter()
        .all(|s| *s == 200));
    let mut ready_again = false;
    for _ in 0..20 {
        if client()
            .get(gateway.admin_url() + "/readyz")
            .send()
            .await
            .unwrap()
            .status()
            == 200
        {
            ready_again = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(ready_again, "the pool reconnects by itself");
}
