//! In-process GCRA on a sharded hash table: the embedded default and the fail-open fallback.
//!
//! # Layout
//!
//! Keys hash (SipHash, randomly seeded per process, so clients choosing IPs or tenant
//! names cannot force collisions) into one of `shards` tables, each behind its own mutex
//! and padded to its own cache lines. The hash is computed once per check and stored with
//! the entry, so probing and growing never re-hash the key. A request touching several
//! shards locks them in ascending index order (no deadlock) and holds them for the few
//! hundred nanoseconds of evaluate-then-commit, which is what makes the multi-policy
//! decision atomic. `governor` was not used because it decides one key at a time and cannot
//! make "all or nothing across tenant, route and global" atomic.
//!
//! # Memory bound
//!
//! An entry stores only the TAT (plus key and hash, ~32 bytes + the key's bytes). A key
//! whose TAT is in the past is a full bucket, identical to an absent key, so dropping it
//! loses nothing. Two mechanisms keep the table bounded:
//!
//! - **amortized sweep**: when a shard grows to twice its size after the previous sweep,
//!   the next insert drops all full buckets in it (O(shard) once per doubling, O(1)
//!   amortized per insert); [`LocalLimiter::sweep`] does the same for all shards on demand
//!   (e.g. from a periodic task, to give memory back after a spike);
//! - **hard cap** (`max_keys`, split evenly across shards): a shard at its cap evicts the
//!   entry with the earliest TAT among 8 sampled entries before inserting. Evicting a bucket
//!   that is not yet full forgets what that key spent, making it *more* permissive by at
//!   most one burst, never stricter; the cap only binds under a key-spraying flood.
//!
//! # Calendar quota counters
//!
//! A calendar quota's state is `(key, window id) → used`, kept in a second table of the same
//! shard (same hash, same lock, so a request mixing buckets and quotas is still decided
//! under one set of locks). It cannot share the bucket table's "TAT in the past = full"
//! rule: a counter is worthless only once its *window* has ended, whatever its count. Each
//! counter therefore stores the monotonic tick at which its window ends (now + time left in
//! the window by the wall clock, computed when it is written), and both sweeps drop counters
//! whose window has ended, never a live one. The window id in the identity makes the
//! window's end, not the sweep, what starts a fresh count: a stale counter that was not yet
//! swept is simply never read. Counters are subject to the same per-shard cap, separately
//! (at most `max_keys` buckets plus `max_keys` counters); evicting a live counter forgets up
//! to one quota's worth of use, which only a key-spraying flood on quota keys could force —
//! quota keys are normally per tenant, a bounded set.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::{Arc, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use smallvec::SmallVec;
use tokio::time::Instant;

use super::{window_at, Check, Eval, Limiter, LimiterError};
use crate::clock::{Clock, SystemClock};
use crate::decision::{Decision, Verdict};
use crate::gcra::Gcra;
use crate::key::LimitKey;
use crate::period::Quota;
use table::{lock, Shard, Table, WindowAt};

/// One tick of the local clock.
const NANO: Duration = Duration::from_nanos(1);

/// Settings for [`LocalLimiter`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalLimiterConfig {
    /// Hard cap on tracked keys (default 1 000 000, roughly 80 MB with short keys).
    pub max_keys: usize,
    /// Number of independently locked shards, rounded up to a power of two (default 64).
    pub shards: usize,
    /// Divide every policy's rate and burst by this (min 1): the share of one replica out of
    /// `share` when standing in for a shared store. Default 1.
    pub share: u32,
}

/// In-process rate limiter. See the module docs.
#[derive(Debug)]
pub struct LocalLimiter {
    shards: Box<[Shard]>,
    mask: usize,
    shard_cap: usize,
    share: u64,
    hasher: RandomState,
    clock: Arc<dyn Clock>,
    origin: Instant,
}

/// Where one check's state lives: the key's hash and, for a calendar quota, its window.
#[derive(Debug, Clone, Copy)]
struct Target {
    hash: u64,
    window: Option<WindowAt>,
}

// === impl LocalLimiterConfig ===

impl Default for LocalLimiterConfig {
    fn default() -> Self {
        Self {
            max_keys: 1_000_000,
            shards: 64,
            share: 1,
        }
    }
}

// === impl LocalLimiter ===

impl LocalLimiter {
    /// A limiter on the real clock with default settings.
    pub fn new() -> Self {
        Self::with_config(LocalLimiterConfig::default(), Arc::new(SystemClock))
    }

    /// A limiter with explicit settings and clock.
    pub fn with_config(config: LocalLimiterConfig, clock: Arc<dyn Clock>) -> Self {
        let shards = config.shards.clamp(1, 1 << 16).next_power_of_two();
        let shard_cap = config.max_keys.div_ceil(shards).max(1);
        let origin = clock.now();
        Self {
            shards: (0..shards).map(|_| Shard::new()).collect(),
            mask: shards - 1,
            shard_cap,
            share: u64::from(config.share.max(1)),
            hasher: RandomState::new(),
            clock,
            origin,
        }
    }

    /// Number of tracked keys, buckets and quota counters (for a gauge; walks all shards).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).len()).sum()
    }

    /// Whether no key is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `key` has state: a bucket that is not full, or a quota counter of any window,
    /// not yet swept.
    pub fn contains(&self, key: &LimitKey) -> bool {
        let hash = self.hasher.hash_one(key.as_str());
        lock(&self.shards[self.shard_of(hash)]).contains(hash, key.as_str())
    }

    /// Drops every full bucket and every quota counter whose window has ended, now.
    /// Optional: inserts already sweep amortized; call this periodically to return memory
    /// after a burst of one-off keys.
    pub fn sweep(&self) {
        let now = self.ticks();
        for shard in self.shards.iter() {
            let mut table = lock(shard);
            table.sweep_entries(now);
            table.sweep_counters(now);
        }
    }

    fn ticks(&self) -> u64 {
        let since = self.clock.now().saturating_duration_since(self.origin);
        u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
    }

    fn gcra(&self, check: &Check) -> Gcra {
        let p = &check.policy;
        if self.share == 1 {
            Gcra::new(p.interval_nanos(), p.burst())
        } else {
            // Off the hot path (fallback only): exact per × share / rate, rounded up once.
            let interval =
                (p.per().as_nanos() * u128::from(self.share)).div_ceil(u128::from(p.rate()));
            Gcra::new(
                u64::try_from(interval).unwrap_or(u64::MAX),
                (p.burst() / self.share).max(1),
            )
        }
    }

    fn quota(&self, check: &Check) -> Quota {
        Quota::new((check.policy.burst() / self.share).max(1))
    }

    fn target(&self, check: &Check, unix_now: Option<Duration>) -> Target {
        let window = check
            .policy
            .period()
            .zip(unix_now)
            .map(|(period, unix_now)| {
                let (window, until_end) = window_at(period, unix_now);
                WindowAt {
                    id: window.id,
                    until_end,
                }
            });
        Target {
            hash: self.hasher.hash_one(check.key.as_str()),
            window,
        }
    }

    fn evaluate(&self, table: &Table, check: &Check, target: &Target, now: u64) -> Eval {
        let (key, cost) = (check.key.as_str(), u64::from(check.cost));
        match target.window {
            None => Eval::Bucket(
                self.gcra(check)
                    .evaluate(table.tat(target.hash, key), now, cost),
            ),
            Some(w) => {
                let used = table.used(target.hash, key, w.id);
                Eval::Quota(self.quota(check).evaluate(used, cost, w.until_end))
            }
        }
    }

    fn shard_of(&self, hash: u64) -> usize {
        // hashbrown places entries by the low bits and tags them with the top 7; pick the
        // shard from the middle so shard choice and in-table position stay independent.
        (hash >> 32) as usize & self.mask
    }

    fn decide(&self, checks: &[Check], commit: bool) -> Verdict {
        // Read the clock before taking any lock: it keeps ~20 ns of clock_gettime out of the
        // critical section. A reading a few ns stale only makes the decision stricter.
        let now = self.ticks();
        if let [check] = checks {
            if check.policy.period().is_none() {
                return self.decide_one(check, now, commit);
            }
        }
        // The wall clock places calendar windows; not read at all without a calendar check.
        let unix_now = checks
            .iter()
            .any(|c| c.policy.period().is_some())
            .then(|| self.clock.unix_now());
        let targets: SmallVec<[Target; 4]> =
            checks.iter().map(|c| self.target(c, unix_now)).collect();
        let mut order: SmallVec<[usize; 4]> =
            targets.iter().map(|t| self.shard_of(t.hash)).collect();
        order.sort_unstable();
        order.dedup();
        // Ascending order: two requests sharing shards always lock them in the same order.
        let mut guards: SmallVec<[MutexGuard<'_, Table>; 4]> =
            order.iter().map(|&i| lock(&self.shards[i])).collect();
        let slot = |hash: u64| order.binary_search(&self.shard_of(hash)).unwrap_or(0);

        let evals: SmallVec<[Eval; 4]> = checks
            .iter()
            .zip(&targets)
            .map(|(check, t)| self.evaluate(&guards[slot(t.hash)], check, t, now))
            .collect();
        let admitted = !checks
            .iter()
            .zip(&evals)
            .any(|(c, e)| !e.allowed() && !c.policy.is_shadow());

        if commit && admitted {
            for ((check, t), eval) in checks.iter().zip(&targets).zip(&evals) {
                let table = &mut guards[slot(t.hash)];
                let key = check.key.as_str();
                match (eval, t.window) {
                    (Eval::Bucket(e), _) if e.allowed && e.new_tat > now => {
                        table.store(t.hash, key, e.new_tat, now, self.shard_cap);
                    }
                    (Eval::Quota(e), Some(w)) if e.allowed && e.new_used > e.used => {
                        table.store_counter(t.hash, key, w, e.new_used, now, self.shard_cap);
                    }
                    _ => {}
                }
            }
        }
        drop(guards);

        Verdict::from_decisions(checks.iter().zip(&evals).map(|(c, e)| -> Decision {
            e.decision(
                commit && admitted && e.allowed(),
                c.policy.is_shadow(),
                NANO,
            )
        }))
    }

    fn reset_now(&self, checks: &[Check]) {
        let unix_now = self.clock.unix_now();
        for check in checks {
            let target = self.target(check, Some(unix_now));
            let key = check.key.as_str();
            let mut table = lock(&self.shards[self.shard_of(target.hash)]);
            match target.window {
                None => table.remove(target.hash, key),
                Some(w) => table.remove_counter(target.hash, key, w.id),
            }
        }
    }

    fn give_back_now(&self, check: &Check, amount: u64) -> Decision {
        let now = self.ticks();
        let target = self.target(check, Some(self.clock.unix_now()));
        let (hash, key) = (target.hash, check.key.as_str());
        let mut table = lock(&self.shards[self.shard_of(hash)]);
        match target.window {
            None => {
                if let Some(tat) = table.tat(hash, key) {
                    let gcra = self.gcra(check);
                    // More than a burst back is a full bucket; capping first avoids overflow.
                    let back = amount.min(gcra.burst()).saturating_mul(gcra.interval());
                    match tat.saturating_sub(back) {
                        tat if tat > now => table.store(hash, key, tat, now, self.shard_cap),
                        _ => table.remove(hash, key),
                    }
                }
            }
            Some(w) => {
                let used = table.used(hash, key, w.id).saturating_sub(amount);
                if used == 0 {
                    table.remove_counter(hash, key, w.id);
                } else {
                    table.store_counter(hash, key, w, used, now, self.shard_cap);
                }
            }
        }
        let eval = self.evaluate(&table, check, &target, now);
        drop(table);
        eval.decision(false, check.policy.is_shadow(), NANO)
    }

    /// The common single-policy case, without the multi-lock bookkeeping.
    fn decide_one(&self, check: &Check, now: u64, commit: bool) -> Verdict {
        let key = check.key.as_str();
        let hash = self.hasher.hash_one(key);
        let gcra = self.gcra(check);
        let eval = {
            let mut table = lock(&self.shards[self.shard_of(hash)]);
            let eval = gcra.evaluate(table.tat(hash, key), now, u64::from(check.cost));
            if commit && eval.allowed && eval.new_tat > now {
                table.store(hash, key, eval.new_tat, now, self.shard_cap);
            }
            eval
        };
        let shadow = check.policy.is_shadow();
        // A lone shadow check that would reject admits the request without consuming.
        let committed = commit && eval.allowed;
        Verdict::single(eval.decision(committed, shadow, NANO))
    }
}

impl Default for LocalLimiter {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait]
impl Limiter for LocalLimiter {
    async fn check(&self, checks: &[Check]) -> Result<Verdict, LimiterError> {
        Ok(self.decide(checks, true))
    }

    async fn peek(&self, checks: &[Check]) -> Result<Verdict, LimiterError> {
        Ok(self.decide(checks, false))
    }

    async fn reset(&self, checks: &[Check]) -> Result<(), LimiterError> {
        self.reset_now(checks);
        Ok(())
    }

    async fn give_back(&self, check: &Check, amount: u64) -> Result<Decision, LimiterError> {
        Ok(self.give_back_now(check, amount))
    }
}

mod table;
#[cfg(test)]
mod tests;
