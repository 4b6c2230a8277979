//! Per-dependency circuit breaker on `tokio::time::Instant`.
//!
//! # What counts as an upstream health failure
//!
//! The breaker answers one question: *is this upstream reachable and serving?* Following
//! Envoy's outlier detection (`consecutive_gateway_failure`), only gateway failures count
//! ([`classify::breaker_outcome`](super::classify::breaker_outcome)): connect refused or
//! timed out, DNS, TLS failures, resets, attempt timeouts, 502, 503 and 504. A plain 500 is
//! an application error that one path or one request body can provoke, and 408 a client
//! that was too slow: both are neutral, like 429 (the upstream is alive and throttling).
//! The gateway's own rejections never reach the breaker because they never become
//! attempts.
//!
//! # One request, one vote; one caller, never alone
//!
//! Any single client could otherwise open the breaker for every tenant: a few requests to
//! a path that fails, each retried, used to count one failure per attempt. Two rules stop
//! that:
//!
//! * **A request counts once**, with the outcome of its last attempt (what its caller got
//!   after retries), so retries do not multiply one caller's weight, and a failure that a
//!   retry repaired is not held against the upstream. `min_requests` counts requests.
//! * **Failures are attributed to callers** (a `u64` key per request, the tenant or the
//!   anonymous client's address, from [`RetryLayer`](super::RetryLayer)'s extractor).
//!   When at least `min_requests` requests were counted in the rolling window and the
//!   failure share reaches `failure_rate`, the breaker opens only if the share *still*
//!   reaches `failure_rate` once the failed requests of the `min_callers - 1` callers with
//!   the most failures are set aside (from both the failures and the total). So failures
//!   from fewer than `min_callers` distinct callers never open it, and neither does one
//!   caller flooding a failing path on top of the usual background of sporadic failures
//!   from others. An outage that many callers see opens it as before. Attribution memory
//!   is bounded (see `callers.rs`); `min_callers = 1` restores the unattributed rule.
//!
//! # States
//!
//! * **Closed**: every request passes; outcomes are counted as above.
//! * **Open** for `open_for`: requests fail fast with `BreakerOpen { retry_after }`, where
//!   `retry_after` is the time until the next probe is admitted.
//! * **Half-open**: at most `half_open_probes` requests run at once, each holding a probe
//!   [`BreakerPermit`] (RAII: dropping an unrecorded probe frees its slot), and at most one
//!   per caller, so one caller cannot hold every slot. A probe request gets one attempt
//!   (no retries: the upstream may be recovering). Once `half_open_probes` probes
//!   succeeded the breaker closes with an empty window; it reopens once probes of
//!   `min_callers` distinct callers failed, so one caller sending its failing path as the
//!   probe cannot keep the breaker open for everyone. While no slot is free for a caller,
//!   its requests are refused with `retry_after` = 1 s.

use std::{
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use tokio::time::Instant;

use crate::{classify::BreakerOutcome, metrics::BreakerMetrics, window::Ring};

mod callers;
mod config;
mod permit;

use self::callers::FailingCallers;
pub use self::config::{BreakerConfig, DEFAULT_MIN_CALLERS};
pub(crate) use self::permit::BreakerPermit;

/// `retry_after` reported while no half-open probe slot is free for the caller.
pub(crate) const PROBES_BUSY_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The three states; the gauge `circuit_breaker_state{dependency}` reports their value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BreakerState {
    /// Traffic flows (gauge 0).
    Closed = 0,
    /// A bounded number of probes flows (gauge 1).
    HalfOpen = 1,
    /// Requests fail fast (gauge 2).
    Open = 2,
}

/// The circuit breaker of one dependency. Clones share state.
#[derive(Debug, Clone)]
pub(crate) struct CircuitBreaker {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    name: Arc<str>,
    metrics: BreakerMetrics,
    config: BreakerConfig,
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    state: State,
    /// Bumped on every transition so outcomes of permits from an older state are ignored.
    generation: u64,
    window: Ring<Counts>,
    /// Half-open: callers holding a probe slot (at most `half_open_probes` entries).
    probes: Vec<u64>,
    /// Half-open: distinct callers whose probe failed (at most `min_callers` entries).
    probe_failures: Vec<u64>,
}

#[derive(Debug, Clone, Copy)]
enum State {
    Closed,
    Open { until: Instant },
    HalfOpen { successes: u32 },
}

/// One window bucket: requests judged, failed ones, and whose they were.
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    total: u32,
    failures: u32,
    callers: FailingCallers,
}

// === impl CircuitBreaker ===

impl CircuitBreaker {
    /// A closed breaker for dependency `name`.
    pub(crate) fn new(name: Arc<str>, config: BreakerConfig) -> Self {
        let breaker = Self {
            shared: Arc::new(Shared {
                metrics: BreakerMetrics::new(&name),
                name,
                config,
                inner: Mutex::new(Inner {
                    state: State::Closed,
                    generation: 0,
                    window: Ring::new(config.window()),
                    probes: Vec::new(),
                    probe_failures: Vec::new(),
                }),
            }),
        };
        breaker.shared.report(BreakerState::Closed);
        breaker
    }

    /// The current state (an open breaker whose time is up still reads `Open` until the
    /// next request turns it half-open).
    #[cfg(test)]
    pub(crate) fn state(&self) -> BreakerState {
        self.shared.lock().state.public()
    }

    /// The current state's name, for the admin API (same caveat as `state`).
    pub(crate) fn state_name(&self) -> &'static str {
        match self.shared.lock().state.public() {
            BreakerState::Closed => "closed",
            BreakerState::HalfOpen => "half_open",
            BreakerState::Open => "open",
        }
    }

    /// Admits one request of `caller` (an opaque key: tenant, client address…), or says
    /// how long until the next probe.
    pub(crate) fn try_acquire(&self, caller: u64) -> Result<BreakerPermit, Duration> {
        self.try_acquire_at(caller, Instant::now())
    }

    pub(crate) fn try_acquire_at(
        &self,
        caller: u64,
        now: Instant,
    ) -> Result<BreakerPermit, Duration> {
        let shared = &self.shared;
        let cfg = &shared.config;
        let mut inner = shared.lock();
        match inner.state {
            State::Closed => {}
            State::Open { until } if now < until => {
                drop(inner);
                shared.rejected();
                return Err(until - now);
            }
            State::Open { .. } => inner.transition(State::HalfOpen { successes: 0 }, shared),
            State::HalfOpen { .. } => {}
        }
        let probe = matches!(inner.state, State::HalfOpen { .. });
        if probe {
            // One slot per caller (unless attribution is off), so a single caller cannot
            // hold every probe slot with slow requests.
            let full = inner.probes.len() >= cfg.half_open_probes() as usize;
            let holds_one = cfg.min_callers() > 1 && inner.probes.contains(&caller);
            if full || holds_one {
                drop(inner);
                shared.rejected();
                return Err(PROBES_BUSY_RETRY_AFTER);
            }
            inner.probes.push(caller);
        }
        Ok(BreakerPermit {
            shared: shared.clone(),
            generation: inner.generation,
            caller,
            probe,
            done: false,
        })
    }
}

// === impl Shared ===

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Poisoning is ignored: the state is a few counters, always internally consistent.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `outcome == None`: a probe was dropped without an outcome (cancelled request).
    fn on_outcome(
        &self,
        generation: u64,
        probe: bool,
        caller: u64,
        outcome: Option<BreakerOutcome>,
        now: Instant,
    ) {
        let cfg = &self.config;
        let mut inner = self.lock();
        if inner.generation != generation {
            return; // admitted under an older state; that state is gone.
        }
        match (inner.state, probe) {
            (State::HalfOpen { successes }, true) => {
                if let Some(i) = inner.probes.iter().position(|c| *c == caller) {
                    inner.probes.swap_remove(i);
                }
                match outcome {
                    Some(BreakerOutcome::Failure) => {
                        if !inner.probe_failures.contains(&caller) {
                            inner.probe_failures.push(caller);
                        }
                        if inner.probe_failures.len() >= cfg.min_callers() as usize {
                            inner.transition(
                                State::Open {
                                    until: now + cfg.open_for(),
                                },
                                self,
                            );
                        }
                    }
                    Some(BreakerOutcome::Success) if successes + 1 >= cfg.half_open_probes() => {
                        inner.window.clear();
                        inner.transition(State::Closed, self);
                    }
                    Some(BreakerOutcome::Success) => {
                        inner.state = State::HalfOpen {
                            successes: successes + 1,
                        }
                    }
                    Some(BreakerOutcome::Neutral) | None => {}
                }
            }
            (State::Closed, false) => {
                let failed = match outcome {
                    Some(BreakerOutcome::Success) => false,
                    Some(BreakerOutcome::Failure) => true,
                    Some(BreakerOutcome::Neutral) | None => return,
                };
                let slot = inner.window.current(now);
                slot.total = slot.total.saturating_add(1);
                if failed {
                    slot.failures = slot.failures.saturating_add(1);
                    slot.callers.add(caller);
                }
                if failed && inner.judge(cfg, now, &self.name) {
                    inner.transition(
                        State::Open {
                            until: now + cfg.open_for(),
                        },
                        self,
                    );
                }
            }
            _ => {}
        }
    }

    fn rejected(&self) {
        self.metrics.rejected();
    }

    fn report(&self, state: BreakerState) {
        self.metrics.state(state as u8);
    }
}

// === impl Inner ===

impl Inner {
    fn transition(&mut self, state: State, shared: &Shared) {
        self.state = state;
        self.generation += 1;
        self.probes.clear();
        self.probe_failures.clear();
        let public = state.public();
        tracing::info!(dependency = %shared.name, state = ?public, "circuit breaker state changed");
        shared.report(public);
    }

    /// Whether the window ending at `now` opens the breaker (see the module doc).
    fn judge(&mut self, cfg: &BreakerConfig, now: Instant, name: &str) -> bool {
        let buckets = self.window.buckets(now);
        let (total, failures) = buckets.iter().fold((0u64, 0u64), |(t, f), c| {
            (t + u64::from(c.total), f + u64::from(c.failures))
        });
        // The cheap, unattributed test first: most failures stop here.
        if !opens(cfg, total, failures, 0) {
            return false;
        }
        let sums = callers::per_caller(buckets.iter().map(|c| &c.callers));
        let set_aside = callers::top_failures(&sums, cfg.min_callers() as usize - 1);
        let open = opens(cfg, total, failures, set_aside);
        if open {
            tracing::warn!(
                dependency = %name,
                failures,
                total,
                failing_callers = sums.len(),
                set_aside,
                open_for_ms = cfg.open_for().as_millis() as u64,
                "circuit breaker opened"
            );
        } else {
            tracing::debug!(
                dependency = %name,
                failures,
                total,
                failing_callers = sums.len(),
                set_aside,
                "failure rate reached, but not without the callers with the most failures"
            );
        }
        open
    }
}

/// The opening rule as arithmetic: at least `min_requests` requests, and a failure share of
/// at least `failure_rate` once `set_aside` failed requests (those of the callers with the
/// most failures) are removed from both counts; at least one failure must remain.
fn opens(cfg: &BreakerConfig, total: u64, failures: u64, set_aside: u64) -> bool {
    let set_aside = set_aside.min(failures);
    let (total_left, failures_left) = (total - set_aside, failures - set_aside);
    total >= u64::from(cfg.min_requests())
        && failures_left > 0
        && failures_left as f64 / total_left as f64 >= cfg.failure_rate()
}

// === impl State ===

impl State {
    fn public(self) -> BreakerState {
        match self {
            Self::Closed => BreakerState::Closed,
            Self::Open { .. } => BreakerState::Open,
            Self::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }
}

#[cfg(test)]
mod tests;
