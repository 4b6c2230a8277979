//! Backoff between attempts: full or decorrelated jitter (docs/retry-policy.md), as plain functions
//! of a random source so they can be property-tested.

use std::time::Duration;

use rand::Rng;

use super::policy::Jitter;

/// Largest backoff window for the `n`-th retry (n from 0): `min(cap, base · 2^n)`.
/// Saturates instead of overflowing for any `n`.
pub(crate) fn full_jitter_ceiling(base: Duration, cap: Duration, n: u32) -> Duration {
    let factor = 1u32.checked_shl(n).filter(|f| n < 32 && *f != 0);
    match factor.and_then(|f| base.checked_mul(f)) {
        Some(window) => window.min(cap),
        None => cap,
    }
}

/// One full-jitter draw: uniform in `[0, min(cap, base · 2^n)]`.
pub(crate) fn full_jitter<R: Rng + ?Sized>(
    rng: &mut R,
    base: Duration,
    cap: Duration,
    n: u32,
) -> Duration {
    uniform(rng, Duration::ZERO, full_jitter_ceiling(base, cap, n))
}

/// One decorrelated-jitter draw: `min(cap, uniform(base, prev · 3))`.
pub(crate) fn decorrelated_jitter<R: Rng + ?Sized>(
    rng: &mut R,
    base: Duration,
    cap: Duration,
    prev: Duration,
) -> Duration {
    let hi = prev.saturating_mul(3).max(base);
    uniform(rng, base, hi).min(cap)
}

/// Uniform duration in `[lo, hi]` with nanosecond resolution (clamped to ~584 years).
pub(crate) fn uniform<R: Rng + ?Sized>(rng: &mut R, lo: Duration, hi: Duration) -> Duration {
    let lo = u64::try_from(lo.as_nanos()).unwrap_or(u64::MAX);
    let hi = u64::try_from(hi.as_nanos()).unwrap_or(u64::MAX);
    if hi <= lo {
        return Duration::from_nanos(lo);
    }
    Duration::from_nanos(rng.gen_range(lo..=hi))
}

/// The backoff sequence of one request.
#[derive(Debug)]
pub(crate) struct Backoff<R> {
    jitter: Jitter,
    base: Duration,
    cap: Duration,
    retries: u32,
    prev: Duration,
    rng: R,
}

// === impl Backoff ===

impl<R: Rng> Backoff<R> {
    /// A fresh sequence; `rng` is injected so tests can seed it.
    pub(crate) fn new(jitter: Jitter, base: Duration, cap: Duration, rng: R) -> Self {
        Self {
            jitter,
            base,
            cap,
            retries: 0,
            prev: base,
            rng,
        }
    }

    /// The sleep before the next retry.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let d = match self.jitter {
            Jitter::Full => full_jitter(&mut self.rng, self.base, self.cap, self.retries),
            Jitter::Decorrelated => {
                decorrelated_jitter(&mut self.rng, self.base, self.cap, self.prev)
            }
        };
        self.retries = self.retries.saturating_add(1);
        self.prev = d;
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::{rngs::StdRng, SeedableRng};

    const MS: u64 = 1_000_000;

    #[test]
    fn ceiling_doubles_then_caps() {
        let (b, c) = (Duration::from_secs(1), Duration::from_secs(30));
        let got: Vec<u64> = (0..7)
            .map(|n| full_jitter_ceiling(b, c, n).as_secs())
            .collect();
        assert_eq!(got, [1, 2, 4, 8, 16, 30, 30]);
        assert_eq!(full_jitter_ceiling(b, c, 31), c);
        assert_eq!(full_jitter_ceiling(b, c, 32), c);
        assert_eq!(full_jitter_ceiling(b, c, u32::MAX), c);
        assert_eq!(
            full_jitter_ceiling(Duration::MAX, Duration::MAX, 3),
            Duration::MAX
        );
    }

    #[test]
    fn draws_differ_across_calls() {
        let mut rng = StdRng::seed_from_u64(42);
        let (b, c) = (Duration::from_secs(1), Duration::from_secs(30));
        let draws: Vec<Duration> = (0..20).map(|_| full_jitter(&mut rng, b, c, 3)).collect();
        let distinct: std::collections::HashSet<_> = draws.iter().collect();
        assert!(distinct.len() > 15, "jitter not applied: {draws:?}");
    }

    proptest! {
        #[test]
        fn full_jitter_within_window(seed: u64, base_ms in 1u64..=5_000, extra_ms in 0u64..=60_000, n in 0u32..=64) {
            let base = Duration::from_nanos(base_ms * MS);
            let cap = base + Duration::from_nanos(extra_ms * MS);
            let mut rng = StdRng::seed_from_u64(seed);
            let d = full_jitter(&mut rng, base, cap, n);
            let ceiling = if n < 32 { base.saturating_mul(1 << n).min(cap) } else { cap };
            prop_assert!(d <= ceiling, "{d:?} > {ceiling:?}");
            prop_assert!(d <= cap);
        }

        #[test]
        fn decorrelated_within_base_and_cap(seed: u64, base_ms in 1u64..=5_000, extra_ms in 0u64..=60_000, steps in 1usize..=12) {
            let base = Duration::from_nanos(base_ms * MS);
            let cap = base + Duration::from_nanos(extra_ms * MS);
            let mut b = Backoff::new(Jitter::Decorrelated, base, cap, StdRng::seed_from_u64(seed));
            let mut prev = base;
            for _ in 0..steps {
                let d = b.next_delay();
                prop_assert!(d >= base && d <= cap, "{d:?} outside [{base:?}, {cap:?}]");
                prop_assert!(d <= prev.saturating_mul(3).max(base));
                prev = d;
            }
        }

        #[test]
        fn backoff_sequence_respects_ceiling(seed: u64, steps in 1u32..=10) {
            let (base, cap) = (Duration::from_secs(1), Duration::from_secs(30));
            let mut b = Backoff::new(Jitter::Full, base, cap, StdRng::seed_from_u64(seed));
            for n in 0..steps {
                prop_assert!(b.next_delay() <= full_jitter_ceiling(base, cap, n));
            }
        }

        #[test]
        fn full_jitter_draws_differ(seed: u64) {
            let mut rng = StdRng::seed_from_u64(seed);
            let (b, c) = (Duration::from_secs(1), Duration::from_secs(30));
            let a = full_jitter(&mut rng, b, c, 4);
            let z = full_jitter(&mut rng, b, c, 4);
            let y = full_jitter(&mut rng, b, c, 4);
            prop_assert!(a != z || z != y, "three equal draws {a:?}");
        }
    }
}
