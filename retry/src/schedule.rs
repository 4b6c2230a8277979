//! The delivery schedule of asynchronous routes (docs/async-delivery.md): when a message whose
//! delivery attempt failed is tried again, or that it is dead. Synchronous calls back off
//! with [`crate::backoff`]; this is the slower, table-driven schedule of queued deliveries.
//!
//! Retry `n` (1-based) waits a draw uniform between the schedule's entry `n - 1` and entry
//! `n` (full jitter inside the step, so a retry never comes earlier than its step); past the
//! table's end the last entry repeats, and the last step's band reaches 1.5 × the entry. A
//! `Retry-After` from the upstream is a floor. A retry past `max_retries`, or one that would
//! fall after `max_age` since acceptance, is not scheduled: the message is dead at once.
//! Pure functions of the attempt count, the message's age and a random source.

use std::time::Duration;

use rand::Rng;

use crate::backoff::uniform;

/// Default schedule: 0 s, 1 s, 5 s, 30 s, 2 min, 15 min, 1 h, 4 h.
pub const DEFAULT_SCHEDULE: [Duration; 8] = [
    Duration::from_secs(0),
    Duration::from_secs(1),
    Duration::from_secs(5),
    Duration::from_secs(30),
    Duration::from_secs(120),
    Duration::from_secs(900),
    Duration::from_secs(3600),
    Duration::from_secs(4 * 3600),
];

/// Default retries after the first delivery attempt.
pub const DEFAULT_MAX_RETRIES: u32 = 5;

/// Allowed `max_retries`.
pub const MAX_RETRIES_RANGE: std::ops::RangeInclusive<u32> = 3..=8;

/// The longest a message may stay undelivered (and the default `max_age`).
pub const MAX_AGE_CAP: Duration = Duration::from_secs(24 * 3600);

/// A schedule the checks refused; [`ScheduleError::field`] names the setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScheduleError {
    /// `max_retries` outside [`MAX_RETRIES_RANGE`].
    #[error("= {0}: allowed 3..=8")]
    MaxRetries(u32),
    /// An empty schedule.
    #[error("is empty: give at least one duration")]
    Empty,
    /// Entry `index` is shorter than the one before it.
    #[error("[{index}] is shorter than the entry before it: the schedule must not decrease")]
    Decreasing {
        /// Position of the offending entry.
        index: usize,
    },
    /// `max_age` zero or over [`MAX_AGE_CAP`].
    #[error("must be more than 0s and at most 24h")]
    MaxAge,
}

impl ScheduleError {
    /// The setting at fault: `max_retries`, `schedule` or `max_age`.
    pub fn field(&self) -> &'static str {
        match self {
            Self::MaxRetries(_) => "max_retries",
            Self::Empty | Self::Decreasing { .. } => "schedule",
            Self::MaxAge => "max_age",
        }
    }
}

/// Why a message is not tried again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadReason {
    /// `max_retries` retries were made.
    RetriesExhausted,
    /// The next retry would fall after `max_age` since acceptance.
    MaxAge,
    /// The upstream's `Retry-After` asks for a wait past `max_age`.
    RetryAfterBeyondMaxAge,
}

impl DeadReason {
    /// A short label for logs, metrics and the dead-letter record.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RetriesExhausted => "retries_exhausted",
            Self::MaxAge => "max_age",
            Self::RetryAfterBeyondMaxAge => "retry_after_beyond_max_age",
        }
    }
}

/// What follows a failed, retryable attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextDelivery {
    /// Try again after this wait.
    After(Duration),
    /// Dead-letter the message now.
    Dead(DeadReason),
}

/// A validated delivery schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliverySchedule {
    steps: Vec<Duration>,
    max_retries: u32,
    max_age: Duration,
}

impl Default for DeliverySchedule {
    fn default() -> Self {
        Self {
            steps: DEFAULT_SCHEDULE.to_vec(),
            max_retries: DEFAULT_MAX_RETRIES,
            max_age: MAX_AGE_CAP,
        }
    }
}

impl DeliverySchedule {
    /// Checks and builds a schedule; every problem found is returned.
    pub fn new(
        steps: Vec<Duration>,
        max_retries: u32,
        max_age: Duration,
    ) -> Result<Self, Vec<ScheduleError>> {
        let mut errors = Vec::new();
        if !MAX_RETRIES_RANGE.contains(&max_retries) {
            errors.push(ScheduleError::MaxRetries(max_retries));
        }
        if steps.is_empty() {
            errors.push(ScheduleError::Empty);
        }
        if let Some(index) = (1..steps.len()).find(|&i| steps[i] < steps[i - 1]) {
            errors.push(ScheduleError::Decreasing { index });
        }
        if max_age.is_zero() || max_age > MAX_AGE_CAP {
            errors.push(ScheduleError::MaxAge);
        }
        if errors.is_empty() {
            Ok(Self {
                steps,
                max_retries,
                max_age,
            })
        } else {
            Err(errors)
        }
    }

    /// Attempts in all: the first delivery and `max_retries` retries.
    pub fn max_attempts(&self) -> u32 {
        self.max_retries.saturating_add(1)
    }

    /// Retries after the first attempt.
    pub fn max_retries(&self) -> u32 {
        self.max_retries
    }

    /// The longest a message may stay undelivered.
    pub fn max_age(&self) -> Duration {
        self.max_age
    }

    /// The band of retry `n` (1-based): from entry `n - 1` to entry `n` (the last repeating,
    /// its own band reaching 1.5 × it).
    pub fn band(&self, n: u32) -> (Duration, Duration) {
        let last = self.steps.len().saturating_sub(1);
        let at = |i: usize| self.steps.get(i.min(last)).copied().unwrap_or_default();
        let i = usize::try_from(n.saturating_sub(1)).unwrap_or(usize::MAX);
        let lo = at(i);
        let hi = if i < last {
            at(i + 1)
        } else {
            lo.saturating_add(lo / 2)
        };
        (lo, hi)
    }

    /// What follows a retryable failure of attempt `attempts` (1-based: the count of
    /// attempts made, the failed one included) of a message accepted `age` ago; the
    /// upstream's `retry_after`, if any, is a floor on the wait.
    pub fn after_failure<R: Rng + ?Sized>(
        &self,
        rng: &mut R,
        attempts: u32,
        age: Duration,
        retry_after: Option<Duration>,
    ) -> NextDelivery {
        if attempts > self.max_retries {
            return NextDelivery::Dead(DeadReason::RetriesExhausted);
        }
        let (lo, hi) = self.band(attempts);
        let drawn = uniform(rng, lo, hi);
        let wait = retry_after.map_or(drawn, |floor| drawn.max(floor));
        if age.saturating_add(wait) > self.max_age {
            return NextDelivery::Dead(if retry_after.is_some_and(|floor| floor >= drawn) {
                DeadReason::RetryAfterBeyondMaxAge
            } else {
                DeadReason::MaxAge
            });
        }
        NextDelivery::After(wait)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::StdRng, SeedableRng};

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn defaults_are_the_policy_table() {
        let s = DeliverySchedule::default();
        assert_eq!(s.max_attempts(), 6);
        assert_eq!(s.max_age(), MAX_AGE_CAP);
        assert_eq!(s.band(1), (Duration::ZERO, Duration::from_secs(1)));
        assert_eq!(
            s.band(5),
            (Duration::from_secs(120), Duration::from_secs(900))
        );
        assert_eq!(
            s.band(8),
            (Duration::from_secs(4 * 3600), Duration::from_secs(6 * 3600))
        );
        assert_eq!(s.band(9), s.band(8), "the last entry repeats");
    }

    #[test]
    fn refusals_name_their_field() {
        let errors = DeliverySchedule::new(vec![ms(5), ms(1)], 9, Duration::from_secs(25 * 3600))
            .unwrap_err();
        let fields: Vec<_> = errors.iter().map(ScheduleError::field).collect();
        assert_eq!(fields, ["max_retries", "schedule", "max_age"]);
        assert_eq!(
            DeliverySchedule::new(vec![], 3, ms(1)).unwrap_err(),
            [ScheduleError::Empty]
        );
        assert!(DeliverySchedule::new(vec![ms(50)], 2, ms(1)).is_err());
        assert!(DeliverySchedule::new(vec![ms(50), ms(50)], 3, ms(1)).is_ok());
    }

    #[test]
    fn waits_stay_inside_each_step() {
        let s = DeliverySchedule::default();
        let mut rng = StdRng::seed_from_u64(7);
        for n in 1..=5 {
            let (lo, hi) = s.band(n);
            let mut seen = std::collections::HashSet::new();
            for _ in 0..200 {
                match s.after_failure(&mut rng, n, Duration::ZERO, None) {
                    NextDelivery::After(wait) => {
                        assert!(wait >= lo && wait <= hi, "retry {n}: {wait:?}");
                        seen.insert(wait);
                    }
                    other => panic!("retry {n}: {other:?}"),
                }
            }
            assert!(seen.len() > 100, "retry {n} not jittered");
        }
    }

    #[test]
    fn past_max_retries_is_dead() {
        let s = DeliverySchedule::default();
        let mut rng = StdRng::seed_from_u64(1);
        assert_eq!(
            s.after_failure(&mut rng, 6, Duration::ZERO, None),
            NextDelivery::Dead(DeadReason::RetriesExhausted)
        );
    }

    #[test]
    fn retry_after_is_a_floor_and_past_max_age_is_dead_at_once() {
        let s = DeliverySchedule::default();
        let mut rng = StdRng::seed_from_u64(3);
        let floor = Duration::from_secs(600);
        assert_eq!(
            s.after_failure(&mut rng, 1, Duration::ZERO, Some(floor)),
            NextDelivery::After(floor)
        );
        // A Retry-After beyond what is left of the 24 h.
        assert_eq!(
            s.after_failure(
                &mut rng,
                1,
                Duration::from_secs(3600),
                Some(Duration::from_secs(24 * 3600))
            ),
            NextDelivery::Dead(DeadReason::RetryAfterBeyondMaxAge)
        );
        // The schedule's own step past max_age.
        let short = DeliverySchedule::new(vec![ms(100), ms(100)], 3, ms(250)).unwrap();
        assert_eq!(
            short.after_failure(&mut rng, 2, ms(200), None),
            NextDelivery::Dead(DeadReason::MaxAge)
        );
    }

    /// A message failing every attempt, on paused time: the retries come at least a step
    /// apart, and the message is dead after `max_retries` retries, well inside `max_age`.
    #[tokio::test(start_paused = true)]
    async fn a_failing_message_walks_the_schedule_then_dies() {
        let s = DeliverySchedule::new(vec![ms(50), ms(100), ms(200)], 4, Duration::from_secs(60))
            .unwrap();
        let mut rng = StdRng::seed_from_u64(11);
        let accepted = tokio::time::Instant::now();
        let mut attempts = 0;
        let mut last = accepted;
        loop {
            attempts += 1;
            let now = tokio::time::Instant::now();
            if attempts > 1 {
                let (lo, _) = s.band(attempts - 1);
                assert!(now - last >= lo, "attempt {attempts} early");
            }
            last = now;
            match s.after_failure(&mut rng, attempts, now - accepted, None) {
                NextDelivery::After(wait) => tokio::time::sleep(wait).await,
                NextDelivery::Dead(reason) => {
                    assert_eq!(reason, DeadReason::RetriesExhausted);
                    break;
                }
            }
            assert!(attempts < 10, "never died");
        }
        assert_eq!(attempts, s.max_attempts());
    }
}
