//! GCRA (the generic cell rate algorithm), as pure integer arithmetic over values.
//!
//! GCRA is a token bucket stored as one number per key: the *theoretical arrival time*
//! (TAT), the instant at which the bucket would be full again. With an emission interval
//! `T = per / rate` and capacity `burst` (tolerance `τ = burst × T`), a request of `cost`
//! tokens arriving at `now` is admitted iff
//!
//! ```text
//! max(TAT, now) + cost × T − τ ≤ now
//! ```
//!
//! and then `TAT := max(TAT, now) + cost × T`. Tokens available now are
//! `⌊(τ − (TAT − now)) / T⌋`. Compared with a classic bucket (tokens + last-refill time)
//! it stores a single integer, needs no refill step, and a key whose TAT is in the past is a
//! full bucket, which is exactly what an absent key means: expiry and eviction lose nothing.
//!
//! Units are abstract *ticks*: the local backend uses nanoseconds on tokio's monotonic
//! clock, the Redis script nanoseconds on server `TIME` (a microsecond clock; buckets
//! refilling over ~52 days keep microsecond ticks, see
//! [`Policy::store_tick`](crate::Policy::store_tick)). All arithmetic is exact `u64` with
//! saturation at the extremes, so the bound "admitted ≤ burst + rate × interval" holds
//! without floating-point slack (see the property tests below).

use std::time::Duration;

use crate::decision::Decision;

/// One policy's bucket parameters in ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gcra {
    interval: u64,
    burst: u64,
}

/// The outcome of evaluating one request against one bucket, before deciding whether to
/// commit it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Evaluation {
    /// The bucket would admit the request.
    pub allowed: bool,
    /// `max(stored TAT, now)`: the bucket's state now.
    pub tat: u64,
    /// The TAT to store if the request is admitted and consumed.
    pub new_tat: u64,
    now: u64,
    gcra: Gcra,
}

// === impl Gcra ===

impl Gcra {
    /// A bucket refilling one token every `interval` ticks, holding up to `burst` tokens.
    /// Both are clamped to at least 1.
    pub fn new(interval: u64, burst: u64) -> Self {
        Self {
            interval: interval.max(1),
            burst: burst.max(1),
        }
    }

    /// Ticks per token.
    pub fn interval(&self) -> u64 {
        self.interval
    }

    /// Capacity in tokens.
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// `τ = burst × interval`: how far TAT may run ahead of now.
    pub fn tolerance(&self) -> u64 {
        self.interval.saturating_mul(self.burst)
    }

    /// Evaluates a request of `cost` tokens at `now` against the stored TAT (`None`: no
    /// state, i.e. a full bucket). Pure: the caller commits `new_tat` if it decides to.
    ///
    /// A request whose cost exceeds `burst` is never allowed; its `retry_after` is then the
    /// time until the bucket is full, after which it would still not fit. Reject such
    /// routes at configuration time (cost ≤ burst).
    pub fn evaluate(&self, stored_tat: Option<u64>, now: u64, cost: u64) -> Evaluation {
        let tat = stored_tat.map_or(now, |t| t.max(now));
        let new_tat = tat.saturating_add(cost.saturating_mul(self.interval));
        let allow_at = new_tat.saturating_sub(self.tolerance());
        Evaluation {
            allowed: allow_at <= now && cost <= self.burst,
            tat,
            new_tat,
            now,
            gcra: *self,
        }
    }
}

// === impl Evaluation ===

impl Evaluation {
    /// The decision to report. `committed`: the request was admitted and this bucket's TAT
    /// was set to `new_tat`. `tick` is the duration of one tick (1 ns, 1 µs).
    pub fn decision(&self, committed: bool, shadow: bool, tick: Duration) -> Decision {
        let Gcra { interval, burst } = self.gcra;
        let tolerance = self.gcra.tolerance();
        let ticks = |n: u64| {
            Duration::from_nanos(u64::try_from(u128::from(n) * tick.as_nanos()).unwrap_or(u64::MAX))
        };
        let state = if committed { self.new_tat } else { self.tat };
        let used = state.saturating_sub(self.now);
        let remaining = (tolerance.saturating_sub(used) / interval).min(burst);
        // The next token: `remaining` grows once τ − used reaches (remaining + 1) × T, which
        // is strictly after now since remaining = ⌊(τ − used) / T⌋. A full bucket gains none.
        let refill_after = (remaining < burst).then(|| {
            used.saturating_add((remaining + 1).saturating_mul(interval))
                .saturating_sub(tolerance)
        });
        let retry_after = if self.allowed {
            0
        } else if self.new_tat - self.tat > tolerance {
            // cost > burst: it will never fit; point at the full bucket.
            used.max(1)
        } else {
            // allow_at − now: strictly positive when not allowed.
            self.new_tat
                .saturating_sub(tolerance)
                .saturating_sub(self.now)
        };
        Decision {
            allowed: self.allowed,
            shadow,
            limit: burst,
            remaining,
            reset_after: ticks(used),
            refill_after: refill_after.map(ticks),
            retry_after: ticks(retry_after),
        }
    }
}

#[cfg(test)]
mod tests;
