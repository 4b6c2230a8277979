//! The caps on open tunnels: `max_websockets` per route and per tenant (per replica). A
//! tunnel holds its [`Slots`] from its admitted handshake until it closes; a handshake the
//! upstream does not answer 101 gives them back with the request.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::config::Config;
use crate::plumbing::context::{Caller, RequestContext};

/// Open tunnels against one cap.
#[derive(Debug)]
struct Count {
    open: AtomicU32,
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

/// Every cap, built once from the configuration.
#[derive(Debug, Default)]
pub(crate) struct Caps {
    /// By route index; `None`: no cap.
    routes: Box<[Option<Arc<Count>>]>,
    /// Tenants of `[[tenants]]` that have a cap.
    tenants: HashMap<String, Arc<Count>>,
}

/// An admitted tunnel's places under its caps, given back on drop.
#[derive(Debug, Default)]
pub(crate) struct Slots(Vec<Arc<Count>>);

/// Request extension: the slots of an admitted handshake, taken by the proxy when the
/// tunnel opens (clones of the request share them).
#[derive(Debug, Clone, Default)]
pub(crate) struct Admitted(Arc<Mutex<Option<Slots>>>);

// === impl Caps ===

impl Caps {
    pub(crate) fn new(config: &Config) -> Self {
        let count = |max: u32| {
            Arc::new(Count {
                open: AtomicU32::new(0),
                max,
            })
        };
        Self {
            routes: config
                .routes
                .iter()
                .map(|r| r.websocket.and_then(|w| w.max_open).map(count))
                .collect(),
            tenants: config
                .tenants
                .iter()
                .filter_map(|t| Some((t.id.clone(), count(t.max_websockets?))))
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
            slots.take(count).map_err(Over::Route)?;
        }
        if let Caller::Tenant(tenant) = &context.caller {
            if let Some(count) = self.tenants.get(&*tenant.id) {
                // The route's slot, if taken, goes back as `slots` drops.
                slots.take(count).map_err(Over::Tenant)?;
            }
        }
        Ok(slots)
    }
}

// === impl Slots ===

impl Slots {
    /// One place under `count`, or its cap when full.
    fn take(&mut self, count: &Arc<Count>) -> Result<(), u32> {
        count
            .open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < count.max).then_some(n + 1)
            })
            .map_err(|_| count.max)?;
        self.0.push(count.clone());
        Ok(())
    }
}

impl Drop for Slots {
    fn drop(&mut self) {
        for count in &self.0 {
            count.open.fetch_sub(1, Ordering::AcqRel);
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
        let count = Arc::new(Count {
            open: AtomicU32::new(0),
            max: 2,
        });
        let mut a = Slots::default();
        a.take(&count).unwrap();
        let mut b = Slots::default();
        b.take(&count).unwrap();
        let mut c = Slots::default();
        assert_eq!(c.take(&count), Err(2));
        drop(a);
        c.take(&count).unwrap();
        drop((b, c));
        assert_eq!(count.open.load(Ordering::Acquire), 0);
    }
}
