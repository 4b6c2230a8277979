//! State-machine tests of the circuit breaker on paused time.

use super::super::policy::InvalidRetryConfig;
use super::*;
use BreakerOutcome::{Failure, Neutral, Success};

fn breaker(probes: u32) -> CircuitBreaker {
    let cfg = BreakerConfig::try_new(
        0.5,
        20,
        Duration::from_secs(30),
        Duration::from_secs(10),
        probes,
    )
    .expect("valid");
    CircuitBreaker::new(Arc::from("orders"), cfg)
}

fn record(b: &CircuitBreaker, outcome: BreakerOutcome, now: Instant) {
    b.try_acquire_at(now)
        .expect("admitted")
        .record_at(outcome, now);
}

#[test]
fn config_validation_names_the_field() {
    let s = Duration::from_secs(1);
    let field = |r: Result<BreakerConfig, InvalidRetryConfig>| r.expect_err("invalid").field;
    assert_eq!(
        field(BreakerConfig::try_new(0.0, 20, s, s, 3)),
        "failure_rate"
    );
    assert_eq!(
        field(BreakerConfig::try_new(1.5, 20, s, s, 3)),
        "failure_rate"
    );
    assert_eq!(
        field(BreakerConfig::try_new(f64::NAN, 20, s, s, 3)),
        "failure_rate"
    );
    assert_eq!(
        field(BreakerConfig::try_new(0.5, 0, s, s, 3)),
        "min_requests"
    );
    assert_eq!(
        field(BreakerConfig::try_new(0.5, 20, Duration::ZERO, s, 3)),
        "window"
    );
    assert_eq!(
        field(BreakerConfig::try_new(0.5, 20, s, Duration::ZERO, 3)),
        "open_for"
    );
    assert_eq!(
        field(BreakerConfig::try_new(0.5, 20, s, s, 0)),
        "half_open_probes"
    );
    assert!(BreakerConfig::try_new(1.0, 1, s, s, 1).is_ok());
    let d = BreakerConfig::default();
    assert_eq!((d.failure_rate(), d.min_requests()), (0.5, 20));
    assert_eq!(
        (d.open_for(), d.half_open_probes()),
        (Duration::from_secs(10), 3)
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
    assert_eq!(b.state(), BreakerState::Closed, "429s are neutral");
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
        .try_acquire_at(t0 + Duration::from_secs(4))
        .expect_err("open");
    assert_eq!(wait, Duration::from_secs(6), "time until the next probe");

    let t1 = t0 + Duration::from_secs(10);
    let p1 = b.try_acquire_at(t1).expect("probe 1");
    assert!(p1.is_probe());
    assert_eq!(b.state(), BreakerState::HalfOpen);
    let p2 = b.try_acquire_at(t1).expect("probe 2");
    assert_eq!(
        b.try_acquire_at(t1).expect_err("slots full"),
        PROBES_BUSY_RETRY_AFTER
    );
    p1.record_at(Success, t1);
    assert_eq!(b.state(), BreakerState::HalfOpen, "one success of two");
    p2.record_at(Success, t1);
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
    b.try_acquire_at(t1).expect("probe").record_at(Failure, t1);
    assert_eq!(b.state(), BreakerState::Open);
    let wait = b
        .try_acquire_at(t1 + Duration::from_secs(1))
        .expect_err("open");
    assert_eq!(wait, Duration::from_secs(9));
}

#[tokio::test(start_paused = true)]
async fn dropped_probe_frees_its_slot_and_stale_permits_are_ignored() {
    let b = breaker(1);
    let t0 = Instant::now();
    let stale = b.try_acquire_at(t0).expect("closed permit");
    for _ in 0..20 {
        record(&b, Failure, t0);
    }
    let t1 = t0 + Duration::from_secs(10);
    let probe = b.try_acquire_at(t1).expect("probe");
    assert!(b.try_acquire_at(t1).is_err());
    drop(probe);
    // An outcome from before the breaker opened changes nothing now.
    stale.record_at(Failure, t1);
    assert_eq!(b.state(), BreakerState::HalfOpen);
    b.try_acquire_at(t1)
        .expect("slot freed")
        .record_at(Success, t1);
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
        "only 10 attempts in the window"
    );
}
