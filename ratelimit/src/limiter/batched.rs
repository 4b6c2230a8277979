//! Hybrid ("batched") limiter: each replica decides locally from tokens it leases from the
//! shared store in batches, with a stated bound on what the fleet may over-admit.
//!
//! [`BatchedLimiter`] wraps the shared limiter (Redis or Redis Cluster, usually behind the
//! [`FallbackLimiter`](super::FallbackLimiter)). For every token bucket whose lease would be
//! worth it, a replica takes a **lease** of `L` tokens from the shared bucket with one
//! ordinary decision of cost `L` (the same script, so atomic, all-or-nothing, on server
//! time), then admits requests against that lease in process, without a round trip. When a
//! lease falls below `L / 4`, the request that saw it starts a top-up back to `L` in the
//! background (no request waits for it; a refused top-up only marks the bucket as near its
//! limit); a request that finds its lease empty tops it up in its own decision.
//!
//! # Lease size and the overshoot bound
//!
//! `L = ⌊max_overshoot × burst / replicas⌋` (at most the burst, and at most `u32::MAX`).
//! Every token a replica admits was first taken from the shared GCRA bucket, so tokens are
//! never created; what changes is *when* they are spent: a token leased at `t` may be spent
//! later. A replica holds at most `L` unspent tokens per bucket, so over any interval of
//! length `w` the fleet admits at most
//!
//! ```text
//! burst + rate × w + replicas × L  ≤  (1 + max_overshoot) × burst + rate × w
//! ```
//!
//! against `burst + rate × w` in exact mode: the overshoot is at most `max_overshoot` of the
//! policy's limit (its burst, the `X-RateLimit-Limit` value), fleet-wide, **if `replicas` is
//! the real replica count** (more replicas than configured raise the bound in proportion).
//! The other side: tokens sitting in one replica's lease are missing for the others, so the
//! fleet may also *under*-admit by up to the same amount while a bucket is exhausted.
//!
//! # Exact where batching does not pay
//!
//! A check is decided exactly (forwarded, at its own cost, in the same store call as the
//! lease top-ups) when
//!
//! - its lease would be smaller than 2 tokens: small limits stay exact automatically (with
//!   `max_overshoot = 0.05` and 3 replicas, any burst below 120);
//! - it is a calendar quota (billing-grade counts; a lease would hide usage), a shadow policy
//!   (whose "would reject" must describe the shared bucket), or its cost exceeds the lease;
//! - another request of this replica is already topping that lease up (one top-up in flight
//!   per bucket, so a replica never holds more than `L`), or the store's last answer left
//!   less than a lease in the bucket (near its limit a top-up would not fit: exact mode's
//!   one round trip per decision, until an answer shows a lease's worth again); in both
//!   cases what is left in the lease pays part of the cost;
//! - the lease table is full (`max_leases`, default 10 000 buckets).
//!
//! # All-or-nothing, and what a rejection costs
//!
//! Lease tokens are reserved under a lock before the store is asked; if the store then
//! rejects the request, the reservations are put back, so "a rejected request consumes
//! nothing" holds for the local leases exactly as for the store. A top-up that does not fit
//! (the shared bucket has fewer than `L` tokens left) does not reject the request: the same
//! checks are sent again at their plain cost, which decides exactly (a second round trip,
//! only when a bucket is nearly empty). Requests decided from leases alone are always
//! admissions; **every rejection comes from the store**, so `Retry-After`, the 429 problem
//! and the `RateLimit` fields of a 429 are the exact ones.
//!
//! # Headers of an admission from a lease
//!
//! On an admission decided locally, a leased check reports `remaining` = the shared bucket's
//! `remaining` as the store answered at this replica's last top-up, plus what is left in the
//! lease (capped at the burst), and that answer's `reset_after` / `refill_after` minus the
//! time since. Right after a top-up this equals what exact mode would report; later it
//! ignores refill and other replicas' spending since the top-up: an estimate, by at most the
//! other replicas' leases plus the refill since.
//!
//! # Giving leases back
//!
//! A lease no request has spent from for `lease_ttl` (default 1 s) is returned to the store
//! ([`Limiter::give_back`], in a background task) by the next decision of this replica
//! after it expired; [`Limiter::release`] returns every lease at once (the gateway
//! calls it on graceful shutdown). A return that fails (store down, circuit open) or never
//! happens (the process crashed, or sees no more traffic) lets the tokens lapse: they are
//! lost for the current window only (the bucket refills them in `L × per / rate`), an
//! under-admission of at most `L` tokens per bucket and replica, never an over-admission.
//! Admin [`Limiter::reset`] drops this replica's leases of the reset keys (without returning
//! them: the bucket is full again anyway); leases on other replicas stay valid until they
//! are spent or expire. [`Limiter::peek`] and [`Limiter::give_back`] act on the store and
//! do not see leased tokens.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use smallvec::SmallVec;
use tokio::time::Instant;

use super::{Check, Limiter, LimiterError};
use crate::clock::{Clock, SystemClock};
use crate::decision::{Decision, Verdict};
use crate::key::LimitKey;
use crate::policy::Policy;
pub use lease::BatchedConfig;
use lease::{full, lease_check, lock, same_policy, with_lease, Lease, State};
use pending::{store_checks, Pending, Plan};

/// A limiter deciding from leased batches of tokens. See the module docs.
#[derive(Debug)]
pub struct BatchedLimiter {
    inner: Arc<dyn Limiter>,
    config: BatchedConfig,
    clock: Arc<dyn Clock>,
    /// Shared with the background top-ups.
    state: Arc<Mutex<State>>,
}

// === impl BatchedLimiter ===

impl BatchedLimiter {
    /// Wraps `inner` (the shared store). Fails on a `max_overshoot` outside `(0, 1]`.
    pub fn new(inner: Arc<dyn Limiter>, config: BatchedConfig) -> Result<Self, LimiterError> {
        Self::with_clock(inner, config, Arc::new(SystemClock))
    }

    /// [`BatchedLimiter::new`] with an injected clock (lease expiry and header ages).
    pub fn with_clock(
        inner: Arc<dyn Limiter>,
        config: BatchedConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, LimiterError> {
        if !(config.max_overshoot > 0.0 && config.max_overshoot <= 1.0) {
            return Err(LimiterError::Config(format!(
                "max_overshoot must be in (0, 1], not {}",
                config.max_overshoot
            )));
        }
        let next_sweep = clock.now() + config.lease_ttl;
        Ok(Self {
            inner,
            config,
            clock,
            state: Arc::new(Mutex::new(State {
                leases: HashMap::new(),
                next_sweep,
            })),
        })
    }

    /// The settings in force.
    pub fn config(&self) -> &BatchedConfig {
        &self.config
    }

    /// Tokens this replica holds in leases right now, over all buckets (for tests and
    /// metrics).
    pub fn leased_tokens(&self) -> u64 {
        self.lock().leases.values().map(|l| l.tokens).sum()
    }

    /// Returns every lease's unspent tokens to the store. Returns that fail are logged and
    /// lapse (see the module docs).
    async fn release_leases(&self) {
        let returns: Vec<(Check, u64)> = {
            let mut state = self.lock();
            state
                .leases
                .drain()
                .filter(|(_, lease)| lease.tokens > 0)
                .map(|(key, lease)| (lease_check(key, lease.policy), lease.tokens))
                .collect()
        };
        give_back_all(self.inner.as_ref(), returns).await;
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Tops a lease up to `size` in the background, without making any request wait: the
    /// store call takes `n` tokens for future requests, not for a request's verdict, so it
    /// is not part of any request's all-or-nothing decision. A refusal marks the lease low
    /// (the bucket has less than that left); an error leaves it as it was.
    fn top_up_ahead(&self, key: LimitKey, policy: Arc<Policy>, n: u64) {
        let (inner, state, clock) = (self.inner.clone(), self.state.clone(), self.clock.clone());
        let size = self.config.lease_size(&policy).unwrap_or(u64::MAX);
        tokio::spawn(async move {
            let check = Check {
                key,
                policy,
                cost: u32::try_from(n).unwrap_or(u32::MAX),
            };
            let answer = inner.check(std::slice::from_ref(&check)).await;
            let mut state = lock(&state);
            let Some(lease) = state
                .leases
                .get_mut(&check.key)
                .filter(|l| same_policy(&l.policy, &check.policy))
            else {
                // Released or replaced meanwhile: what was taken lapses (module docs).
                return;
            };
            lease.refilling = false;
            match answer {
                Ok(verdict) => {
                    let d = verdict.decisions().first().copied();
                    if verdict.is_allowed() {
                        lease.tokens = lease.tokens.saturating_add(u64::from(check.cost));
                        lease.topped_up = clock.now();
                        if let Some(d) = d {
                            lease.snapshot = d;
                        }
                    }
                    lease.low = d.is_some_and(|d| d.remaining < size);
                }
                Err(err) => tracing::debug!(error = %err, "rate-limit lease top-up failed"),
            }
        });
    }

    /// Plans every check under the lock, reserving lease tokens; also collects the leases
    /// to give back (expired, or of a policy that changed).
    fn plan(&self, checks: &[Check], now: Instant) -> (SmallVec<[Plan; 4]>, Vec<(Check, u64)>) {
        let mut returns = Vec::new();
        let mut ahead: SmallVec<[(LimitKey, Arc<Policy>, u64); 2]> = SmallVec::new();
        let mut state = self.lock();
        if now >= state.next_sweep {
            state.next_sweep = now + self.config.lease_ttl;
            let ttl = self.config.lease_ttl;
            state.leases.retain(|key, lease| {
                let keep = lease.refilling || now < lease.used + ttl;
                if !keep && lease.tokens > 0 {
                    returns.push((lease_check(key.clone(), lease.policy.clone()), lease.tokens));
                }
                keep
            });
        }
        let mut plans = SmallVec::new();
        for check in checks {
            let cost = u64::from(check.cost);
            let size = match self.config.lease_size(&check.policy) {
                Some(size) if cost >= 1 && cost <= size => size,
                _ => {
                    plans.push(Plan::Exact);
                    continue;
                }
            };
            let table_full = state.leases.len() >= self.config.max_leases;
            let plan = match state.leases.get_mut(&check.key) {
                Some(lease) if !same_policy(&lease.policy, &check.policy) => {
                    if lease.refilling {
                        Plan::Exact
                    } else {
                        // A reloaded policy: the old lease goes back to the bucket it came
                        // from (same key), the new one starts empty.
                        if lease.tokens > 0 {
                            returns.push((
                                lease_check(check.key.clone(), lease.policy.clone()),
                                lease.tokens,
                            ));
                        }
                        lease.policy = check.policy.clone();
                        lease.tokens = 0;
                        lease.refilling = true;
                        Plan::TopUp(size)
                    }
                }
                Some(lease) if lease.tokens >= cost => {
                    lease.tokens -= cost;
                    lease.used = now;
                    // Below a quarter of a lease: refill ahead, so the requests that follow
                    // do not find it empty (each would then be decided exactly).
                    if lease.tokens < size / 4 && !lease.refilling && !lease.low {
                        lease.refilling = true;
                        ahead.push((check.key.clone(), check.policy.clone(), size - lease.tokens));
                    }
                    Plan::Local
                }
                Some(lease) if lease.refilling || lease.low => {
                    // Exact, with what is left of the lease making up part of the cost.
                    let take = lease.tokens.min(cost - 1);
                    lease.tokens -= take;
                    Plan::Borrow(take)
                }
                Some(lease) => {
                    lease.refilling = true;
                    Plan::TopUp(size.saturating_sub(lease.tokens).max(1))
                }
                None if table_full => Plan::Exact,
                None => {
                    state.leases.insert(
                        check.key.clone(),
                        Lease {
                            policy: check.policy.clone(),
                            tokens: 0,
                            refilling: true,
                            low: false,
                            topped_up: now,
                            used: now,
                            snapshot: full(&check.policy),
                        },
                    );
                    Plan::TopUp(size)
                }
            };
            plans.push(plan);
        }
        drop(state);
        for (key, policy, n) in ahead {
            self.top_up_ahead(key, policy, n);
        }
        (plans, returns)
    }
}

#[async_trait]
impl Limiter for BatchedLimiter {
    async fn check(&self, checks: &[Check]) -> Result<Verdict, LimiterError> {
        let now = self.clock.now();
        let (plans, returns) = self.plan(checks, now);
        if !returns.is_empty() {
            let inner = self.inner.clone();
            // Off the request's path; a failed return lapses (module docs).
            tokio::spawn(async move { give_back_all(inner.as_ref(), returns).await });
        }
        let mut pending = Pending::new(&self.state, &self.config, checks, plans);
        if pending.plans.iter().all(|p| *p == Plan::Local) {
            return Ok(pending.settle(None, now));
        }
        let first = store_checks(checks, &pending.plans);
        let verdict = self.inner.check(&first).await?;
        if verdict.is_allowed() {
            return Ok(pending.settle(Some(verdict), now));
        }
        // Top-ups the shared bucket refused, with the tokens it has left.
        let store_plans = pending
            .plans
            .iter()
            .enumerate()
            .filter(|(_, p)| **p != Plan::Local);
        let refused: SmallVec<[(usize, usize, u64); 4]> = store_plans
            .zip(verdict.decisions())
            .enumerate()
            .filter(|(_, ((_, p), d))| matches!(p, Plan::TopUp(_)) && d.blocks())
            .map(|(at, ((i, _), d))| (i, at, d.remaining))
            .collect();
        if refused.is_empty() {
            return Ok(pending.settle(Some(verdict), now));
        }
        if let Some(verdict) = pending.refusal(&refused, &verdict) {
            // Neither the bucket nor the lease can serve the request: the answer is known.
            return Ok(pending.settle(Some(verdict), now));
        }
        // The bucket has less than a lease left: take what it has instead (a partial lease),
        // or, when it has less than this request's cost, this replica's own lease makes up
        // the difference. One more round trip, only while a bucket is nearly empty; it
        // decides exactly, so one replica never refuses what its lease and the shared
        // bucket could serve together.
        let refused: SmallVec<[(usize, u64); 4]> =
            refused.iter().map(|&(i, _, left)| (i, left)).collect();
        pending.shrink(&refused);
        let second = store_checks(checks, &pending.plans);
        let verdict = self.inner.check(&second).await?;
        Ok(pending.settle(Some(verdict), now))
    }

    async fn peek(&self, checks: &[Check]) -> Result<Verdict, LimiterError> {
        let verdict = self.inner.peek(checks).await?;
        let state = self.lock();
        Ok(Verdict::from_decisions(
            checks
                .iter()
                .zip(verdict.decisions())
                .map(|(check, d)| with_lease(&state, check, *d)),
        ))
    }

    async fn reset(&self, checks: &[Check]) -> Result<(), LimiterError> {
        {
            let mut state = self.lock();
            for check in checks {
                if let Some(lease) = state.leases.get_mut(&check.key) {
                    lease.tokens = 0;
                }
            }
        }
        self.inner.reset(checks).await
    }

    async fn give_back(&self, check: &Check, amount: u64) -> Result<Decision, LimiterError> {
        let d = self.inner.give_back(check, amount).await?;
        Ok(with_lease(&self.lock(), check, d))
    }

    /// Returns every lease's unspent tokens to the store (graceful shutdown).
    async fn release(&self) {
        self.release_leases().await;
    }
}

async fn give_back_all(inner: &dyn Limiter, returns: Vec<(Check, u64)>) {
    for (check, amount) in returns {
        if let Err(err) = inner.give_back(&check, amount).await {
            tracing::debug!(error = %err, key = %check.key, amount, "lease not returned; it lapses");
        }
    }
}

mod lease;
mod pending;
#[cfg(test)]
mod tests;
