//! Store conformance suite: every behaviour of the `Store` contract, run against every
//! backend — `MemoryStore` on tokio's paused clock, and `RedisStore` / `PostgresStore` on
//! real servers.
//!
//! Servers come from the environment (`scripts/test.sh` exports both):
//! - `PORTCULLIS_TEST_REDIS_URL`, e.g. `redis://127.0.0.1:6391`; tests isolate themselves
//!   with a random tenant prefix (never `FLUSHALL`);
//! - `PORTCULLIS_TEST_DATABASE_URL`, a server URL on which the test may `CREATE DATABASE`;
//!   each test gets a fresh, randomly named database with the migrations applied, dropped
//!   at the end.
//!
//! If a variable is unset, that backend's tests **fail** with a message saying so: a suite
//! that silently skips its real backends proves nothing. The one exception is
//! `PORTCULLIS_TEST_REDIS_CLUSTER_URL` (`redis-cluster://h:p,…`, a real 3-master cluster
//! that `scripts/test.sh` also starts): without it the `redis_cluster` tests print a note
//! and pass, so `cargo test -p portcullis-idempotency` with a single Redis still works. On
//! the cluster each test's random tenant lands on some master; a record's keys share the
//! tenant's hash tag.
//!
//! Server-side backends decide on the server clock, which paused tokio time cannot move, so
//! leases and retentions here are short real durations (hundreds of milliseconds) and every
//! wait is bounded.

// Test code: a failed unwrap is a failed test (clippy only exempts `#[test]` fns).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};
use portcullis_idempotency::{
    Completion, Fingerprint, FingerprintInput, IdempotencyKey, LockOutcome, MemoryStore,
    PostgresSettings, PostgresStore, RecordKey, RecordState, RedisStore, Store, StoreError,
    StoredResponse,
};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, Executor};

/// Lease used throughout: long enough for a loaded CI machine to do a round trip or two.
const LEASE: Duration = Duration::from_millis(400);
/// Retention for everything except the TTL test.
const RETENTION: Duration = Duration::from_secs(60);
/// Wait that is certainly past a lease (server clocks included).
const PAST_LEASE: Duration = Duration::from_millis(600);

struct Backend {
    store: Arc<dyn Store>,
    prefix: String,
    cleanup: Option<(PgConnectOptions, String)>,
}

// === backends ===

async fn memory() -> Backend {
    Backend {
        store: Arc::new(MemoryStore::new(64 << 20)),
        prefix: "mem".into(),
        cleanup: None,
    }
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!(
            "{name} is not set: this conformance test needs a real server. Run the README \
             test script (scripts/test.sh), which starts Redis and PostgreSQL and exports \
             PORTCULLIS_TEST_REDIS_URL and PORTCULLIS_TEST_DATABASE_URL."
        )
    })
}

fn random_name() -> String {
    format!("{:016x}", rand::random::<u64>())
}

async fn redis() -> Backend {
    let url = env("PORTCULLIS_TEST_REDIS_URL");
    let store = RedisStore::connect(&url, Duration::from_secs(2))
        .await
        .unwrap_or_else(|e| panic!("cannot connect to Redis at {url}: {e}"));
    Backend {
        store: Arc::new(store),
        prefix: format!("t{}", random_name()),
        cleanup: None,
    }
}

/// `None` (with a note) when no cluster URL is set.
async fn redis_cluster() -> Option<Backend> {
    let Ok(url) = std::env::var("PORTCULLIS_TEST_REDIS_CLUSTER_URL") else {
        eprintln!(
            "PORTCULLIS_TEST_REDIS_CLUSTER_URL is not set: skipping the Redis Cluster \
             instantiation (scripts/test.sh starts a 3-master cluster and exports it)"
        );
        return None;
    };
    let nodes: Vec<String> = url
        .trim_start_matches("redis-cluster://")
        .split(',')
        .map(|n| format!("redis://{n}"))
        .collect();
    let store = RedisStore::connect_cluster(&nodes, Duration::from_secs(2))
        .await
        .unwrap_or_else(|e| panic!("cannot connect to the Redis Cluster at {url}: {e}"));
    Some(Backend {
        store: Arc::new(store),
        prefix: format!("t{}", random_name()),
        cleanup: None,
    })
}

async fn postgres() -> Backend {
    let url = env("PORTCULLIS_TEST_DATABASE_URL");
    let server: PgConnectOptions = url.parse().expect("PORTCULLIS_TEST_DATABASE_URL");
    let db = format!("idem_test_{}", random_name());
    let mut admin = server
        .connect()
        .await
        .unwrap_or_else(|e| panic!("cannot connect to PostgreSQL at {url}: {e}"));
    admin
        .execute(format!(r#"CREATE DATABASE "{db}""#).as_str())
        .await
        .expect("CREATE DATABASE");
    admin.close().await.ok();
    let pool = PgPoolOptions::new()
        .max_connections(16)
        .connect_with(server.clone().database(&db))
        .await
        .expect("connect to the test database");
    sqlx::migrate!("../migrations/postgres")
        .run(&pool)
        .await
        .expect("migrations");
    pool.close().await;
    let settings = PostgresSettings {
        timeout: Duration::from_secs(5),
        ..PostgresSettings::default()
    };
    let store = PostgresStore::connect_with(server.clone().database(&db), settings)
        .await
        .expect("connect the store");
    Backend {
        store: Arc::new(store),
        prefix: "pg".into(),
        cleanup: Some((server, db)),
    }
}

impl Backend {
    fn key(&self, tenant: &str, route: &str, key: &str) -> RecordKey {
        let k = IdempotencyKey::parse(key.as_bytes(), 64).unwrap();
        RecordKey::new(format!("{}-{tenant}", self.prefix), route, k)
    }

    async fn lock(&self, key: &RecordKey, fp: &Fingerprint) -> LockOutcome {
        self.store
            .try_lock(key, fp, LEASE, RETENTION)
            .await
            .unwrap()
    }

    async fn acquire(&self, key: &RecordKey, fp: &Fingerprint) -> u64 {
        match self.lock(key, fp).await {
            LockOutcome::Acquired { fencing, .. } => fencing,
            other => panic!("expected Acquired, got {other:?}"),
        }
    }

    async fn finish(self) {
        drop(self.store);
        if let Some((server, db)) = self.cleanup {
            if let Ok(mut c) = server.connect().await {
                let _ = c
                    .execute(format!(r#"DROP DATABASE "{db}" WITH (FORCE)"#).as_str())
                    .await;
            }
        }
    }
}

fn fp(body: &str) -> Fingerprint {
    Fingerprint::compute(&FingerprintInput {
        method: "POST",
        path_and_query: "/orders",
        tenant: "t",
        content_type: Some(b"application/json"),
        body: body.as_bytes(),
    })
}

fn response(status: u16, body: Vec<u8>) -> StoredResponse {
    let mut h = HeaderMap::new();
    h.insert(
        "content-type",
        HeaderValue::from_static("application/octet-stream"),
    );
    h.append("set-cookie", HeaderValue::from_static("a=1"));
    h.append("set-cookie", HeaderValue::from_static("b=2"));
    h.insert("x-obs-text", HeaderValue::from_bytes(b"caf\xe9").unwrap());
    StoredResponse::new(StatusCode::from_u16(status).unwrap(), &h, Bytes::from(body))
}

fn assert_fenced(r: Result<(), StoreError>) {
    match r {
        Err(e) => assert!(e.is_fenced(), "expected a fencing error, got {e:?}"),
        Ok(()) => panic!("a stale holder must not succeed"),
    }
}

// === behaviours ===

async fn lock_then_duplicate_conflicts(b: &Backend) {
    let k = b.key("a", "/orders", "k1");
    b.acquire(&k, &fp("x")).await;
    match b.lock(&k, &fp("x")).await {
        LockOutcome::InFlight { lease_remaining } => assert!(lease_remaining <= LEASE),
        other => panic!("expected InFlight, got {other:?}"),
    }
}

async fn completed_is_replayed_byte_for_byte(b: &Backend) {
    let k = b.key("a", "/orders", "k2");
    let f = b.acquire(&k, &fp("x")).await;
    let body: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    let resp = response(201, body);
    let done = Completion::Response(resp.clone());
    b.store.complete(&k, f, done, RETENTION).await.unwrap();
    for _ in 0..2 {
        assert_eq!(
            b.lock(&k, &fp("x")).await,
            LockOutcome::Completed(resp.clone())
        );
    }
}

async fn mismatch_detected(b: &Backend) {
    let k = b.key("a", "/orders", "k3");
    let f = b.acquire(&k, &fp("x")).await;
    assert_eq!(b.lock(&k, &fp("y")).await, LockOutcome::Mismatch);
    let done = Completion::Response(response(200, b"ok".to_vec()));
    b.store.complete(&k, f, done, RETENTION).await.unwrap();
    assert_eq!(b.lock(&k, &fp("y")).await, LockOutcome::Mismatch);
}

async fn release_allows_reexecution(b: &Backend) {
    let k = b.key("a", "/orders", "k4");
    let f1 = b.acquire(&k, &fp("x")).await;
    b.store.release(&k, f1).await.unwrap();
    match b.lock(&k, &fp("x")).await {
        LockOutcome::Acquired { fencing, took_over } => {
            assert!(fencing > f1, "fencing tokens must grow: {fencing} <= {f1}");
            assert!(!took_over, "a released key is not a takeover");
        }
        other => panic!("expected Acquired, got {other:?}"),
    }
}

async fn lease_expiry_allows_takeover(b: &Backend) {
    let k = b.key("a", "/orders", "k5");
    let f1 = b.acquire(&k, &fp("x")).await;
    tokio::time::sleep(PAST_LEASE).await;
    match b.lock(&k, &fp("x")).await {
        LockOutcome::Acquired { fencing, took_over } => {
            assert!(fencing > f1);
            assert!(took_over, "taking an expired lease is a takeover");
        }
        other => panic!("expected takeover, got {other:?}"),
    }
}

async fn stale_fencing_token_cannot_complete(b: &Backend) {
    let k = b.key("a", "/orders", "k6");
    let old = b.acquire(&k, &fp("x")).await;
    tokio::time::sleep(PAST_LEASE).await;
    let new = b.acquire(&k, &fp("x")).await;
    let late = Completion::Response(response(200, b"late".to_vec()));
    assert_fenced(b.store.complete(&k, old, late, RETENTION).await);
    let fresh = response(201, b"fresh".to_vec());
    let done = Completion::Response(fresh.clone());
    b.store.complete(&k, new, done, RETENTION).await.unwrap();
    // A late holder can't overwrite a completed record either.
    let late = Completion::Response(response(200, b"late".to_vec()));
    assert_fenced(b.store.complete(&k, old, late, RETENTION).await);
    assert_eq!(b.lock(&k, &fp("x")).await, LockOutcome::Completed(fresh));
}

async fn stale_fencing_token_cannot_release(b: &Backend) {
    let k = b.key("a", "/orders", "k7");
    let old = b.acquire(&k, &fp("x")).await;
    tokio::time::sleep(PAST_LEASE).await;
    let new = b.acquire(&k, &fp("x")).await;
    assert_fenced(b.store.release(&k, old).await);
    assert!(matches!(
        b.lock(&k, &fp("x")).await,
        LockOutcome::InFlight { .. }
    ));
    // Nor can a holder release after completing, or release twice.
    let done = Completion::Response(response(200, b"ok".to_vec()));
    b.store.complete(&k, new, done, RETENTION).await.unwrap();
    assert_fenced(b.store.release(&k, new).await);
}

async fn expired_lease_cannot_complete(b: &Backend) {
    let k = b.key("a", "/orders", "k8");
    let f = b.acquire(&k, &fp("x")).await;
    tokio::time::sleep(PAST_LEASE).await;
    let done = Completion::Response(response(200, b"late".to_vec()));
    assert_fenced(b.store.complete(&k, f, done, RETENTION).await);
}

async fn tenant_keys_are_isolated(b: &Backend) {
    let a = b.key("a", "/orders", "shared-key");
    let other_tenant = b.key("b", "/orders", "shared-key");
    let other_route = b.key("a", "/refunds", "shared-key");
    let f = b.acquire(&a, &fp("x")).await;
    let done = Completion::Response(response(201, b"a".to_vec()));
    b.store.complete(&a, f, done, RETENTION).await.unwrap();
    // Same key, same body, other tenant or route: a fresh lock, no replay, no mismatch.
    b.acquire(&other_tenant, &fp("x")).await;
    b.acquire(&other_route, &fp("y")).await;
    assert!(matches!(
        b.lock(&a, &fp("x")).await,
        LockOutcome::Completed(_)
    ));
}

async fn too_large_never_reexecuted(b: &Backend) {
    let k = b.key("a", "/orders", "k9");
    let f = b.acquire(&k, &fp("x")).await;
    let done = Completion::TooLarge(StatusCode::OK);
    b.store.complete(&k, f, done, RETENTION).await.unwrap();
    tokio::time::sleep(PAST_LEASE).await;
    let want = LockOutcome::TooLarge {
        status: StatusCode::OK,
    };
    assert_eq!(b.lock(&k, &fp("x")).await, want);
    assert_eq!(b.lock(&k, &fp("y")).await, LockOutcome::Mismatch);
}

async fn ttl_expiry_forgets(b: &Backend) {
    let retention = Duration::from_millis(500);
    let k = b.key("a", "/orders", "k10");
    let f = match b.store.try_lock(&k, &fp("x"), LEASE, retention).await {
        Ok(LockOutcome::Acquired { fencing, .. }) => fencing,
        other => panic!("expected Acquired, got {other:?}"),
    };
    let done = Completion::Response(response(200, b"ok".to_vec()));
    b.store.complete(&k, f, done, retention).await.unwrap();
    assert!(matches!(
        b.lock(&k, &fp("x")).await,
        LockOutcome::Completed(_)
    ));
    tokio::time::sleep(retention + Duration::from_millis(300)).await;
    assert_eq!(b.store.get(&k).await.unwrap(), None);
    // Forgotten: even another fingerprint locks afresh, and it is not a takeover.
    match b.lock(&k, &fp("y")).await {
        LockOutcome::Acquired { took_over, .. } => assert!(!took_over),
        other => panic!("expected Acquired, got {other:?}"),
    }
}

async fn concurrent_try_lock_one_winner(b: &Backend) {
    let k = b.key("a", "/orders", "k11");
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let store = b.store.clone();
            let k = k.clone();
            tokio::spawn(async move { store.try_lock(&k, &fp("x"), RETENTION, RETENTION).await })
        })
        .collect();
    let mut acquired = 0;
    for t in tasks {
        match t.await.unwrap().unwrap() {
            LockOutcome::Acquired { .. } => acquired += 1,
            LockOutcome::InFlight { .. } => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(
        acquired, 1,
        "exactly one of 50 concurrent try_lock calls may win"
    );
}

async fn get_and_delete(b: &Backend) {
    let k = b.key("a", "/orders", "k12");
    assert_eq!(b.store.get(&k).await.unwrap(), None);
    assert!(!b.store.delete(&k).await.unwrap());
    let f = b.acquire(&k, &fp("x")).await;
    let info = b.store.get(&k).await.unwrap().expect("in-flight record");
    assert_eq!(info.state, RecordState::InFlight);
    assert_eq!(info.fencing, f);
    assert_eq!(info.fingerprint_hex, fp("x").to_hex());
    assert_eq!(info.status, None);
    let done = Completion::Response(response(201, b"ok".to_vec()));
    b.store.complete(&k, f, done, RETENTION).await.unwrap();
    let info = b.store.get(&k).await.unwrap().expect("completed record");
    assert_eq!(info.state, RecordState::Completed);
    assert_eq!(info.status, Some(201));
    assert!(info.created_at < info.expires_at);
    assert!(b.store.delete(&k).await.unwrap());
    assert_eq!(b.store.get(&k).await.unwrap(), None);
    b.acquire(&k, &fp("y")).await;
}

/// Expands each behaviour into one test per backend: `memory::name`, `redis::name`,
/// `redis_cluster::name`, `postgres::name`. Memory runs on paused time (sleeps are instant); the others need a
/// multi-threaded runtime on the real clock.
macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(start_paused = true)]
                async fn $name() {
                    let b = super::memory().await;
                    super::$name(&b).await;
                    b.finish().await;
                }
            )*
        }
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let b = super::redis().await;
                    super::$name(&b).await;
                    b.finish().await;
                }
            )*
        }
        mod redis_cluster {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    if let Some(b) = super::redis_cluster().await {
                        super::$name(&b).await;
                        b.finish().await;
                    }
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let b = super::postgres().await;
                    super::$name(&b).await;
                    b.finish().await;
                }
            )*
        }
    };
}

conformance!(
    lock_then_duplicate_conflicts,
    completed_is_replayed_byte_for_byte,
    mismatch_detected,
    release_allows_reexecution,
    lease_expiry_allows_takeover,
    stale_fencing_token_cannot_complete,
    stale_fencing_token_cannot_release,
    expired_lease_cannot_complete,
    tenant_keys_are_isolated,
    too_large_never_reexecuted,
    ttl_expiry_forgets,
    concurrent_try_lock_one_winner,
    get_and_delete,
);
