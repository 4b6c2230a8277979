//! Per-dependency retry budget (docs/retry-policy.md): retries may be at most `percent` of the
//! requests seen over a rolling window, plus a small per-second floor.
//!
//! Every original request deposits; every retry withdraws. A retry is allowed while
//! `retries + 1 ≤ requests · percent / 100 + min_retries_per_second · window_seconds`.
//! The floor lets a quiet upstream still get a retry for a rare blip; it is why the default
//! is small (1/s): at 10 requests/s over a 30 s window it adds 10 % to the 20 %.
//!
//! Cost and accuracy: one short `Mutex` section (no await inside) per request and per retry
//! attempt, over a ring of 10 buckets (see `window.rs`: the effective window is 90–100 % of
//! the configured one). Each gateway replica keeps its own budget, so N replicas together
//! allow N floors.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::time::Instant;

use crate::{metrics::BudgetMetrics, policy::InvalidRetryConfig, window::Ring};

/// Default share of requests that may be retries (docs/retry-policy.md).
pub(crate) const DEFAULT_BUDGET_PERCENT: u32 = 20;
/// Largest allowed share (docs/retry-policy.md: 0–50 %).
pub(crate) const MAX_BUDGET_PERCENT: u32 = 50;
/// Default rolling window (docs/retry-policy.md).
pub(crate) const DEFAULT_BUDGET_WINDOW: Duration = Duration::from_secs(30);
/// Default floor of retries per second allowed whatever the traffic.
pub(crate) const DEFAULT_MIN_RETRIES_PER_SECOND: u32 = 1;

/// Validated retry-budget settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetConfig {
    percent: u32,
    window: Duration,
    min_retries_per_second: u32,
}

/// A point-in-time view of a budget, for tests and the admin API.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct BudgetSnapshot {
    /// Original requests in the window.
    pub(crate) requests: u64,
    /// Retries in the window.
    pub(crate) retries: u64,
    /// Retries the window allows in total.
    pub(crate) allowed: f64,
}

/// The retry budget of one dependency; cheap to share (`&self` methods).
#[derive(Debug)]
pub(crate) struct RetryBudget {
    metrics: BudgetMetrics,
    config: BudgetConfig,
    ring: Mutex<Ring<Slot>>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Slot {
    requests: u64,
    retries: u64,
}

// === impl BudgetConfig ===

impl BudgetConfig {
    /// Validates: `percent` 0..=50, `window` 1 s..=10 min, `min_retries_per_second` 0..=1000.
    pub fn try_new(
        percent: u32,
        window: Duration,
        min_retries_per_second: u32,
    ) -> Result<Self, InvalidRetryConfig> {
        if percent > MAX_BUDGET_PERCENT {
            return Err(InvalidRetryConfig {
                field: "budget_percent",
                value: percent.to_string(),
                allowed: "0..=50 (default 20)".to_owned(),
            });
        }
        if window < Duration::from_secs(1) || window > Duration::from_secs(600) {
            return Err(InvalidRetryConfig {
                field: "budget_window",
                value: format!("{window:?}"),
                allowed: "1s..=600s".to_owned(),
            });
        }
        if min_retries_per_second > 1000 {
            return Err(InvalidRetryConfig {
                field: "budget_min_retries_per_second",
                value: min_retries_per_second.to_string(),
                allowed: "0..=1000".to_owned(),
            });
        }
        Ok(Self {
            percent,
            window,
            min_retries_per_second,
        })
    }

    /// Share of requests that may be retries, in percent.
    pub fn percent(&self) -> u32 {
        self.percent
    }

    /// Rolling window.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Retries per second allowed whatever the traffic.
    #[cfg(test)]
    pub(crate) fn min_retries_per_second(&self) -> u32 {
        self.min_retries_per_second
    }

    fn allowed(&self, requests: u64) -> f64 {
        requests as f64 * f64::from(self.percent) / 100.0
            + f64::from(self.min_retries_per_second) * self.window.as_secs_f64()
    }
}

impl Default for BudgetConfig {
    /// 20 % over 30 s, floor 1 retry/s.
    fn default() -> Self {
        Self {
            percent: DEFAULT_BUDGET_PERCENT,
            window: DEFAULT_BUDGET_WINDOW,
            min_retries_per_second: DEFAULT_MIN_RETRIES_PER_SECOND,
        }
    }
}

// === impl RetryBudget ===

impl RetryBudget {
    /// An empty budget for dependency `name`.
    pub(crate) fn new(name: Arc<str>, config: BudgetConfig) -> Self {
        Self {
            metrics: BudgetMetrics::new(&name),
            ring: Mutex::new(Ring::new(config.window)),
            config,
        }
    }

    /// Takes one retry from the budget; `false` (and counted as
    /// `retry_budget_exhausted_total`) when the budget is spent.
    pub(crate) fn try_withdraw(&self) -> bool {
        self.try_withdraw_at(Instant::now())
    }

    /// Current state of the window.
    pub(crate) fn snapshot(&self) -> BudgetSnapshot {
        let mut ring = self.lock();
        snapshot(&self.config, &mut ring, Instant::now())
    }

    /// Records one original request, which arrived at `now`.
    pub(crate) fn deposit_at(&self, now: Instant) {
        let snap = {
            let mut ring = self.lock();
            ring.current(now).requests += 1;
            snapshot(&self.config, &mut ring, now)
        };
        self.report(snap);
    }

    pub(crate) fn try_withdraw_at(&self, now: Instant) -> bool {
        let (ok, snap) = {
            let mut ring = self.lock();
            let before = snapshot(&self.config, &mut ring, now);
            let ok = (before.retries + 1) as f64 <= before.allowed;
            if ok {
                ring.current(now).retries += 1;
            }
            (ok, snapshot(&self.config, &mut ring, now))
        };
        if !ok {
            self.metrics.exhausted();
        }
        self.report(snap);
        ok
    }

    fn report(&self, snap: BudgetSnapshot) {
        let ratio = if snap.allowed > 0.0 {
            (snap.retries as f64 / snap.allowed).min(1.0)
        } else {
            1.0
        };
        self.metrics.utilization(ratio);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ring<Slot>> {
        // A panic while holding this lock cannot leave the counters inconsistent in a way
        // that matters (worst case one count is lost), so poisoning is ignored.
        self.ring.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn snapshot(config: &BudgetConfig, ring: &mut Ring<Slot>, now: Instant) -> BudgetSnapshot {
    let (requests, retries) = ring
        .buckets(now)
        .iter()
        .fold((0, 0), |(q, r), s| (q + s.requests, r + s.retries));
    BudgetSnapshot {
        requests,
        retries,
        allowed: config.allowed(requests),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(percent: u32, floor: u32) -> RetryBudget {
        let cfg = BudgetConfig::try_new(percent, Duration::from_secs(30), floor).expect("valid");
        RetryBudget::new(Arc::from("orders"), cfg)
    }

    #[test]
    fn config_validation_names_the_field() {
        let e = BudgetConfig::try_new(51, Duration::from_secs(30), 1).expect_err("51");
        assert_eq!(e.field, "budget_percent");
        let e = BudgetConfig::try_new(20, Duration::ZERO, 1).expect_err("0s");
        assert_eq!(e.field, "budget_window");
        assert!(BudgetConfig::try_new(0, Duration::from_secs(1), 0).is_ok());
        assert!(BudgetConfig::try_new(50, Duration::from_secs(600), 1000).is_ok());
        let d = BudgetConfig::default();
        assert_eq!((d.percent(), d.window()), (20, Duration::from_secs(30)));
    }

    #[tokio::test(start_paused = true)]
    async fn allows_percent_of_requests() {
        let b = budget(20, 0);
        let now = Instant::now();
        for _ in 0..100 {
            b.deposit_at(now);
        }
        let granted = (0..100).filter(|_| b.try_withdraw_at(now)).count();
        assert_eq!(granted, 20);
    }

    #[tokio::test(start_paused = true)]
    async fn floor_allows_retries_without_traffic() {
        let b = budget(20, 1);
        let now = Instant::now();
        let granted = (0..100).filter(|_| b.try_withdraw_at(now)).count();
        assert_eq!(granted, 30, "1/s over a 30 s window");
    }

    #[tokio::test(start_paused = true)]
    async fn zero_budget_refuses_every_retry() {
        let b = budget(0, 0);
        let now = Instant::now();
        b.deposit_at(now);
        assert!(!b.try_withdraw_at(now));
    }

    #[tokio::test(start_paused = true)]
    async fn budget_refills_as_the_window_rolls() {
        let b = budget(20, 0);
        let t0 = Instant::now();
        for _ in 0..10 {
            b.deposit_at(t0);
        }
        assert!(b.try_withdraw_at(t0));
        assert!(b.try_withdraw_at(t0));
        assert!(!b.try_withdraw_at(t0));
        // After the window the old deposits and withdrawals are gone.
        let later = t0 + Duration::from_secs(31);
        assert!(!b.try_withdraw_at(later));
        for _ in 0..5 {
            b.deposit_at(later);
        }
        assert!(b.try_withdraw_at(later));
        let snap = b.snapshot();
        assert_eq!((snap.requests, snap.retries), (5, 1));
    }
}
