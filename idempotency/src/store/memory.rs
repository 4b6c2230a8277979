//! In-process store for the single-node embedded mode.
//!
//! - **Bounded by bytes**, not entries: one stored 1 MiB response weighs as much as thousands
//!   of small ones. Accounting is approximate (key strings twice, response headers and body,
//!   plus a measured [`ENTRY_OVERHEAD`] for map, index and allocator overhead), so the bound
//!   tracks resident memory within about 10 % for small responses.
//! - **When full**, expired records go first, then finished records nearest their expiry
//!   (across all shards; each eviction peeks every shard, which is fine on this rare path).
//!   In-flight records with a live lease are never evicted: that would let a duplicate run
//!   while the first copy is still executing. If nothing more can go, `try_lock` fails with
//!   the transient [`StoreError::Full`] and the layer answers 503. Evicting a completed record
//!   before its retention ends re-opens its key; `idempotency_evictions_total` counts that,
//!   and the capacity should cover `retention × keyed request rate × response size`.
//! - **TTL**: each `try_lock` purges the expired records of its shard; eviction under
//!   pressure and [`MemoryStore::purge_expired`] sweep the others.
//! - **Sharded** `Mutex<HashMap>` (16 shards). Locks are held for map operations only, never
//!   across an `.await`. Eviction visits other shards with `try_lock`, so two shards are
//!   never waited on at once and lock order cannot deadlock.
//! - **Time**: leases and TTLs run on `tokio::time::Instant`, so tests drive them with
//!   `start_paused`; wall-clock times for the admin view come from the injected [`Clock`].

use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tokio::time::Instant;

use super::{LockOutcome, RecordKey, Store, StoreError};
use crate::clock::{Clock, SystemClock};
use crate::fingerprint::Fingerprint;
use crate::record::{Completion, Record, RecordInfo, RecordState};

mod shard;

use shard::{Entry, Shard};

/// Bytes charged per record on top of its keys and response: map slot, index node, `Entry`,
/// and the allocator's share of the record's half-dozen small heap allocations (key strings,
/// header map, body). Measured with `examples/store_growth.rs`: with 192 here the process held
/// 2.2× the accounted bytes (553 MiB resident for a 256 MiB bound); with 672 the bound and the
/// resident memory agree within about 10 %.
pub const ENTRY_OVERHEAD: usize = 672;

/// Default capacity: 64 MiB.
pub const DEFAULT_CAPACITY_BYTES: usize = 64 << 20;

const SHARDS: usize = 16;

/// Upper bound on evictions while making room for one record.
const MAX_EVICTIONS_PER_CALL: usize = 4096;

/// In-memory [`Store`], bounded by bytes, with TTL eviction.
pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    capacity: usize,
    used: AtomicUsize,
    next_fencing: AtomicU64,
    clock: Arc<dyn Clock>,
}

// === impl MemoryStore ===

impl MemoryStore {
    /// A store holding at most `capacity_bytes`, stamping admin times with the system clock.
    pub fn new(capacity_bytes: usize) -> Self {
        Self::with_clock(capacity_bytes, Arc::new(SystemClock))
    }

    /// A store with an injected wall clock (for the admin view's timestamps only).
    pub fn with_clock(capacity_bytes: usize, clock: Arc<dyn Clock>) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            hasher: RandomState::new(),
            capacity: capacity_bytes,
            used: AtomicUsize::new(0),
            next_fencing: AtomicU64::new(1),
            clock,
        }
    }

    /// Bytes currently accounted to stored records.
    pub fn used_bytes(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Removes every expired record in every shard; returns how many went.
    pub fn purge_expired(&self) -> usize {
        let now = Instant::now();
        let freed: (usize, usize) = self
            .shards
            .iter()
            .map(|s| lock(s).purge_expired(now))
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
        self.unreserve(freed.1);
        freed.0
    }

    /// Spawns a task that calls [`purge_expired`](Self::purge_expired) every `every`, so idle
    /// shards release memory too. Abort the handle to stop it.
    pub fn spawn_sweeper(self: &Arc<Self>, every: Duration) -> tokio::task::JoinHandle<()> {
        let store = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                match store.upgrade() {
                    Some(s) => s.purge_expired(),
                    None => return,
                };
            }
        })
    }

    fn shard_index(&self, key: &RecordKey) -> usize {
        (self.hasher.hash_one(key) as usize) % self.shards.len()
    }

    fn shard(&self, key: &RecordKey) -> &Mutex<Shard> {
        &self.shards[self.shard_index(key)]
    }

    fn try_reserve(&self, n: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(n).filter(|&t| t <= self.capacity)
            })
            .is_ok()
    }

    fn unreserve(&self, n: usize) {
        if n > 0 {
            self.used.fetch_sub(n, Ordering::AcqRel);
        }
        metrics::gauge!("idempotency_stored_bytes").set(self.used_bytes() as f64);
    }

    fn after_reserve(&self) {
        metrics::gauge!("idempotency_stored_bytes").set(self.used_bytes() as f64);
    }

    /// Makes room for `needed` bytes: expired records first (all shards), then finished
    /// records in global order of expiry. `own` is the shard the caller holds (index
    /// `own_idx`); other shards are only ever `try_lock`ed, and skipped when busy, so no
    /// thread waits on a second lock. Returns whether the bytes are reserved.
    fn reserve_evicting(
        &self,
        own: &mut Shard,
        own_idx: usize,
        needed: usize,
        now: Instant,
    ) -> bool {
        if self.try_reserve(needed) {
            return true;
        }
        let mut freed = own.purge_expired(now).1;
        for (i, shard) in self.shards.iter().enumerate() {
            if i != own_idx {
                if let Ok(mut other) = shard.try_lock() {
                    freed += other.purge_expired(now).1;
                }
            }
        }
        self.unreserve(freed);
        // Bounded so a pathological race (shards refilling as we evict) cannot spin.
        for _ in 0..MAX_EVICTIONS_PER_CALL {
            if self.try_reserve(needed) {
                return true;
            }
            let mut best = own.first_evictable(now).map(|t| (t, own_idx));
            for (i, shard) in self.shards.iter().enumerate() {
                if i == own_idx {
                    continue;
                }
                let Ok(other) = shard.try_lock() else {
                    continue;
                };
                if let Some(t) = other.first_evictable(now) {
                    if !matches!(best, Some((b, _)) if b <= t) {
                        best = Some((t, i));
                    }
                }
            }
            let Some((_, i)) = best else {
                return false;
            };
            let freed = if i == own_idx {
                own.evict_first(now)
            } else {
                self.shards[i]
                    .try_lock()
                    .map_or(0, |mut s| s.evict_first(now))
            };
            self.unreserve(freed);
        }
        self.try_reserve(needed)
    }

    fn wall_in(&self, from: Instant, to: Instant) -> SystemTime {
        self.clock.now() + to.saturating_duration_since(from)
    }
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("capacity", &self.capacity)
            .field("used", &self.used_bytes())
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn try_lock(
        &self,
        key: &RecordKey,
        fingerprint: &Fingerprint,
        lease: Duration,
        retention: Duration,
    ) -> Result<LockOutcome, StoreError> {
        let now = Instant::now();
        let idx = self.shard_index(key);
        let mut shard = lock(&self.shards[idx]);
        let (_, freed) = shard.purge_expired(now);
        self.unreserve(freed);

        let mut took_over = false;
        if let Some(entry) = shard.map.get(key) {
            match &entry.record {
                Record::InFlight { lease_until, .. } if *lease_until <= now => took_over = true,
                r if record_fingerprint(r) != fingerprint => return Ok(LockOutcome::Mismatch),
                Record::InFlight { lease_until, .. } => {
                    return Ok(LockOutcome::InFlight {
                        lease_remaining: *lease_until - now,
                    })
                }
                Record::Completed { response, .. } => {
                    return Ok(LockOutcome::Completed(response.clone()))
                }
                Record::TooLarge { status, .. } => {
                    return Ok(LockOutcome::TooLarge { status: *status })
                }
            }
        }

        let fencing = self.next_fencing.fetch_add(1, Ordering::Relaxed);
        let record = Record::InFlight {
            fencing,
            lease_until: now + lease.min(retention),
            fingerprint: *fingerprint,
        };
        if took_over {
            // Same key and fingerprint size: the existing reservation covers the new record.
            shard.replace(key, record, now + retention, self.clock.now());
        } else {
            let needed = Entry::size_of(key, &record);
            if !self.reserve_evicting(&mut shard, idx, needed, now) {
                return Err(StoreError::Full {
                    needed,
                    capacity: self.capacity,
                });
            }
            self.after_reserve();
            shard.insert(
                key.clone(),
                record,
                needed,
                now + retention,
                self.clock.now(),
            );
        }
        Ok(LockOutcome::Acquired { fencing, took_over })
    }

    async fn complete(
        &self,
        key: &RecordKey,
        fencing: u64,
        completion: Completion,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let now = Instant::now();
        let idx = self.shard_index(key);
        let mut shard = lock(&self.shards[idx]);
        let (fingerprint, old_size) = shard.check_holder(key, fencing, now)?;
        let mut record = match completion {
            Completion::Response(response) => Record::Completed {
                fingerprint,
                response,
            },
            Completion::TooLarge(status) => Record::TooLarge {
                fingerprint,
                status,
            },
        };
        let new_size = Entry::size_of(key, &record);
        if new_size > old_size && !self.reserve_evicting(&mut shard, idx, new_size - old_size, now)
        {
            // No room for the response. The request *did* run, so forgetting the key would
            // invite a duplicate execution: keep a small tombstone instead (no extra bytes
            // beyond the in-flight record's reservation), answered like a too-large response.
            let status = match &record {
                Record::Completed { response, .. } => response.status,
                Record::TooLarge { status, .. } => *status,
                Record::InFlight { .. } => http::StatusCode::OK,
            };
            tracing::warn!(
                capacity = self.capacity,
                "idempotency memory store full: storing a too-large tombstone instead"
            );
            record = Record::TooLarge {
                fingerprint,
                status,
            };
            let size = Entry::size_of(key, &record);
            shard.set(key, record, size, now + retention);
            self.unreserve(old_size.saturating_sub(size));
            return Ok(());
        }
        shard.set(key, record, new_size, now + retention);
        if new_size < old_size {
            self.unreserve(old_size - new_size);
        } else {
            self.after_reserve();
        }
        Ok(())
    }

    async fn release(&self, key: &RecordKey, fencing: u64) -> Result<(), StoreError> {
        let now = Instant::now();
        let mut shard = lock(self.shard(key));
        shard.check_holder(key, fencing, now)?;
        let freed = shard.remove(key).unwrap_or(0);
        drop(shard);
        self.unreserve(freed);
        Ok(())
    }

    async fn get(&self, key: &RecordKey) -> Result<Option<RecordInfo>, StoreError> {
        let now = Instant::now();
        let shard = lock(self.shard(key));
        let Some(entry) = shard.map.get(key).filter(|e| e.expires_at > now) else {
            return Ok(None);
        };
        let (state, fencing, status) = match &entry.record {
            Record::InFlight { fencing, .. } => (RecordState::InFlight, *fencing, None),
            Record::Completed { response, .. } => (
                RecordState::Completed,
                entry.fencing,
                Some(response.status.as_u16()),
            ),
            Record::TooLarge { status, .. } => {
                (RecordState::TooLarge, entry.fencing, Some(status.as_u16()))
            }
        };
        Ok(Some(RecordInfo {
            state,
            fingerprint_hex: record_fingerprint(&entry.record).to_hex(),
            fencing,
            status,
            created_at: entry.created_at,
            expires_at: self.wall_in(now, entry.expires_at),
        }))
    }

    async fn delete(&self, key: &RecordKey) -> Result<bool, StoreError> {
        let now = Instant::now();
        let mut shard = lock(self.shard(key));
        let live = shard.map.get(key).is_some_and(|e| e.expires_at > now);
        let freed = shard.remove(key);
        drop(shard);
        self.unreserve(freed.unwrap_or(0));
        Ok(live)
    }
}

fn record_fingerprint(r: &Record) -> &Fingerprint {
    match r {
        Record::InFlight { fingerprint, .. }
        | Record::Completed { fingerprint, .. }
        | Record::TooLarge { fingerprint, .. } => fingerprint,
    }
}

/// A poisoned shard only means another thread panicked mid-operation; every operation
/// leaves the map consistent before it can panic, so keep serving.
fn lock(m: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests;
