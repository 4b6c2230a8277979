//! Hot paths of a keyed request: fingerprinting and the memory store.
//!
//! | group | scenario | what it shows |
//! |---|---|---|
//! | `fingerprint` | `sha256-body-only/{1KiB,64KiB}` | baseline: raw SHA-256 of the body |
//! | `fingerprint` | `fingerprint/{1KiB,64KiB}` | our framed hash (method, path, tenant, type, body) |
//! | `memory_store` | `lock+complete/fresh-key` | first execution: two store calls |
//! | `memory_store` | `try_lock/replay` | a duplicate: one store call returning the response |
//! | `memory_store` | `lock+complete/at-bound` | first execution into a store at its bound whose records expire as new ones come (10 ms retention, 8 MiB bound): the sweep's hot path; a key refused while nothing has expired yet counts too |
//! | `memory_store` | `mutex-hashmap/insert` | baseline: one `Mutex<HashMap>` insert |
//! | `postgres_store` | `lock+complete/conns-N` | first executions, N in flight on N connections |
//!
//! Bodies come from a fixed seed (42). Timings are never asserted; run with
//! `cargo bench -p portcullis-idempotency`.
//!
//! `postgres_store` runs only when `PORTCULLIS_TEST_DATABASE_URL` names a server on which it
//! may create a database (it drops it at the end); `PORTCULLIS_BENCH_PG_CONNS` sets N
//! (default: the store's default pool size). Its throughput (elements/s = first executions
//! per second) is compared in BENCHMARKS.md with `pgbench` running the same two statements
//! with N clients (`bench/pg.sh` runs both against one server).

// Bench setup: a failed unwrap aborts the bench, which is what we want.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(missing_docs)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use http::{HeaderMap, StatusCode};
use portcullis_idempotency::store::postgres::default_pool_size;
use portcullis_idempotency::{
    Completion, Fingerprint, FingerprintInput, IdempotencyKey, LockOutcome, MemoryStore,
    PostgresSettings, PostgresStore, RecordKey, Store, StoredResponse,
};
use rand::{rngs::StdRng, RngCore, SeedableRng};
use sha2::{Digest, Sha256};

const SEED: u64 = 42;

fn body(len: usize) -> Vec<u8> {
    let mut b = vec![0; len];
    StdRng::seed_from_u64(SEED).fill_bytes(&mut b);
    b
}

fn fingerprint(c: &mut Criterion) {
    let mut g = c.benchmark_group("fingerprint");
    for (name, len) in [("1KiB", 1024), ("64KiB", 64 * 1024)] {
        let data = body(len);
        g.throughput(Throughput::Bytes(len as u64));
        g.bench_with_input(BenchmarkId::new("sha256-body-only", name), &data, |b, d| {
            b.iter(|| Sha256::digest(d))
        });
        g.bench_with_input(BenchmarkId::new("fingerprint", name), &data, |b, d| {
            b.iter(|| {
                Fingerprint::compute(&FingerprintInput {
                    method: "POST",
                    path_and_query: "/v1/payments?expand=customer",
                    tenant: "acme",
                    content_type: Some(b"application/json"),
                    body: d,
                })
            })
        });
    }
    g.finish();
}

fn record_key(n: u64) -> RecordKey {
    let key = format!("7c4a8d09-ca95-4c6d-8f3b-{n:012x}");
    RecordKey::new(
        "acme",
        "/v1/payments",
        IdempotencyKey::parse(key.as_bytes(), 64).unwrap(),
    )
}

fn memory_store(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let store = MemoryStore::new(256 << 20);
    let fp = Fingerprint::compute(&FingerprintInput {
        method: "POST",
        path_and_query: "/v1/payments",
        tenant: "acme",
        content_type: Some(b"application/json"),
        body: &body(1024),
    });
    let mut headers = HeaderMap::new();
    headers.insert("content-type", "application/json".parse().unwrap());
    let response = StoredResponse::new(StatusCode::CREATED, &headers, Bytes::from(body(512)));
    // Short retention keeps the store at a steady size: each try_lock purges expired
    // records of its shard, as in production (there after 24 h).
    let retention = Duration::from_millis(20);
    let lease = Duration::from_millis(10);
    let next = AtomicU64::new(0);

    let mut g = c.benchmark_group("memory_store");
    g.bench_function(BenchmarkId::new("lock+complete", "fresh-key"), |b| {
        b.to_async(&rt).iter(|| async {
            let key = record_key(next.fetch_add(1, Ordering::Relaxed));
            let LockOutcome::Acquired { fencing, .. } =
                store.try_lock(&key, &fp, lease, retention).await.unwrap()
            else {
                panic!("fresh key must lock");
            };
            let done = Completion::Response(response.clone());
            // On a busy machine a preemption can outlast the 10 ms lease; the refused
            // completion (LeaseLost) costs the same, so it is not an error here.
            let _ = store.complete(&key, fencing, done, retention).await;
        })
    });

    let replay_key = record_key(u64::MAX >> 16);
    rt.block_on(async {
        if let LockOutcome::Acquired { fencing, .. } = store
            .try_lock(&replay_key, &fp, lease, Duration::from_secs(3600))
            .await
            .unwrap()
        {
            let done = Completion::Response(response.clone());
            store
                .complete(&replay_key, fencing, done, Duration::from_secs(3600))
                .await
                .unwrap();
        }
    });
    g.bench_function(BenchmarkId::new("try_lock", "replay"), |b| {
        b.to_async(&rt).iter(|| async {
            let outcome = store
                .try_lock(&replay_key, &fp, lease, retention)
                .await
                .unwrap();
            assert!(matches!(outcome, LockOutcome::Completed(_)));
        })
    });

    // A store at its bound whose records expire as fast as new ones come: new records wait
    // for the sweep of expired ones (the expiry index's hot path). Live records are never
    // evicted, so a key arriving before anything expired is refused, which is measured too.
    let full = MemoryStore::new(8 << 20);
    let day = Duration::from_millis(10);
    let lease = Duration::from_secs(60);
    let lock_complete_full = |key: RecordKey| {
        let full = &full;
        let response = &response;
        let fp = &fp;
        async move {
            let Ok(LockOutcome::Acquired { fencing, .. }) =
                full.try_lock(&key, fp, lease, day).await
            else {
                return;
            };
            let done = Completion::Response(response.clone());
            let _ = full.complete(&key, fencing, done, day).await;
        }
    };
    rt.block_on(async {
        for _ in 0..40_000 {
            lock_complete_full(record_key(next.fetch_add(1, Ordering::Relaxed))).await;
        }
    });
    g.bench_function(BenchmarkId::new("lock+complete", "at-bound"), |b| {
        b.to_async(&rt)
            .iter(|| lock_complete_full(record_key(next.fetch_add(1, Ordering::Relaxed))))
    });

    let naive: Mutex<HashMap<String, Bytes>> = Mutex::new(HashMap::new());
    g.bench_function(BenchmarkId::new("mutex-hashmap", "insert"), |b| {
        b.iter(|| {
            let n = next.fetch_add(1, Ordering::Relaxed);
            let key = format!("acme/v1/payments/7c4a8d09-ca95-4c6d-8f3b-{n:012x}");
            let mut map = naive.lock().unwrap();
            if map.len() > 100_000 {
                map.clear();
            }
            map.insert(key, response.body.clone());
        })
    });
    g.finish();
}

/// A fresh database with the migrations applied; returns its options and a drop guard.
async fn bench_database(url: &str) -> (sqlx::postgres::PgConnectOptions, String) {
    use sqlx::{ConnectOptions, Executor};
    let server: sqlx::postgres::PgConnectOptions = url.parse().unwrap();
    let name = format!("idem_bench_{:016x}", rand::random::<u64>());
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
    (server, name)
}

fn postgres_store(c: &mut Criterion) {
    let Ok(url) = std::env::var("PORTCULLIS_TEST_DATABASE_URL") else {
        eprintln!("postgres_store: PORTCULLIS_TEST_DATABASE_URL not set, skipped");
        return;
    };
    let conns: usize = std::env::var("PORTCULLIS_BENCH_PG_CONNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(default_pool_size);
    // One thread, as the gateway benchmark's `worker_threads = 1`.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (server, name) = rt.block_on(bench_database(&url));
    let settings = PostgresSettings {
        pool_size: conns,
        timeout: Duration::from_secs(5),
    };
    let store: Arc<dyn Store> = Arc::new(
        rt.block_on(PostgresStore::connect_with(
            server.clone().database(&name),
            settings,
        ))
        .unwrap(),
    );
    let fp = Fingerprint::compute(&FingerprintInput {
        method: "POST",
        path_and_query: "/orders",
        tenant: "bench",
        content_type: Some(b"application/json"),
        body: b"{\"item\":\"book\",\"qty\":1,\"note\":\"portcullis benchmark payload\"}",
    });
    let mut headers = HeaderMap::new();
    headers.insert("content-type", "application/json".parse().unwrap());
    // The benchmark upstream's answer (bench-upstream: `201 {"id":N,"ok":true}`).
    let response = StoredResponse::new(
        StatusCode::CREATED,
        &headers,
        Bytes::from_static(b"{\"id\":1,\"ok\":true}"),
    );
    let (lease, retention) = (Duration::from_secs(30), Duration::from_secs(86_400));

    let mut g = c.benchmark_group("postgres_store");
    g.throughput(Throughput::Elements(1));
    g.sample_size(20);
    g.measurement_time(Duration::from_secs(10));
    g.bench_function(
        BenchmarkId::new("lock+complete", format!("conns-{conns}")),
        |b| {
            b.to_async(&rt).iter_custom(|iters| {
                let (store, response) = (store.clone(), response.clone());
                async move {
                    // `conns` workers share `iters` first executions: `conns` in flight.
                    let todo = Arc::new(AtomicU64::new(iters));
                    let started = tokio::time::Instant::now();
                    let workers: Vec<_> = (0..conns)
                        .map(|_| {
                            let (store, response, todo) =
                                (store.clone(), response.clone(), todo.clone());
                            tokio::spawn(async move {
                                while todo
                                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                                        n.checked_sub(1)
                                    })
                                    .is_ok()
                                {
                                    // Random keys, as pgbench's `random(1, 10^12)` and
                                    // clients' UUIDs: index inserts land all over the tree.
                                    let n = rand::random::<u64>() % 1_000_000_000_000;
                                    let key = RecordKey::new(
                                        "bench",
                                        "/orders",
                                        IdempotencyKey::parse(n.to_string().as_bytes(), 64)
                                            .unwrap(),
                                    );
                                    let LockOutcome::Acquired { fencing, .. } =
                                        store.try_lock(&key, &fp, lease, retention).await.unwrap()
                                    else {
                                        panic!("fresh key must lock");
                                    };
                                    let done = Completion::Response(response.clone());
                                    store
                                        .complete(&key, fencing, done, retention)
                                        .await
                                        .unwrap();
                                }
                            })
                        })
                        .collect();
                    for w in workers {
                        w.await.unwrap();
                    }
                    started.elapsed()
                }
            })
        },
    );
    g.finish();
    drop(store);
    rt.block_on(async {
        use sqlx::{ConnectOptions, Executor};
        if let Ok(mut c) = server.connect().await {
            let _ = c
                .execute(format!(r#"DROP DATABASE "{name}" WITH (FORCE)"#).as_str())
                .await;
        }
    });
}

criterion_group!(benches, fingerprint, memory_store, postgres_store);
criterion_main!(benches);
