//! The PostgreSQL store's own connection pool, against a real server
//! (`PORTCULLIS_TEST_DATABASE_URL`, see `tests/conformance.rs`):
//!
//! - a connection reset by the server (restart, `pg_terminate_backend`) costs at most one
//!   failed call, transient; the next calls reconnect and re-prepare their statements;
//! - a pool whose every connection is busy answers `PoolExhausted` (transient) instead of
//!   queueing the caller past its timeout, and recovers once the connection is free;
//! - a first execution is exactly two exchanges with the server, counted on the wire by a
//!   loopback proxy (a `Sync` message each; no release ping, no re-`Parse`).

// Test code: a failed unwrap is a failed test (clippy only exempts `#[test]` fns).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use portcullis_idempotency::store::postgres::APPLICATION_NAME;
use portcullis_idempotency::{
    Completion, Fingerprint, FingerprintInput, IdempotencyKey, LockOutcome, PostgresSettings,
    PostgresStore, RecordKey, Store, StoreError, StoredResponse,
};
use sqlx::postgres::{PgConnectOptions, PgConnection, PgSslMode};
use sqlx::{ConnectOptions, Connection, Executor};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

/// A fresh database with the migrations applied, dropped on `finish`.
struct Db {
    server: PgConnectOptions,
    name: String,
}

impl Db {
    async fn new() -> Self {
        let url = std::env::var("PORTCULLIS_TEST_DATABASE_URL").expect(
            "PORTCULLIS_TEST_DATABASE_URL is not set: run the README test script (scripts/test.sh)",
        );
        let server: PgConnectOptions = url.parse().unwrap();
        let name = format!("idem_pool_{:016x}", rand::random::<u64>());
        let mut admin = server.connect().await.unwrap();
        admin
            .execute(format!(r#"CREATE DATABASE "{name}""#).as_str())
            .await
            .unwrap();
        let mut conn = server.clone().database(&name).connect().await.unwrap();
        sqlx::migrate!("../migrations/postgres")
            .run(&mut conn)
            .await
            .unwrap();
        Self { server, name }
    }

    fn options(&self) -> PgConnectOptions {
        self.server.clone().database(&self.name)
    }

    async fn admin(&self) -> PgConnection {
        self.options().connect().await.unwrap()
    }

    async fn store(&self, pool_size: usize, timeout: Duration) -> PostgresStore {
        let settings = PostgresSettings { pool_size, timeout };
        PostgresStore::connect_with(self.options(), settings)
            .await
            .unwrap()
    }

    /// Server process ids of the store's connections to this database.
    async fn store_backends(&self, admin: &mut PgConnection) -> Vec<i32> {
        sqlx::query_scalar(
            "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND application_name = $2 \
             ORDER BY pid",
        )
        .bind(&self.name)
        .bind(APPLICATION_NAME)
        .fetch_all(admin)
        .await
        .unwrap()
    }

    async fn finish(self) {
        if let Ok(mut c) = self.server.connect().await {
            let _ = c
                .execute(format!(r#"DROP DATABASE "{}" WITH (FORCE)"#, self.name).as_str())
                .await;
        }
    }
}

fn key(k: &str) -> RecordKey {
    RecordKey::new(
        "t",
        "/orders",
        IdempotencyKey::parse(k.as_bytes(), 64).unwrap(),
    )
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

const LEASE: Duration = Duration::from_secs(30);
const RETENTION: Duration = Duration::from_secs(600);

/// One first execution (lock + complete); the store error if either fails.
async fn first_execution(store: &PostgresStore, k: &str) -> Result<(), StoreError> {
    let fencing = match store.try_lock(&key(k), &fp(), LEASE, RETENTION).await? {
        LockOutcome::Acquired { fencing, .. } => fencing,
        other => panic!("fresh key {k} must lock, got {other:?}"),
    };
    let resp = StoredResponse::new(StatusCode::CREATED, &HeaderMap::new(), Bytes::from("ok"));
    store
        .complete(&key(k), fencing, Completion::Response(resp), RETENTION)
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepared_statements_survive_a_connection_reset() {
    let db = Db::new().await;
    let store = db.store(2, Duration::from_secs(5)).await;
    let mut admin = db.admin().await;
    first_execution(&store, "before").await.unwrap();
    let before = db.store_backends(&mut admin).await;
    assert!(!before.is_empty(), "the store holds a connection");

    // The server drops every store connection (as a restart or an operator would).
    for pid in &before {
        let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .fetch_one(&mut admin)
            .await
            .unwrap();
        assert!(killed);
    }

    // At most the first call notices the dead connection, and it says so transiently (503).
    match first_execution(&store, "during").await {
        Ok(()) => {}
        Err(e) => {
            assert!(e.is_transient(), "a reset connection is transient: {e:?}");
            first_execution(&store, "during-retry").await.unwrap();
        }
    }
    // Later calls run on fresh connections, statements prepared again on first use.
    for i in 0..5 {
        first_execution(&store, &format!("after-{i}"))
            .await
            .unwrap();
    }
    let after = db.store_backends(&mut admin).await;
    assert!(!after.is_empty());
    assert!(
        after.iter().all(|pid| !before.contains(pid)),
        "the store reconnected: {before:?} -> {after:?}"
    );
    admin.close().await.ok();
    drop(store);
    db.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exhausted_pool_gives_a_clear_transient_error() {
    let db = Db::new().await;
    // A long call timeout: the blocked call must outlive the second call's wait (half of it).
    let store = Arc::new(db.store(1, Duration::from_secs(6)).await);
    let mut admin = db.admin().await;

    // Another session inserts the key and keeps its transaction open: the store's
    // `try_lock` of the same key waits for that row lock, holding the pool's only connection.
    let mut blocker = db.admin().await;
    blocker.execute("BEGIN").await.unwrap();
    sqlx::query(
        "INSERT INTO idempotency_records (tenant, route, key, fingerprint, state, fencing_token, \
         lease_until, expires_at) VALUES ('t', '/orders', 'held', $1, 'in_flight', 1, \
         now() + interval '1 hour', now() + interval '1 hour')",
    )
    .bind(&fp().as_bytes()[..])
    .execute(&mut blocker)
    .await
    .unwrap();
    let blocked = {
        let store = store.clone();
        tokio::spawn(async move { store.try_lock(&key("held"), &fp(), LEASE, RETENTION).await })
    };
    // Bounded wait until the store's statement is waiting on the row lock.
    let mut waiting = false;
    for _ in 0..100 {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND application_name = $2 \
             AND wait_event_type = 'Lock'",
        )
        .bind(&db.name)
        .bind(APPLICATION_NAME)
        .fetch_one(&mut admin)
        .await
        .unwrap();
        if n > 0 {
            waiting = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        waiting,
        "the store's try_lock never blocked on the row lock"
    );

    // Any other key now finds no free connection: a clear, transient error, not a hang.
    let err = tokio::time::timeout(Duration::from_secs(30), first_execution(&store, "other"))
        .await
        .expect("a full pool must not hang a call")
        .expect_err("the only connection is busy");
    assert!(
        matches!(err, StoreError::PoolExhausted { size: 1, .. }),
        "expected PoolExhausted, got {err:?}"
    );
    assert!(err.is_transient());
    assert_eq!(err.kind(), "pool_exhausted");

    // The blocker commits: the waiting call sees the committed in-flight row.
    blocker.execute("COMMIT").await.unwrap();
    let outcome = blocked.await.unwrap().unwrap();
    assert!(
        matches!(outcome, LockOutcome::InFlight { .. }),
        "expected InFlight, got {outcome:?}"
    );
    // And the pool serves again.
    first_execution(&store, "other").await.unwrap();

    blocker.close().await.ok();
    admin.close().await.ok();
    drop(store);
    db.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_execution_is_two_exchanges_without_pings() {
    let db = Db::new().await;
    let proxy = CountingProxy::start(&db.options()).await;
    let options = db
        .options()
        .host("127.0.0.1")
        .port(proxy.port)
        .ssl_mode(PgSslMode::Disable);
    let settings = PostgresSettings {
        pool_size: 1,
        timeout: Duration::from_secs(5),
    };
    let store = PostgresStore::connect_with(options, settings)
        .await
        .unwrap();
    // Warm up: the first use of each statement on the connection prepares it (Parse).
    first_execution(&store, "warm").await.unwrap();

    let n = 20;
    let (syncs, parses) = (proxy.count(b'S'), proxy.count(b'P'));
    for i in 0..n {
        first_execution(&store, &format!("k{i}")).await.unwrap();
    }
    // One Sync per exchange: lock, complete. A pool that pings on release sends 2 more.
    assert_eq!(
        proxy.count(b'S') - syncs,
        2 * n,
        "Sync messages (exchanges)"
    );
    assert_eq!(
        proxy.count(b'P') - parses,
        0,
        "statements are prepared once"
    );
    assert_eq!(proxy.connections(), 1, "one connection, never re-opened");
    drop(store);
    db.finish().await;
}

/// A loopback TCP proxy in front of PostgreSQL that counts the frontend messages by type
/// (plain protocol only: the store connects through it with `sslmode=disable`).
struct CountingProxy {
    port: u16,
    counts: Arc<Mutex<HashMap<u8, u64>>>,
    connections: Arc<AtomicU64>,
}

impl CountingProxy {
    async fn start(server: &PgConnectOptions) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let target = format!("{}:{}", server.get_host(), server.get_port());
        let counts = Arc::new(Mutex::new(HashMap::new()));
        let connections = Arc::new(AtomicU64::new(0));
        let (c, n) = (counts.clone(), connections.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                n.fetch_add(1, Ordering::SeqCst);
                let upstream = TcpStream::connect(&target).await.unwrap();
                let (cr, cw) = client.into_split();
                let (ur, uw) = upstream.into_split();
                tokio::spawn(pump(cr, uw, Some(c.clone())));
                tokio::spawn(pump(ur, cw, None));
            }
        });
        Self {
            port,
            counts,
            connections,
        }
    }

    fn count(&self, kind: u8) -> u64 {
        *self.counts.lock().unwrap().get(&kind).unwrap_or(&0)
    }

    fn connections(&self) -> u64 {
        self.connections.load(Ordering::SeqCst)
    }
}

/// Copies bytes; when `counts` is set, parses the frontend stream (an untyped startup
/// message, then `type, i32 length` messages) and counts messages by type.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    counts: Option<Arc<Mutex<HashMap<u8, u64>>>>,
) {
    let mut pending = Vec::new();
    let mut startup = true;
    let mut chunk = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let Some(counts) = &counts else {
            if to.write_all(&chunk[..n]).await.is_err() {
                break;
            }
            continue;
        };
        // Count before forwarding, so a count read after the reply includes the request.
        pending.extend_from_slice(&chunk[..n]);
        loop {
            let header = if startup { 4 } else { 5 };
            if pending.len() < header {
                break;
            }
            let len_bytes: [u8; 4] = pending[header - 4..header].try_into().unwrap();
            let total = header - 4 + u32::from_be_bytes(len_bytes) as usize;
            if pending.len() < total {
                break;
            }
            if !startup {
                *counts.lock().unwrap().entry(pending[0]).or_insert(0) += 1;
            }
            pending.drain(..total);
            startup = false;
        }
        if to.write_all(&chunk[..n]).await.is_err() {
            break;
        }
    }
}
