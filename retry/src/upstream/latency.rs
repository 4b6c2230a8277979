//! Attempt latency of one upstream, measured: percentiles for operators and a recommended
//! attempt timeout (docs/retries.md: timeouts set from the measured p99, 2–3×, not from guesses).
//!
//! Every attempt's time to response headers (or to its failure, or to its timeout) is
//! counted in a log-linear histogram: four buckets per power of two of microseconds, so a
//! percentile is known within 19 %, from 1 µs to 2^28 µs (4.5 min). Two windows of
//! [`WINDOW`] rotate, and percentiles read both: the last one to two minutes, never an
//! empty view right after a rotation. Recording is two relaxed atomic adds; no lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// One window of samples.
pub const WINDOW: Duration = Duration::from_secs(60);

/// Sub-buckets per power of two.
const SUB: usize = 4;
/// Powers of two of microseconds covered.
const OCTAVES: usize = 28;
const BUCKETS: usize = SUB * OCTAVES;

/// Fewer samples than this in view: no percentile is claimed, no timeout recommended.
pub const MIN_SAMPLES: u64 = 100;

/// The multiple of p99 a recommended attempt timeout is (2–3× is the usual advice; the upper end,
/// because a timeout that fires on healthy tail latency turns slowness into retries).
pub const P99_MULTIPLIER: u32 = 3;

/// Attempt latencies of one upstream or one route.
#[derive(Debug)]
pub struct Latency {
    origin: Instant,
    /// The window (number since `origin`) that `windows[n % 2]` counts.
    epochs: [AtomicU64; 2],
    windows: [Window; 2],
}

#[derive(Debug)]
struct Window {
    buckets: [AtomicU64; BUCKETS],
}

/// Percentiles of what is in view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Percentiles {
    /// Samples in view.
    pub samples: u64,
    /// Median.
    pub p50: Duration,
    /// 99th percentile.
    pub p99: Duration,
    /// 99.9th percentile.
    pub p999: Duration,
}

// === impl Latency ===

impl Default for Latency {
    fn default() -> Self {
        Self::new()
    }
}

impl Latency {
    /// An empty histogram.
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
            epochs: [AtomicU64::new(0), AtomicU64::new(1)],
            windows: [Window::new(), Window::new()],
        }
    }

    /// Counts one attempt that took `took`, ending at `now`.
    pub(crate) fn record(&self, took: Duration, now: Instant) {
        let epoch = self.epoch(now);
        let slot = usize::from(epoch % 2 == 1);
        if self.epochs[slot].load(Ordering::Relaxed) != epoch {
            // The first sample of a new window clears what that slot counted two windows
            // ago. Racing recorders may lose a handful of samples at the boundary; a
            // percentile does not notice.
            let previous = self.epochs[slot].swap(epoch, Ordering::Relaxed);
            if previous != epoch {
                self.windows[slot].clear();
            }
        }
        self.windows[slot].buckets[bucket(took)].fetch_add(1, Ordering::Relaxed);
    }

    /// Percentiles of the last one to two minutes, now; `None` below [`MIN_SAMPLES`].
    pub fn recent(&self) -> Option<Percentiles> {
        self.percentiles(Instant::now())
    }

    /// Percentiles of the current and the previous window; `None` below [`MIN_SAMPLES`].
    pub(crate) fn percentiles(&self, now: Instant) -> Option<Percentiles> {
        let (counts, samples) = self.in_view(now)?;
        let at = |q: f64| quantile(&counts, samples, q);
        Some(Percentiles {
            samples,
            p50: at(0.5),
            p99: at(0.99),
            p999: at(0.999),
        })
    }

    /// The bucket counts of the current and the previous window, and their sum; `None`
    /// below [`MIN_SAMPLES`].
    fn in_view(&self, now: Instant) -> Option<([u64; BUCKETS], u64)> {
        let epoch = self.epoch(now);
        let mut counts = [0u64; BUCKETS];
        for (slot, window) in self.windows.iter().enumerate() {
            let seen = self.epochs[slot].load(Ordering::Relaxed);
            if seen + 1 < epoch || seen > epoch {
                continue; // stale: older than the previous window
            }
            for (count, bucket) in counts.iter_mut().zip(&window.buckets) {
                *count += bucket.load(Ordering::Relaxed);
            }
        }
        let samples: u64 = counts.iter().sum();
        (samples >= MIN_SAMPLES).then_some((counts, samples))
    }

    /// The `q`-quantile of what is in view; `None` below [`MIN_SAMPLES`].
    pub(crate) fn quantile(&self, now: Instant, q: f64) -> Option<Duration> {
        let (counts, samples) = self.in_view(now)?;
        Some(quantile(&counts, samples, q))
    }

    /// [`Latency::recommended_timeout`] now.
    pub fn recommended(&self, floor: Duration, ceiling: Duration) -> Duration {
        self.recommended_timeout(Instant::now(), floor, ceiling)
    }

    /// `P99_MULTIPLIER` × p99 within `[floor, ceiling]`; `ceiling` until enough is known.
    pub(crate) fn recommended_timeout(
        &self,
        now: Instant,
        floor: Duration,
        ceiling: Duration,
    ) -> Duration {
        self.percentiles(now)
            .map_or(ceiling, |p| (p.p99 * P99_MULTIPLIER).clamp(floor, ceiling))
    }

    fn epoch(&self, now: Instant) -> u64 {
        let elapsed = now.saturating_duration_since(self.origin);
        elapsed.as_secs() / WINDOW.as_secs()
    }
}

impl Window {
    fn new() -> Self {
        Self {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    fn clear(&self) {
        for bucket in &self.buckets {
            bucket.store(0, Ordering::Relaxed);
        }
    }
}

/// The bucket of a duration: octave = ⌊log2 µs⌋, then the next two bits.
fn bucket(took: Duration) -> usize {
    let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX).max(1);
    let octave = 63 - us.leading_zeros() as usize;
    let sub = if octave >= 2 {
        ((us >> (octave - 2)) & 0b11) as usize
    } else {
        0
    };
    (octave * SUB + sub).min(BUCKETS - 1)
}

/// The upper bound of a bucket (a percentile is never reported lower than the truth).
fn upper_bound(index: usize) -> Duration {
    let octave = index / SUB;
    let sub = (index % SUB) as u64;
    let base = 1u64 << octave;
    let step = (base / SUB as u64).max(1);
    Duration::from_micros(base + step * (sub + 1))
}

fn quantile(counts: &[u64; BUCKETS], samples: u64, q: f64) -> Duration {
    // Rank of the q-quantile, 1-based: the smallest bucket holding it.
    let rank = ((samples as f64) * q).ceil().max(1.0) as u64;
    let mut seen = 0;
    for (index, count) in counts.iter().enumerate() {
        seen += count;
        if seen >= rank {
            return upper_bound(index);
        }
    }
    upper_bound(BUCKETS - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_bound_their_durations_within_a_fifth() {
        for us in [1u64, 3, 7, 100, 999, 1_000, 12_345, 250_000, 9_000_000] {
            let d = Duration::from_micros(us);
            let upper = upper_bound(bucket(d));
            assert!(upper >= d, "{us} µs → {upper:?}");
            if us >= 8 {
                assert!(
                    upper.as_micros() as f64 <= us as f64 * 1.26,
                    "{us} µs → {upper:?}"
                );
            }
        }
        assert_eq!(bucket(Duration::from_secs(100_000)), BUCKETS - 1);
    }

    #[tokio::test(start_paused = true)]
    async fn percentiles_of_a_known_mix() {
        let latency = Latency::new();
        let now = Instant::now();
        assert_eq!(latency.percentiles(now), None);
        for i in 0..1000u64 {
            // 98.9 % at 10 ms, 1 % at 200 ms, 0.1 % at 2 s.
            let took = match i {
                0 => Duration::from_secs(2),
                1..=10 => Duration::from_millis(200),
                _ => Duration::from_millis(10),
            };
            latency.record(took, now);
        }
        let p = latency.percentiles(now).unwrap();
        assert_eq!(p.samples, 1000);
        assert!(p.p50 >= Duration::from_millis(10) && p.p50 < Duration::from_millis(13));
        assert!(p.p99 >= Duration::from_millis(200) && p.p99 < Duration::from_millis(251));
        // The 999th of 1000 samples: the slowest (2 s) is beyond p99.9.
        assert!(p.p999 >= Duration::from_millis(200) && p.p999 < Duration::from_secs(2));
        let floor = Duration::from_millis(50);
        let ceiling = Duration::from_secs(10);
        let t = latency.recommended_timeout(now, floor, ceiling);
        assert_eq!(t, p.p99 * 3);
        assert_eq!(
            latency.recommended_timeout(now, floor, Duration::from_millis(300)),
            Duration::from_millis(300)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn old_windows_leave_the_view() {
        let latency = Latency::new();
        for _ in 0..200 {
            latency.record(Duration::from_millis(5), Instant::now());
        }
        assert!(latency.percentiles(Instant::now()).is_some());
        tokio::time::advance(WINDOW).await;
        // The previous window is still in view…
        assert_eq!(latency.percentiles(Instant::now()).unwrap().samples, 200);
        for _ in 0..200 {
            latency.record(Duration::from_millis(50), Instant::now());
        }
        assert_eq!(latency.percentiles(Instant::now()).unwrap().samples, 400);
        tokio::time::advance(WINDOW).await;
        // …then only the newer one; the slot the first filled is cleared on reuse.
        latency.record(Duration::from_millis(50), Instant::now());
        let p = latency.percentiles(Instant::now()).unwrap();
        assert_eq!(p.samples, 201);
        assert!(p.p50 >= Duration::from_millis(50));
        tokio::time::advance(WINDOW * 3).await;
        assert_eq!(latency.percentiles(Instant::now()), None, "nothing recent");
        assert_eq!(
            latency.recommended_timeout(Instant::now(), Duration::ZERO, Duration::from_secs(7)),
            Duration::from_secs(7)
        );
    }
}
