//! Per-dependency circuit breaker on `tokio::time::Instant`.
//!
//! * **Closed**: every attempt passes. Outcomes are counted in a rolling window; when at
//!   least `min_requests` attempts were counted and the failure share reaches
//!   `failure_rate`, the breaker opens. Each *attempt* counts once, so a request that
//!   failed three times counts three failures: the breaker measures what the upstream
//!   suffered, which is what it protects.
//! * **Open** for `open_for`: requests fail fast with `BreakerOpen { retry_after }`, where
//!   `retry_after` is the time until the next probe is admitted.
//! * **Half-open**: at most `half_open_probes` attempts run at once, each holding a
//!   [`BreakerPermit`] (RAII: dropping an unrecorded probe frees its slot). Once
//!   `half_open_probes` probes succeeded the breaker closes with an empty window; any probe
//!   failure reopens it. While every probe slot is taken, requests are refused with
//!   `retry_after` = 1 s.
//!
//! What counts is decided by `classify::breaker_outcome`: 408/500/502/503/504, transport
//! failures and attempt timeouts are failures; 429 is neutral (the upstream is alive and
//! throttling, opening would punish every tenant for one); the gateway's own rejections
//! never reach the breaker because they never become attempts.

use std::{
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use tokio::time::Instant;

use super::{classify::BreakerOutcome, window::Ring};

mod config;

pub use self::config::BreakerConfig;

/// `retry_after` reported while all half-open probe slots are in use.
pub const PROBES_BUSY_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The three states; the gauge `circuit_breaker_state{dependency}` reports their value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Traffic flows (gauge 0).
    Closed = 0,
    /// A bounded number of probes flows (gauge 1).
    HalfOpen = 1,
    /// Requests fail fast (gauge 2).
    Open = 2,
}

/// The circuit breaker of one dependency. Clones share state.
#[derive(Debug, Clone)]
pub struct CircuitBreaker {
    shared: Arc<Shared>,
}

/// Admission to send one attempt; record its outcome with [`BreakerPermit::record`].
#[derive(Debug)]
#[must_use = "record the attempt's outcome"]
pub struct BreakerPermit {
    shared: Arc<Shared>,
    generation: u64,
    probe: bool,
    done: bool,
}

#[derive(Debug)]
struct Shared {
    name: Arc<str>,
    config: BreakerConfig,
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    state: State,
    /// Bumped on every transition so outcomes of permits from an older state are ignored.
    generation: u64,
    window: Ring<Counts>,
}

#[derive(Debug, Clone, Copy)]
enum State {
    Closed,
    Open { until: Instant },
    HalfOpen { in_flight: u32, successes: u32 },
}

#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    total: u32,
    failures: u32,
}

// === impl CircuitBreaker ===

impl CircuitBreaker {
    /// A closed breaker for dependency `name`.
    pub fn new(name: Arc<str>, config: BreakerConfig) -> Self {
        let breaker = Self {
            shared: Arc::new(Shared {
                name,
                config,
                inner: Mutex::new(Inner {
                    state: State::Closed,
                    generation: 0,
                    window: Ring::new(config.window()),
                }),
            }),
        };
        breaker.shared.report(BreakerState::Closed);
        breaker
    }

    /// The settings.
    pub fn config(&self) -> &BreakerConfig {
        &self.shared.config
    }

    /// The current state (an open breaker whose time is up still reads `Open` until the
    /// next request turns it half-open).
    pub fn state(&self) -> BreakerState {
        self.shared.lock().state.public()
    }

    /// Whether [`CircuitBreaker::try_acquire`] would admit an attempt now (no side effect).
    pub fn would_admit(&self) -> bool {
        let now = Instant::now();
        match self.shared.lock().state {
            State::Closed => true,
            State::Open { until } => now >= until,
            State::HalfOpen { in_flight, .. } => in_flight < self.shared.config.half_open_probes(),
        }
    }

    /// Admits one attempt, or says how long until the next probe.
    pub fn try_acquire(&self) -> Result<BreakerPermit, Duration> {
        self.try_acquire_at(Instant::now())
    }

    pub(super) fn try_acquire_at(&self, now: Instant) -> Result<BreakerPermit, Duration> {
        let shared = &self.shared;
        let mut inner = shared.lock();
        let probe = match inner.state {
            State::Closed => false,
            State::Open { until } if now < until => {
                drop(inner);
                shared.rejected();
                return Err(until - now);
            }
            State::Open { .. } => {
                inner.transition(
                    State::HalfOpen {
                        in_flight: 0,
                        successes: 0,
                    },
                    shared,
                );
                true
            }
            State::HalfOpen { .. } => true,
        };
        if let State::HalfOpen {
            in_flight,
            successes,
        } = inner.state
        {
            if in_flight >= shared.config.half_open_probes() {
                drop(inner);
                shared.rejected();
                return Err(PROBES_BUSY_RETRY_AFTER);
            }
            inner.state = State::HalfOpen {
                in_flight: in_flight + 1,
                successes,
            };
        }
        Ok(BreakerPermit {
            shared: shared.clone(),
            generation: inner.generation,
            probe,
            done: false,
        })
    }
}

// === impl BreakerPermit ===

impl BreakerPermit {
    /// Whether this permit is a half-open probe.
    pub fn is_probe(&self) -> bool {
        self.probe
    }

    /// Records the outcome of the attempt this permit admitted.
    pub fn record(mut self, outcome: BreakerOutcome) {
        self.done = true;
        self.shared
            .on_outcome(self.generation, self.probe, Some(outcome), Instant::now());
    }

    #[cfg(test)]
    pub(super) fn record_at(mut self, outcome: BreakerOutcome, now: Instant) {
        self.done = true;
        self.shared
            .on_outcome(self.generation, self.probe, Some(outcome), now);
    }
}

impl Drop for BreakerPermit {
    fn drop(&mut self) {
        if !self.done && self.probe {
            self.shared
                .on_outcome(self.generation, true, None, Instant::now());
        }
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
        outcome: Option<BreakerOutcome>,
        now: Instant,
    ) {
        let cfg = &self.config;
        let mut inner = self.lock();
        if inner.generation != generation {
            return; // admitted under an older state; that state is gone.
        }
        match (inner.state, probe) {
            (
                State::HalfOpen {
                    in_flight,
                    successes,
                },
                true,
            ) => {
                let in_flight = in_flight.saturating_sub(1);
                match outcome {
                    Some(BreakerOutcome::Failure) => inner.transition(
                        State::Open {
                            until: now + cfg.open_for(),
                        },
                        self,
                    ),
                    Some(BreakerOutcome::Success) if successes + 1 >= cfg.half_open_probes() => {
                        inner.window.clear();
                        inner.transition(State::Closed, self);
                    }
                    Some(BreakerOutcome::Success) => {
                        inner.state = State::HalfOpen {
                            in_flight,
                            successes: successes + 1,
                        }
                    }
                    Some(BreakerOutcome::Neutral) | None => {
                        inner.state = State::HalfOpen {
                            in_flight,
                            successes,
                        }
                    }
                }
            }
            (State::Closed, false) => {
                let failed = match outcome {
                    Some(BreakerOutcome::Success) => false,
                    Some(BreakerOutcome::Failure) => true,
                    Some(BreakerOutcome::Neutral) | None => return,
                };
                let slot = inner.window.current(now);
                slot.total += 1;
                slot.failures += u32::from(failed);
                let (total, failures) = inner
                    .window
                    .buckets(now)
                    .iter()
                    .fold((0u64, 0u64), |(t, f), c| {
                        (t + u64::from(c.total), f + u64::from(c.failures))
                    });
                let rate = failures as f64 / total as f64;
                if failed && total >= u64::from(cfg.min_requests()) && rate >= cfg.failure_rate() {
                    tracing::warn!(
                        dependency = %self.name,
                        failures,
                        total,
                        open_for_ms = cfg.open_for().as_millis() as u64,
                        "circuit breaker opened"
                    );
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
        metrics::counter!("circuit_breaker_rejected_total", "dependency" => self.name.to_string())
            .increment(1);
    }

    fn report(&self, state: BreakerState) {
        metrics::gauge!("circuit_breaker_state", "dependency" => self.name.to_string())
            .set(state as u8 as f64);
    }
}

// === impl Inner ===

impl Inner {
    fn transition(&mut self, state: State, shared: &Shared) {
        self.state = state;
        self.generation += 1;
        let public = state.public();
        tracing::info!(dependency = %shared.name, state = ?public, "circuit breaker state changed");
        shared.report(public);
    }
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
