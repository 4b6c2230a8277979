//! Attempt timeouts as passive-health failures (Envoy counts a per-try timeout as a
//! gateway failure for `consecutive_gateway_failure`; so does nginx's `proxy_next_upstream
//! timeout` for `max_fails`).
//!
//! The attempt timeout is the retry layer's: it drops the attempt's future, so the upstream
//! client never sees an outcome. A future dropped for other reasons (the loser of a hedge,
//! a client that went away) says nothing about the endpoint, so the witness counts a drop
//! only at or after the attempt's `timeout_at` ([`portcullis_retry::AttemptInfo`]): the
//! retry layer's timer is set at least that late, and every other drop comes before it.

use tokio::time::Instant;

/// Armed while an attempt waits for its answer; calls `on_timeout` when dropped armed at
/// or after `timeout_at`.
pub(crate) struct TimeoutWitness<F: FnOnce()> {
    timeout_at: Instant,
    on_timeout: Option<F>,
}

impl<F: FnOnce()> TimeoutWitness<F> {
    /// Armed; `None` without a deadline to judge by (no retry policy on the request).
    pub(crate) fn arm(timeout_at: Option<Instant>, on_timeout: F) -> Option<Self> {
        timeout_at.map(|timeout_at| Self {
            timeout_at,
            on_timeout: Some(on_timeout),
        })
    }

    /// The attempt ended with an outcome of its own (recorded by the caller).
    pub(crate) fn disarm(mut self) {
        self.on_timeout = None;
    }
}

impl<F: FnOnce()> Drop for TimeoutWitness<F> {
    fn drop(&mut self) {
        if let Some(on_timeout) = self.on_timeout.take() {
            if Instant::now() >= self.timeout_at {
                on_timeout();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn only_a_drop_at_the_timeout_counts() {
        let counted = Cell::new(0);
        let at = Instant::now() + Duration::from_secs(1);
        // Dropped early: a hedge's loser or a client gone.
        drop(TimeoutWitness::arm(Some(at), || {
            counted.set(counted.get() + 1)
        }));
        assert_eq!(counted.get(), 0);
        // Answered in time, or later: disarmed.
        let witness = TimeoutWitness::arm(Some(at), || counted.set(counted.get() + 1));
        tokio::time::advance(Duration::from_secs(2)).await;
        witness.expect("armed").disarm();
        assert_eq!(counted.get(), 0);
        // Dropped by the retry layer's timer.
        drop(TimeoutWitness::arm(Some(at), || {
            counted.set(counted.get() + 1)
        }));
        assert_eq!(counted.get(), 1);
        // No deadline to judge by: nothing armed.
        assert!(TimeoutWitness::arm(None, || counted.set(counted.get() + 1)).is_none());
    }
}
