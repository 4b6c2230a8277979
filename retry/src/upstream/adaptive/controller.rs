//! The pure controller: a token bucket filled at a rate CUBIC drives from the backend's
//! answers (module docs of [`super`]). Every decision takes `now`, so tests drive it on
//! explicit instants.

use std::collections::VecDeque;
use std::time::Duration;

use portcullis_problem::grpc::GrpcCode;
use tokio::time::Instant;

use super::config::AdaptiveConfig;
use super::fleet::FleetReport;
use super::meter::{Latency, RateMeter};
use crate::classify::AttemptOutcome;

/// Multiplicative decrease on congestion (CUBIC's β; botocore's `_BETA` is 0.7).
pub(super) const BETA: f64 = 0.8;
/// CUBIC's scaling constant C (botocore's `_SCALE_CONSTANT`).
const SCALE: f64 = 0.4;
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
/// Decreases remembered for re-timing the queue: at most one per [`MIN_WINDOW`], and none
/// is needed once every request admitted before it has left (see [`Controller::retime`]).
const MAX_STRETCHES: usize = 256;

/// What one attempt's outcome says about the rate the backend accepts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Signal {
    /// 429/503, gRPC RESOURCE_EXHAUSTED/UNAVAILABLE.
    Throttled,
    /// The attempt timed out.
    Timeout,
    /// Any other answer, after this long.
    Accepted(Duration),
    /// A failure below HTTP: the breaker's business.
    Unrelated,
}

/// Which signal made the controller decrease its rate (the `cause` label of
/// `adaptive_decreases_total`): what tells a backend that refuses apart from a latency
/// gradient read from a noisy machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cause {
    // The discriminant indexes the throttle's counters.
    Throttled,
    Timeout,
    Latency,
}

/// The controller of one upstream.
#[derive(Debug)]
pub(crate) struct Controller {
    config: AdaptiveConfig,
    origin: Instant,
    /// The bucket refuses only after the first congestion signal.
    active: bool,
    rate: f64,
    /// Below zero while requests wait for tokens already promised to them.
    tokens: f64,
    refilled_at: Instant,
    /// CUBIC's W_max: the rate at the last decrease.
    last_max: f64,
    /// CUBIC's K: seconds from the last decrease back to `last_max`.
    k: f64,
    decreased_at: Option<Instant>,
    /// Congestion on attempts sent before this does not decrease again (TCP NewReno's
    /// recovery point): the window of sends at the new rate after the last decrease, or
    /// the last send promised before it, whichever is later.
    recover_at: Option<Instant>,
    /// When the last admitted attempt is due to leave.
    promised: Instant,
    /// The decreases of the last few seconds, as (when, old rate / new rate): a request
    /// waiting for a token promised before a decrease leaves at the new rate, not the old
    /// one (its wait after the decrease is stretched by that factor, see [`Self::retime`]).
    stretches: VecDeque<(Instant, f64)>,
    /// Attempts, counted at their send time when their outcome comes (admissions would
    /// not do: after a decrease the queue admits nothing for a while, but its requests
    /// still leave at the old rate).
    sent: RateMeter,
    /// New requests, counted when they arrive.
    offered: RateMeter,
    latency: Latency,
    fleet: Option<(f64, Instant)>,
}

// === impl Signal ===

impl Signal {
    pub(crate) fn of(outcome: AttemptOutcome, latency: Duration) -> Self {
        match outcome {
            AttemptOutcome::Status(s) if matches!(s.as_u16(), 429 | 503) => Self::Throttled,
            AttemptOutcome::Grpc(GrpcCode::ResourceExhausted | GrpcCode::Unavailable) => {
                Self::Throttled
            }
            AttemptOutcome::Timeout => Self::Timeout,
            AttemptOutcome::Status(_) | AttemptOutcome::Grpc(_) => Self::Accepted(latency),
            AttemptOutcome::Failure(_) => Self::Unrelated,
        }
    }
}

// === impl Cause ===

impl Cause {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Throttled => "throttled",
            Self::Timeout => "timeout",
            Self::Latency => "latency",
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
            recover_at: None,
            promised: now,
            stretches: VecDeque::new(),
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

    /// `Ok(wait)`: admitted, to be sent after `wait` (zero, or the time until its token
    /// when that is within `max_wait` and `within`, the time the request has left);
    /// `Err(wait)`: refused, its token would come after `wait`.
    pub(crate) fn admit(
        &mut self,
        now: Instant,
        first: bool,
        within: Duration,
    ) -> Result<Duration, Duration> {
        let t = self.secs(now);
        if first {
            self.offered.record(t);
        }
        let Some(rate) = self.rate(now) else {
            // No limit: keep one token ready for the moment a limit appears.
            self.tokens = 1.0;
            self.refilled_at = now;
            return Ok(Duration::ZERO);
        };
        self.refill(now, rate);
        // Never ahead of a request admitted earlier: after the rate grew, a new request's
        // token could come before the slot an older one was promised at the old rate, and
        // both would leave together, a burst of up to `max_wait` of sends.
        let queued = self.promised.saturating_duration_since(now);
        let wait = Duration::from_secs_f64(((1.0 - self.tokens) / rate).max(0.0)).max(queued);
        if wait <= self.config.max_wait.min(within) {
            // The token is taken now, ahead of time if need be: later requests see a
            // bucket below zero and wait behind this one (a FIFO queue without a queue:
            // each waiter sleeps until its own token).
            self.tokens -= 1.0;
            self.promised = self.promised.max(now + wait);
            Ok(wait)
        } else {
            Err(wait)
        }
    }

    /// When a request admitted (or last re-timed) at `checked` and due at `due` may leave,
    /// after the decreases since: each one at `t` stretches what was left of its wait
    /// beyond `t` by old rate / new rate, so the queue leaves at the rate in force. `due`
    /// when none happened.
    pub(crate) fn retime(&self, checked: Instant, due: Instant) -> Instant {
        let mut due = due;
        for &(at, factor) in self.stretches.iter().filter(|(at, _)| *at > checked) {
            if at < due {
                due = at + (due - at).mul_f64(factor);
            }
        }
        due
    }

    fn refill(&mut self, now: Instant, rate: f64) {
        // `now` is read before the lock is taken, so it can be a little behind the last
        // refill: the refill point never moves back, or that interval would count twice.
        if now <= self.refilled_at {
            return;
        }
        let elapsed = (now - self.refilled_at).as_secs_f64();
        let depth = (rate * BURST_SECS).max(1.0);
        self.tokens = (self.tokens + elapsed * rate).min(depth);
        self.refilled_at = now;
    }

    /// Feeds one attempt's outcome; returns the cause when it decreased the rate.
    pub(crate) fn observe(
        &mut self,
        signal: Signal,
        sent_at: Instant,
        now: Instant,
    ) -> Option<Cause> {
        self.sent.record(self.secs(sent_at));
        let cause = match signal {
            Signal::Unrelated => return None,
            Signal::Throttled => Cause::Throttled,
            Signal::Timeout => Cause::Timeout,
            Signal::Accepted(latency) => {
                let tolerance = self.config.latency_tolerance;
                if !self
                    .latency
                    .inflated(latency.as_secs_f64(), tolerance, self.secs(now))
                {
                    self.grow(now);
                    return None;
                }
                Cause::Latency
            }
        };
        self.decrease(sent_at, now, cause).then_some(cause)
    }

    /// Multiplicative decrease, once per congestion window; false when the window had
    /// already decreased.
    fn decrease(&mut self, sent_at: Instant, now: Instant, cause: Cause) -> bool {
        if self.recover_at.is_some_and(|at| sent_at < at) {
            return false; // sent before the last decrease took effect: that one answered for it
        }
        let measured = self.sent.estimate(self.secs(now));
        let base = if self.active {
            // CUBIC's W_max is the window in force at the loss, not a measurement: the
            // measured rate of clients that come and go (and of clients sent away for a
            // whole second) dips far below the rate in force, and decreasing from the dip
            // would spiral down. An idle upstream cannot grow its rate (see `grow`).
            match self.rate(now) {
                Some(rate) => {
                    self.refill(now, rate);
                    rate
                }
                None => self.rate,
            }
        } else {
            self.tokens = 0.0;
            self.refilled_at = now;
            // Until now nothing was refused, so the arrivals were all sent; they count
            // when they arrive, the sends only when their answer came (the ones in flight
            // at the first 429 are not counted yet).
            measured.max(self.offered.estimate(self.secs(now)))
        };
        let base = self.config.clamp(base);
        self.last_max = base;
        let old = self.rate(now);
        self.rate = self.config.clamp(base * BETA);
        self.k = ((self.last_max - self.rate).max(0.0) / SCALE).cbrt();
        // The queue was promised its tokens at the old rate: re-spaced at the new one, or
        // for up to `max_wait` after this the backend would still get the rate it refused.
        // The tokens owed (below zero) refill at the new rate already.
        if let (Some(old), Some(new)) = (old, self.rate(now)) {
            if old > new && self.promised > now {
                let factor = old / new;
                self.promised = now + self.promised.duration_since(now).mul_f64(factor);
                // Requests admitted before the oldest are long gone (a wait is at most
                // `max_wait`, stretched a few times).
                let horizon = self.config.max_wait.mul_f64(4.0);
                while self.stretches.len() >= MAX_STRETCHES
                    || self
                        .stretches
                        .front()
                        .is_some_and(|(at, _)| *at + horizon < now)
                {
                    self.stretches.pop_front();
                }
                self.stretches.push_back((now, factor));
            }
        }
        let window =
            Duration::from_secs_f64(WINDOW_SENDS / self.rate).clamp(MIN_WINDOW, MAX_WINDOW);
        self.recover_at = Some((now + window).max(self.promised));
        self.decreased_at = Some(now);
        self.active = true;
        tracing::debug!(
            measured_rate = measured,
            rate = self.rate,
            cause = cause.as_str(),
            "adaptive: congestion, rate decreased"
        );
        true
    }

    /// Growth along the CUBIC curve since the last decrease.
    fn grow(&mut self, now: Instant) {
        let (true, Some(at)) = (self.active, self.decreased_at) else {
            return;
        };
        let t = now.saturating_duration_since(at).as_secs_f64();
        let cubic = SCALE * (t - self.k).powi(3) + self.last_max;
        // Twice the demand (arrivals, refused ones too): a quiet period cannot grow a
        // meaningless limit that a burst would then overrun. botocore caps at twice its
        // sending rate, which is its demand; here the sending rate falls while the queue
        // refuses, and capping at it would spiral the rate down.
        let ceiling = (2.0 * self.offered.estimate(t + self.secs(at))).max(self.config.min_rate);
        if let Some(rate) = self.rate(now) {
            self.refill(now, rate);
        }
        // The ceiling stops growth, it never cuts the rate: demand measured over 0.1 s
        // buckets dips whenever clients pause together.
        self.rate = self.config.clamp(cubic.min(ceiling.max(self.rate)));
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
