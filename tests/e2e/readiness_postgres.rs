//! `/readyz` over PostgreSQL, against a private server the tests change under the gateway
//! (`pipeline::health`): a directory database (`storage.database`) that still answers
//! `SELECT 1` but refuses writes, and a PostgreSQL idempotency store (`storage.idempotency`)
//! that goes down, each turn readiness 503 within 2 s naming the store, and 200 again once
//! it is back.

use std::net::SocketAddr;
use std::time::Duration;

use portcullis_testkit::gateway::{parse_status, raw_request, GatewayProcess};
use portcullis_testkit::postgres::{fresh_database_on, PostgresServer};
use portcullis_testkit::upstream::ScriptedUpstream;
use sqlx::{ConnectOptions, Connection};

use crate::common::BIN;
use crate::idempotency_replay::keyed_config;

/// `GET /readyz` on `addr` over a raw connection: the status and the whole answer.
async fn readyz(addr: SocketAddr) -> (Option<u16>, String) {
    let answer = raw_request(
        addr,
        b"GET /readyz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap_or_default();
    (
        parse_status(&answer),
        String::from_utf8_lossy(&answer).into_owned(),
    )
}

/// Polls `/readyz` on `addr` until it answers `want`, at most `polls` times 100 ms apart;
/// the answer that did.
async fn readyz_becomes(addr: SocketAddr, want: u16, polls: usize) -> Option<String> {
    for _ in 0..polls {
        let (status, text) = readyz(addr).await;
        if status == Some(want) {
            return Some(text);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// A keyed POST (`Idempotency-Key: key`) as raw bytes; its status.
async fn keyed_post(addr: SocketAddr, key: &str) -> Option<u16> {
    let body = "{\"amount\":1}";
    let request = format!(
        "POST /pay HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer acme-key-0001\r\n\
         Idempotency-Key: {key}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    parse_status(
        &raw_request(addr, request.as_bytes())
            .await
            .unwrap_or_default(),
    )
}

/// Runs `statements` as the superuser on `server_url`, each on its own (`ALTER SYSTEM`
/// refuses a transaction block).
async fn as_superuser(server_url: &str, statements: &[&str]) {
    let options: sqlx::postgres::PgConnectOptions = server_url.parse().unwrap();
    let mut conn = options.connect().await.unwrap();
    for statement in statements {
        sqlx::query(statement).execute(&mut conn).await.unwrap();
    }
    conn.close().await.ok();
}

#[tokio::test]
async fn readyz_names_the_database_when_it_stops_accepting_writes() {
    let postgres = PostgresServer::start().await;
    let database = fresh_database_on(&postgres.url()).await;
    let upstream = ScriptedUpstream::start(vec![]).await;
    let storage = format!("[storage]\ndatabase = \"{database}\"\n");
    let gateway =
        GatewayProcess::start(BIN, &keyed_config(&upstream.url(), &storage, "", "")).await;
    let (status, text) = readyz(gateway.admin_addr).await;
    assert_eq!(status, Some(200), "{text}");

    // Every session's transactions become read-only (as on a standby after a fail-over):
    // `SELECT 1` still answers, every write is refused.
    as_superuser(
        &postgres.url(),
        &[
            "ALTER SYSTEM SET default_transaction_read_only = on",
            "SELECT pg_reload_conf()",
        ],
    )
    .await;
    // Within 2 s (20 polls 100 ms apart, each answer bounded by the check's 1 s), on both
    // listeners.
    let text = readyz_becomes(gateway.admin_addr, 503, 20)
        .await
        .unwrap_or_else(|| panic!("/readyz still 200, database read-only\n{}", gateway.logs()));
    assert!(text.contains("database"), "names the database: {text}");
    assert!(text.contains("read-only"), "and why: {text}");
    let (status, text) = readyz(gateway.addr).await;
    assert_eq!(status, Some(503), "{text}");

    // Writable again: ready again.
    as_superuser(
        &postgres.url(),
        &[
            "SET default_transaction_read_only = off",
            "ALTER SYSTEM RESET default_transaction_read_only",
            "SELECT pg_reload_conf()",
        ],
    )
    .await;
    assert!(
        readyz_becomes(gateway.admin_addr, 200, 50).await.is_some(),
        "ready again once writable\n{}",
        gateway.logs()
    );
}

#[tokio::test]
async fn readyz_names_the_postgres_idempotency_store_while_it_is_down() {
    let postgres = PostgresServer::start().await;
    let database = fresh_database_on(&postgres.url()).await;
    let upstream = ScriptedUpstream::start(vec![]).await;
    let storage = format!("[storage]\nidempotency = \"{database}\"\n");
    let gateway =
        GatewayProcess::start(BIN, &keyed_config(&upstream.url(), &storage, "", "")).await;
    let (status, text) = readyz(gateway.addr).await;
    assert_eq!(status, Some(200), "{text}");
    assert_eq!(keyed_post(gateway.addr, "ready-1").await, Some(200));

    postgres.stop();
    let text = readyz_becomes(gateway.addr, 503, 20)
        .await
        .unwrap_or_else(|| panic!("/readyz still 200, store down\n{}", gateway.logs()));
    assert!(
        text.contains("storage.idempotency (postgres)"),
        "names the store: {text}"
    );
    // What readiness promised: a keyed write is refused, and never reached the upstream.
    assert_eq!(keyed_post(gateway.addr, "ready-2").await, Some(503));
    assert_eq!(upstream.hit_count(), 1);
    // /healthz stays liveness only.
    let answer = raw_request(
        gateway.addr,
        b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap_or_default();
    assert_eq!(parse_status(&answer), Some(200));

    postgres.start_again().await;
    assert!(
        readyz_becomes(gateway.addr, 200, 100).await.is_some(),
        "ready again once the store is back\n{}",
        gateway.logs()
    );
    assert_eq!(keyed_post(gateway.addr, "ready-3").await, Some(200));
    assert_eq!(upstream.hit_count(), 2);
}
