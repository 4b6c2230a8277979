//! Shares of the memory store's bound: which share a record's tenant is charged to, how many
//! bytes that share may hold, and what each share holds now.
//!
//! The store never evicts a live record (see the store's docs), so without shares one tenant
//! filling the bound would leave every other tenant with 503s. With shares a tenant fills only
//! its own: the store refuses its *new* keys with [`StoreError::ShareFull`] while every other
//! share keeps its room.
//!
//! When is a share full? A new key needs only a small in-flight record; its response's size
//! is known only at completion. So a share is full for new keys once a response did not fit
//! it (that record keeps a too-large tombstone, so its key still never executes twice), until
//! expiries leave room for a response of that size again; or, earlier, when not even the
//! in-flight record fits.
//!
//! [`StoreError::ShareFull`]: crate::StoreError::ShareFull

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

/// How a bounded store's bytes are split between tenants. Implemented by the embedding
/// application, which knows its tenants; [`Whole`] is the rule without shares.
pub trait Shares: Send + Sync + 'static {
    /// The share a record of `tenant` (a [`RecordKey::tenant`](crate::RecordKey)) is charged
    /// to. Several scopes may share one, as per-address anonymous scopes usually should.
    fn share_of<'t>(&self, tenant: &'t str) -> Cow<'t, str>;

    /// Bytes the share named `share` may hold in a store of `capacity` bytes.
    fn bytes(&self, share: &str, capacity: usize) -> usize;
}

/// Every tenant may use the whole store (first come, first served).
#[derive(Debug, Clone, Copy, Default)]
pub struct Whole;

impl Shares for Whole {
    fn share_of<'t>(&self, _tenant: &'t str) -> Cow<'t, str> {
        Cow::Borrowed("")
    }

    fn bytes(&self, _share: &str, capacity: usize) -> usize {
        capacity
    }
}

/// Bytes one share holds; every record keeps its share's counter and gives its bytes back
/// when it goes.
#[derive(Debug, Default)]
pub(super) struct ShareUse {
    used: AtomicUsize,
    /// Bytes of the last response the share had no room for (0: none since it had room).
    turned_away: AtomicUsize,
}

impl ShareUse {
    /// Whether a new key may lock: no response was turned away, or one of that size fits
    /// again (which clears the mark).
    pub(super) fn takes_new_keys(&self, limit: usize) -> bool {
        let turned_away = self.turned_away.load(Ordering::Relaxed);
        if turned_away == 0 {
            return true;
        }
        if self.used().saturating_add(turned_away) > limit {
            return false;
        }
        self.turned_away.store(0, Ordering::Relaxed);
        true
    }

    /// A response needing `n` more bytes did not fit.
    pub(super) fn turn_away(&self, n: usize) {
        self.turned_away.fetch_max(n.max(1), Ordering::Relaxed);
    }

    /// Adds `n` bytes unless that would take the share past `limit`.
    pub(super) fn try_reserve(&self, n: usize, limit: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(n).filter(|&t| t <= limit)
            })
            .is_ok()
    }

    pub(super) fn release(&self, n: usize) {
        // Saturating: a release never takes more than was reserved, but never wrap if it did.
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                Some(u.saturating_sub(n))
            });
    }

    pub(super) fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }
}

/// The counter of every share seen so far. Shares are tenants (and the anonymous scope), a
/// set the administrators control, so the table is not bounded further.
#[derive(Debug, Default)]
pub(super) struct ShareTable {
    by_name: RwLock<HashMap<Box<str>, Arc<ShareUse>>>,
}

impl ShareTable {
    pub(super) fn get(&self, name: &str) -> Arc<ShareUse> {
        if let Some(found) = read(&self.by_name).get(name) {
            return found.clone();
        }
        let mut map = self.by_name.write().unwrap_or_else(|p| p.into_inner());
        map.entry(name.into()).or_default().clone()
    }
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|p| p.into_inner())
}
