//! One shard of the memory store: a map plus an expiry index.
//!
//! Byte accounting is returned to the caller (`MemoryStore` owns the global counter), so the
//! shard never needs to know about other shards.

use std::collections::{BTreeMap, HashMap};
use std::time::SystemTime;

use tokio::time::Instant;

use super::ENTRY_OVERHEAD;
use crate::fingerprint::Fingerprint;
use crate::record::Record;
use crate::store::{RecordKey, StoreError};

/// A stored record with its bookkeeping.
#[derive(Debug)]
pub(super) struct Entry {
    pub(super) record: Record,
    /// Latest holder's fencing token (kept after completion for the admin view).
    pub(super) fencing: u64,
    pub(super) size: usize,
    pub(super) expires_at: Instant,
    pub(super) created_at: SystemTime,
    seq: u64,
}

#[derive(Debug, Default)]
pub(super) struct Shard {
    pub(super) map: HashMap<RecordKey, Entry>,
    /// (expiry, insertion sequence) → key; the sequence makes equal instants distinct.
    by_expiry: BTreeMap<(Instant, u64), RecordKey>,
    seq: u64,
}

// === impl Entry ===

impl Entry {
    pub(super) fn size_of(key: &RecordKey, record: &Record) -> usize {
        // Key strings live twice: in the map and in the expiry index.
        let key_bytes = 2 * (key.tenant.len() + key.route.len() + key.key.as_str().len());
        let payload = match record {
            Record::Completed { response, .. } => response.size_bytes(),
            Record::InFlight { .. } | Record::TooLarge { .. } => 0,
        };
        key_bytes + payload + ENTRY_OVERHEAD
    }
}

// === impl Shard ===

impl Shard {
    /// Drops every record whose retention has passed. Returns (records, bytes) freed.
    pub(super) fn purge_expired(&mut self, now: Instant) -> (usize, usize) {
        let mut count = 0;
        let mut bytes = 0;
        while let Some(entry) = self.by_expiry.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let key = entry.remove();
            if let Some(e) = self.map.remove(&key) {
                bytes += e.size;
                count += 1;
            }
        }
        (count, bytes)
    }

    /// Expiry of the record [`evict_first`](Self::evict_first) would remove.
    pub(super) fn first_evictable(&self, now: Instant) -> Option<Instant> {
        self.first_evictable_slot(now).map(|slot| slot.0)
    }

    /// Evicts the finished record nearest its expiry (or an in-flight one whose lease ran
    /// out: its holder is gone). Live in-flight records are never touched. Returns bytes
    /// freed (0 when nothing is evictable).
    pub(super) fn evict_first(&mut self, now: Instant) -> usize {
        let Some(slot) = self.first_evictable_slot(now) else {
            return 0;
        };
        let Some(key) = self.by_expiry.remove(&slot) else {
            return 0;
        };
        metrics::counter!("idempotency_evictions_total").increment(1);
        self.map.remove(&key).map_or(0, |e| e.size)
    }

    fn first_evictable_slot(&self, now: Instant) -> Option<(Instant, u64)> {
        // Live locks are bounded by request concurrency, so skipping them stays cheap.
        self.by_expiry.iter().find_map(|(slot, key)| {
            let e = self.map.get(key)?;
            let live_lock =
                matches!(e.record, Record::InFlight { lease_until, .. } if lease_until > now);
            (!live_lock).then_some(*slot)
        })
    }

    pub(super) fn insert(
        &mut self,
        key: RecordKey,
        record: Record,
        size: usize,
        expires_at: Instant,
        created_at: SystemTime,
    ) {
        let seq = self.next_seq();
        let fencing = match record {
            Record::InFlight { fencing, .. } => fencing,
            _ => 0,
        };
        self.by_expiry.insert((expires_at, seq), key.clone());
        let old = self.map.insert(
            key,
            Entry {
                record,
                fencing,
                size,
                expires_at,
                created_at,
                seq,
            },
        );
        debug_assert!(old.is_none(), "insert over a live record");
    }

    /// Replaces an expired lease with a new holder's (takeover): new record, expiry and
    /// creation time; the byte size is unchanged.
    pub(super) fn replace(
        &mut self,
        key: &RecordKey,
        record: Record,
        expires_at: Instant,
        created_at: SystemTime,
    ) {
        if let Record::InFlight { fencing, .. } = record {
            if let Some(e) = self.map.get_mut(key) {
                e.fencing = fencing;
                e.created_at = created_at;
            }
        }
        self.set_inner(key, record, None, expires_at);
    }

    /// Stores a completion over the holder's in-flight record.
    pub(super) fn set(
        &mut self,
        key: &RecordKey,
        record: Record,
        size: usize,
        expires_at: Instant,
    ) {
        self.set_inner(key, record, Some(size), expires_at);
    }

    fn set_inner(
        &mut self,
        key: &RecordKey,
        record: Record,
        size: Option<usize>,
        expires_at: Instant,
    ) {
        let seq = self.next_seq();
        let Some(e) = self.map.get_mut(key) else {
            return;
        };
        self.by_expiry.remove(&(e.expires_at, e.seq));
        self.by_expiry.insert((expires_at, seq), key.clone());
        e.record = record;
        e.expires_at = expires_at;
        e.seq = seq;
        if let Some(size) = size {
            e.size = size;
        }
    }

    /// Checks that `fencing` holds a live lease on `key`; returns the record's fingerprint and
    /// current size.
    pub(super) fn check_holder(
        &self,
        key: &RecordKey,
        fencing: u64,
        now: Instant,
    ) -> Result<(Fingerprint, usize), StoreError> {
        let lost = StoreError::LeaseLost { presented: fencing };
        let Some(e) = self.map.get(key).filter(|e| e.expires_at > now) else {
            return Err(lost);
        };
        match &e.record {
            Record::InFlight {
                fencing: f,
                lease_until,
                fingerprint,
            } if *f == fencing => {
                if *lease_until <= now {
                    Err(lost)
                } else {
                    Ok((*fingerprint, e.size))
                }
            }
            _ => Err(StoreError::Fenced { presented: fencing }),
        }
    }

    /// Removes a record; returns its size when one was there.
    pub(super) fn remove(&mut self, key: &RecordKey) -> Option<usize> {
        let e = self.map.remove(key)?;
        self.by_expiry.remove(&(e.expires_at, e.seq));
        Some(e.size)
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }
}
