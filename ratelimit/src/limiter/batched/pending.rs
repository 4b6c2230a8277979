//! One request's reservations while the store decides: how each of its checks is decided
//! ([`Plan`]), and how the store's answer is applied to the leases, or undone when the
//! request is dropped.

use std::sync::Mutex;
use std::time::Duration;

use smallvec::SmallVec;
use tokio::time::Instant;

use super::lease::{full, lock, same_policy, with_tokens, BatchedConfig, State};
use crate::decision::{Decision, Verdict};
use crate::limiter::Check;

/// How one check of a request is decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Plan {
    /// From the lease, `cost` tokens already reserved.
    Local,
    /// By the store at the check's own cost.
    Exact,
    /// By the store with cost `top_up` (bringing the lease back to its size, or taking what
    /// the shared bucket has left when that is less).
    TopUp(u64),
    /// By the store at the check's cost minus `borrowed` tokens already taken from the
    /// lease: the bucket had fewer tokens than the request's cost, the lease the rest.
    Borrow(u64),
}

/// The reservations of one request in flight. Dropped without [`Pending::settle`] (the
/// store failed, or the caller stopped waiting), it puts reserved tokens back and clears
/// the top-up marks, so a cancelled request neither consumes nor blocks a lease.
pub(super) struct Pending<'a> {
    state: &'a Mutex<State>,
    config: &'a BatchedConfig,
    checks: &'a [Check],
    pub(super) plans: SmallVec<[Plan; 4]>,
    settled: bool,
}

// === impl Pending ===

impl<'a> Pending<'a> {
    /// The reservations `plans` made for `checks` in `state`.
    pub(super) fn new(
        state: &'a Mutex<State>,
        config: &'a BatchedConfig,
        checks: &'a [Check],
        plans: SmallVec<[Plan; 4]>,
    ) -> Self {
        Self {
            state,
            config,
            checks,
            plans,
            settled: false,
        }
    }

    /// When no refused top-up can be served by what its bucket has left plus its lease,
    /// the request is refused as exact mode would refuse it: `verdict` (the answer to the
    /// top-ups) with each refused top-up's wait shortened from its top-up size to what the
    /// request itself lacks (`(n − lacking) × T` less). `refused`: (check index, store
    /// answer index, tokens left). `None`: a second store call is worth it.
    pub(super) fn refusal(
        &self,
        refused: &[(usize, usize, u64)],
        verdict: &Verdict,
    ) -> Option<Verdict> {
        let state = lock(self.state);
        let mut decisions: SmallVec<[Decision; 4]> = verdict.decisions().iter().copied().collect();
        for &(i, at, left) in refused {
            let check = self.checks.get(i)?;
            let Some(Plan::TopUp(n)) = self.plans.get(i) else {
                return None;
            };
            let leased = state.leases.get(&check.key).map_or(0, |l| l.tokens);
            let lacking = u64::from(check.cost).saturating_sub(leased);
            if left >= lacking {
                return None;
            }
            let d = decisions.get_mut(at)?;
            let p = &check.policy;
            let tick = u64::try_from(p.store_tick().as_nanos()).unwrap_or(1);
            let shorter = n
                .saturating_sub(lacking)
                .saturating_mul(p.store_interval())
                .saturating_mul(tick);
            d.retry_after = d
                .retry_after
                .saturating_sub(Duration::from_nanos(shorter))
                .max(Duration::from_nanos(1));
        }
        Some(Verdict::from_decisions(decisions))
    }

    /// Records whether the store's answer (as reported, lease included) left less than a
    /// lease in `check`'s bucket (see [`Lease::low`](super::lease::Lease::low)).
    fn observe(&self, state: &mut State, check: &Check, decision: &Decision) {
        let Some(size) = self.config.lease_size(&check.policy) else {
            return;
        };
        if let Some(lease) = state.leases.get_mut(&check.key) {
            if same_policy(&lease.policy, &check.policy) {
                let in_bucket = decision.remaining.saturating_sub(lease.tokens);
                lease.low = in_bucket < size;
            }
        }
    }

    /// Before the second store call: each refused top-up (`refused`: its index and the
    /// tokens the bucket has left) becomes a partial lease of what the bucket has, or, when
    /// that is less than the request's cost, borrows the rest (up to `cost − 1`) from the
    /// lease.
    pub(super) fn shrink(&mut self, refused: &[(usize, u64)]) {
        let mut state = lock(self.state);
        for &(i, available) in refused {
            let (Some(check), Some(plan)) = (self.checks.get(i), self.plans.get_mut(i)) else {
                continue;
            };
            let cost = u64::from(check.cost);
            let Plan::TopUp(n) = *plan else { continue };
            if available >= cost {
                *plan = Plan::TopUp(n.min(available));
            } else if let Some(lease) = state.leases.get_mut(&check.key) {
                let take = lease.tokens.min(cost.saturating_sub(1));
                lease.tokens -= take;
                // No longer a top-up: the next request may try one.
                lease.refilling = false;
                *plan = Plan::Borrow(take);
            }
        }
    }

    /// Applies the store's answer (`None`: decided from leases alone) and builds the
    /// verdict.
    pub(super) fn settle(&mut self, store: Option<Verdict>, now: Instant) -> Verdict {
        self.settled = true;
        let admitted = !matches!(&store, Some(v) if !v.is_allowed());
        let mut from_store = store
            .as_ref()
            .map(|v| v.decisions().iter().copied())
            .into_iter()
            .flatten();
        let mut state = lock(self.state);
        let mut decisions: SmallVec<[Decision; 4]> = SmallVec::new();
        for (check, plan) in self.checks.iter().zip(&self.plans) {
            let cost = u64::from(check.cost);
            let lease = state.leases.get_mut(&check.key);
            let decision = match (plan, lease) {
                (Plan::Local, Some(lease)) => {
                    if !admitted {
                        lease.tokens = lease.tokens.saturating_add(cost);
                    }
                    lease.decision(now)
                }
                (Plan::TopUp(n), Some(lease)) => {
                    lease.refilling = false;
                    let d = from_store.next().unwrap_or_else(|| full(&check.policy));
                    if admitted {
                        // The lease now holds what it had plus the top-up, minus this
                        // request's cost (n ≥ 1; cost ≤ size, so it stays ≤ size).
                        lease.tokens = lease.tokens.saturating_add(*n).saturating_sub(cost);
                        lease.topped_up = now;
                        lease.used = now;
                        lease.snapshot = d;
                        lease.decision(now)
                    } else {
                        // The store's answer, with what is left of this replica's lease.
                        with_tokens(d, lease.tokens)
                    }
                }
                (Plan::Borrow(borrowed), Some(lease)) => {
                    if !admitted {
                        lease.tokens = lease.tokens.saturating_add(*borrowed);
                    }
                    with_tokens(
                        from_store.next().unwrap_or_else(|| full(&check.policy)),
                        lease.tokens,
                    )
                }
                (Plan::TopUp(_) | Plan::Borrow(_) | Plan::Exact, None) | (Plan::Exact, Some(_)) => {
                    from_store.next().unwrap_or_else(|| full(&check.policy))
                }
                // A lease reserved from cannot vanish meanwhile (only `plan` and `release`
                // remove leases, and a released one lapses): report the bucket as full.
                (Plan::Local, None) => full(&check.policy),
            };
            if *plan != Plan::Local {
                self.observe(&mut state, check, &decision);
            }
            decisions.push(decision);
        }
        Verdict::from_decisions(decisions)
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let mut state = lock(self.state);
        for (check, plan) in self.checks.iter().zip(&self.plans) {
            if let Some(lease) = state.leases.get_mut(&check.key) {
                match plan {
                    Plan::Local => {
                        lease.tokens = lease.tokens.saturating_add(u64::from(check.cost))
                    }
                    Plan::TopUp(_) => lease.refilling = false,
                    Plan::Borrow(borrowed) => {
                        lease.tokens = lease.tokens.saturating_add(*borrowed);
                    }
                    Plan::Exact => {}
                }
            }
        }
    }
}

/// The store's checks for `plans`: all but the local ones, with their costs.
pub(super) fn store_checks(checks: &[Check], plans: &[Plan]) -> SmallVec<[Check; 4]> {
    checks
        .iter()
        .zip(plans)
        .filter_map(|(check, plan)| {
            let cost = match plan {
                Plan::Local => return None,
                Plan::Exact => check.cost,
                Plan::TopUp(n) => u32::try_from(*n).unwrap_or(u32::MAX),
                Plan::Borrow(b) => check
                    .cost
                    .saturating_sub(u32::try_from(*b).unwrap_or(u32::MAX)),
            };
            Some(Check {
                key: check.key.clone(),
                policy: check.policy.clone(),
                cost,
            })
        })
        .collect()
}
