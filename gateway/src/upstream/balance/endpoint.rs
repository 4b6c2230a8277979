//! One endpoint and its state: in-flight count, latency EWMA, active-check verdict and
//! passive ejection. All atomics, so the request path takes no lock; the state sits behind
//! an `Arc` that survives endpoint-set replacement (discovery) for endpoints that stay.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::uri::{Authority, Scheme};
use http::HeaderValue;

use crate::config::OutlierSettings;

/// The latency assumed for an endpoint with no observation yet (linkerd's default RTT).
pub(crate) const DEFAULT_RTT: Duration = Duration::from_millis(30);
/// Time constant of the EWMA's decay (linkerd's default): an observation's weight falls to
/// 1/e after this long, and an idle endpoint's estimate decays toward 0, so a once-slow
/// endpoint is tried again.
pub(crate) const EWMA_DECAY: Duration = Duration::from_secs(10);

/// Monotonic nanoseconds since the upstream's clock base (`tokio::time::Instant`, so tests
/// can pause time). 0 means "never" in the stamps below, so real stamps start at 1.
pub(crate) type Nanos = u64;

/// Where an endpoint is, as the connection pool and the `Host` header need it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Address {
    /// `http` or `https`.
    pub(crate) scheme: Scheme,
    /// What to connect to (an IP for resolved host names).
    pub(crate) authority: Authority,
    /// The `Host` header: the configured `host:port`, also for resolved names.
    pub(crate) host: HeaderValue,
}

// === impl Address ===

impl Address {
    /// `scheme://authority`, for logs and the admin API.
    pub(crate) fn url(&self) -> String {
        format!("{}://{}", self.scheme, self.authority)
    }
}

/// One endpoint in a set: where it is, its weight, and its shared state.
#[derive(Debug)]
pub(crate) struct Endpoint {
    pub(crate) address: Address,
    pub(crate) weight: u32,
    pub(crate) state: Arc<EndpointState>,
}

/// The result of one attempt, as passive health sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Any answer other than 502/503/504.
    Success,
    /// A gateway failure: connect error, reset, attempt timeout, or 502/503/504 from the
    /// endpoint.
    Failure,
    /// Neither (the client's body failed): says nothing about the endpoint.
    Neutral,
}

/// Per-endpoint state that outlives endpoint-set replacement.
#[derive(Debug)]
pub(crate) struct EndpointState {
    /// Stable identity, reported as `ServedBy` and used as the retry layer's `avoid` hint
    /// (indices would change when discovery replaces the set).
    pub(crate) id: usize,
    in_flight: AtomicUsize,
    /// f64 bits of the latency estimate in nanoseconds.
    ewma_bits: AtomicU64,
    ewma_stamp: AtomicU64,
    /// Active check verdict; only the checker task writes these three.
    active_down: AtomicBool,
    check_passes: AtomicU32,
    check_failures: AtomicU32,
    consecutive_failures: AtomicU32,
    /// 0: not ejected; else the end of the current (or last) ejection.
    ejected_until: AtomicU64,
    /// Ejections in a row: the next ejection lasts this + 1 times the base.
    multiplier: AtomicU32,
    ejections: AtomicU32,
}

static NEXT_ID: AtomicUsize = AtomicUsize::new(0);

// === impl EndpointState ===

impl EndpointState {
    /// Fresh state: healthy, not ejected, the default RTT.
    pub(crate) fn new() -> Self {
        Self {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            in_flight: AtomicUsize::new(0),
            ewma_bits: AtomicU64::new((DEFAULT_RTT.as_nanos() as f64).to_bits()),
            ewma_stamp: AtomicU64::new(0),
            active_down: AtomicBool::new(false),
            check_passes: AtomicU32::new(0),
            check_failures: AtomicU32::new(0),
            consecutive_failures: AtomicU32::new(0),
            ejected_until: AtomicU64::new(0),
            multiplier: AtomicU32::new(0),
            ejections: AtomicU32::new(0),
        }
    }

    /// Requests sent and not yet finished.
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Counts one more request until the guard drops.
    pub(crate) fn start(self: &Arc<Self>) -> EndpointLoad {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        EndpointLoad(self.clone())
    }

    /// Whether the endpoint may be picked at `now`: not failed by active checks, not ejected.
    #[inline]
    pub(crate) fn usable(&self, now: &mut Now<'_>) -> bool {
        if self.active_down.load(Ordering::Relaxed) {
            return false;
        }
        let until = self.ejected_until.load(Ordering::Relaxed);
        until == 0 || until <= now.get()
    }

    /// Whether active checks currently fail it.
    pub(crate) fn active_down(&self) -> bool {
        self.active_down.load(Ordering::Relaxed)
    }

    /// Whether ejected at `now`, and until when.
    pub(crate) fn ejected_until(&self, now: Nanos) -> Option<Nanos> {
        let until = self.ejected_until.load(Ordering::Relaxed);
        (until > now).then_some(until)
    }

    /// Ejections so far.
    pub(crate) fn ejections(&self) -> u32 {
        self.ejections.load(Ordering::Relaxed)
    }

    /// Gateway failures in a row.
    pub(crate) fn consecutive_failures(&self) -> u32 {
        self.consecutive_failures.load(Ordering::Relaxed)
    }

    /// The latency estimate at `now` in nanoseconds, decayed since the last observation.
    #[inline]
    pub(crate) fn ewma(&self, now: Nanos) -> f64 {
        let value = f64::from_bits(self.ewma_bits.load(Ordering::Relaxed));
        let stamp = self.ewma_stamp.load(Ordering::Relaxed);
        if stamp == 0 || now <= stamp {
            return value;
        }
        value * decay(now - stamp)
    }

    /// Folds one observed latency into the estimate: a sample above it replaces it at once
    /// (peak sensitivity), a lower one is averaged in by recency. The two atomics are
    /// written without a lock: a racing pair of updates may lose one sample, which only
    /// makes the estimate lag by one observation.
    pub(crate) fn observe_latency(&self, rtt: Duration, now: Nanos) {
        let rtt = rtt.as_nanos() as f64;
        let previous_stamp = self.ewma_stamp.swap(now.max(1), Ordering::Relaxed);
        let value = f64::from_bits(self.ewma_bits.load(Ordering::Relaxed));
        let next = if rtt >= value {
            rtt
        } else {
            let w = if previous_stamp == 0 || now <= previous_stamp {
                0.0
            } else {
                decay(now - previous_stamp)
            };
            value * w + rtt * (1.0 - w)
        };
        self.ewma_bits.store(next.to_bits(), Ordering::Relaxed);
    }

    /// Records a passive outcome; returns `true` when this failure crossed the threshold
    /// and the caller should try to eject (subject to the ejected-share cap).
    pub(crate) fn record(&self, outcome: Outcome, outlier: &OutlierSettings) -> bool {
        match outcome {
            Outcome::Neutral => false,
            Outcome::Success => {
                if self.consecutive_failures.load(Ordering::Relaxed) != 0 {
                    self.consecutive_failures.store(0, Ordering::Relaxed);
                }
                false
            }
            Outcome::Failure => {
                let n = self.consecutive_failures.fetch_add(1, Ordering::Relaxed) + 1;
                outlier.consecutive_failures != 0 && n >= outlier.consecutive_failures
            }
        }
    }

    /// Ejects until `now + base × n` (capped), n counting ejections in a row; an ejection
    /// that comes more than `max_ejection` after the last one ended starts again at 1
    /// (Envoy decrements its multiplier while the host stays healthy; this is the coarse
    /// version). Returns the ejection's end, or `None` when already ejected.
    pub(crate) fn eject(&self, now: Nanos, outlier: &OutlierSettings) -> Option<Nanos> {
        let until = self.ejected_until.load(Ordering::Relaxed);
        if until > now {
            return None;
        }
        let quiet = until != 0 && now.saturating_sub(until) > nanos(outlier.max_ejection);
        let n = if quiet || until == 0 {
            1
        } else {
            self.multiplier.load(Ordering::Relaxed).saturating_add(1)
        };
        let length = outlier
            .base_ejection
            .saturating_mul(n)
            .min(outlier.max_ejection);
        let end = now.saturating_add(nanos(length)).max(1);
        // One winner among racing failures.
        self.ejected_until
            .compare_exchange(until, end, Ordering::Relaxed, Ordering::Relaxed)
            .ok()?;
        self.multiplier.store(n, Ordering::Relaxed);
        self.ejections.fetch_add(1, Ordering::Relaxed);
        self.consecutive_failures.store(0, Ordering::Relaxed);
        Some(end)
    }

    /// Ends a current ejection at `now`: an active health check passed, so the endpoint is
    /// back in service at once (Envoy's `successful_active_health_check_uneject_host`,
    /// on by default). The multiplier stays: an endpoint that fails again is ejected for
    /// longer. Returns whether an ejection was lifted.
    pub(crate) fn uneject(&self, now: Nanos) -> bool {
        let until = self.ejected_until.load(Ordering::Relaxed);
        until > now
            && self
                .ejected_until
                .compare_exchange(until, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// Folds one active check result in; returns the new verdict when it changed
    /// (`Some(true)`: now healthy).
    pub(crate) fn record_check(&self, passed: bool, healthy: u32, unhealthy: u32) -> Option<bool> {
        if passed {
            self.check_failures.store(0, Ordering::Relaxed);
            let n = self.check_passes.fetch_add(1, Ordering::Relaxed) + 1;
            if self.active_down.load(Ordering::Relaxed) && n >= healthy {
                self.active_down.store(false, Ordering::Relaxed);
                return Some(true);
            }
        } else {
            self.check_passes.store(0, Ordering::Relaxed);
            let n = self.check_failures.fetch_add(1, Ordering::Relaxed) + 1;
            if !self.active_down.load(Ordering::Relaxed) && n >= unhealthy {
                self.active_down.store(true, Ordering::Relaxed);
                return Some(false);
            }
        }
        None
    }
}

/// `e^(-elapsed / EWMA_DECAY)`.
#[inline]
fn decay(elapsed: Nanos) -> f64 {
    (-(elapsed as f64) / EWMA_DECAY.as_nanos() as f64).exp()
}

pub(crate) fn nanos(d: Duration) -> Nanos {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Counts a request in flight on an endpoint until dropped (when the response body ends or
/// the attempt is abandoned).
#[derive(Debug)]
pub(crate) struct EndpointLoad(Arc<EndpointState>);

impl Drop for EndpointLoad {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The clock, read at most once per pick and only when something needs it (an ejection to
/// check, a latency to decay): round robin over healthy endpoints never reads it.
pub(crate) struct Now<'a> {
    clock: &'a Clock,
    value: Nanos,
}

impl<'a> Now<'a> {
    /// A lazy reading of `clock`.
    pub(crate) fn new(clock: &'a Clock) -> Self {
        Self { clock, value: 0 }
    }

    /// The time, read on first use.
    #[inline]
    pub(crate) fn get(&mut self) -> Nanos {
        if self.value == 0 {
            self.value = self.clock.now();
        }
        self.value
    }
}

/// Monotonic nanoseconds since a base instant (tokio's clock, pausable in tests).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    base: tokio::time::Instant,
}

impl Clock {
    /// A clock starting now.
    pub(crate) fn new() -> Self {
        Self {
            base: tokio::time::Instant::now(),
        }
    }

    /// Nanoseconds since the base, plus 1: never 0, which means "never".
    pub(crate) fn now(&self) -> Nanos {
        nanos(tokio::time::Instant::now().saturating_duration_since(self.base)).saturating_add(1)
    }

    /// `at` as a duration from now (0 when past).
    pub(crate) fn until(&self, at: Nanos) -> Duration {
        Duration::from_nanos(at.saturating_sub(self.now()))
    }
}
