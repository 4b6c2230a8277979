//! Backend-specific behaviour outside the shared contract:
//!
//! - Redis down or stalled → a transient error within the call timeout, never a hang (each
//!   test starts and kills its own `redis-server`, so the shared one is untouched);
//! - PostgreSQL's batch reaper deletes expired rows and nothing else.
//!
//! Needs `redis-server` on `PATH` and `PORTCULLIS_TEST_DATABASE_URL` (see
//! `tests/conformance.rs`); missing either fails the test with a message.

// Test code: a failed unwrap is a failed test (clippy only exempts `#[test]` fns).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use portcullis_idempotency::{
    Completion, Fingerprint, FingerprintInput, IdempotencyKey, LockOutcome, PostgresSettings,
    PostgresStore, RecordKey, RedisStore, Store, StoredResponse,
};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Executor};

/// Kills the child by PID and waits for it on drop, so no server outlives its test.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-CONT", &self.0.id().to_string()])
            .status();
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn own_redis() -> (ChildGuard, RedisStore) {
    let port = free_port();
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
        ])
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server must be on PATH (scripts/test.sh installs it)");
    let guard = ChildGuard(child);
    let url = format!("redis://127.0.0.1:{port}");
    for _ in 0..100 {
        if let Ok(store) = RedisStore::connect(&url, Duration::from_millis(200)).await {
            return (guard, store);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("redis-server on port {port} did not become ready within 5 s");
}

fn key() -> RecordKey {
    let k = IdempotencyKey::parse(b"down-test", 64).unwrap();
    RecordKey::new(format!("t{:x}", rand::random::<u64>()), "/orders", k)
}

fn fp() -> Fingerprint {
    Fingerprint::compute(&FingerprintInput {
        method: "POST",
        path_and_query: "/orders",
        tenant: "t",
        content_type: None,
        body: b"{}",
    })
}

/// Runs `try_lock` and asserts it fails transiently well within `bound`.
async fn assert_fails_fast(store: &RedisStore, bound: Duration) {
    let started = tokio::time::Instant::now();
    let r = tokio::time::timeout(
        bound,
        store.try_lock(
            &key(),
            &fp(),
            Duration::from_secs(5),
            Duration::from_secs(60),
        ),
    )
    .await
    .expect("a store call must never hang");
    let err = r.expect_err("a dead store must not lock");
    assert!(
        err.is_transient(),
        "expected a transient error, got {err:?}"
    );
    assert!(started.elapsed() < bound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_gives_transient_error() {
    let (mut guard, store) = own_redis().await;
    let (k, f) = (key(), fp());
    let outcome = store.try_lock(&k, &f, Duration::from_secs(5), Duration::from_secs(60));
    assert!(matches!(
        outcome.await.unwrap(),
        LockOutcome::Acquired { .. }
    ));
    guard.0.kill().unwrap();
    guard.0.wait().unwrap();
    assert_fails_fast(&store, Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stalled_times_out() {
    let (guard, store) = own_redis().await;
    let store = store.with_timeout(Duration::from_millis(200));
    // SIGSTOP: the socket stays open but nothing answers (a hung or partitioned server).
    let stopped = Command::new("kill")
        .args(["-STOP", &guard.0.id().to_string()])
        .status()
        .unwrap();
    assert!(stopped.success());
    assert_fails_fast(&store, Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_reaper_deletes_only_expired_rows_in_batches() {
    let url = std::env::var("PORTCULLIS_TEST_DATABASE_URL").expect(
        "PORTCULLIS_TEST_DATABASE_URL is not set: run the README test script (scripts/test.sh)",
    );
    let server: PgConnectOptions = url.parse().unwrap();
    let db = format!("idem_reaper_{:016x}", rand::random::<u64>());
    let mut admin = server.connect().await.unwrap();
    admin
        .execute(format!(r#"CREATE DATABASE "{db}""#).as_str())
        .await
        .unwrap();
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect_with(server.clone().database(&db))
        .await
        .unwrap();
    sqlx::migrate!("../migrations/postgres")
        .run(&pool)
        .await
        .unwrap();
    let store =
        PostgresStore::connect_with(server.clone().database(&db), PostgresSettings::default())
            .await
            .unwrap();

    let short = Duration::from_millis(300);
    let long = Duration::from_secs(3600);
    for i in 0..25 {
        let k = RecordKey::new(
            "t",
            "/r",
            IdempotencyKey::parse(format!("k{i}").as_bytes(), 64).unwrap(),
        );
        let retention = if i < 20 { short } else { long };
        let LockOutcome::Acquired { fencing, .. } =
            store.try_lock(&k, &fp(), short, retention).await.unwrap()
        else {
            panic!("fresh key must lock");
        };
        let resp =
            StoredResponse::new(StatusCode::OK, &HeaderMap::new(), Bytes::from_static(b"ok"));
        store
            .complete(&k, fencing, Completion::Response(resp), retention)
            .await
            .unwrap();
    }
    tokio::time::sleep(short + Duration::from_millis(300)).await;
    assert_eq!(store.reap_expired(8).await.unwrap(), 8);
    assert_eq!(store.reap_expired(8).await.unwrap(), 8);
    assert_eq!(store.reap_expired(8).await.unwrap(), 4);
    assert_eq!(store.reap_expired(8).await.unwrap(), 0);
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM idempotency_records")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(left, 5);

    // The spawned reaper does the same periodically.
    let k = RecordKey::new("t", "/r", IdempotencyKey::parse(b"periodic", 64).unwrap());
    store.try_lock(&k, &fp(), short, short).await.unwrap();
    let reaper = store.spawn_reaper(Duration::from_millis(100), 8);
    tokio::time::sleep(Duration::from_millis(900)).await;
    reaper.abort();
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM idempotency_records")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(left, 5);

    pool.close().await;
    let _ = admin
        .execute(format!(r#"DROP DATABASE "{db}" WITH (FORCE)"#).as_str())
        .await;
}
