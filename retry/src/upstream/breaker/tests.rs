//! State-machine tests of the circuit breaker on paused time.

use super::config::MAX_MIN_CALLERS;
use super::*;
use crate::policy::InvalidRetryConfig;
use BreakerOutcome::{Failure, Neutral, Success};

/// 50 % of ≥ 20 requests over 30 s, open 10 s, `probes` probes, `min_callers` callers.
fn breaker_with(probes: u32, min_callers: u32) -> CircuitBreaker {
    let cfg = BreakerConfig::try_new(
        0.5,
        20,
        Duration::from_secs(30),
        Duration::from_secs(10),
        probes,
        min_callers,
    )
    .expect("valid");
    CircuitBreaker::new(Arc::from("orders"), cfg)
}

/// Attribution off: the classic unattributed rule.
fn breaker(probes: u32) -> CircuitBreaker {
    breaker_with(probes, 1)
}

fn record_as(b: &CircuitBreaker, caller: u64, outcome: BreakerOutcome, now: Instant) {
    b.try_acquire_at(caller, now)
        .expect("admitted")
        .record(outcome, now);
}

fn record(b: &CircuitBreaker, outcome: BreakerOutcome, now: Instant) {
    record_as(b, 1, outcome, now);
}

#[test]
fn config_validation_names_the_field() {
    let s = Duration::from_secs(1);
    let field = |r: Result<BreakerConfig, InvalidRetryConfig>| r.expect_err("invalid").field;
    assert_eq!(
        field(BreakerConfig::try_new(0.0, 20, s, s, 3, 3)),
        "failure_rate"
    );
    assert_eq!(
        field(BreakerConfig::try_new(1.5, 20, s, s, 3, 3)),
        "failure_rate"
    );
    assert_eq!(
        field(BreakerConfig::try_new(f64::NAN, 20, s, s, 3, 3)),
        "failure_rate"
    );
    assert_eq!(
        field(BreakerConfig::try_new(0.5, 0, s, s, 3, 3)),
        "min_requests"
    );
    assert_eq!(
        field(BreakerConfig::try_new(0.5, 20, Duration::ZERO, s, 3, 3)),
        "window"
    );
    assert_eq!(
        field(BreakerConfig::try_new(0.5, 20, s, Duration::ZERO, 3, 3)),
        "open_for"
    );
    assert_eq!(
        field(BreakerConfig::try_new(0.5, 20, s, s, 0, 3)),
        "half_open_probes"
    );
    assert_eq!(
        field(BreakerConfig::try_new(0.5, 20, s, s, 3, 0)),
        "min_callers"
    );
    assert_eq!(
        field(BreakerConfig::try_new(
            0.5,
            20,
            s,
            s,
            3,
            MAX_MIN_CALLERS + 1
        )),
        "min_callers"
    );
    assert!(BreakerConfig::try_new(1.0, 1, s, s, 1, 1).is_ok());
    assert!(BreakerConfig::try_new(1.0, 1, s, s, 1, MAX_MIN_CALLERS).is_ok());
    let d = BreakerConfig::default();
    assert_eq!((d.failure_rate(), d.min_requests()), (0.5, 20));
    assert_eq!(
        (d.open_for(), d.half_open_probes(), d.min_callers()),
        (Duration::from_secs(10), 3, DEFAULT_MIN_CALLERS)
    );
}

#[tokio::test(start_paused = true)]
async fn stays_closed_below_min_requests_or_rate() {
    let b = breaker(1);
    let now = Instant::now();
    for _ in 0..19 {
        record(&b, Failure, now);
    }
    assert_eq!(b.state(), BreakerState::Closed, "19 < min_requests");
    let b = breaker(1);
    for i in 0..100 {
        record(&b, if i % 3 == 0 { Failure } else { Success }, now);
    }
    assert_eq!(b.state(), BreakerState::Closed, "33 % < 50 %");
    for _ in 0..50 {
        record(&b, Neutral, now);
    }
    assert_eq!(
        b.state(),
        BreakerState::Closed,
        "neutral outcomes do not count"
    );
}

#[tokio::test(start_paused = true)]
async fn opens_fails_fast_then_probes_and_closes() {
    let b = breaker(2);
    let t0 = Instant::now();
    for _ in 0..10 {
        record(&b, Success, t0);
    }
    for _ in 0..10 {
        record(&b, Failure, t0);
    }
    assert_eq!(b.state(), BreakerState::Open);
    let wait = b
        .try_acquire_at(1, t0 + Duration::from_secs(4))
        .expect_err("open");
    assert_eq!(wait, Duration::from_secs(6), "time until the next probe");

    let t1 = t0 + Duration::from_secs(10);
    let p1 = b.try_acquire_at(1, t1).expect("probe 1");
    assert!(p1.is_probe());
    assert_eq!(b.state(), BreakerState::HalfOpen);
    let p2 = b.try_acquire_at(1, t1).expect("probe 2");
    assert_eq!(
        b.try_acquire_at(1, t1).expect_err("slots full"),
        PROBES_BUSY_RETRY_AFTER
    );
    p1.record(Success, t1);
    assert_eq!(b.state(), BreakerState::HalfOpen, "one success of two");
    p2.record(Success, t1);
    assert_eq!(b.state(), BreakerState::Closed);
    // The window starts empty after closing.
    for _ in 0..19 {
        record(&b, Failure, t1);
    }
    assert_eq!(b.state(), BreakerState::Closed);
}

#[tokio::test(start_paused = true)]
async fn failed_probe_reopens() {
    let b = breaker(1);
    let t0 = Instant::now();
    for _ in 0..20 {
        record(&b, Failure, t0);
    }
    let t1 = t0 + Duration::from_secs(10);
    b.try_acquire_at(1, t1).expect("probe").record(Failure, t1);
    assert_eq!(b.state(), BreakerState::Open);
    let wait = b
        .try_acquire_at(1, t1 + Duration::from_secs(1))
        .expect_err("open");
    assert_eq!(wait, Duration::from_secs(9));
}

#[tokio::test(start_paused = true)]
async fn dropped_probe_frees_its_slot_and_stale_permits_are_ignored() {
    let b = breaker(1);
    let t0 = Instant::now();
    let stale = b.try_acquire_at(1, t0).expect("closed permit");
    assert!(stale.is_current());
    for _ in 0..20 {
        record(&b, Failure, t0);
    }
    assert!(!stale.is_current(), "the breaker opened since");
    let t1 = t0 + Duration::from_secs(10);
    let probe = b.try_acquire_at(1, t1).expect("probe");
    assert!(b.try_acquire_at(1, t1).is_err());
    drop(probe);
    // An outcome from before the breaker opened changes nothing now.
    stale.record(Failure, t1);
    assert_eq!(b.state(), BreakerState::HalfOpen);
    b.try_acquire_at(1, t1)
        .expect("slot freed")
        .record(Success, t1);
    assert_eq!(b.state(), BreakerState::Closed);
}

#[tokio::test(start_paused = true)]
async fn old_failures_leave_the_window() {
    let b = breaker(1);
    let t0 = Instant::now();
    for _ in 0..15 {
        record(&b, Failure, t0);
    }
    let t1 = t0 + Duration::from_secs(31);
    for _ in 0..10 {
        record(&b, Failure, t1);
    }
    assert_eq!(
        b.state(),
        BreakerState::Closed,
        "only 10 requests in the window"
    );
}

// --- attribution to callers ---

#[tokio::test(start_paused = true)]
async fn one_callers_failures_never_open_it() {
    let b = breaker_with(3, 3);
    let mut now = Instant::now();
    // Caller 7 fails 10 000 times over 100 s while nobody else sends anything…
    for _ in 0..10_000 {
        record_as(&b, 7, Failure, now);
        now += Duration::from_millis(10);
    }
    assert_eq!(b.state(), BreakerState::Closed);
    // …and while 50 other callers succeed.
    for i in 0..1_000 {
        record_as(&b, 7, Failure, now);
        record_as(&b, 100 + i % 50, Success, now);
    }
    assert_eq!(b.state(), BreakerState::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_flooding_caller_does_not_tip_background_failures_over() {
    let b = breaker_with(3, 3);
    let now = Instant::now();
    // A healthy upstream: 1 000 requests from 100 callers, 2 % sporadic failures from 20
    // distinct callers (more than min_callers of them).
    for i in 0..1_000u64 {
        let outcome = if i % 50 == 0 { Failure } else { Success };
        record_as(&b, 1_000 + i % 100, outcome, now);
    }
    // One caller floods a failing path: without attribution 1 500 / 2 500 = 60 % ≥ 50 %.
    for _ in 0..1_500 {
        record_as(&b, 7, Failure, now);
    }
    assert_eq!(b.state(), BreakerState::Closed);
    // Even two flooding callers cannot, with min_callers = 3.
    for _ in 0..1_500 {
        record_as(&b, 8, Failure, now);
    }
    assert_eq!(b.state(), BreakerState::Closed);
}

#[tokio::test(start_paused = true)]
async fn many_callers_failures_open_it_within_the_window() {
    let b = breaker_with(3, 3);
    let t0 = Instant::now();
    // Three callers failing in turn, one request a second: it opens at the 20th request,
    // 19 s into the 30 s window, not before.
    for n in 0..20u64 {
        assert_eq!(b.state(), BreakerState::Closed, "after {n}");
        record_as(&b, n % 3, Failure, t0 + Duration::from_secs(n));
    }
    assert_eq!(b.state(), BreakerState::Open, "20 requests from 3 callers");

    // An outage seen by many callers opens it even after a burst of successes of one
    // caller: each failing caller counts once.
    let b = breaker_with(3, 3);
    for _ in 0..10 {
        record_as(&b, 500, Success, t0);
    }
    for i in 0..10u64 {
        record_as(&b, i, Failure, t0);
    }
    assert_eq!(
        b.state(),
        BreakerState::Closed,
        "20 requests, 10 of 18 left failing"
    );
    record_as(&b, 10, Failure, t0);
    record_as(&b, 11, Failure, t0);
    assert_eq!(b.state(), BreakerState::Open, "10 of 20 left failing");
}

#[tokio::test(start_paused = true)]
async fn two_callers_are_not_enough_with_min_callers_3() {
    let b = breaker_with(3, 3);
    let now = Instant::now();
    for _ in 0..50 {
        record_as(&b, 1, Failure, now);
        record_as(&b, 2, Failure, now);
    }
    assert_eq!(b.state(), BreakerState::Closed);
    record_as(&b, 3, Failure, now);
    assert_eq!(b.state(), BreakerState::Open, "a third caller sees it too");
}

#[tokio::test(start_paused = true)]
async fn half_open_needs_min_callers_failed_probes_and_one_slot_per_caller() {
    let b = breaker_with(2, 3);
    let t0 = Instant::now();
    for i in 0..20u64 {
        record_as(&b, i, Failure, t0);
    }
    assert_eq!(b.state(), BreakerState::Open);
    let t1 = t0 + Duration::from_secs(10);
    // One caller holds at most one probe slot.
    let p7 = b.try_acquire_at(7, t1).expect("probe of caller 7");
    assert_eq!(
        b.try_acquire_at(7, t1).expect_err("caller 7 holds a slot"),
        PROBES_BUSY_RETRY_AFTER
    );
    // Its probe fails (its failing path), repeatedly: that alone does not reopen.
    p7.record(Failure, t1);
    for _ in 0..5 {
        b.try_acquire_at(7, t1)
            .expect("slot freed")
            .record(Failure, t1);
    }
    assert_eq!(b.state(), BreakerState::HalfOpen);
    // Other callers' probes succeed: the breaker closes.
    b.try_acquire_at(1, t1).expect("probe").record(Success, t1);
    b.try_acquire_at(2, t1).expect("probe").record(Success, t1);
    assert_eq!(b.state(), BreakerState::Closed);

    // Still down: probes of three distinct callers fail, and it reopens.
    for i in 0..20u64 {
        record_as(&b, i, Failure, t1);
    }
    assert_eq!(b.state(), BreakerState::Open);
    let t2 = t1 + Duration::from_secs(10);
    for caller in [1, 2] {
        b.try_acquire_at(caller, t2)
            .expect("probe")
            .record(Failure, t2);
        assert_eq!(b.state(), BreakerState::HalfOpen);
    }
    b.try_acquire_at(3, t2).expect("probe").record(Failure, t2);
    assert_eq!(b.state(), BreakerState::Open);
}

#[test]
fn opening_rule_arithmetic() {
    let cfg = BreakerConfig::default(); // 50 %, 20 requests
    assert!(!opens(&cfg, 19, 19, 0), "min_requests");
    assert!(opens(&cfg, 20, 10, 0));
    assert!(!opens(&cfg, 20, 9, 0));
    // 30 failures of 40; the top callers had 20: 10 of 20 left, still 50 %.
    assert!(opens(&cfg, 40, 30, 20));
    assert!(!opens(&cfg, 40, 30, 21));
    assert!(!opens(&cfg, 40, 30, 30), "nothing left once set aside");
    assert!(
        !opens(&cfg, 40, 30, 99),
        "set-aside is capped, no underflow"
    );
}

proptest::proptest! {
    /// Whatever the interleaving, failures from fewer than `min_callers` callers never
    /// open the breaker, however many other callers succeed.
    #[test]
    fn fewer_than_min_callers_never_open(
        events in proptest::collection::vec((0u64..2, proptest::bool::ANY, 0u64..40), 0..600),
        min_callers in 3u32..=MAX_MIN_CALLERS,
    ) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("runtime");
        rt.block_on(async {
            let b = breaker_with(3, min_callers);
            let now = Instant::now();
            for (attacker, fails, other) in events {
                if fails {
                    record_as(&b, attacker, Failure, now);
                } else {
                    record_as(&b, 100 + other, Success, now);
                }
            }
            proptest::prop_assert_eq!(b.state(), BreakerState::Closed);
            Ok(())
        })?;
    }
}
