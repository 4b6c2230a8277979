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
//!   `RESOURCE_EXHAUSTED`/`UNAVAILABLE`, an attempt timeout, or a success whose smoothed
//!   latency is over `latency_tolerance` × its long-run average (and 25 ms above it): the
//!   rate becomes `0.8 × min(measured sending rate, current rate)` and the bucket turns on
//!   (botocore and CUBIC use 0.7; with 0.8 the sawtooth below the capacity is shallower,
//!   which keeps ≥ 90 % of a 50 req/s backend in use in the unit test's synthetic run).
//!   The decrease happens once per congestion window, like TCP's: answers to attempts sent
//!   before the last decrease, or within the time of 10 sends at the new rate after it
//!   (50 ms..1 s), do not decrease again. botocore decreases on each of them, so a burst of
//!   20 throttled answers in flight would cut the rate to β^20 of it.
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
//! A request whose token is due within 50 ms waits for it (pacing: clumps of arrivals leave
//! evenly spaced); one over the rate beyond that is refused at the edge (503
//! `upstream-throttled` with a `Retry-After` of the time until the next token, rounded up to
//! whole seconds) instead of being sent. A retry over the rate is not sent either, and the
//! upstream's own answer is returned. The bucket holds 0.1 s of the rate (at least one
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
//! Off (`adaptive = false`, the default) the `Dependency` holds `None` and the request path
//! touches nothing. On, each request takes one uncontended mutex for the admission and one
//! for the outcome (a few floating-point operations each).

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use metrics::{Counter, Gauge, SharedString};
use portcullis_problem::grpc::GrpcCode;
use tokio::time::Instant;

use super::{classify::AttemptOutcome, policy::InvalidRetryConfig};

/// Multiplicative decrease on congestion (CUBIC's β; botocore's `_BETA` is 0.7).
const BETA: f64 = 0.8;
/// CUBIC's scaling constant C (botocore's `_SCALE_CONSTANT`).
const SCALE: f64 = 0.4;
/// Weight of the newest 0.1 s bucket in the measured sending rate (botocore).
const SMOOTHING: f64 = 0.8;
/// Width of one rate-measurement bucket, in seconds.
const BUCKET_SECS: f64 = 0.1;
/// Depth of the token bucket, in seconds of the rate (at least one token).
const BURST_SECS: f64 = 0.1;
/// A decrease is judged by the attempts sent after it: congestion reported for attempts
/// sent within the time of this many sends at the new rate does not decrease again. A
/// backend's own bucket is empty when it starts refusing and refills only at the
/// difference between its capacity and the new rate, so the first few attempts after a
/// decrease can still be refused; counting each would cut the rate to βⁿ of it.
const WINDOW_SENDS: f64 = 10.0;
/// Bounds of that window.
const MIN_WINDOW: Duration = Duration::from_millis(50);
const MAX_WINDOW: Duration = Duration::from_secs(1);
/// A request whose token comes within this long waits for it instead of being refused:
/// requests arriving in clumps leave evenly spaced (a backend's own bucket is often only a
/// few requests deep), and a client is not sent away for a second over a few milliseconds.
/// Longer waits are refused: the layer paces, it does not queue.
pub(crate) const MAX_PACE: Duration = Duration::from_millis(50);
/// Weights of the newest latency sample in the short and the long average.
const LATENCY_SHORT_ALPHA: f64 = 0.25;
const LATENCY_LONG_ALPHA: f64 = 0.02;
/// Latency inflation below this is never congestion: loopback and scheduling jitter on a
/// backend that answers in a millisecond would otherwise read as a 3× gradient.
const LATENCY_FLOOR_SECS: f64 = 0.025;

/// Default lowest rate the controller backs off to, in requests per second.
pub const DEFAULT_MIN_RATE: f64 = 1.0;
/// Default latency gradient read as congestion.
pub const DEFAULT_LATENCY_TOLERANCE: f64 = 2.0;

/// Bounds of the adaptive controller of one upstream (`adaptive = { … }`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdaptiveConfig {
    min_rate: f64,
    max_rate: Option<f64>,
    latency_tolerance: f64,
}

/// The adaptive throttle of one upstream: the controller behind a mutex, and its metrics.
#[derive(Debug)]
pub struct AdaptiveThrottle {
    inner: Mutex<Controller>,
    metrics: ThrottleMetrics,
}

/// What one replica publishes to the others about an upstream.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FleetReport {
    /// The rate this replica learned the upstream accepts, once it has seen congestion.
    pub learned_rate: Option<f64>,
    /// Requests per second arriving at this replica for the upstream (sent or refused).
    pub demand: f64,
}

/// What one attempt's outcome says about the rate the backend accepts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Signal {
    /// 429/503, gRPC RESOURCE_EXHAUSTED/UNAVAILABLE, an attempt timeout.
    Congestion,
    /// Any other answer, after this long.
    Accepted(Duration),
    /// A failure below HTTP: the breaker's business.
    Unrelated,
}

/// The pure controller: every decision takes `now`, so tests drive it on paused time.
#[derive(Debug)]
pub(crate) struct Controller {
    config: AdaptiveConfig,
    origin: Instant,
    /// The bucket refuses only after the first congestion signal.
    active: bool,
    rate: f64,
    tokens: f64,
    refilled_at: Instant,
    /// CUBIC's W_max: the rate at the last decrease.
    last_max: f64,
    /// CUBIC's K: seconds from the last decrease back to `last_max`.
    k: f64,
    decreased_at: Option<Instant>,
    /// Attempts sent within this long after a decrease do not decrease again.
    window: Duration,
    sent: RateMeter,
    offered: RateMeter,
    latency: Latency,
    fleet: Option<(f64, Instant)>,
}

/// botocore's `RateClocker`: requests per second, smoothed over 0.1 s buckets.
#[derive(Debug, Default)]
struct RateMeter {
    started: bool,
    count: f64,
    bucket: f64,
    rate: f64,
}

/// Short and long exponential averages of accepted answers' latency, in seconds.
#[derive(Debug, Default)]
struct Latency {
    short: Option<f64>,
    long: Option<f64>,
}

#[derive(Debug)]
struct ThrottleMetrics {
    label: SharedString,
    refused: std::sync::OnceLock<Counter>,
    rate: std::sync::OnceLock<Gauge>,
}

// === impl AdaptiveConfig ===

impl Default for AdaptiveConfig {
    fn default() -> Self {
        Self {
            min_rate: DEFAULT_MIN_RATE,
            max_rate: None,
            latency_tolerance: DEFAULT_LATENCY_TOLERANCE,
        }
    }
}

impl AdaptiveConfig {
    /// `min_rate` (0.1..=1e6 req/s) is the floor of every decrease; `max_rate` (≥ min_rate)
    /// caps the learned rate; `latency_tolerance` (0 = latency ignored, else 1.5..=100) is
    /// the latency gradient read as congestion.
    pub fn try_new(
        min_rate: f64,
        max_rate: Option<f64>,
        latency_tolerance: f64,
    ) -> Result<Self, InvalidRetryConfig> {
        if !(0.1..=1e6).contains(&min_rate) {
            return Err(InvalidRetryConfig {
                field: "min_rate",
                value: min_rate.to_string(),
                allowed: "0.1..=1000000 requests per second".to_owned(),
            });
        }
        if let Some(max) = max_rate {
            if !(min_rate..=1e9).contains(&max) {
                return Err(InvalidRetryConfig {
                    field: "max_rate",
                    value: max.to_string(),
                    allowed: format!("{min_rate}..=1000000000 requests per second (≥ min_rate)"),
                });
            }
        }
        if latency_tolerance != 0.0 && !(1.5..=100.0).contains(&latency_tolerance) {
            return Err(InvalidRetryConfig {
                field: "latency_tolerance",
                value: latency_tolerance.to_string(),
                allowed: "0 (latency ignored) or 1.5..=100".to_owned(),
            });
        }
        Ok(Self {
            min_rate,
            max_rate,
            latency_tolerance,
        })
    }

    fn clamp(&self, rate: f64) -> f64 {
        let rate = rate.max(self.min_rate);
        self.max_rate.map_or(rate, |max| rate.min(max))
    }
}

// === impl AdaptiveThrottle ===

impl AdaptiveThrottle {
    pub(crate) fn new(name: &std::sync::Arc<str>, config: AdaptiveConfig) -> Self {
        Self {
            inner: Mutex::new(Controller::new(config, Instant::now())),
            metrics: ThrottleMetrics {
                label: SharedString::from(name.clone()),
                refused: std::sync::OnceLock::new(),
                rate: std::sync::OnceLock::new(),
            },
        }
    }

    fn lock(&self) -> MutexGuard<'_, Controller> {
        // Poisoning is ignored: the state is a few numbers, consistent after every step.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes a token for one attempt (`first`: a new request, counted as demand): `Ok` with
    /// the time to wait before sending it (at most [`MAX_PACE`]), or `Err` with the time
    /// until the next token.
    pub(crate) fn admit(&self, first: bool) -> Result<Duration, Duration> {
        let refused = self.lock().admit(Instant::now(), first);
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

    /// Feeds one attempt's outcome, sent at `sent_at`.
    pub(crate) fn observe(&self, outcome: AttemptOutcome, sent_at: Instant) {
        let now = Instant::now();
        let rate = {
            let mut controller = self.lock();
            controller.observe(Signal::of(outcome, now - sent_at), sent_at, now);
            controller.rate(now)
        };
        if let Some(rate) = rate {
            let label = &self.metrics.label;
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

// === fn fleet_share ===

/// This replica's share of what the fleet learned: the sum of the replicas' learned rates,
/// split in proportion to their demand (at least 1 req/s each, so an idle replica keeps a
/// foothold). `None` when no replica has learned a rate yet.
pub fn fleet_share(mine: &FleetReport, fleet: &[FleetReport]) -> Option<f64> {
    let learned: f64 = fleet.iter().filter_map(|r| r.learned_rate).sum();
    if fleet.iter().all(|r| r.learned_rate.is_none()) {
        return None;
    }
    let weight = |r: &FleetReport| r.demand.max(1.0);
    let total: f64 = fleet.iter().map(weight).sum();
    Some(learned * weight(mine) / total.max(weight(mine)))
}

// === impl Signal ===

impl Signal {
    pub(crate) fn of(outcome: AttemptOutcome, latency: Duration) -> Self {
        match outcome {
            AttemptOutcome::Status(s) if matches!(s.as_u16(), 429 | 503) => Self::Congestion,
            AttemptOutcome::Grpc(GrpcCode::ResourceExhausted | GrpcCode::Unavailable) => {
                Self::Congestion
            }
            AttemptOutcome::Timeout => Self::Congestion,
            AttemptOutcome::Status(_) | AttemptOutcome::Grpc(_) => Self::Accepted(latency),
            AttemptOutcome::Failure(_) => Self::Unrelated,
        }
    }
}

// === impl Controller ===

impl Controller {
    pub(crate) fn new(config: AdaptiveConfig, now: Instant) -> Self {
        Self {
            config,
            origin: now,
            active: false,
            rate: 0.0,
            tokens: 0.0,
            refilled_at: now,
            last_max: 0.0,
            k: 0.0,
            decreased_at: None,
            window: Duration::ZERO,
            sent: RateMeter::default(),
            offered: RateMeter::default(),
            latency: Latency::default(),
            fleet: None,
        }
    }

    fn secs(&self, now: Instant) -> f64 {
        now.saturating_duration_since(self.origin).as_secs_f64()
    }

    /// The rate enforced now: the learned one, capped by a live fleet share.
    pub(crate) fn rate(&self, now: Instant) -> Option<f64> {
        let local = self.active.then_some(self.rate);
        let fleet = self.fleet.filter(|(_, until)| now < *until).map(|f| f.0);
        match (local, fleet) {
            (Some(local), Some(fleet)) => Some(local.min(fleet)),
            (local, fleet) => local.or(fleet),
        }
    }

    /// `Ok(pace)`: admitted, to be sent after `pace` (zero, or the time until its token when
    /// that is within [`MAX_PACE`]); `Err(wait)`: refused, the next token comes after `wait`.
    pub(crate) fn admit(&mut self, now: Instant, first: bool) -> Result<Duration, Duration> {
        let t = self.secs(now);
        if first {
            self.offered.record(t);
        }
        let Some(rate) = self.rate(now) else {
            // No limit: keep one token ready for the moment a limit appears.
            self.tokens = 1.0;
            self.refilled_at = now;
            self.sent.record(t);
            return Ok(Duration::ZERO);
        };
        self.refill(now, rate);
        let wait = Duration::from_secs_f64(((1.0 - self.tokens) / rate).max(0.0));
        if wait <= MAX_PACE {
            // The token is taken now, ahead of time if need be: later requests see a
            // bucket below zero and wait behind this one.
            self.tokens -= 1.0;
            self.sent.record(t);
            Ok(wait)
        } else {
            Err(wait)
        }
    }

    fn refill(&mut self, now: Instant, rate: f64) {
        let elapsed = now
            .saturating_duration_since(self.refilled_at)
            .as_secs_f64();
        let depth = (rate * BURST_SECS).max(1.0);
        self.tokens = (self.tokens + elapsed * rate).min(depth);
        self.refilled_at = now;
    }

    pub(crate) fn observe(&mut self, signal: Signal, sent_at: Instant, now: Instant) {
        match signal {
            Signal::Unrelated => {}
            Signal::Congestion => self.decrease(sent_at, now),
            Signal::Accepted(latency) => {
                let tolerance = self.config.latency_tolerance;
                if self.latency.inflated(latency.as_secs_f64(), tolerance) {
                    self.decrease(sent_at, now);
                } else {
                    self.grow(now);
                }
            }
        }
    }

    /// Multiplicative decrease, once per congestion window.
    fn decrease(&mut self, sent_at: Instant, now: Instant) {
        if self
            .decreased_at
            .is_some_and(|at| sent_at < at + self.window)
        {
            return; // sent before the last decrease took effect: that one answered for it
        }
        let measured = self.sent.estimate(self.secs(now));
        let base = if self.active {
            if let Some(rate) = self.rate(now) {
                self.refill(now, rate);
            }
            measured.min(self.rate)
        } else {
            self.tokens = 0.0;
            self.refilled_at = now;
            measured
        };
        let base = self.config.clamp(base);
        self.last_max = base;
        self.k = (base * (1.0 - BETA) / SCALE).cbrt();
        self.rate = self.config.clamp(base * BETA);
        self.window =
            Duration::from_secs_f64(WINDOW_SENDS / self.rate).clamp(MIN_WINDOW, MAX_WINDOW);
        self.decreased_at = Some(now);
        self.active = true;
        tracing::debug!(
            measured_rate = measured,
            rate = self.rate,
            "adaptive: congestion, rate decreased"
        );
    }

    /// Growth along the CUBIC curve since the last decrease.
    fn grow(&mut self, now: Instant) {
        let (true, Some(at)) = (self.active, self.decreased_at) else {
            return;
        };
        let t = now.saturating_duration_since(at).as_secs_f64();
        let cubic = SCALE * (t - self.k).powi(3) + self.last_max;
        let ceiling = (2.0 * self.sent.estimate(t + self.secs(at))).max(self.config.min_rate);
        if let Some(rate) = self.rate(now) {
            self.refill(now, rate);
        }
        self.rate = self.config.clamp(cubic.min(ceiling));
    }

    pub(crate) fn report(&self, now: Instant) -> FleetReport {
        // Demand decays when nothing arrives: a replica idle since its last request must
        // not keep claiming the share its old demand earned.
        let idle = self.secs(now) - self.offered.bucket;
        let demand = if idle > 1.0 {
            self.offered.rate / idle
        } else {
            self.offered.rate
        };
        FleetReport {
            learned_rate: self.active.then_some(self.rate),
            demand,
        }
    }

    pub(crate) fn set_fleet_share(&mut self, share: Option<f64>, until: Instant, now: Instant) {
        if let Some(rate) = self.rate(now) {
            self.refill(now, rate);
        }
        self.fleet = share.map(|rate| (self.config.clamp(rate), until));
    }
}

// === impl RateMeter ===

impl RateMeter {
    /// Counts one event at `t` seconds; closes the bucket when `t` is in a later one.
    fn record(&mut self, t: f64) {
        let bucket = (t / BUCKET_SECS).floor() * BUCKET_SECS;
        if !self.started {
            // The first bucket opens with the first event, not when the gateway started:
            // an upstream first called after an hour must not measure 1 request per hour.
            self.started = true;
            self.bucket = bucket;
        }
        self.count += 1.0;
        if bucket > self.bucket {
            let current = self.count / (bucket - self.bucket);
            self.rate = current * SMOOTHING + self.rate * (1.0 - SMOOTHING);
            self.count = 0.0;
            self.bucket = bucket;
        }
    }

    /// The smoothed rate; before the first bucket closes, the rate so far (throttling can
    /// start within the first 0.1 s, and a rate of 0 would send the controller to its floor).
    fn estimate(&self, t: f64) -> f64 {
        if self.rate > 0.0 {
            self.rate
        } else {
            self.count / (t - self.bucket).max(BUCKET_SECS)
        }
    }
}

// === impl Latency ===

impl Latency {
    /// Adds a sample; true when the short average is `tolerance` × the long one and
    /// [`LATENCY_FLOOR_SECS`] above it. The long average learns the inflated samples too,
    /// so a backend that became slower for good stops reading as congested.
    fn inflated(&mut self, sample: f64, tolerance: f64) -> bool {
        let ewma =
            |avg: Option<f64>, alpha: f64| Some(avg.map_or(sample, |a| a + alpha * (sample - a)));
        self.short = ewma(self.short, LATENCY_SHORT_ALPHA);
        self.long = ewma(self.long, LATENCY_LONG_ALPHA);
        match (self.short, self.long) {
            (Some(short), Some(long)) if tolerance > 0.0 => {
                short > tolerance * long && short - long > LATENCY_FLOOR_SECS
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests;
