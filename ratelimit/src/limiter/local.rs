//! In-process GCRA on a sharded hash table: the embedded default and the fail-open fallback.
//!
//! # Layout
//!
//! Keys hash (SipHash, randomly seeded per process, so clients choosing IPs or tenant
//! names cannot force collisions) into one of `shards` tables, each behind its own mutex
//! and padded to its own cache lines. The hash is computed once per check and stored with
//! the entry, so probing and growing never re-hash the key. A request touching several
//! shards locks them in ascending index order (no deadlock) and holds them for the few
//! hundred nanoseconds of evaluate-then-commit, which is what makes the multi-policy
//! decision atomic. `governor` was not used because it decides one key at a time and cannot
//! make "all or nothing across tenant, route and global" atomic.
//!
//! # Memory bound
//!
//! An entry stores only the TAT (plus key and hash, ~32 bytes + the key's bytes). A key
//! whose TAT is in the past is a full bucket, identical to an absent key, so dropping it
//! loses nothing. Two mechanisms keep the table bounded:
//!
//! - **amortized sweep**: when a shard grows to twice its size after the previous sweep,
//!   the next insert drops all full buckets in it (O(shard) once per doubling, O(1)
//!   amortized per insert); [`LocalLimiter::sweep`] does the same for all shards on demand
//!   (e.g. from a periodic task, to give memory back after a spike);
//! - **hard cap** (`max_keys`, split evenly across shards): a shard at its cap evicts the
//!   entry with the earliest TAT among 8 sampled entries before inserting. Evicting a bucket
//!   that is not yet full forgets what that key spent, making it *more* permissive by at
//!   most one burst, never stricter; the cap only binds under a key-spraying flood.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use hashbrown::HashTable;
use smallvec::SmallVec;
use tokio::time::Instant;

use super::{Check, Limiter, LimiterError};
use crate::clock::{Clock, SystemClock};
use crate::decision::{Decision, Verdict};
use crate::gcra::{Evaluation, Gcra};
use crate::key::LimitKey;

/// Smallest shard size at which an insert triggers a sweep.
const MIN_SWEEP: usize = 64;
/// One tick of the local clock.
const NANO: Duration = Duration::from_nanos(1);
/// Entries sampled when a shard at its cap must evict one.
const EVICTION_SAMPLE: usize = 8;

/// Settings for [`LocalLimiter`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalLimiterConfig {
    /// Hard cap on tracked keys (default 1 000 000, roughly 80 MB with short keys).
    pub max_keys: usize,
    /// Number of independently locked shards, rounded up to a power of two (default 64).
    pub shards: usize,
    /// Divide every policy's rate and burst by this (min 1): the share of one replica out of
    /// `share` when standing in for a shared store. Default 1.
    pub share: u32,
}

/// In-process rate limiter. See the module docs.
#[derive(Debug)]
pub struct LocalLimiter {
    shards: Box<[Shard]>,
    mask: usize,
    shard_cap: usize,
    share: u64,
    hasher: RandomState,
    clock: Arc<dyn Clock>,
    origin: Instant,
}

// 128-byte alignment keeps two shards' mutexes off one cache line (and off one adjacent-line
// prefetch pair on x86), so two threads on different shards do not contend.
#[derive(Debug)]
#[repr(align(128))]
struct Shard(Mutex<Table>);

#[derive(Debug)]
struct Table {
    entries: HashTable<Entry>,
    sweep_at: usize,
}

#[derive(Debug)]
struct Entry {
    hash: u64,
    tat: u64,
    key: Box<str>,
}

// === impl LocalLimiterConfig ===

impl Default for LocalLimiterConfig {
    fn default() -> Self {
        Self {
            max_keys: 1_000_000,
            shards: 64,
            share: 1,
        }
    }
}

// === impl LocalLimiter ===

impl LocalLimiter {
    /// A limiter on the real clock with default settings.
    pub fn new() -> Self {
        Self::with_config(LocalLimiterConfig::default(), Arc::new(SystemClock))
    }

    /// A limiter with explicit settings and clock.
    pub fn with_config(config: LocalLimiterConfig, clock: Arc<dyn Clock>) -> Self {
        let shards = config.shards.clamp(1, 1 << 16).next_power_of_two();
        let shard_cap = config.max_keys.div_ceil(shards).max(1);
        let origin = clock.now();
        Self {
            shards: (0..shards)
                .map(|_| {
                    Shard(Mutex::new(Table {
                        entries: HashTable::new(),
                        sweep_at: MIN_SWEEP,
                    }))
                })
                .collect(),
            mask: shards - 1,
            shard_cap,
            share: u64::from(config.share.max(1)),
            hasher: RandomState::new(),
            clock,
            origin,
        }
    }

    /// Number of tracked keys (for a gauge; walks all shards).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).entries.len()).sum()
    }

    /// Whether no key is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `key` has state (a bucket that is not full, or not yet swept).
    pub fn contains(&self, key: &LimitKey) -> bool {
        let hash = self.hasher.hash_one(key.as_str());
        let table = lock(&self.shards[self.shard_of(hash)]);
        let key = key.as_str();
        table
            .entries
            .find(hash, |e| e.hash == hash && &*e.key == key)
            .is_some()
    }

    /// Drops every full bucket now. Optional: inserts already sweep amortized; call this
    /// periodically to return memory after a burst of one-off keys.
    pub fn sweep(&self) {
        let now = self.ticks();
        for shard in self.shards.iter() {
            let mut table = lock(shard);
            table.entries.retain(|e| e.tat > now);
            table.sweep_at = (table.entries.len() * 2).max(MIN_SWEEP);
        }
    }

    fn ticks(&self) -> u64 {
        let since = self.clock.now().saturating_duration_since(self.origin);
        u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
    }

    fn gcra(&self, check: &Check) -> Gcra {
        let p = &check.policy;
        if self.share == 1 {
            Gcra::new(p.interval_nanos(), p.burst())
        } else {
            // Off the hot path (fallback only): exact per × share / rate, rounded up once.
            let interval =
                (p.per().as_nanos() * u128::from(self.share)).div_ceil(u128::from(p.rate()));
            Gcra::new(
                u64::try_from(interval).unwrap_or(u64::MAX),
                (p.burst() / self.share).max(1),
            )
        }
    }

    fn shard_of(&self, hash: u64) -> usize {
        // hashbrown places entries by the low bits and tags them with the top 7; pick the
        // shard from the middle so shard choice and in-table position stay independent.
        (hash >> 32) as usize & self.mask
    }

    fn decide(&self, checks: &[Check], commit: bool) -> Verdict {
        // Read the clock before taking any lock: it keeps ~20 ns of clock_gettime out of the
        // critical section. A reading a few ns stale only makes the decision stricter.
        let now = self.ticks();
        if let [check] = checks {
            return self.decide_one(check, now, commit);
        }
        let hashes: SmallVec<[u64; 4]> = checks
            .iter()
            .map(|c| self.hasher.hash_one(c.key.as_str()))
            .collect();
        let mut order: SmallVec<[usize; 4]> = hashes.iter().map(|&h| self.shard_of(h)).collect();
        order.sort_unstable();
        order.dedup();
        // Ascending order: two requests sharing shards always lock them in the same order.
        let mut guards: SmallVec<[MutexGuard<'_, Table>; 4]> =
            order.iter().map(|&i| lock(&self.shards[i])).collect();
        let slot = |hash: u64| order.binary_search(&self.shard_of(hash)).unwrap_or(0);

        let evals: SmallVec<[Evaluation; 4]> = checks
            .iter()
            .zip(&hashes)
            .map(|(check, &hash)| {
                let stored = guards[slot(hash)].tat(hash, check.key.as_str());
                self.gcra(check)
                    .evaluate(stored, now, u64::from(check.cost))
            })
            .collect();
        let admitted = !checks
            .iter()
            .zip(&evals)
            .any(|(c, e)| !e.allowed && !c.policy.is_shadow());

        if commit && admitted {
            for ((check, &hash), eval) in checks.iter().zip(&hashes).zip(&evals) {
                if eval.allowed && eval.new_tat > now {
                    let table = &mut guards[slot(hash)];
                    table.store(hash, check.key.as_str(), eval.new_tat, now, self.shard_cap);
                }
            }
        }
        drop(guards);

        Verdict::from_decisions(checks.iter().zip(&evals).map(|(c, e)| -> Decision {
            e.decision(commit && admitted && e.allowed, c.policy.is_shadow(), NANO)
        }))
    }

    /// The common single-policy case, without the multi-lock bookkeeping.
    fn decide_one(&self, check: &Check, now: u64, commit: bool) -> Verdict {
        let key = check.key.as_str();
        let hash = self.hasher.hash_one(key);
        let gcra = self.gcra(check);
        let eval = {
            let mut table = lock(&self.shards[self.shard_of(hash)]);
            let eval = gcra.evaluate(table.tat(hash, key), now, u64::from(check.cost));
            if commit && eval.allowed && eval.new_tat > now {
                table.store(hash, key, eval.new_tat, now, self.shard_cap);
            }
            eval
        };
        let shadow = check.policy.is_shadow();
        // A lone shadow check that would reject admits the request without consuming.
        let committed = commit && eval.allowed;
        Verdict::single(eval.decision(committed, shadow, NANO))
    }
}

impl Default for LocalLimiter {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait]
impl Limiter for LocalLimiter {
    async fn check(&self, checks: &[Check]) -> Result<Verdict, LimiterError> {
        Ok(self.decide(checks, true))
    }

    async fn peek(&self, checks: &[Check]) -> Result<Verdict, LimiterError> {
        Ok(self.decide(checks, false))
    }
}

// === impl Table ===

impl Table {
    fn tat(&self, hash: u64, key: &str) -> Option<u64> {
        self.entries
            .find(hash, |e| e.hash == hash && &*e.key == key)
            .map(|e| e.tat)
    }

    fn store(&mut self, hash: u64, key: &str, tat: u64, now: u64, cap: usize) {
        if let Some(e) = self
            .entries
            .find_mut(hash, |e| e.hash == hash && &*e.key == key)
        {
            e.tat = tat;
            return;
        }
        if self.entries.len() >= cap {
            self.evict_one();
        } else if self.entries.len() >= self.sweep_at {
            self.entries.retain(|e| e.tat > now);
            self.sweep_at = (self.entries.len() * 2).max(MIN_SWEEP);
        }
        let entry = Entry {
            hash,
            tat,
            key: key.into(),
        };
        self.entries.insert_unique(hash, entry, |e| e.hash);
    }

    fn evict_one(&mut self) {
        let victim = self
            .entries
            .iter()
            .take(EVICTION_SAMPLE)
            .min_by_key(|e| e.tat)
            .map(|e| (e.hash, e.key.clone()));
        if let Some((hash, key)) = victim {
            if let Ok(entry) = self
                .entries
                .find_entry(hash, |e| e.hash == hash && e.key == key)
            {
                entry.remove();
            }
        }
    }
}

fn lock(shard: &Shard) -> MutexGuard<'_, Table> {
    // A panic while holding a shard cannot leave an entry half-written (each is a plain
    // integer update), so a poisoned lock is still a consistent table.
    shard.0.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests;
