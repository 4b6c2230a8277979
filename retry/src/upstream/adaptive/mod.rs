//! Adaptive throttling: the rate an upstream accepts, learned from its answers, enforced at
//! the edge.
//!
//! # Why a rate controller (botocore's adaptive mode), not a concurrency limit
//!
//! The backends this protects say "too much" with 429/503 (S3's `503 Slow Down`, API
//! quotas): their limit is a *rate*. A concurrency limit (Netflix's gradient/AIMD) learns
//! how many requests may be in flight, which for a backend answering in 2 ms at 50 req/s is
//! one, and then refuses every burst of two. So this follows botocore's adaptive retry mode
//! (`botocore/retries/adaptive.py`, `standard.py`, `bucket.py`): a token bucket filled at
//! a learned rate, the rate driven by CUBIC (RFC 9438) on throttling answers. Latency is a
//! second congestion signal in the spirit of Netflix's gradient: a queue building up in the
//! backend shows in its latency before it starts refusing.
//!
//! # The controller
//!
//! - Until the backend first signals congestion the bucket is off: nothing is refused, only
//!   the sending rate is measured (0.1 s buckets, smoothed 0.8, as botocore).
//! - **Congestion** — a 429 or 503 (with or without `Retry-After`), gRPC
//!   `RESOURCE_EXHAUSTED`/`UNAVAILABLE`, an attempt timeout, or a sustained latency
//!   gradient (below): the rate becomes `0.8 × min(measured sending rate, current rate)`
//!   and the bucket turns on (botocore and CUBIC use 0.7; with 0.8 the sawtooth below the
//!   capacity is shallower, which keeps ≥ 90 % of a 50 req/s backend in use in the unit
//!   test's synthetic run). The first decrease starts from the rate sent until then,
//!   measured from the first request (arrivals count: the attempts in flight have not
//!   answered yet).
//!   The decrease happens once per congestion window, like TCP's: answers to attempts sent
//!   before the last decrease, or within the time of 10 sends at the new rate after it
//!   (50 ms..1 s), do not decrease again. botocore decreases on each of them, so a burst of
//!   20 throttled answers in flight would cut the rate to β^20 of it.
//! - **Latency** — accepted answers whose smoothed latency stays over `latency_tolerance`
//!   × the long-run average (and 25 ms above it) on every answer for a second and 20
//!   answers, after a baseline of 50: once per such run, judged against the latency
//!   before it. A run that lasts another second is the backend's new normal (the long
//!   average takes it). A loaded machine, or a backend's garbage collector, stalls a few
//!   hundred milliseconds and then answers a burst late, which the former per-answer
//!   gradient read as congestion (unit test `a_stalling_backend_is_not_read_as_congested`).
//! - **Accepted** — any other HTTP answer (2xx, 4xx, even a 500: the backend took the
//!   request at that rate): the rate grows along the CUBIC curve
//!   `0.4 · (t − K)³ + W_max`, `K = ∛(W_max · (1 − β) / 0.4)`, concave back up to the rate of
//!   the last decrease `W_max` within `K` seconds (2.9 s for 50 req/s), then probing beyond
//!   it slowly at first. It never exceeds twice the measured sending rate (botocore), so a
//!   quiet period cannot grow a meaningless limit that a burst would then overrun.
//! - **Unrelated** — failures below HTTP (connect refused or timeout, DNS, resets, TLS)
//!   say nothing about the rate a backend accepts; they are the circuit breaker's business
//!   and leave the rate alone.
//!
//! A request whose token comes within `max_wait` (default 1 s) and before its deadline
//! waits for it (waited out with [`AdaptiveThrottle::wait_turn`], the wait is re-timed
//! when the rate is cut meanwhile, so the queue leaves at the new rate): clumps
//! of arrivals leave evenly spaced, and the requests over the rate
//! queue in token order instead of being sent away. Only one whose token comes later is
//! refused at the edge (503 `upstream-throttled` with a `Retry-After` of the time until
//! that token, rounded up to whole seconds) instead of being sent. The queue is what keeps
//! the backend busy: a client refused with a whole-second `Retry-After` leaves a gap that
//! a 50 ms pacing window could not fill, and refused clients return together, in waves
//! (BENCHMARKS.md). Its length is bounded by `max_wait` × the rate. A retry over the rate
//! is not sent either, and the upstream's own answer is returned; a hedged copy is sent
//! only when its token is there at once. The bucket holds 0.1 s of the rate (at least one
//! token), so the backend sees the rate it takes rather than bursts.
//!
//! # Across replicas
//!
//! Each replica learns on its own, and N replicas behind one backend converge to a fair
//! share of it as TCP flows do. With a shared state store each replica also publishes its
//! learned rate and its demand ([`FleetReport`]), and uses at most [`fleet_share`] of the
//! sum of the learned rates, split by demand: a replica that has not seen the backend
//! throttle yet (just started, or idle until now) does not send a burst at a rate the rest
//! of the fleet has already learned to be too much.
//!
//! # Cost
//!
//! Off (`adaptive = false`, the default) the `UpstreamState` holds `None` and the request path
//! touches nothing. On, each request takes one uncontended mutex for the admission and one
//! for the outcome (a few floating-point operations each).

mod config;
mod controller;
mod fleet;
mod meter;
#[cfg(test)]
mod tests;

use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use metrics::{Counter, Gauge, SharedString};
use tokio::time::Instant;

pub use self::config::{
    AdaptiveConfig, DEFAULT_LATENCY_TOLERANCE, DEFAULT_MAX_WAIT, DEFAULT_MIN_RATE,
};
pub(crate) use self::controller::{Controller, Signal};
pub use self::fleet::{fleet_share, FleetReport};
use crate::classify::AttemptOutcome;

/// Re-timings of one wait at most (each follows a decrease; past them the request goes).
const MAX_RETIMES: usize = 16;

/// The adaptive throttle of one upstream: the controller behind a mutex, and its metrics.
#[derive(Debug)]
pub struct AdaptiveThrottle {
    inner: Mutex<Controller>,
    metrics: ThrottleMetrics,
}

#[derive(Debug)]
struct ThrottleMetrics {
    label: SharedString,
    refused: OnceLock<Counter>,
    rate: OnceLock<Gauge>,
    /// `adaptive_decreases_total{cause}`, indexed by the cause's discriminant.
    decreases: [OnceLock<Counter>; 3],
}

// === impl AdaptiveThrottle ===

impl AdaptiveThrottle {
    pub(crate) fn new(name: &std::sync::Arc<str>, config: AdaptiveConfig) -> Self {
        Self {
            inner: Mutex::new(Controller::new(config, Instant::now())),
            metrics: ThrottleMetrics {
                label: SharedString::from(name.clone()),
                refused: OnceLock::new(),
                rate: OnceLock::new(),
                decreases: Default::default(),
            },
        }
    }

    fn lock(&self) -> MutexGuard<'_, Controller> {
        // Poisoning is ignored: the state is a few numbers, consistent after every step.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes a token for one attempt (`first`: a new request, counted as demand) that may
    /// wait at most `within` (what is left of its deadline): `Ok` with the time to wait
    /// before sending it (at most `max_wait`), or `Err` with the time until the next token.
    pub(crate) fn admit(&self, first: bool, within: Duration) -> Result<Duration, Duration> {
        let refused = self.lock().admit(Instant::now(), first, within);
        if refused.is_err() {
            let label = &self.metrics.label;
            self.metrics
                .refused
                .get_or_init(
                    || metrics::counter!("adaptive_throttled_total", "dependency" => label.clone()),
                )
                .increment(1);
        }
        refused
    }

    /// Waits out the `pace` [`Self::admit`] gave (called right after it), re-timed by the
    /// decreases that happen meanwhile: a request promised its token at the old rate
    /// leaves at the new one, so the queue does not send the backend the rate it just
    /// refused for up to `max_wait`.
    pub async fn wait_turn(&self, pace: Duration) {
        let mut checked = Instant::now();
        let mut due = checked + pace;
        // Bounded: each round follows a decrease, at most one per congestion window.
        for _ in 0..MAX_RETIMES {
            tokio::time::sleep_until(due).await;
            let later = self.lock().retime(checked, due);
            if later <= due {
                return;
            }
            (checked, due) = (due, later);
        }
    }

    /// Feeds one attempt's outcome, sent at `sent_at`.
    pub(crate) fn observe(&self, outcome: AttemptOutcome, sent_at: Instant) {
        let now = Instant::now();
        let (cause, rate) = {
            let mut controller = self.lock();
            let cause = controller.observe(Signal::of(outcome, now - sent_at), sent_at, now);
            (cause, controller.rate(now))
        };
        let label = &self.metrics.label;
        if let Some(cause) = cause {
            self.metrics.decreases[cause as usize]
                .get_or_init(|| {
                    metrics::counter!("adaptive_decreases_total",
                        "dependency" => label.clone(), "cause" => cause.as_str())
                })
                .increment(1);
        }
        if let Some(rate) = rate {
            self.metrics
                .rate
                .get_or_init(
                    || metrics::gauge!("adaptive_rate_limit", "dependency" => label.clone()),
                )
                .set(rate);
        }
    }

    /// The rate this replica enforces now (requests per second); `None` while it has not
    /// seen the upstream throttle and no fleet share applies.
    pub fn rate(&self) -> Option<f64> {
        self.lock().rate(Instant::now())
    }

    /// What this replica tells the others (see [`fleet_share`]).
    pub fn report(&self) -> FleetReport {
        self.lock().report(Instant::now())
    }

    /// Caps this replica's rate at `share` (from [`fleet_share`]) for `valid_for`: past it
    /// (the store stopped answering) the replica is on its own again.
    pub fn set_fleet_share(&self, share: Option<f64>, valid_for: Duration) {
        let now = Instant::now();
        self.lock().set_fleet_share(share, now + valid_for, now);
    }
}
