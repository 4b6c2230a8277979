//! Memory-specific behaviour: byte bounds, shares and expiry (the shared contract is covered
//! by `tests/conformance.rs`). All on paused time.

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
    key_of("t", k)
}

fn key_of(tenant: &str, k: &str) -> RecordKey {
    RecordKey::new(
        tenant,
        "/r",
        IdempotencyKey::parse(k.as_bytes(), 64).unwrap(),
    )
}

/// Each tenant its own share of half the store.
struct Halves;

impl Shares for Halves {
    fn share_of<'t>(&self, tenant: &'t str) -> std::borrow::Cow<'t, str> {
        tenant.into()
    }

    fn bytes(&self, _share: &str, capacity: usize) -> usize {
        capacity / 2
    }
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
async fn a_full_store_keeps_every_live_record() {
    // Room for three 10 KB responses: a fourth key still gets its small lock, but its
    // response no longer fits and leaves a tombstone; none of the three goes.
    let s = MemoryStore::new(34_000);
    for (k, retention) in [("soon", DAY / 2), ("late", DAY), ("later", DAY * 2)] {
        let f = lock(&s, k, retention).await.unwrap();
        s.complete(&key(k), f, body(10_000), retention)
            .await
            .unwrap();
    }
    let f = lock(&s, "new", DAY).await.unwrap();
    s.complete(&key("new"), f, body(10_000), DAY).await.unwrap();
    for k in ["soon", "late", "later"] {
        let replay = s.try_lock(&key(k), &fp(), LEASE, DAY).await.unwrap();
        assert!(
            matches!(replay, LockOutcome::Completed(_)),
            "{k}: {replay:?}"
        );
    }
    let again = s.try_lock(&key("new"), &fp(), LEASE, DAY).await.unwrap();
    assert_eq!(
        again,
        LockOutcome::TooLarge {
            status: StatusCode::OK
        }
    );
    assert!(s.used_bytes() <= 34_000);

    // Room comes back as records expire, not before.
    tokio::time::advance(DAY / 2 + Duration::from_secs(1)).await;
    let f = lock(&s, "after", DAY).await.unwrap();
    s.complete(&key("after"), f, body(10_000), DAY)
        .await
        .unwrap();
    assert!(s.get(&key("soon")).await.unwrap().is_none());
    let replay = s.try_lock(&key("after"), &fp(), LEASE, DAY).await.unwrap();
    assert!(matches!(replay, LockOutcome::Completed(_)), "{replay:?}");
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
    // Once a lease has run out its key is taken over in place; a new key waits for room.
    tokio::time::advance(LEASE + Duration::from_secs(1)).await;
    let again = s.try_lock(&key("k0"), &fp(), LEASE, DAY).await.unwrap();
    assert!(
        matches!(
            again,
            LockOutcome::Acquired {
                took_over: true,
                ..
            }
        ),
        "{again:?}"
    );
    assert!(matches!(
        lock(&s, "after", DAY).await,
        Err(StoreError::Full { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn one_tenant_fills_only_its_own_share() {
    let s = MemoryStore::new(64_000).with_shares(Arc::new(Halves));
    // "b" stores one record first; then "a" writes until its share refuses.
    let fb = s
        .try_lock(&key_of("b", "kept"), &fp(), LEASE, DAY)
        .await
        .unwrap();
    let LockOutcome::Acquired { fencing: fb, .. } = fb else {
        panic!("{fb:?}")
    };
    s.complete(&key_of("b", "kept"), fb, body(10_000), DAY)
        .await
        .unwrap();
    let mut refused = None;
    for n in 0..100 {
        let k = key_of("a", &format!("k{n}"));
        match s.try_lock(&k, &fp(), LEASE, DAY).await {
            Ok(LockOutcome::Acquired { fencing, .. }) => {
                s.complete(&k, fencing, body(5_000), DAY).await.unwrap();
            }
            Err(e) => {
                refused = Some((n, e));
                break;
            }
            Ok(other) => panic!("{other:?}"),
        }
    }
    let (n, err) = refused.expect("a's share fills up");
    assert!(n >= 5, "a stored {n} records");
    assert!(
        matches!(&err, StoreError::ShareFull { share, .. } if share == "a"),
        "{err}"
    );
    assert!(err.is_transient());
    assert!(s.share_used_bytes("a") <= 32_000);

    // b's record is still there, and b still has room for new keys.
    let replay = s
        .try_lock(&key_of("b", "kept"), &fp(), LEASE, DAY)
        .await
        .unwrap();
    assert!(matches!(replay, LockOutcome::Completed(_)), "{replay:?}");
    let fresh = s
        .try_lock(&key_of("b", "new"), &fp(), LEASE, DAY)
        .await
        .unwrap();
    assert!(matches!(fresh, LockOutcome::Acquired { .. }), "{fresh:?}");
}

#[tokio::test(start_paused = true)]
async fn share_bytes_come_back_when_records_go() {
    let s = MemoryStore::new(1 << 20).with_shares(Arc::new(Halves));
    let released = s
        .try_lock(&key_of("a", "r"), &fp(), LEASE, DAY)
        .await
        .unwrap();
    let LockOutcome::Acquired { fencing, .. } = released else {
        panic!()
    };
    s.release(&key_of("a", "r"), fencing).await.unwrap();
    let done = s
        .try_lock(&key_of("a", "d"), &fp(), LEASE, DAY)
        .await
        .unwrap();
    let LockOutcome::Acquired { fencing, .. } = done else {
        panic!()
    };
    s.complete(
        &key_of("a", "d"),
        fencing,
        body(1_000),
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    assert_eq!(s.share_used_bytes("a"), s.used_bytes());
    let deleted = s
        .try_lock(&key_of("a", "x"), &fp(), LEASE, DAY)
        .await
        .unwrap();
    assert!(matches!(deleted, LockOutcome::Acquired { .. }));
    assert!(s.delete(&key_of("a", "x")).await.unwrap());
    tokio::time::advance(Duration::from_secs(61)).await;
    s.purge_expired();
    assert_eq!((s.share_used_bytes("a"), s.used_bytes()), (0, 0));
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
    let clock = Arc::new(crate::ManualWallClock::new(start));
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
async fn expiry_follows_completion_time_not_lock_time() {
    // "first" is locked first but completed last, so it expires last: "second" must go
    // first even though its heap item was pushed later.
    let s = MemoryStore::new(1 << 20);
    let minute = Duration::from_secs(60);
    let f1 = lock(&s, "first", DAY).await.unwrap();
    let f2 = lock(&s, "second", DAY).await.unwrap();
    tokio::time::advance(Duration::from_secs(1)).await;
    s.complete(&key("second"), f2, body(100), minute)
        .await
        .unwrap();
    tokio::time::advance(Duration::from_secs(1)).await;
    s.complete(&key("first"), f1, body(100), minute)
        .await
        .unwrap();
    tokio::time::advance(minute - Duration::from_millis(500)).await;
    assert_eq!(s.purge_expired(), 1);
    assert!(s.get(&key("second")).await.unwrap().is_none());
    assert!(s.get(&key("first")).await.unwrap().is_some());
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
    // Tables grow from empty, then, with 1.5 s retention and a record a millisecond, every
    // new record comes as old ones expire: the removals leave tombstones that make hashbrown
    // re-hash in place, from the hash kept in each slot. The newest records must all still
    // be found, the expired ones not, and the byte count must match what is left.
    let retention = Duration::from_millis(1_500);
    let s = MemoryStore::new(2_000 * (ENTRY_OVERHEAD + 64));
    let total = 20_000;
    for i in 0..total {
        let k = format!("churn-{i:05}");
        let f = lock(&s, &k, retention).await.unwrap();
        s.complete(&key(&k), f, body(16), retention).await.unwrap();
        // Later records expire later, so expiry order is insertion order.
        tokio::time::advance(Duration::from_millis(1)).await;
    }
    s.purge_expired();
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
async fn stored_bytes_are_reported_through_the_handle_resolved_at_build() {
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
    let mut stored = None;
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        if let ("idempotency_stored_bytes", DebugValue::Gauge(v)) = (key.key().name(), value) {
            stored = Some(v.into_inner());
        }
    }
    assert_eq!(stored, Some(s.used_bytes() as f64));
}
