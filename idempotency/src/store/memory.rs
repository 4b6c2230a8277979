//! In-process store for the single-node embedded mode.
//!
//! - **Bounded by bytes**, not entries: one stored 1 MiB response weighs as much as thousands
//!   of small ones. A record is one exact-size allocation (its key, and once completed its
//!   status, headers and body, encoded back to back) plus a fixed-size boxed entry, a 16-byte
//!   table slot and an expiry-heap item; it is charged the allocation rounded up to
//!   allocator size classes plus [`ENTRY_OVERHEAD`] (the entry, the table slot at 50 % load
//!   and 1.5 heap items). With the gateway's allocator, resident memory tracks the bound
//!   within about 10 % for small responses (BENCHMARKS.md, "Cost growth").
//! - **Nothing live is evicted.** A record stays until its retention ends, is released or
//!   deleted: evicting a completed record early would re-open its key, and the client's retry
//!   would execute a second time. When a new key does not fit, expired records are swept
//!   (all shards) and, if that is not enough, `try_lock` fails with a transient error and the
//!   layer answers 503: [`StoreError::ShareFull`] when the tenant's share is full,
//!   [`StoreError::Full`] when the whole bound is. A completion that does not fit keeps a
//!   small too-large tombstone (answered 422 on replay), never nothing.
//! - **Shares** ([`Shares`]): each record is charged to its tenant's share as well as to the
//!   bound, so one tenant's load can fill its own share and never another's room. Without
//!   [`MemoryStore::with_shares`] every tenant may use the whole bound ([`Whole`]).
//! - **TTL**: each `try_lock` purges the expired records of its shard; a full store and
//!   [`MemoryStore::purge_expired`] sweep the others.
//! - **Sharded** `Mutex<Shard>` (16 shards, see `shard.rs` for the table and expiry heap).
//!   Locks are held for map operations only, never across an `.await`. The sweep visits other
//!   shards with `try_lock`, so two shards are never waited on at once and lock order cannot
//!   deadlock.
//! - **Time**: leases and TTLs run on `tokio::time::Instant`, so tests drive them with
//!   `start_paused`; wall-clock times for the admin view come from the injected [`WallClock`].

use std::hash::RandomState;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tokio::time::Instant;

use super::{LockOutcome, RecordKey, Store, StoreError};
use crate::fingerprint::Fingerprint;
use crate::record::{Completion, RecordInfo, RecordState};
use portcullis_problem::clock::{SystemWallClock, WallClock};

mod blob;
mod shard;
mod share;

use blob::Blob;
use shard::{charge, hash_key, Shard, State};
use share::{ShareTable, ShareUse};

pub use share::{Shares, Whole};

/// Bytes charged per record on top of its encoded key and response: its boxed entry, its
/// table slot at 50 % load and 1.5 expiry-heap items, computed from their layout (≈ 194
/// bytes on 64-bit targets). A record's whole charge is [`ENTRY_OVERHEAD`] plus its encoded
/// bytes rounded up to allocator size classes. Measured with `examples/store_growth.rs` under mimalloc (the
/// gateway's allocator): resident memory per record within about 10 % of the charge.
pub const ENTRY_OVERHEAD: usize = shard::RECORD_OVERHEAD;

/// Default capacity: 64 MiB.
pub const DEFAULT_CAPACITY_BYTES: usize = 64 << 20;

const SHARDS: usize = 16;

/// In-memory [`Store`], bounded by bytes, with TTL eviction.
pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    capacity: usize,
    used: AtomicUsize,
    shares: Arc<dyn Shares>,
    share_use: ShareTable,
    next_fencing: AtomicU64,
    clock: Arc<dyn WallClock>,
    /// `idempotency_stored_bytes`, resolved once against the recorder installed when the
    /// store is built (the gateway installs it first): a `gauge!` per request looked the
    /// series up in the registry every time.
    stored_bytes: metrics::Gauge,
}

// === impl MemoryStore ===

impl MemoryStore {
    /// A store holding at most `capacity_bytes`, stamping admin times with the system clock.
    pub fn new(capacity_bytes: usize) -> Self {
        Self::with_clock(capacity_bytes, Arc::new(SystemWallClock))
    }

    /// A store with an injected wall clock (for the admin view's timestamps only).
    pub fn with_clock(capacity_bytes: usize, clock: Arc<dyn WallClock>) -> Self {
        let hasher = RandomState::new();
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::new())).collect(),
            hasher,
            capacity: capacity_bytes,
            used: AtomicUsize::new(0),
            shares: Arc::new(Whole),
            share_use: ShareTable::default(),
            next_fencing: AtomicU64::new(1),
            clock,
            stored_bytes: metrics::gauge!("idempotency_stored_bytes"),
        }
    }

    /// Splits the bound between tenants by `shares` (see [`Shares`]).
    pub fn with_shares(mut self, shares: Arc<dyn Shares>) -> Self {
        self.shares = shares;
        self
    }

    /// Bytes currently charged to the share `tenant` belongs to.
    pub fn share_used_bytes(&self, tenant: &str) -> usize {
        self.share_use.get(&self.shares.share_of(tenant)).used()
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

    /// Reserves `needed` bytes of the bound, sweeping expired records (all shards) when they
    /// do not fit at once. Returns whether the bytes are reserved.
    fn reserve_sweeping(
        &self,
        own: &mut Shard,
        own_idx: usize,
        needed: usize,
        now: Instant,
    ) -> bool {
        if self.try_reserve(needed) {
            return true;
        }
        self.sweep(own, own_idx, now);
        self.try_reserve(needed)
    }

    /// Removes the expired records of every shard: `own` (index `own_idx`), held by the
    /// caller, and the others that are not busy.
    fn sweep(&self, own: &mut Shard, own_idx: usize, now: Instant) {
        let mut freed = own.purge_expired(now).1;
        for (i, shard) in self.shards.iter().enumerate() {
            if i != own_idx {
                if let Ok(mut other) = shard.try_lock() {
                    freed += other.purge_expired(now).1;
                }
            }
        }
        self.unreserve(freed);
    }

    /// Reserves `needed` bytes in the bound and in `share` (of at most `limit`), or neither.
    fn reserve_in_share(
        &self,
        share: &ShareUse,
        limit: usize,
        own: &mut Shard,
        own_idx: usize,
        needed: usize,
        now: Instant,
    ) -> Result<(), Refused> {
        if !self.reserve_sweeping(own, own_idx, needed, now) {
            return Err(Refused::Bound);
        }
        if share.try_reserve(needed, limit) {
            return Ok(());
        }
        // The share may hold expired records that the bound did not need swept.
        self.sweep(own, own_idx, now);
        if share.try_reserve(needed, limit) {
            return Ok(());
        }
        self.unreserve(needed);
        Err(Refused::Share)
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
            let Some(blob) = Blob::key_only(key) else {
                return Err(StoreError::Full {
                    needed: usize::MAX,
                    capacity: self.capacity,
                });
            };
            let needed = charge(blob.len());
            let name = self.shares.share_of(&key.tenant);
            let limit = self.shares.bytes(&name, self.capacity);
            let share = self.share_use.get(&name);
            let admitted = if share.takes_new_keys(limit) {
                self.reserve_in_share(&share, limit, &mut shard, idx, needed, now)
            } else {
                // Expired records may be what keeps the share full.
                self.sweep(&mut shard, idx, now);
                if share.takes_new_keys(limit) {
                    self.reserve_in_share(&share, limit, &mut shard, idx, needed, now)
                } else {
                    Err(Refused::Share)
                }
            };
            match admitted {
                Ok(()) => {}
                Err(Refused::Share) => {
                    return Err(StoreError::ShareFull {
                        share: name.into_owned(),
                        needed,
                        limit,
                    })
                }
                Err(Refused::Bound) => {
                    return Err(StoreError::Full {
                        needed,
                        capacity: self.capacity,
                    })
                }
            }
            self.after_reserve();
            shard.insert(
                hash,
                blob,
                share,
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
        let share = shard
            .get(hash, key)
            .map(|e| e.share().clone())
            .unwrap_or_default();
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
                new_size <= old_size || {
                    let limit = self
                        .shares
                        .bytes(&self.shares.share_of(&key.tenant), self.capacity);
                    let growth = new_size - old_size;
                    let stored = self.reserve_in_share(&share, limit, &mut shard, idx, growth, now);
                    if let Err(Refused::Share) = stored {
                        share.turn_away(growth);
                    }
                    stored.is_ok()
                }
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
                tenant = %key.tenant,
                "no room for the response in the idempotency memory store or the tenant's \
                 share: storing a too-large tombstone instead"
            );
            shard.set(hash, key, State::TooLarge(status), None, now + retention);
            return Ok(());
        }
        shard.set(hash, key, state, blob, now + retention);
        if new_size < old_size {
            share.release(old_size - new_size);
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

/// Why a record could not be given room.
enum Refused {
    /// Its tenant's share is full.
    Share,
    /// The whole bound is.
    Bound,
}

/// A poisoned shard only means another thread panicked mid-operation; every operation
/// leaves the map consistent before it can panic, so keep serving.
fn lock(m: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests;
