//! The caps on open tunnels: `max_websockets` per route and per tenant (per replica). A
//! tunnel holds its [`Slots`] from its admitted handshake until it closes; a handshake the
//! upstream does not answer 101 gives them back with the request.
//!
//! A route's count lives here; a tenant's lives on the tenant (`Tenant::websockets_open`),
//! so every kind of tenant — the file's `[[tenants]]`, those managed through the admin API
//! — has one, and a directory reload neither forgets open tunnels nor lets a burst in
//! beside them.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::config::Config;
use crate::plumbing::context::{Caller, RequestContext};

/// Open tunnels against one route's cap.
#[derive(Debug)]
struct Count {
    open: Arc<AtomicU32>,
    max: u32,
}

/// Which cap refused a handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Over {
    /// The route's `max_websockets`.
    Route(u32),
    /// The tenant's `max_websockets`.
    Tenant(u32),
}

/// The routes' caps, built once from the configuration.
#[derive(Debug, Default)]
pub(crate) struct Caps {
    /// By route index; `None`: no cap.
    routes: Box<[Option<Count>]>,
}

/// An admitted tunnel's places under its caps, given back on drop.
#[derive(Debug, Default)]
pub(crate) struct Slots(Vec<Arc<AtomicU32>>);

/// Request extension: the slots of an admitted handshake, taken by the proxy when the
/// tunnel opens (clones of the request share them).
#[derive(Debug, Clone, Default)]
pub(crate) struct Admitted(Arc<Mutex<Option<Slots>>>);

// === impl Caps ===

impl Caps {
    pub(crate) fn new(config: &Config) -> Self {
        Self {
            routes: config
                .routes
                .iter()
                .map(|r| {
                    let max = r.websocket.and_then(|w| w.max_open)?;
                    Some(Count {
                        open: Arc::default(),
                        max,
                    })
                })
                .collect(),
        }
    }

    /// One more tunnel for `context`, or the cap it would exceed.
    pub(crate) fn admit(&self, context: &RequestContext) -> Result<Slots, Over> {
        let mut slots = Slots::default();
        if let Some(count) = self
            .routes
            .get(context.route.index)
            .and_then(Option::as_ref)
        {
            slots.take(&count.open, count.max).map_err(Over::Route)?;
        }
        if let Caller::Tenant(tenant) = &context.caller {
            if let Some(max) = tenant.max_websockets {
                // The route's slot, if taken, goes back as `slots` drops.
                slots
                    .take(tenant.websockets_open(), max)
                    .map_err(Over::Tenant)?;
            }
        }
        Ok(slots)
    }
}

// === impl Slots ===

impl Slots {
    /// One place under `max` in `open`, or `max` when full.
    fn take(&mut self, open: &Arc<AtomicU32>, max: u32) -> Result<(), u32> {
        open.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < max).then_some(n + 1)
        })
        .map_err(|_| max)?;
        self.0.push(open.clone());
        Ok(())
    }
}

impl Drop for Slots {
    fn drop(&mut self) {
        for open in &self.0 {
            open.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

// === impl Admitted ===

impl Admitted {
    pub(crate) fn new(slots: Slots) -> Self {
        Self(Arc::new(Mutex::new(Some(slots))))
    }

    /// The slots, once.
    pub(crate) fn take(&self) -> Option<Slots> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_cap_refuses_and_a_dropped_slot_frees_it() {
        let open = Arc::new(AtomicU32::new(0));
        let mut a = Slots::default();
        a.take(&open, 2).unwrap();
        let mut b = Slots::default();
        b.take(&open, 2).unwrap();
        let mut c = Slots::default();
        assert_eq!(c.take(&open, 2), Err(2));
        drop(a);
        c.take(&open, 2).unwrap();
        drop((b, c));
        assert_eq!(open.load(Ordering::Acquire), 0);
    }
}
