//! A rolling window of counters: a ring of `SLOTS` buckets on `tokio::time::Instant`.
//!
//! Accuracy: the window covers between `(SLOTS - 1) / SLOTS` and all of the configured
//! duration (27–30 s for a 30 s window), because the current bucket is partial and a whole
//! bucket expires at once. Memory is `SLOTS` counters whatever the traffic.

use std::time::Duration;

use tokio::time::Instant;

/// Number of buckets per window.
pub(super) const SLOTS: usize = 10;

/// Ring of `SLOTS` counters of type `T` covering `window`.
#[derive(Debug)]
pub(super) struct Ring<T> {
    slots: [T; SLOTS],
    current: usize,
    current_start: Option<Instant>,
    slot_len: Duration,
}

// === impl Ring ===

impl<T: Default + Copy> Ring<T> {
    /// An empty ring over `window` (bucket length at least 1 ms).
    pub(super) fn new(window: Duration) -> Self {
        let slot_len = (window / SLOTS as u32).max(Duration::from_millis(1));
        Self {
            slots: [T::default(); SLOTS],
            current: 0,
            current_start: None,
            slot_len,
        }
    }

    /// The bucket that `now` falls into, expiring older buckets first.
    pub(super) fn current(&mut self, now: Instant) -> &mut T {
        self.advance(now);
        &mut self.slots[self.current]
    }

    /// All buckets of the window that ends at `now`.
    pub(super) fn buckets(&mut self, now: Instant) -> &[T; SLOTS] {
        self.advance(now);
        &self.slots
    }

    /// Forgets everything.
    pub(super) fn clear(&mut self) {
        self.slots = [T::default(); SLOTS];
        self.current_start = None;
    }

    fn advance(&mut self, now: Instant) {
        let Some(start) = self.current_start else {
            self.current_start = Some(now);
            return;
        };
        let elapsed = now.saturating_duration_since(start);
        let n = elapsed.as_nanos() / self.slot_len.as_nanos().max(1);
        if n == 0 {
            return;
        }
        if n >= SLOTS as u128 {
            self.slots = [T::default(); SLOTS];
            self.current_start = Some(now);
            return;
        }
        // n < SLOTS, so the casts cannot truncate.
        let n = n as usize;
        for i in 1..=n {
            self.slots[(self.current + i) % SLOTS] = T::default();
        }
        self.current = (self.current + n) % SLOTS;
        self.current_start = Some(start + self.slot_len * n as u32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn buckets_expire_after_the_window() {
        let mut ring: Ring<u32> = Ring::new(Duration::from_secs(10));
        let t0 = Instant::now();
        *ring.current(t0) += 5;
        *ring.current(t0 + Duration::from_millis(4_500)) += 1;
        assert_eq!(
            ring.buckets(t0 + Duration::from_millis(9_999))
                .iter()
                .sum::<u32>(),
            6
        );
        // The first bucket ([0 s, 1 s)) expires once the window has moved past it.
        assert_eq!(
            ring.buckets(t0 + Duration::from_secs(10))
                .iter()
                .sum::<u32>(),
            1
        );
        assert_eq!(
            ring.buckets(t0 + Duration::from_secs(15))
                .iter()
                .sum::<u32>(),
            0
        );
        *ring.current(t0 + Duration::from_secs(16)) += 2;
        assert_eq!(
            ring.buckets(t0 + Duration::from_secs(100))
                .iter()
                .sum::<u32>(),
            0
        );
        *ring.current(t0 + Duration::from_secs(100)) += 3;
        assert_eq!(
            ring.buckets(t0 + Duration::from_secs(101))
                .iter()
                .sum::<u32>(),
            3
        );
        ring.clear();
        assert_eq!(
            ring.buckets(t0 + Duration::from_secs(101))
                .iter()
                .sum::<u32>(),
            0
        );
    }
}
