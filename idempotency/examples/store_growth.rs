//! Cost growth of the memory idempotency store as records grow to 1 000 000, with the store
//! bounded at 256 MiB as configured by default: lock + complete time, the store's own byte
//! accounting and the process's resident memory at each step.
//!
//! `cargo run --release -p portcullis-idempotency --example store_growth`
//!
//! Numbers go to BENCHMARKS.md ("Cost growth"). A measurement, not a test.
#![allow(
    clippy::disallowed_types,
    clippy::disallowed_methods,
    clippy::unwrap_used,
    missing_docs
)]

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use portcullis_idempotency::{
    Completion, Fingerprint, IdempotencyKey, LockOutcome, MemoryStore, RecordKey, Store,
    StoredResponse,
};

const CAPACITY: usize = 256 * 1024 * 1024;
const RECORDS: usize = 1_000_000;
const STEP: usize = 200_000;

fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .map(str::to_owned)
        })
        .and_then(|l| {
            l.split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<f64>().ok())
        })
        .unwrap_or(0.0)
        / 1024.0
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let store = MemoryStore::new(CAPACITY);
    let body = Bytes::from(vec![b'x'; 200]); // a typical small JSON answer
    let mut headers = HeaderMap::new();
    headers.insert("content-type", "application/json".parse().unwrap());
    let lease = Duration::from_secs(60);
    let ttl = Duration::from_secs(24 * 3600);
    println!("| records written | µs per lock+complete | store bytes (MiB) | RSS (MiB) |");
    println!("|---:|---:|---:|---:|");
    let mut started = Instant::now();
    for i in 0..RECORDS {
        let key = IdempotencyKey::parse(format!("key-{i:08}").as_bytes(), 64).unwrap();
        let record = RecordKey::new(format!("tenant-{}", i % 1000), "/orders", key);
        let fingerprint = Fingerprint::from_bytes([(i % 251) as u8; 32]);
        if let Ok(LockOutcome::Acquired { fencing, .. }) =
            store.try_lock(&record, &fingerprint, lease, ttl).await
        {
            let response = StoredResponse::new(StatusCode::CREATED, &headers, body.clone());
            let _ = store
                .complete(&record, fencing, Completion::Response(response), ttl)
                .await;
        }
        if (i + 1) % STEP == 0 {
            let per = started.elapsed().as_secs_f64() * 1e6 / STEP as f64;
            println!(
                "| {} | {per:.2} | {:.1} | {:.1} |",
                i + 1,
                store.used_bytes() as f64 / 1048576.0,
                rss_mib()
            );
            started = Instant::now();
        }
    }
}
