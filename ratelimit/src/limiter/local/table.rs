//! One shard's state of the [`LocalLimiter`](super::LocalLimiter): the buckets' theoretical
//! arrival times and the calendar quotas' counters, in hash tables keyed by the key's hash,
//! swept of expired entries as they grow and bounded by evicting a sampled entry at the cap.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use hashbrown::HashTable;

/// Smallest shard size at which an insert triggers a sweep.
const MIN_SWEEP: usize = 64;
/// Entries sampled when a shard at its cap must evict one.
const EVICTION_SAMPLE: usize = 8;

// 128-byte alignment keeps two shards' mutexes off one cache line (and off one adjacent-line
// prefetch pair on x86), so two threads on different shards do not contend.
#[derive(Debug)]
#[repr(align(128))]
pub(super) struct Shard(Mutex<Table>);

#[derive(Debug)]
pub(super) struct Table {
    entries: HashTable<Entry>,
    sweep_at: usize,
    counters: HashTable<Counter>,
    counters_sweep_at: usize,
}

#[derive(Debug)]
struct Entry {
    hash: u64,
    tat: u64,
    key: Box<str>,
}

/// One window of a calendar quota. Hashed by key alone (same shard as the key's buckets),
/// identified by key and window.
#[derive(Debug)]
struct Counter {
    hash: u64,
    window: u64,
    used: u64,
    /// Tick at which the window ends; the counter is worthless from then on.
    expires: u64,
    key: Box<str>,
}

#[derive(Debug, Clone, Copy)]
/// A calendar quota's current window: its id and the time left in it.
pub(super) struct WindowAt {
    pub(super) id: u64,
    pub(super) until_end: Duration,
}

// === impl Shard ===

impl Shard {
    pub(super) fn new() -> Self {
        Self(Mutex::new(Table {
            entries: HashTable::new(),
            sweep_at: MIN_SWEEP,
            counters: HashTable::new(),
            counters_sweep_at: MIN_SWEEP,
        }))
    }
}

// === impl Table ===

impl Table {
    /// Buckets and quota counters held.
    pub(super) fn len(&self) -> usize {
        self.entries.len() + self.counters.len()
    }

    /// Whether `key` has a bucket or a quota counter of any window.
    pub(super) fn contains(&self, hash: u64, key: &str) -> bool {
        self.entries
            .find(hash, |e| e.hash == hash && &*e.key == key)
            .is_some()
            || self
                .counters
                .find(hash, |c| c.hash == hash && &*c.key == key)
                .is_some()
    }

    pub(super) fn tat(&self, hash: u64, key: &str) -> Option<u64> {
        self.entries
            .find(hash, |e| e.hash == hash && &*e.key == key)
            .map(|e| e.tat)
    }

    pub(super) fn store(&mut self, hash: u64, key: &str, tat: u64, now: u64, cap: usize) {
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
            self.sweep_entries(now);
        }
        let entry = Entry {
            hash,
            tat,
            key: key.into(),
        };
        self.entries.insert_unique(hash, entry, |e| e.hash);
    }

    pub(super) fn remove(&mut self, hash: u64, key: &str) {
        if let Ok(entry) = self
            .entries
            .find_entry(hash, |e| e.hash == hash && &*e.key == key)
        {
            entry.remove();
        }
    }

    pub(super) fn sweep_entries(&mut self, now: u64) {
        self.entries.retain(|e| e.tat > now);
        self.sweep_at = (self.entries.len() * 2).max(MIN_SWEEP);
    }

    /// Units used in `window` of the quota `key` (0: no counter).
    pub(super) fn used(&self, hash: u64, key: &str, window: u64) -> u64 {
        self.counters
            .find(hash, |c| {
                c.hash == hash && c.window == window && &*c.key == key
            })
            .map_or(0, |c| c.used)
    }

    /// Sets the count of window `w` of the quota `key` to `used`, creating the counter
    /// (expiring when the window ends) if needed.
    pub(super) fn store_counter(
        &mut self,
        hash: u64,
        key: &str,
        w: WindowAt,
        used: u64,
        now: u64,
        cap: usize,
    ) {
        if let Some(c) = self.counters.find_mut(hash, |c| {
            c.hash == hash && c.window == w.id && &*c.key == key
        }) {
            c.used = used;
            return;
        }
        if self.counters.len() >= cap {
            self.evict_one_counter();
        } else if self.counters.len() >= self.counters_sweep_at {
            self.sweep_counters(now);
        }
        let counter = Counter {
            hash,
            window: w.id,
            used,
            expires: now.saturating_add(u64::try_from(w.until_end.as_nanos()).unwrap_or(u64::MAX)),
            key: key.into(),
        };
        self.counters.insert_unique(hash, counter, |c| c.hash);
    }

    pub(super) fn remove_counter(&mut self, hash: u64, key: &str, window: u64) {
        if let Ok(entry) = self.counters.find_entry(hash, |c| {
            c.hash == hash && c.window == window && &*c.key == key
        }) {
            entry.remove();
        }
    }

    /// Drops the counters of windows that have ended; a live counter is never dropped.
    pub(super) fn sweep_counters(&mut self, now: u64) {
        self.counters.retain(|c| c.expires > now);
        self.counters_sweep_at = (self.counters.len() * 2).max(MIN_SWEEP);
    }

    pub(super) fn evict_one(&mut self) {
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

    pub(super) fn evict_one_counter(&mut self) {
        let victim = self
            .counters
            .iter()
            .take(EVICTION_SAMPLE)
            .min_by_key(|c| c.expires)
            .map(|c| (c.hash, c.window, c.key.clone()));
        if let Some((hash, window, key)) = victim {
            self.remove_counter(hash, &key, window);
        }
    }
}

pub(super) fn lock(shard: &Shard) -> MutexGuard<'_, Table> {
    // A panic while holding a shard cannot leave an entry half-written (each is a plain
    // integer update), so a poisoned lock is still a consistent table.
    shard.0.lock().unwrap_or_else(PoisonError::into_inner)
}
