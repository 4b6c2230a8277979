//! Memory-specific behaviour: byte bounds and eviction (the shared contract is covered by
//! `tests/conformance.rs`). All on paused time.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};

use super::*;
use crate::fingerprint::FingerprintInput;
use crate::key::IdempotencyKey;
use crate::record::StoredResponse;

const LEASE: Duration = Duration::from_secs(30);
const DAY: Duration = Duration::from_secs(86_400);

fn key(k: &str) -> RecordKey {
    RecordKey::new("t", "/r", IdempotencyKey::parse(k.as_bytes(), 64).unwrap())
}

fn fp() -> Fingerprint {
    Fingerprint::compute(&FingerprintInput {
        method: "POST",
        path_and_query: "/r",
        tenant: "t",
        content_type: None,
        body: b"",
    })
}

fn body(n: usize) -> Completion {
    let r = StoredResponse::new(StatusCode::OK, &HeaderMap::new(), Bytes::from(vec![7; n]));
    Completion::Response(r)
}

async fn lock(s: &MemoryStore, k: &str, retention: Duration) -> Result<u64, StoreError> {
    match s.try_lock(&key(k), &fp(), LEASE, retention).await? {
        LockOutcome::Acquired { fencing, .. } => Ok(fencing),
        other => panic!("expected Acquired, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn accounting_returns_to_zero() {
    let s = MemoryStore::new(1 << 20);
    let f = lock(&s, "a", DAY).await.unwrap();
    assert!(s.used_bytes() >= ENTRY_OVERHEAD);
    s.complete(&key("a"), f, body(10_000), DAY).await.unwrap();
    assert!(s.used_bytes() > 10_000);
    assert!(s.delete(&key("a")).await.unwrap());
    assert_eq!(s.used_bytes(), 0);
    let f = lock(&s, "b", DAY).await.unwrap();
    s.release(&key("b"), f).await.unwrap();
    assert_eq!(s.used_bytes(), 0);
}

#[tokio::test(start_paused = true)]
async fn full_store_evicts_completed_nearest_expiry_first() {
    // Room for about three 10 KB responses.
    let s = MemoryStore::new(32_000);
    for (k, retention) in [("soon", DAY / 2), ("late", DAY), ("later", DAY * 2)] {
        let f = lock(&s, k, retention).await.unwrap();
        s.complete(&key(k), f, body(10_000), retention)
            .await
            .unwrap();
    }
    let f = lock(&s, "new", DAY).await.unwrap();
    s.complete(&key("new"), f, body(10_000), DAY).await.unwrap();
    assert!(
        s.get(&key("soon")).await.unwrap().is_none(),
        "nearest expiry goes first"
    );
    assert!(s.get(&key("later")).await.unwrap().is_some());
    assert!(s.used_bytes() <= 32_000);
}

#[tokio::test(start_paused = true)]
async fn in_flight_records_are_never_evicted_and_full_is_transient() {
    let s = MemoryStore::new(4 * (ENTRY_OVERHEAD + 20));
    let mut n = 0;
    let err = loop {
        match lock(&s, &format!("k{n}"), DAY).await {
            Ok(_) => n += 1,
            Err(e) => break e,
        }
    };
    assert!(n >= 3);
    assert!(matches!(err, StoreError::Full { .. }) && err.is_transient());
    for i in 0..n {
        let info = s.get(&key(&format!("k{i}"))).await.unwrap();
        assert_eq!(info.map(|i| i.state), Some(RecordState::InFlight));
    }
    // Once their leases have run out, their holders are gone and they may go.
    tokio::time::advance(LEASE + Duration::from_secs(1)).await;
    lock(&s, "after", DAY).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn response_that_cannot_fit_leaves_a_tombstone() {
    let s = MemoryStore::new(2_000);
    let f = lock(&s, "a", DAY).await.unwrap();
    s.complete(&key("a"), f, body(50_000), DAY).await.unwrap();
    let again = s.try_lock(&key("a"), &fp(), LEASE, DAY).await.unwrap();
    assert_eq!(
        again,
        LockOutcome::TooLarge {
            status: StatusCode::OK
        }
    );
    assert!(s.used_bytes() <= 2_000);
}

#[tokio::test(start_paused = true)]
async fn purge_and_sweeper_free_expired_records() {
    let s = Arc::new(MemoryStore::new(1 << 20));
    for k in ["a", "b", "c"] {
        let f = lock(&s, k, Duration::from_secs(60)).await.unwrap();
        s.complete(&key(k), f, body(100), Duration::from_secs(60))
            .await
            .unwrap();
    }
    let sweeper = s.spawn_sweeper(Duration::from_secs(10));
    tokio::time::sleep(Duration::from_secs(75)).await;
    assert_eq!(s.used_bytes(), 0);
    assert_eq!(s.purge_expired(), 0);
    sweeper.abort();
}

#[tokio::test(start_paused = true)]
async fn admin_times_come_from_the_injected_clock() {
    let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let clock = Arc::new(crate::clock::ManualClock::new(start));
    let s = MemoryStore::with_clock(1 << 20, clock);
    lock(&s, "a", DAY).await.unwrap();
    let info = s.get(&key("a")).await.unwrap().unwrap();
    assert_eq!(info.created_at, start);
    assert_eq!(info.expires_at, start + DAY);
}

#[tokio::test(start_paused = true)]
async fn completion_with_a_shorter_retention_expires_on_time() {
    // The lock's heap item (day) is later than the completed record's expiry (60 s): the
    // index must learn the earlier time, not wait a day.
    let s = MemoryStore::new(1 << 20);
    let f = lock(&s, "a", DAY).await.unwrap();
    s.complete(&key("a"), f, body(100), Duration::from_secs(60))
        .await
        .unwrap();
    tokio::time::advance(Duration::from_secs(61)).await;
    assert_eq!(s.purge_expired(), 1);
    assert_eq!(s.used_bytes(), 0);
    assert!(s.get(&key("a")).await.unwrap().is_none());
}

#[tokio::test(start_paused = true)]
async fn eviction_follows_completion_time_not_lock_time() {
    // "first" is locked first but completed last, so it expires last: "second" must go
    // first even though its heap item was pushed later.
    let s = MemoryStore::new(4 * (ENTRY_OVERHEAD + 10_500));
    let f1 = lock(&s, "first", DAY).await.unwrap();
    let f2 = lock(&s, "second", DAY).await.unwrap();
    tokio::time::advance(Duration::from_secs(1)).await;
    s.complete(&key("second"), f2, body(10_000), DAY)
        .await
        .unwrap();
    tokio::time::advance(Duration::from_secs(1)).await;
    s.complete(&key("first"), f1, body(10_000), DAY)
        .await
        .unwrap();
    for k in ["x", "y"] {
        let f = lock(&s, k, DAY).await.unwrap();
        s.complete(&key(k), f, body(10_000), DAY).await.unwrap();
    }
    assert!(s.get(&key("second")).await.unwrap().is_none());
    assert!(s.get(&key("first")).await.unwrap().is_some());
    assert!(s.used_bytes() <= 4 * (ENTRY_OVERHEAD + 10_500));
}

#[tokio::test(start_paused = true)]
async fn expiry_index_stays_bounded_under_release_churn() {
    // Released records leave stale heap items; with a day's retention none surfaces on its
    // own, so the heap must be rebuilt rather than grow with every request.
    let s = MemoryStore::new(1 << 20);
    for i in 0..20_000 {
        let k = format!("k{i}");
        let f = lock(&s, &k, DAY).await.unwrap();
        s.release(&key(&k), f).await.unwrap();
    }
    let items: usize = s.shards.iter().map(|sh| super::lock(sh).index_len()).sum();
    assert!(items <= SHARDS * 1025, "{items} heap items for 0 records");
    assert_eq!(s.used_bytes(), 0);
}

#[tokio::test(start_paused = true)]
async fn accounting_counts_the_encoded_record() {
    // The charge follows what is allocated: a longer key and a stored response cost their
    // encoded bytes (rounded to allocator classes) on top of the fixed overhead.
    let s = MemoryStore::new(1 << 20);
    let f = lock(&s, "a", DAY).await.unwrap();
    let in_flight = s.used_bytes();
    assert!((ENTRY_OVERHEAD..ENTRY_OVERHEAD + 64).contains(&in_flight));
    s.complete(&key("a"), f, body(1000), DAY).await.unwrap();
    let done = s.used_bytes();
    assert!(done >= in_flight + 1000 && done <= in_flight + 1000 + 1000 / 8 + 64);
}

#[tokio::test(start_paused = true)]
async fn records_stay_findable_through_growth_and_rehash_at_the_bound() {
    // Tables grow from empty, then, at the bound, every new record evicts an old one: the
    // removals leave tombstones that make hashbrown re-hash in place, from the hash kept in
    // each slot. The newest records must all still be found, the evicted ones not, and the
    // byte count must match what is left.
    let s = MemoryStore::new(2_000 * (ENTRY_OVERHEAD + 64));
    let total = 20_000;
    for i in 0..total {
        let k = format!("churn-{i:05}");
        let f = lock(&s, &k, DAY).await.unwrap();
        s.complete(&key(&k), f, body(16), DAY).await.unwrap();
        // Later records expire later, so eviction order is insertion order.
        tokio::time::advance(Duration::from_millis(1)).await;
    }
    let (mut kept, mut oldest, mut bytes) = (0, total, 0);
    for i in 0..total {
        let k = format!("churn-{i:05}");
        let (hash, idx) = s.locate(&key(&k));
        if let Some(e) = super::lock(&s.shards[idx]).get(hash, &key(&k)) {
            kept += 1;
            oldest = oldest.min(i);
            bytes += e.size();
        }
    }
    assert!(kept > 1_000, "only {kept} records kept");
    assert_eq!(
        kept,
        total - oldest,
        "the kept records are exactly the newest ones"
    );
    assert!(s.get(&key("churn-19999")).await.unwrap().is_some());
    assert_eq!(s.used_bytes(), bytes);
}

#[tokio::test(start_paused = true)]
async fn bytes_and_evictions_are_reported_through_the_handles_resolved_at_build() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    // Local to this thread: the store resolves its series while the recorder is current and
    // reports through them afterwards, with no recorder installed at all.
    let s = metrics::with_local_recorder(&recorder, || {
        MemoryStore::new(4 * (ENTRY_OVERHEAD + 10_500))
    });
    for k in ["a", "b", "c", "d", "e", "f"] {
        let f = lock(&s, k, DAY).await.unwrap();
        s.complete(&key(k), f, body(10_000), DAY).await.unwrap();
    }
    let mut evictions = None;
    let mut stored = None;
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        match (key.key().name(), value) {
            ("idempotency_evictions_total", DebugValue::Counter(n)) => evictions = Some(n),
            ("idempotency_stored_bytes", DebugValue::Gauge(v)) => stored = Some(v.into_inner()),
            _ => {}
        }
    }
    assert!(evictions.is_some_and(|n| n >= 2), "{evictions:?}");
    assert_eq!(stored, Some(s.used_bytes() as f64));
}
