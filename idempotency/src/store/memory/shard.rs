//! One shard of the memory store: a hash table of compact entries plus an expiry heap.
//!
//! - **Table**: a `hashbrown::HashTable` of [`Row`]s: the key's hash and the boxed [`Entry`]
//!   (16 bytes a slot; no key copy: the key lives in the entry's [`Blob`] and is compared
//!   from there). Slots this small keep growing the table and hashbrown's in-place rehash
//!   (run when removals have left it full of tombstones, i.e. steadily once the store is at
//!   its bound) to moving 16 bytes per record, without touching an entry or hashing again: with
//!   the ≈ 120-byte entries inline and re-hashed from their blobs, one such pass over a shard
//!   of 30 000 records stalled the request that triggered it for ~4–12 ms.
//! - **Expiry index**: a binary min-heap of `(expiry, seq, hash)`, 32 bytes per record, with
//!   lazy deletion. It replaced a `BTreeMap<(Instant, u64), RecordKey>` that held a second copy
//!   of every key (three more allocations) in ≈ 100-byte node slots. An item's time is a
//!   *lower bound* of its record's expiry: when a completion pushes the expiry later, the item
//!   stays and is corrected when it reaches the top; removed records leave stale items that
//!   are dropped when they surface (a record is found by hash and `seq`, which is unique per
//!   shard). The heap is rebuilt from the table once stale items outnumber half the records,
//!   so it stays within 1.5 items per record. Uniform TTLs would allow a FIFO, but TTLs are
//!   per route and a completion moves a record's expiry, so the order is not insertion order.
//!
//! Byte accounting is returned to the caller (`MemoryStore` owns the global counter), so the
//! shard never needs to know about other shards; a record that goes gives its bytes back to
//! its tenant's share itself (see `share.rs`).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::hash::{BuildHasher, Hasher, RandomState};
use std::mem::size_of;
use std::sync::Arc;
use std::time::SystemTime;

use hashbrown::HashTable;
use http::StatusCode;
use tokio::time::Instant;

use super::blob::Blob;
use super::share::ShareUse;
use crate::fingerprint::Fingerprint;
use crate::store::{RecordKey, StoreError};

/// Bytes charged per record besides its blob, from the real layout: the table slot (a
/// [`Row`] and one control byte) at 50 % load (hashbrown runs between 7/16 just after doubling
/// and 7/8 just before), the boxed [`Entry`] rounded up to a 16-byte size class, and 1.5 heap
/// items (vector growth and stale items).
pub(super) const RECORD_OVERHEAD: usize = 2 * (size_of::<Row>() + 1)
    + size_of::<Entry>().next_multiple_of(16)
    + size_of::<Reverse<Slot>>() * 3 / 2;

/// A table slot: the record's key hash beside its entry, so that the table re-hashes from
/// the slot alone.
#[derive(Debug)]
pub(super) struct Row {
    hash: u64,
    entry: Box<Entry>,
}

/// A stored record with its bookkeeping.
#[derive(Debug)]
pub(super) struct Entry {
    blob: Blob,
    pub(super) state: State,
    pub(super) fingerprint: Fingerprint,
    /// Latest holder's fencing token (kept after completion for the admin view).
    pub(super) fencing: u64,
    pub(super) expires_at: Instant,
    pub(super) created_at: SystemTime,
    /// The share this record's bytes are charged to.
    share: Arc<ShareUse>,
    seq: u64,
}

/// What a record is; the response of a completed one is in the entry's blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    InFlight { lease_until: Instant },
    Completed(StatusCode),
    TooLarge(StatusCode),
}

/// An expiry-heap item: a lower bound of the record's expiry, and how to find the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Slot {
    at: Instant,
    seq: u64,
    hash: u64,
}

#[derive(Debug)]
pub(super) struct Shard {
    table: HashTable<Row>,
    by_expiry: BinaryHeap<Reverse<Slot>>,
    seq: u64,
}

/// Hash of a record key, as the table sees it (the store picks the shard from other bits).
/// Computed once per store call; the table keeps it in the slot and never hashes again.
pub(super) fn hash_key(hasher: &RandomState, key: &RecordKey) -> u64 {
    let mut h = hasher.build_hasher();
    // Length-prefixed so ("ab", "c") and ("a", "bc") differ.
    for part in [key.tenant.as_str(), key.route.as_str(), key.key.as_str()] {
        h.write_usize(part.len());
        h.write(part.as_bytes());
    }
    h.finish()
}

/// Bytes charged for a record whose blob is `blob_len` long: the allocation rounded up the
/// way size-class allocators do (16-byte granules, and 1/16 on average for classes 1/8
/// apart, as mimalloc's are), plus [`RECORD_OVERHEAD`].
pub(super) const fn charge(blob_len: usize) -> usize {
    blob_len.next_multiple_of(16) + blob_len / 16 + RECORD_OVERHEAD
}

// === impl Entry ===

impl Entry {
    /// Bytes this record is charged.
    pub(super) fn size(&self) -> usize {
        charge(self.blob.len())
    }

    pub(super) fn blob(&self) -> &Blob {
        &self.blob
    }

    pub(super) fn share(&self) -> &Arc<ShareUse> {
        &self.share
    }

    /// The record leaves the store: its bytes go back to its share. Returns its size.
    fn gone(&self) -> usize {
        let size = self.size();
        self.share.release(size);
        size
    }
}

// === impl Shard ===

impl Shard {
    pub(super) fn new() -> Self {
        Self {
            table: HashTable::new(),
            by_expiry: BinaryHeap::new(),
            seq: 0,
        }
    }

    pub(super) fn get(&self, hash: u64, key: &RecordKey) -> Option<&Entry> {
        self.table
            .find(hash, |r| r.entry.blob.key_is(key))
            .map(|r| &*r.entry)
    }

    /// Drops every record whose retention has passed. Returns (records, bytes) freed.
    pub(super) fn purge_expired(&mut self, now: Instant) -> (usize, usize) {
        let (mut count, mut bytes) = (0, 0);
        // Each item due by `now` is popped once; corrected ones go back with a later time.
        for _ in 0..self.by_expiry.len() {
            let Some(&Reverse(slot)) = self.by_expiry.peek() else {
                break;
            };
            if slot.at > now {
                break;
            }
            self.by_expiry.pop();
            if let Ok(found) = self
                .table
                .find_entry(slot.hash, |r| r.entry.seq == slot.seq)
            {
                let expires_at = found.get().entry.expires_at;
                if expires_at > now {
                    self.by_expiry.push(Reverse(Slot {
                        at: expires_at,
                        ..slot
                    }));
                } else {
                    bytes += found.remove().0.entry.gone();
                    count += 1;
                }
            }
        }
        (count, bytes)
    }

    /// Inserts a new in-flight record (the key must not be in the table), its bytes already
    /// reserved in `share`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn insert(
        &mut self,
        hash: u64,
        blob: Blob,
        share: Arc<ShareUse>,
        fingerprint: Fingerprint,
        fencing: u64,
        lease_until: Instant,
        expires_at: Instant,
        created_at: SystemTime,
    ) {
        let seq = self.next_seq();
        let entry = Box::new(Entry {
            blob,
            state: State::InFlight { lease_until },
            fingerprint,
            fencing,
            expires_at,
            created_at,
            share,
            seq,
        });
        self.table
            .insert_unique(hash, Row { hash, entry }, |r| r.hash);
        self.by_expiry.push(Reverse(Slot {
            at: expires_at,
            seq,
            hash,
        }));
    }

    /// Replaces an expired lease with a new holder's (takeover): new fencing token, lease,
    /// expiry and creation time; the blob (the key alone) and its size are unchanged.
    pub(super) fn take_over(
        &mut self,
        hash: u64,
        key: &RecordKey,
        fencing: u64,
        lease_until: Instant,
        expires_at: Instant,
        created_at: SystemTime,
    ) {
        self.update(hash, key, expires_at, |e| {
            e.state = State::InFlight { lease_until };
            e.fencing = fencing;
            e.created_at = created_at;
        });
    }

    /// Stores a completion over the holder's in-flight record: the new state and, for a
    /// stored response, the blob holding it (`None` keeps the key-only blob).
    pub(super) fn set(
        &mut self,
        hash: u64,
        key: &RecordKey,
        state: State,
        blob: Option<Blob>,
        expires_at: Instant,
    ) {
        self.update(hash, key, expires_at, |e| {
            e.state = state;
            if let Some(blob) = blob {
                e.blob = blob;
            }
        });
    }

    fn update(
        &mut self,
        hash: u64,
        key: &RecordKey,
        expires_at: Instant,
        change: impl FnOnce(&mut Entry),
    ) {
        let seq = self.next_seq();
        let Some(Row { entry: e, .. }) = self.table.find_mut(hash, |r| r.entry.blob.key_is(key))
        else {
            return;
        };
        change(e);
        // A later expiry keeps the heap item (a lower bound, corrected lazily); an earlier
        // one needs a new item, and a new seq turns the old item stale.
        let earlier = expires_at < e.expires_at;
        e.expires_at = expires_at;
        if earlier {
            e.seq = seq;
            self.by_expiry.push(Reverse(Slot {
                at: expires_at,
                seq,
                hash,
            }));
            self.compact_index();
        }
    }

    /// Checks that `fencing` holds a live lease on `key`; returns the record's fingerprint and
    /// current size.
    pub(super) fn check_holder(
        &self,
        hash: u64,
        key: &RecordKey,
        fencing: u64,
        now: Instant,
    ) -> Result<(Fingerprint, usize), StoreError> {
        let lost = StoreError::LeaseLost { presented: fencing };
        let Some(e) = self.get(hash, key).filter(|e| e.expires_at > now) else {
            return Err(lost);
        };
        match e.state {
            State::InFlight { lease_until } if e.fencing == fencing => {
                if lease_until <= now {
                    Err(lost)
                } else {
                    Ok((e.fingerprint, e.size()))
                }
            }
            _ => Err(StoreError::Fenced { presented: fencing }),
        }
    }

    /// Removes a record; returns its size when one was there.
    pub(super) fn remove(&mut self, hash: u64, key: &RecordKey) -> Option<usize> {
        let found = self
            .table
            .find_entry(hash, |r| r.entry.blob.key_is(key))
            .ok()?;
        let size = found.remove().0.entry.gone();
        self.compact_index();
        Some(size)
    }

    /// Rebuilds the heap once stale items exceed half the records (plus slack, so small
    /// shards do not rebuild on every removal): amortised O(1) per removal, and the heap
    /// stays within the 1.5 items per record that [`RECORD_OVERHEAD`] charges.
    fn compact_index(&mut self) {
        let live = self.table.len();
        if self.by_expiry.len() <= live + live / 2 + 1024 {
            return;
        }
        self.by_expiry = self
            .table
            .iter()
            .map(|r| {
                Reverse(Slot {
                    at: r.entry.expires_at,
                    seq: r.entry.seq,
                    hash: r.hash,
                })
            })
            .collect();
    }

    /// Items in the expiry heap, stale ones included (tests check its bound).
    #[cfg(test)]
    pub(super) fn index_len(&self) -> usize {
        self.by_expiry.len()
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }
}
