//! This replica's leases: the tokens it took from shared buckets and has not spent, their
//! sizes ([`BatchedConfig`]), and the decisions reported from them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::decision::Decision;
use crate::key::LimitKey;
use crate::limiter::Check;
use crate::policy::Policy;

/// Settings for [`BatchedLimiter`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchedConfig {
    /// The fraction of a policy's limit (its burst) the fleet may over-admit, in
    /// `(0, 1]` (default 0.05).
    pub max_overshoot: f64,
    /// Gateway replicas sharing the store: each leases `1/replicas` of the overshoot budget
    /// (min 1, default 1).
    pub replicas: u32,
    /// How long an untouched lease is kept before its tokens are returned (default 1 s).
    pub lease_ttl: Duration,
    /// Most buckets leased at once; further buckets are decided exactly (default 10 000).
    pub max_leases: usize,
}

/// Every lease of this replica, by bucket key, and when idle ones are next swept.
#[derive(Debug)]
pub(super) struct State {
    pub(super) leases: HashMap<LimitKey, Lease>,
    pub(super) next_sweep: Instant,
}

/// Tokens this replica took from one shared bucket and has not spent yet.
#[derive(Debug)]
pub(super) struct Lease {
    pub(super) policy: Arc<Policy>,
    pub(super) tokens: u64,
    /// A request is topping this lease up: others decide exactly meanwhile.
    pub(super) refilling: bool,
    /// The store's last answer for this bucket left fewer than a lease in it: requests the
    /// lease cannot serve are decided exactly (one round trip, as in exact mode) until an
    /// answer shows a lease's worth again, rather than trying a top-up that would not fit.
    pub(super) low: bool,
    /// When the lease was last topped up, and the store's decision then.
    pub(super) topped_up: Instant,
    /// When a request last spent from it: an idle lease goes back after `lease_ttl`.
    pub(super) used: Instant,
    pub(super) snapshot: Decision,
}

// === impl BatchedConfig ===

impl Default for BatchedConfig {
    fn default() -> Self {
        Self {
            max_overshoot: 0.05,
            replicas: 1,
            lease_ttl: Duration::from_secs(1),
            max_leases: 10_000,
        }
    }
}

impl BatchedConfig {
    /// The lease size for `policy`, or `None` when its checks are decided exactly.
    pub(super) fn lease_size(&self, policy: &Policy) -> Option<u64> {
        if policy.period().is_some() || policy.is_shadow() {
            return None;
        }
        let share = self.max_overshoot * policy.burst() as f64 / f64::from(self.replicas.max(1));
        // `as` saturates (NaN → 0); the burst and u32 (a check's cost) bound it.
        let size = (share.floor() as u64)
            .min(policy.burst())
            .min(u64::from(u32::MAX));
        (size >= 2).then_some(size)
    }
}

// === impl Lease ===

impl Lease {
    /// The decision to report for a leased check (see "Headers" in the module docs).
    pub(super) fn decision(&self, now: Instant) -> Decision {
        let lease = self;
        let age = now.saturating_duration_since(lease.topped_up);
        let snapshot = lease.snapshot;
        Decision {
            allowed: true,
            shadow: false,
            limit: snapshot.limit,
            remaining: snapshot
                .remaining
                .saturating_add(lease.tokens)
                .min(snapshot.limit),
            reset_after: snapshot.reset_after.saturating_sub(age),
            refill_after: snapshot.refill_after.map(|d| d.saturating_sub(age)),
            retry_after: Duration::ZERO,
        }
    }
}

/// A store decision (peek, give-back) with this replica's unspent lease counted as
/// available: what exact mode would report if this were the only replica.
pub(super) fn with_lease(state: &State, check: &Check, mut d: Decision) -> Decision {
    let Some(lease) = state.leases.get(&check.key) else {
        return d;
    };
    if lease.tokens == 0 || !same_policy(&lease.policy, &check.policy) {
        return d;
    }
    d = with_tokens(d, lease.tokens);
    if !d.allowed && d.remaining >= u64::from(check.cost) {
        d.allowed = true;
        d.retry_after = Duration::ZERO;
    }
    d
}

pub(super) fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // Every update leaves the table consistent between statements; a panic elsewhere cannot
    // leave it half-written.
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `d` with `tokens` more remaining (capped at the limit).
pub(super) fn with_tokens(d: Decision, tokens: u64) -> Decision {
    Decision {
        remaining: d.remaining.saturating_add(tokens).min(d.limit),
        ..d
    }
}

pub(super) fn same_policy(a: &Arc<Policy>, b: &Arc<Policy>) -> bool {
    Arc::ptr_eq(a, b) || a == b
}

pub(super) fn lease_check(key: LimitKey, policy: Arc<Policy>) -> Check {
    Check {
        key,
        policy,
        cost: 1,
    }
}

/// A full bucket's decision: what a lease reports before its first top-up answered.
pub(super) fn full(policy: &Policy) -> Decision {
    Decision {
        allowed: true,
        shadow: policy.is_shadow(),
        limit: policy.burst(),
        remaining: policy.burst(),
        reset_after: Duration::ZERO,
        refill_after: None,
        retry_after: Duration::ZERO,
    }
}
