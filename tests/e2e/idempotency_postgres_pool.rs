//! The PostgreSQL idempotency store's connection pool through the real binary: keyed POSTs
//! over raw sockets, the upstream's count of executions, the database's view of the
//! gateway's connections (`storage.postgres_pool_size`), and a database restart.

use std::net::SocketAddr;
use std::time::Duration;

use portcullis_testkit::gateway::{parse_status, raw_request, GatewayProcess};
use portcullis_testkit::postgres::PostgresServer;
use portcullis_testkit::upstream::{ScriptedUpstream, Step};
use sqlx::{ConnectOptions, Connection};

use crate::common::BIN;
use crate::idempotency_replay::keyed_config;

/// `application_name` of the store's connections (the idempotency crate's constant).
const STORE_APPLICATION: &str = "portcullis-idempotency";

/// A keyed POST written as raw bytes; returns the status and the whole response.
async fn raw_keyed_post(addr: SocketAddr, key: &str) -> (Option<u16>, String) {
    let body = "{\"amount\":100}";
    let request = format!(
        "POST /pay HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer acme-key-0001\r\n\
         Idempotency-Key: {key}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let response = raw_request(addr, request.as_bytes())
        .await
        .unwrap_or_default();
    (
        parse_status(&response),
        String::from_utf8_lossy(&response).into_owned(),
    )
}

/// Connections the store holds to `database` (the URL's last path segment).
async fn store_connections(database_url: &str) -> i64 {
    let options: sqlx::postgres::PgConnectOptions = database_url.parse().unwrap();
    let name = database_url.rsplit('/').next().unwrap().to_owned();
    let mut conn = options.connect().await.unwrap();
    let n = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND application_name = $2",
    )
    .bind(name)
    .bind(STORE_APPLICATION)
    .fetch_one(&mut conn)
    .await
    .unwrap();
    conn.close().await.ok();
    n
}

#[tokio::test]
async fn pool_size_bounds_connections_and_a_database_restart_costs_no_restart() {
    let postgres = PostgresServer::start().await;
    let database = portcullis_testkit::postgres::fresh_database_on(&postgres.url()).await;
    // The upstream is slow enough that 24 concurrent first executions overlap.
    let upstream = ScriptedUpstream::start_with_fallback(
        vec![],
        Step::stall(
            Duration::from_millis(50),
            Step::respond(201, &[], "charged"),
        ),
    )
    .await;
    let storage = format!("[storage]\nidempotency = \"{database}\"\npostgres_pool_size = 2\n");
    let gateway =
        GatewayProcess::start(BIN, &keyed_config(&upstream.url(), &storage, "", "")).await;
    let addr = gateway.addr;

    // 24 concurrent keyed first executions: each runs once upstream and is stored.
    let firsts: Vec<_> = (0..24)
        .map(|i| tokio::spawn(async move { raw_keyed_post(addr, &format!("pool-{i}")).await }))
        .collect();
    for first in firsts {
        let (status, text) = first.await.unwrap();
        assert_eq!(status, Some(201), "{text}");
    }
    assert_eq!(upstream.hit_count(), 24);
    let keys: std::collections::HashSet<_> = upstream
        .hits()
        .iter()
        .filter_map(|h| h.headers.get("idempotency-key").cloned())
        .collect();
    assert_eq!(
        keys.len(),
        24,
        "each key reached the upstream once, with its key"
    );
    // The store never opened more connections than configured (sqlx's pool allowed 16).
    let open = store_connections(&database).await;
    assert!(
        (1..=2).contains(&open),
        "storage.postgres_pool_size = 2, the store holds {open} connections"
    );
    // Replays come from the store; the upstream sees nothing more.
    for i in 0..24 {
        let (status, text) = raw_keyed_post(addr, &format!("pool-{i}")).await;
        assert_eq!(status, Some(201), "{text}");
        assert!(
            text.to_ascii_lowercase()
                .contains("idempotent-replayed: true"),
            "{text}"
        );
    }
    assert_eq!(upstream.hit_count(), 24);

    // The database restarts: keyed requests are refused (503 problem+json), never forwarded
    // unprotected, and served again afterwards by the same gateway process.
    postgres.stop();
    let (status, text) = raw_keyed_post(addr, "during-outage").await;
    assert_eq!(status, Some(503), "{text}");
    assert!(text.contains("application/problem+json"), "{text}");
    assert!(text.to_ascii_lowercase().contains("retry-after:"), "{text}");
    assert_eq!(
        upstream.hit_count(),
        24,
        "nothing forwarded while the store is down"
    );
    postgres.start_again().await;
    let mut recovered = None;
    for attempt in 0..50 {
        let (status, _) = raw_keyed_post(addr, &format!("after-outage-{attempt}")).await;
        if status == Some(201) {
            recovered = Some(attempt);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let attempt = recovered.expect("the gateway serves keyed requests again after the restart");
    // Only the request that was answered 201 reached the upstream.
    assert_eq!(upstream.hit_count(), 25, "after {attempt} refused attempts");
    // A key stored before the restart is still replayed (the completion was durable).
    let (status, text) = raw_keyed_post(addr, "pool-0").await;
    assert_eq!(status, Some(201), "{text}");
    assert!(
        text.to_ascii_lowercase()
            .contains("idempotent-replayed: true"),
        "{text}"
    );
    assert_eq!(upstream.hit_count(), 25);
}
