//! What a limiter answers: one [`Decision`] per policy and the combined [`Verdict`].

use std::time::Duration;

use smallvec::SmallVec;

/// One policy's view of one request.
///
/// When the request was admitted and this policy consumed tokens, `remaining` and
/// `reset_after` describe the bucket *after* the request. When nothing was consumed (the
/// request was rejected, this shadow policy would have rejected it, or it is a
/// [`peek`](crate::Limiter::peek)), they describe the bucket as it is.
///
/// For a calendar quota ([`Policy::calendar`](crate::Policy::calendar)) "bucket" reads
/// "the current window's counter": `limit` is the quota, `remaining` is quota − used, and
/// `reset_after`, `refill_after` (and `retry_after`, when rejected) are the time until the
/// window ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// This policy, alone, would admit the request.
    pub allowed: bool,
    /// The policy is shadow: `allowed == false` is counted and reported, never enforced.
    pub shadow: bool,
    /// Bucket capacity (the policy's burst), or the calendar quota: the `X-RateLimit-Limit`
    /// value.
    pub limit: u64,
    /// Whole tokens left in the bucket (units left in the window), `0..=limit`.
    pub remaining: u64,
    /// Time until the bucket is full again (nothing would be lost by forgetting it then);
    /// for a calendar quota, until the window ends, whatever its count.
    pub reset_after: Duration,
    /// Time until `remaining` grows by at least one unit: the next token's refill, or
    /// `None` when the bucket is full (nothing more can be made available); for a calendar
    /// quota, until the window ends. The admitted side of the draft's `t`
    /// ([`Decision::t_secs`]).
    pub refill_after: Option<Duration>,
    /// Time until this request would be admitted by this policy; zero when allowed.
    pub retry_after: Duration,
}

/// The combined answer for all policies of one request, all-or-nothing.
///
/// `decisions()[i]` answers `checks[i]` of the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    allowed: bool,
    decisions: SmallVec<[Decision; 4]>,
}

pub use portcullis_problem::ceil_secs;
/// A wait as `Retry-After` (and the draft's `t`) carries it: whole seconds, rounded up, at
/// least 1, so a client never reads "retry after 0 seconds" and spins — the one rounding
/// every Portcullis layer uses.
pub(crate) use portcullis_problem::retry_after_secs as wait_secs;

// === impl Decision ===

impl Decision {
    /// `Retry-After` in whole seconds, rounded up; at least 1 whenever a wait is needed, so
    /// a client never reads "retry after 0 seconds" and spins. 0 when allowed.
    pub fn retry_after_secs(&self) -> u64 {
        if self.allowed {
            0
        } else {
            wait_secs(self.retry_after)
        }
    }

    /// The `t` parameter of the `RateLimit` field (draft-ietf-httpapi-ratelimit-headers-10
    /// §4.1.2: "the number of seconds until additional quota […] is made available").
    ///
    /// Refused by this policy: the wait until the bucket holds enough units for this
    /// request's cost, so on a 429 `t` is exactly `Retry-After` ([`Self::retry_after_secs`]).
    /// Otherwise: the wait until one more unit is available ([`Self::refill_after`]), rounded
    /// the same way; for a calendar quota the window's end. `None` for a full bucket, where
    /// no additional quota will ever be made available: the draft makes `t` optional and
    /// shows it omitted when there is no reset to announce.
    pub fn t_secs(&self) -> Option<u64> {
        if self.allowed {
            self.refill_after.map(wait_secs)
        } else {
            Some(self.retry_after_secs())
        }
    }

    /// Seconds until the bucket is full again (for a calendar quota, until the window
    /// ends), rounded up: what `X-RateLimit-Reset` and the problem's `reset` add to the
    /// current Unix second. Not the draft's `t` ([`Self::t_secs`]).
    pub fn reset_after_secs(&self) -> u64 {
        ceil_secs(self.reset_after)
    }

    /// Whether this decision blocks the request (an enforced policy that said no).
    pub fn blocks(&self) -> bool {
        !self.allowed && !self.shadow
    }
}

// === impl Verdict ===

impl Verdict {
    /// Combines per-policy decisions: admitted when no enforced policy rejects.
    pub fn from_decisions(decisions: impl IntoIterator<Item = Decision>) -> Self {
        let decisions: SmallVec<[Decision; 4]> = decisions.into_iter().collect();
        let allowed = !decisions.iter().any(Decision::blocks);
        Self { allowed, decisions }
    }

    /// The verdict of a single-policy request (no iterator machinery on the hot path).
    pub fn single(decision: Decision) -> Self {
        let mut decisions = SmallVec::new();
        decisions.push(decision);
        Self {
            allowed: !decision.blocks(),
            decisions,
        }
    }

    /// Whether the request is admitted.
    pub fn is_allowed(&self) -> bool {
        self.allowed
    }

    /// One decision per check, in the order of the checks.
    pub fn decisions(&self) -> &[Decision] {
        &self.decisions
    }

    /// How long the client must wait before the same request would be admitted: the longest
    /// wait among the enforced policies that rejected it. Zero when admitted.
    pub fn retry_after(&self) -> Duration {
        self.decisions
            .iter()
            .filter(|d| d.blocks())
            .map(|d| d.retry_after)
            .max()
            .unwrap_or(Duration::ZERO)
    }

    /// The index of the decision the response headers should describe.
    ///
    /// Rejected: the blocking policy with the longest wait (the one the client must
    /// respect). Admitted: the most restrictive policy, the lowest `remaining / limit`
    /// (ties: the later reset), shadow policies included since they emit headers too.
    pub fn reported(&self) -> Option<usize> {
        let candidates = self.decisions.iter().enumerate();
        if self.allowed {
            candidates
                .min_by(|(_, a), (_, b)| {
                    // remaining_a / limit_a vs remaining_b / limit_b, exactly.
                    let lhs = u128::from(a.remaining) * u128::from(b.limit);
                    let rhs = u128::from(b.remaining) * u128::from(a.limit);
                    lhs.cmp(&rhs).then(b.reset_after.cmp(&a.reset_after))
                })
                .map(|(i, _)| i)
        } else {
            candidates
                .filter(|(_, d)| d.blocks())
                .max_by_key(|(_, d)| d.retry_after)
                .map(|(i, _)| i)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(allowed: bool, shadow: bool, limit: u64, remaining: u64, retry_ms: u64) -> Decision {
        Decision {
            allowed,
            shadow,
            limit,
            remaining,
            reset_after: Duration::from_millis(100),
            refill_after: Some(Duration::from_millis(100)),
            retry_after: Duration::from_millis(retry_ms),
        }
    }

    #[test]
    fn ceil_secs_rounds_up() {
        assert_eq!(ceil_secs(Duration::ZERO), 0);
        assert_eq!(ceil_secs(Duration::from_nanos(1)), 1);
        assert_eq!(ceil_secs(Duration::from_secs(1)), 1);
        assert_eq!(ceil_secs(Duration::from_micros(1_000_001)), 2);
    }

    #[test]
    fn retry_after_is_never_zero_when_waiting() {
        assert_eq!(d(false, false, 1, 0, 0).retry_after_secs(), 1);
        assert_eq!(d(false, false, 1, 0, 1).retry_after_secs(), 1);
        assert_eq!(d(false, false, 1, 0, 2001).retry_after_secs(), 3);
        assert_eq!(d(true, false, 1, 0, 0).retry_after_secs(), 0);
    }

    #[test]
    fn shadow_never_blocks() {
        let v = Verdict::from_decisions([d(true, false, 10, 5, 0), d(false, true, 10, 0, 500)]);
        assert!(v.is_allowed());
        assert_eq!(v.retry_after(), Duration::ZERO);
        // The shadow policy is the most restrictive, so it is the one reported.
        assert_eq!(v.reported(), Some(1));
    }

    #[test]
    fn rejected_reports_the_longest_wait() {
        let v = Verdict::from_decisions([
            d(false, false, 10, 0, 200),
            d(false, false, 10, 0, 900),
            d(false, true, 10, 0, 5000),
        ]);
        assert!(!v.is_allowed());
        assert_eq!(v.reported(), Some(1));
        assert_eq!(v.retry_after(), Duration::from_millis(900));
    }

    #[test]
    fn admitted_reports_the_lowest_ratio() {
        let v = Verdict::from_decisions([d(true, false, 100, 40, 0), d(true, false, 10, 3, 0)]);
        assert_eq!(v.reported(), Some(1));
    }
}
