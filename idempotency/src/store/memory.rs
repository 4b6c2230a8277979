//! In-process store for the single-node embedded mode.
//!
//! - **Bounded by bytes**, not entries: one stored 1 MiB response weighs as much as thousands
//!   of small ones. A record is one exact-size allocation (its key, and once completed its
//!   status, headers and body, encoded back to back) plus a fixed-size boxed entry, a 16-byte
//!   table slot and an expiry-heap item; it is charged the allocation rounded up to
//!   allocator size classes plus [`ENTRY_OVERHEAD`] (the entry, the table slot at 50 % load
//!   and 1.5 heap items). With the gateway's allocator, resident memory tracks the bound
//!   within about 10 % for small responses (BENCHMARKS.md, "Cost growth").
//! - **When full**, expired records go first, then finished records nearest their expiry
//!   (across all shards; each eviction peeks every shard, which is fine on this rare path).
//!   In-flight records with a live lease are never evicted: that would let a duplicate run
//!   while the first copy is still executing. If nothing more can go, `try_lock` fails with
//!   the transient [`StoreError::Full`] and the layer answers 503. Evicting a completed record
//!   before its retention ends re-opens its key; `idempotency_evictions_total` counts that,
//!   and the capacity should cover `retention × keyed request rate × response size`.
//! - **TTL**: each `try_lock` purges the expired records of its shard; eviction under
//!   pressure and [`MemoryStore::purge_expired`] sweep the others.
//! - **Sharded** `Mutex<Shard>` (16 shards, see `shard.rs` for the table and expiry heap). Locks are held for map operations only, never
//!   across an `.await`. Eviction visits other shards with `try_lock`, so two shards are
//!   never waited on at once and lock order cannot deadlock.
//! - **Time**: leases and TTLs run on `tokio::time::Instant`, so tests drive them with
//!   `start_paused`; wall-clock times for the admin view come from the injected [`Clock`].

use std::hash::RandomState;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tokio::time::Instant;

use super::{LockOutcome, RecordKey, Store, StoreError};
use crate::clock::{Clock, SystemClock};
use crate::fingerprint::Fingerprint;
use crate::record::{Completion, RecordInfo, RecordState};

mod blob;
mod shard;

use blob::Blob;
use shard::{charge, hash_key, Shard, State};

/// Bytes charged per record on top of its encoded key and response: its boxed entry, its
/// table slot at 50 % load and 1.5 expiry-heap items, computed from their layout (≈ 194
/// bytes on 64-bit targets). A record's whole charge is [`ENTRY_OVERHEAD`] plus its encoded
/// bytes rounded up to allocator size classes. Measured with `examples/store_growth.rs` under mimalloc (the
/// gateway's allocator): resident memory per record within about 10 % of the charge.
pub const ENTRY_OVERHEAD: usize = shard::RECORD_OVERHEAD;

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
    /// `idempotency_stored_bytes` and `idempotency_evictions_total`, resolved once against
    /// the recorder installed when the store is built (the gateway installs it first): a
    /// `gauge!` per request looked the series up in the registry every time.
    stored_bytes: metrics::Gauge,
    evictions: metrics::Counter,
}

// === impl MemoryStore ===

impl MemoryStore {
    /// A store holding at most `capacity_bytes`, stamping admin times with the system clock.
    pub fn new(capacity_bytes: usize) -> Self {
        Self::with_clock(capacity_bytes, Arc::new(SystemClock))
    }

    /// A store with an injected wall clock (for the admin view's timestamps only).
    pub fn with_clock(capacity_bytes: usize, clock: Arc<dyn Clock>) -> Self {
        let hasher = RandomState::new();
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::new())).collect(),
            hasher,
            capacity: capacity_bytes,
            used: AtomicUsize::new(0),
            next_fencing: AtomicU64::new(1),
            clock,
            stored_bytes: metrics::gauge!("idempotency_stored_bytes"),
            evictions: metrics::counter!("idempotency_evictions_total"),
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

    /// The key's hash and its shard. The shard comes from bits 32.. of the hash, which the
    /// shard's own table does not use for tables under 2^32 buckets (hashbrown takes the
    /// low bits for the bucket and the top 7 for the tag), so every table sees a uniform hash.
    fn locate(&self, key: &RecordKey) -> (u64, usize) {
        let hash = hash_key(&self.hasher, key);
        (hash, ((hash >> 32) as usize) % self.shards.len())
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
        self.after_reserve();
    }

    fn after_reserve(&self) {
        self.stored_bytes.set(self.used_bytes() as f64);
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
                let Ok(mut other) = shard.try_lock() else {
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
            if freed > 0 {
                self.evictions.increment(1);
            }
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
        let (hash, idx) = self.locate(key);
        let mut shard = lock(&self.shards[idx]);
        let (_, freed) = shard.purge_expired(now);
        self.unreserve(freed);

        let mut took_over = false;
        if let Some(entry) = shard.get(hash, key) {
            match entry.state {
                State::InFlight { lease_until } if lease_until <= now => took_over = true,
                _ if entry.fingerprint != *fingerprint => return Ok(LockOutcome::Mismatch),
                State::InFlight { lease_until } => {
                    return Ok(LockOutcome::InFlight {
                        lease_remaining: lease_until - now,
                    })
                }
                State::Completed(status) => {
                    return Ok(LockOutcome::Completed(entry.blob().response(status)))
                }
                State::TooLarge(status) => return Ok(LockOutcome::TooLarge { status }),
            }
        }

        let fencing = self.next_fencing.fetch_add(1, Ordering::Relaxed);
        let lease_until = now + lease.min(retention);
        if took_over {
            // Same key, key-only blob: the existing reservation covers the new holder.
            shard.take_over(
                hash,
                key,
                fencing,
                lease_until,
                now + retention,
                self.clock.now(),
            );
        } else {
            let blob = Blob::key_only(key);
            let needed = blob.as_ref().map_or(usize::MAX, |b| charge(b.len()));
            let Some(blob) = blob.filter(|_| self.reserve_evicting(&mut shard, idx, needed, now))
            else {
                return Err(StoreError::Full {
                    needed,
                    capacity: self.capacity,
                });
            };
            self.after_reserve();
            shard.insert(
                hash,
                blob,
                *fingerprint,
                fencing,
                lease_until,
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
        let (hash, idx) = self.locate(key);
        let mut shard = lock(&self.shards[idx]);
        let old_size = shard.check_holder(hash, key, fencing, now)?.1;
        let (state, blob) = match &completion {
            Completion::Response(response) => (
                State::Completed(response.status),
                shard
                    .get(hash, key)
                    .and_then(|e| e.blob().with_response(response)),
            ),
            Completion::TooLarge(status) => (State::TooLarge(*status), None),
        };
        // A too-large tombstone keeps the key-only blob: the in-flight reservation covers it.
        let new_size = blob.as_ref().map_or(old_size, |b| charge(b.len()));
        let fits = match (state, &blob) {
            (State::Completed(_), None) => false, // a part over 4 GiB: cannot be encoded
            _ => {
                new_size <= old_size
                    || self.reserve_evicting(&mut shard, idx, new_size - old_size, now)
            }
        };
        if !fits {
            // No room for the response. The request *did* run, so forgetting the key would
            // invite a duplicate execution: keep a small tombstone instead (no extra bytes
            // beyond the in-flight record's reservation), answered like a too-large response.
            let status = match state {
                State::Completed(status) | State::TooLarge(status) => status,
                State::InFlight { .. } => http::StatusCode::OK,
            };
            tracing::warn!(
                capacity = self.capacity,
                "idempotency memory store full: storing a too-large tombstone instead"
            );
            shard.set(hash, key, State::TooLarge(status), None, now + retention);
            return Ok(());
        }
        shard.set(hash, key, state, blob, now + retention);
        if new_size < old_size {
            self.unreserve(old_size - new_size);
        } else {
            self.after_reserve();
        }
        Ok(())
    }

    async fn release(&self, key: &RecordKey, fencing: u64) -> Result<(), StoreError> {
        let now = Instant::now();
        let (hash, idx) = self.locate(key);
        let mut shard = lock(&self.shards[idx]);
        shard.check_holder(hash, key, fencing, now)?;
        let freed = shard.remove(hash, key).unwrap_or(0);
        drop(shard);
        self.unreserve(freed);
        Ok(())
    }

    async fn get(&self, key: &RecordKey) -> Result<Option<RecordInfo>, StoreError> {
        let now = Instant::now();
        let (hash, idx) = self.locate(key);
        let shard = lock(&self.shards[idx]);
        let Some(entry) = shard.get(hash, key).filter(|e| e.expires_at > now) else {
            return Ok(None);
        };
        let (state, status) = match entry.state {
            State::InFlight { .. } => (RecordState::InFlight, None),
            State::Completed(status) => (RecordState::Completed, Some(status.as_u16())),
            State::TooLarge(status) => (RecordState::TooLarge, Some(status.as_u16())),
        };
        Ok(Some(RecordInfo {
            state,
            fingerprint_hex: entry.fingerprint.to_hex(),
            fencing: entry.fencing,
            status,
            created_at: entry.created_at,
            expires_at: self.wall_in(now, entry.expires_at),
        }))
    }

    async fn delete(&self, key: &RecordKey) -> Result<bool, StoreError> {
        let now = Instant::now();
        let (hash, idx) = self.locate(key);
        let mut shard = lock(&self.shards[idx]);
        let live = shard.get(hash, key).is_some_and(|e| e.expires_at > now);
        let freed = shard.remove(hash, key);
        drop(shard);
        self.unreserve(freed.unwrap_or(0));
        Ok(live)
    }
}

/// A poisoned shard only means another thread panicked mid-operation; every operation
/// leaves the map consistent before it can panic, so keep serving.
fn lock(m: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests;
