//! Cost growth of the memory idempotency store as records grow to 1 500 000, with the store
//! bounded at 256 MiB as configured by default: lock + complete time (mean, and the tail of
//! single operations: a shard growing its table stalls the one request that grows it), the
//! store's own byte accounting and the process's resident memory (growth over the process
//! before the first record) at each step.
//!
//! The records are the ones the benchmark's keyed POSTs leave in the gateway (`bench/run.sh`):
//! anonymous caller `ip:127.0.0.1`, route `/`, a 36-byte key, and bench-upstream's `201` with
//! `content-type`, `content-length`, `date` and a 23-byte JSON body. The allocator is the
//! gateway's (mimalloc), so the resident memory is what the gateway would hold.
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
const RECORDS: usize = 1_500_000;
const STEP: usize = 250_000;

/// The gateway's allocator: resident memory per record depends on its size classes.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    let mut headers = HeaderMap::new();
    headers.insert("content-type", "application/json".parse().unwrap());
    headers.insert("content-length", "23".parse().unwrap());
    headers.insert("date", "Sun, 23 Nov 2026 19:55:49 GMT".parse().unwrap());
    let base = rss_mib();
    let lease = Duration::from_secs(60);
    let ttl = Duration::from_secs(24 * 3600);
    println!("| records written | µs per lock+complete | p99.9 (µs) | slowest (µs) | store bytes (MiB) | RSS growth (MiB) | RSS growth / bound |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    let mut started = Instant::now();
    let mut each = Vec::with_capacity(STEP);
    for i in 0..RECORDS {
        let key = format!("1763927749-tput1-pc-keyed-mem-1-{i:08}");
        let key = IdempotencyKey::parse(key.as_bytes(), 64).unwrap();
        let record = RecordKey::new("ip:127.0.0.1", "/", key);
        // A fresh body per record, as the gateway copies each response into its own buffer.
        let body = Bytes::from(format!("{{\"id\":{:09},\"ok\":true}}", i % 1_000_000_000));
        let fingerprint = Fingerprint::from_bytes([(i % 251) as u8; 32]);
        let op = Instant::now();
        if let Ok(LockOutcome::Acquired { fencing, .. }) =
            store.try_lock(&record, &fingerprint, lease, ttl).await
        {
            let response = StoredResponse::new(StatusCode::CREATED, &headers, body);
            let _ = store
                .complete(&record, fencing, Completion::Response(response), ttl)
                .await;
        }
        each.push(op.elapsed());
        if (i + 1) % STEP == 0 {
            let per = started.elapsed().as_secs_f64() * 1e6 / STEP as f64;
            each.sort_unstable();
            let micros = |d: Option<&Duration>| d.map_or(0.0, |d| d.as_secs_f64() * 1e6);
            let p999 = micros(each.get(each.len() * 999 / 1000));
            let slowest = micros(each.last());
            each.clear();
            let growth = rss_mib() - base;
            println!(
                "| {} | {per:.2} | {p999:.1} | {slowest:.0} | {:.1} | {growth:.1} | {:.2} |",
                i + 1,
                store.used_bytes() as f64 / 1048576.0,
                growth * 1048576.0 / CAPACITY as f64,
            );
            started = Instant::now();
        }
    }
}
