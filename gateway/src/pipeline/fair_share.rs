//! Fair shares of `server.load_shed_limit`: no single caller can hold the last slots.
//!
//! A caller is a tenant, else an anonymous client address (an IPv6 client by its /64:
//! [`caller_key`](crate::plumbing::context::caller_key)). Two rules, checked by the
//! load shedder before the server-wide cap:
//!
//! 1. **Cap**: one caller holds at most `⌊load_shed_limit × server.caller_share⌋` requests at
//!    once (at least 1; default share 0.5), however idle the server is.
//! 2. **Fair share under pressure**: once half of `load_shed_limit` is in flight, a caller
//!    that already holds `⌈load_shed_limit / callers with requests in flight⌉` gets no more
//!    until one of its requests ends. A lone caller keeps the cap of rule 1; each caller
//!    that arrives tightens everyone's share, so the slots left go to those holding fewer.
//!
//! Over either rule the answer is the concurrency limiter's 429 `concurrency-limited`
//! (scope `caller`, `Retry-After: 1`), distinct from the server-wide 503: the caller is
//! asked to slow down, the server is not full. Nothing is preempted: requests already
//! admitted finish (or meet `server.send_timeout`).
//!
//! `caller_share = 1.0` turns both rules off (no table, no hashing). Otherwise the table
//! holds one entry per caller with a request in flight (removed at zero, as
//! `in_flight::KeyedCounts` does), so at most `load_shed_limit` entries plus the requests
//! being admitted: memory is bounded by the cap. The cost on the request path is one
//! caller-key hash and one short critical section on one of 64 shards.
//!
//! Like Envoy's overload manager and nginx's `limit_conn`, this is per replica.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::pipeline::in_flight::{KeyedCounts, KeyedPermit};

/// Per-caller admission against the server's cap (see the module docs).
#[derive(Debug)]
pub(crate) struct FairShare {
    load_shed_limit: u64,
    /// Rule 2 applies from this many requests in flight (half the cap).
    pressure_from: u64,
    /// Rule 1's cap.
    cap: u64,
    /// Requests in flight per caller (its own limit unused: the rules decide).
    callers: Arc<KeyedCounts>,
}

// === impl FairShare ===

impl FairShare {
    /// Shares of `load_shed_limit`, each caller at most `caller_share` of it; `None` when
    /// `caller_share` is 1.0 or more (no fairness).
    pub(crate) fn new(load_shed_limit: usize, caller_share: f64) -> Option<Self> {
        if caller_share.is_nan() || caller_share >= 1.0 {
            return None;
        }
        let max = u64::try_from(load_shed_limit).unwrap_or(u64::MAX).max(1);
        // Truncation is the rounding down intended; the 1e-9 absorbs a product meant whole.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let cap = ((max as f64) * caller_share.max(0.0) + 1e-9).floor() as u64;
        Some(Self {
            load_shed_limit: max,
            pressure_from: max.div_ceil(2),
            cap: cap.clamp(1, max),
            callers: Arc::new(KeyedCounts::new(u32::MAX)),
        })
    }

    /// Rule 1's cap per caller.
    #[cfg(test)]
    pub(crate) fn cap(&self) -> u64 {
        self.cap
    }

    /// Admits one more request of `caller` while `in_flight` (the server's counter) is what
    /// it is; `Err` carries the limit that refused it (for the 429).
    pub(crate) fn try_acquire(
        &self,
        caller: u64,
        in_flight: &AtomicU64,
    ) -> Result<KeyedPermit, u64> {
        let pressure = in_flight.load(Ordering::Relaxed) >= self.pressure_from;
        let mut limit = self.cap;
        let permit = self.callers.try_acquire_if(caller, |count, callers| {
            if pressure && count > 0 {
                // `callers` includes this one (it has a request in flight).
                limit = limit.min(fair_share(self.load_shed_limit, callers));
            }
            u64::from(count) < limit
        });
        permit.ok_or(limit)
    }
}

/// `⌈max / callers⌉`, at least 1.
fn fair_share(max: u64, callers: usize) -> u64 {
    let callers = u64::try_from(callers).unwrap_or(u64::MAX).max(1);
    max.div_ceil(callers).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_is_the_share_rounded_down_at_least_one() {
        let cap = |max, share| FairShare::new(max, share).map(|f| f.cap());
        assert_eq!(cap(10_000, 0.5), Some(5_000));
        assert_eq!(cap(10, 0.29), Some(2));
        assert_eq!(cap(100, 0.29), Some(29), "28.999… is 29");
        assert_eq!(cap(1, 0.5), Some(1));
        assert_eq!(cap(10, 0.0), Some(1));
        assert_eq!(cap(10, 1.0), None, "1.0 turns fairness off");
        assert_eq!(cap(10, f64::NAN), None);
    }

    #[test]
    fn one_caller_stops_at_its_cap_and_leaves_the_rest() {
        let fair = FairShare::new(10, 0.5).unwrap();
        let in_flight = AtomicU64::new(0);
        let mut held = Vec::new();
        for _ in 0..5 {
            held.push(fair.try_acquire(1, &in_flight).unwrap());
            in_flight.fetch_add(1, Ordering::Relaxed);
        }
        assert_eq!(fair.try_acquire(1, &in_flight).unwrap_err(), 5);
        // Another caller is admitted.
        let other = fair.try_acquire(2, &in_flight).unwrap();
        drop(held.pop());
        in_flight.fetch_sub(1, Ordering::Relaxed);
        // Under pressure (6 of 10 once counted) with two callers: shares of 5 each.
        assert!(fair.try_acquire(1, &in_flight).is_ok());
        drop(other);
    }

    #[test]
    fn under_pressure_each_caller_gets_its_fair_share() {
        let fair = FairShare::new(12, 0.75).unwrap();
        let in_flight = AtomicU64::new(0);
        let mut held = Vec::new();
        // Caller 1 alone takes its cap of 9 (rule 2 only tightens once others arrive).
        for _ in 0..9 {
            held.push(fair.try_acquire(1, &in_flight).unwrap());
            in_flight.fetch_add(1, Ordering::Relaxed);
        }
        assert_eq!(fair.try_acquire(1, &in_flight).unwrap_err(), 9);
        // Two more callers: the share is ⌈12 / 3⌉ = 4; each newcomer still gets in.
        for caller in [2, 3] {
            held.push(fair.try_acquire(caller, &in_flight).unwrap());
            in_flight.fetch_add(1, Ordering::Relaxed);
        }
        assert_eq!(
            fair.try_acquire(1, &in_flight).unwrap_err(),
            4,
            "over its fair share"
        );
        assert!(fair.try_acquire(2, &in_flight).is_ok(), "under its share");
    }

    #[test]
    fn below_half_occupancy_only_the_cap_applies() {
        let fair = FairShare::new(100, 0.5).unwrap();
        let in_flight = AtomicU64::new(49);
        let _a = fair.try_acquire(1, &in_flight).unwrap();
        let _b = fair.try_acquire(2, &in_flight).unwrap();
        let _c = fair.try_acquire(3, &in_flight).unwrap();
        // Three callers would have a share of 34 each; below half that does not matter.
        let more: Vec<_> = (0..40)
            .map(|_| fair.try_acquire(1, &in_flight).unwrap())
            .collect();
        assert_eq!(more.len(), 40);
    }
}
