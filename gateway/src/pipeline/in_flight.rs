//! In-flight counting for the gateway's concurrency limits: a counter with an RAII permit
//! (the global load shedder, a tenant's `concurrency_limit`) and a bounded per-caller table (a
//! route's `concurrency_per_caller`); the response body holds permits until its last byte
//! (`plumbing::held`).
//!
//! A permit is released exactly once, by `Drop`: when the response body ends or is dropped,
//! or, for a request that never produced a response (client gone, future dropped), with the
//! request's future. Nothing here waits: admission is one compare-and-swap (counter) or one
//! short critical section on one shard (table), and a full limit is a refusal at once.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// One admitted request on an in-flight counter; decrements it when dropped.
#[derive(Debug)]
pub(crate) struct CountPermit(Arc<AtomicU64>);

// === impl CountPermit ===

impl CountPermit {
    /// Admits one more request on `count` if fewer than `limit` are in flight. A CAS loop
    /// rather than add-then-undo, so two racing requests at the limit never both see it
    /// exceeded and both get refused. Relaxed: the counter guards no other memory.
    pub(crate) fn try_acquire(count: &Arc<AtomicU64>, limit: u64) -> Option<Self> {
        count
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < limit).then_some(n + 1)
            })
            .ok()
            .map(|_| Self(count.clone()))
    }
}

impl Drop for CountPermit {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Shards of a [`KeyedCounts`] table: enough that callers rarely share a lock on a 2–16
/// core machine, few enough that an idle table is ~3 KiB.
const SHARDS: usize = 64;

/// In-flight requests per caller key, at most `limit` each. An entry exists only while its
/// caller has a request in flight (removed at zero), so the table never holds more entries
/// than requests in flight, which `server.load_shed_limit` bounds.
#[derive(Debug)]
pub(crate) struct KeyedCounts {
    limit: u32,
    /// Keys with a request in flight (entries in the table); read by the fair share.
    keys: AtomicUsize,
    shards: Box<[Mutex<Counts>]>,
}

/// One shard: in-flight count per key.
type Counts = HashMap<u64, u32, BuildHasherDefault<KeyHasher>>;

/// The table's hasher: keys are caller keys, already hashed with a per-process random key
/// (`plumbing::context::caller_key`), so they are used as they are rather than hashed again
/// (two hash runs per request saved; nobody outside can aim keys at one bucket).
#[derive(Debug, Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `u64` keys are hashed here; any other input still gets a deterministic hash.
        for byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*byte);
        }
    }

    fn write_u64(&mut self, key: u64) {
        self.0 = key;
    }
}

// === impl KeyedCounts ===

impl KeyedCounts {
    /// A table allowing `limit` requests in flight per key.
    pub(crate) fn new(limit: u32) -> Self {
        Self {
            limit,
            keys: AtomicUsize::new(0),
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
        }
    }

    /// The per-key limit.
    pub(crate) fn limit(&self) -> u32 {
        self.limit
    }

    /// Admits one more request of `key` if it has fewer than `limit` in flight.
    pub(crate) fn try_acquire(self: &Arc<Self>, key: u64) -> Option<KeyedPermit> {
        self.try_acquire_if(key, |_, _| true)
    }

    /// Admits one more request of `key` if it has fewer than `limit` in flight and
    /// `admit(its count, keys in flight)` agrees (decided under the key's shard lock, so
    /// the count cannot move meanwhile; the number of keys is a relaxed reading).
    pub(crate) fn try_acquire_if(
        self: &Arc<Self>,
        key: u64,
        admit: impl FnOnce(u32, usize) -> bool,
    ) -> Option<KeyedPermit> {
        let mut shard = self.shard(key);
        let count = shard.get(&key).copied().unwrap_or(0);
        if count >= self.limit || !admit(count, self.keys.load(Ordering::Relaxed)) {
            return None;
        }
        if count == 0 {
            self.keys.fetch_add(1, Ordering::Relaxed);
        }
        shard.insert(key, count + 1);
        drop(shard);
        Some(KeyedPermit {
            table: self.clone(),
            key,
        })
    }

    /// Requests of `key` in flight now (for tests).
    #[cfg(test)]
    fn count(&self, key: u64) -> u32 {
        self.shard(key).get(&key).copied().unwrap_or(0)
    }

    /// Keys with requests in flight (for tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        (0..SHARDS).map(|i| self.shard(i as u64).len()).sum()
    }

    fn shard(&self, key: u64) -> MutexGuard<'_, Counts> {
        // Keys are already hashes; the low bits pick the shard. A panic while holding a
        // shard cannot leave a count half-written (each update is one store), so a poisoned
        // lock is taken over rather than refusing every later request.
        // `shards` always has SHARDS entries, so the index is in bounds.
        let shard = &self.shards[(key % SHARDS as u64) as usize];
        shard
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// One admitted request of one key in a [`KeyedCounts`]; gives its slot back when dropped.
#[derive(Debug)]
pub(crate) struct KeyedPermit {
    table: Arc<KeyedCounts>,
    key: u64,
}

impl Drop for KeyedPermit {
    fn drop(&mut self) {
        let mut shard = self.table.shard(self.key);
        if let Some(count) = shard.get_mut(&self.key) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                shard.remove(&self.key);
                self.table.keys.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counter_admits_up_to_its_limit_and_permits_give_back() {
        let count = Arc::new(AtomicU64::new(0));
        let a = CountPermit::try_acquire(&count, 2).unwrap();
        let b = CountPermit::try_acquire(&count, 2).unwrap();
        assert!(CountPermit::try_acquire(&count, 2).is_none());
        assert_eq!(count.load(Ordering::Relaxed), 2, "a refusal counts nothing");
        drop(a);
        let c = CountPermit::try_acquire(&count, 2).unwrap();
        drop((b, c));
        assert_eq!(count.load(Ordering::Relaxed), 0);
        assert!(
            CountPermit::try_acquire(&count, 0).is_none(),
            "limit 0 admits none"
        );
    }

    #[test]
    fn a_table_limits_each_key_apart_and_forgets_idle_keys() {
        let table = Arc::new(KeyedCounts::new(1));
        let a = table.try_acquire(7).unwrap();
        assert!(table.try_acquire(7).is_none());
        let b = table.try_acquire(7 + SHARDS as u64).unwrap();
        assert_eq!(
            (table.count(7), table.len()),
            (1, 2),
            "same shard, other key"
        );
        assert_eq!(table.keys.load(Ordering::Relaxed), 2);
        drop(a);
        assert_eq!(table.len(), 1, "an entry goes at zero");
        assert_eq!(table.keys.load(Ordering::Relaxed), 1);
        assert!(table.try_acquire(7).is_some());
        drop(b);
        assert_eq!(table.len(), 0);
    }

    #[test]
    fn contended_admissions_never_exceed_the_limit() {
        let count = Arc::new(AtomicU64::new(0));
        let table = Arc::new(KeyedCounts::new(3));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (count, table) = (count.clone(), table.clone());
                std::thread::spawn(move || {
                    for _ in 0..2_000 {
                        let held = CountPermit::try_acquire(&count, 3);
                        assert!(count.load(Ordering::Relaxed) <= 3);
                        let keyed = table.try_acquire(1);
                        assert!(table.count(1) <= 3);
                        drop((held, keyed));
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!((count.load(Ordering::Relaxed), table.len()), (0, 0));
        assert_eq!(table.keys.load(Ordering::Relaxed), 0);
    }
}
