use std::time::Duration;

use proptest::prelude::*;

use super::*;

const NS: Duration = Duration::from_nanos(1);

/// A bucket as the backends build it: `rate` per `per` ticks, interval rounded up.
fn bucket(rate: u64, per: u64, burst: u64) -> Gcra {
    Gcra::new(per.div_ceil(rate), burst)
}

#[test]
fn full_bucket_admits_exactly_burst() {
    let g = bucket(10, 1_000, 5); // one token per 100 ticks
    let mut tat = None;
    for i in 0..5 {
        let e = g.evaluate(tat, 0, 1);
        assert!(e.allowed, "request {i}");
        assert_eq!(e.decision(true, false, NS).remaining, 4 - i);
        tat = Some(e.new_tat);
    }
    let e = g.evaluate(tat, 0, 1);
    assert!(!e.allowed);
    let d = e.decision(false, false, NS);
    assert_eq!(d.remaining, 0);
    assert_eq!(d.retry_after, Duration::from_nanos(100));
    assert_eq!(d.reset_after, Duration::from_nanos(500));
    assert!(g.evaluate(tat, 100, 1).allowed);
}

#[test]
fn cost_above_burst_never_fits() {
    let g = bucket(1, 10, 3);
    let e = g.evaluate(None, 0, 4);
    assert!(!e.allowed);
    assert!(e.decision(false, false, NS).retry_after > Duration::ZERO);
    assert!(!g.evaluate(None, 1_000_000, 4).allowed);
}

#[test]
fn micro_ticks_scale_durations() {
    let g = bucket(10, 1_000_000, 1); // 10/s in µs
    let e = g.evaluate(None, 5, 1);
    let d = e.decision(true, false, Duration::from_micros(1));
    assert_eq!(d.reset_after, Duration::from_millis(100));
}

fn policy() -> impl Strategy<Value = (u64, u64, u64)> {
    // rate 1..1000 per 1..10^10 ticks, burst 1..50
    (1u64..1_000, 1u64..10_000_000_000, 1u64..50)
}

fn arrivals() -> impl Strategy<Value = Vec<(u64, u64)>> {
    // (gap in ticks, cost)
    prop::collection::vec((0u64..50_000_000, 1u64..5), 1..120)
}

proptest! {
    #[test]
    fn remaining_never_exceeds_burst((rate, per, burst) in policy(), arr in arrivals()) {
        let g = bucket(rate, per, burst);
        let (mut now, mut tat) = (0u64, None);
        for (gap, cost) in arr {
            now += gap;
            let e = g.evaluate(tat, now, cost);
            for committed in [false, e.allowed] {
                let d = e.decision(committed, false, NS);
                prop_assert!(d.remaining <= burst);
                prop_assert_eq!(d.limit, burst);
            }
            if e.allowed { tat = Some(e.new_tat); }
        }
    }

    #[test]
    fn a_wait_is_never_reported_as_zero((rate, per, burst) in policy(), arr in arrivals()) {
        let g = bucket(rate, per, burst);
        let (mut now, mut tat) = (0u64, None);
        for (gap, cost) in arr {
            now += gap;
            let e = g.evaluate(tat, now, cost);
            let d = e.decision(false, false, NS);
            if e.allowed {
                prop_assert_eq!(d.retry_after, Duration::ZERO);
                tat = Some(e.new_tat);
            } else {
                prop_assert!(d.retry_after > Duration::ZERO);
                prop_assert!(d.retry_after_secs() >= 1);
            }
        }
    }

    #[test]
    fn retry_after_is_exact((rate, per, burst) in policy(), arr in arrivals()) {
        let g = bucket(rate, per, burst);
        let (mut now, mut tat) = (0u64, None);
        for (gap, cost) in arr {
            now += gap;
            let cost = cost.min(burst);
            let e = g.evaluate(tat, now, cost);
            if e.allowed {
                tat = Some(e.new_tat);
                continue;
            }
            let wait = u64::try_from(e.decision(false, false, NS).retry_after.as_nanos()).unwrap();
            prop_assert!(g.evaluate(tat, now + wait, cost).allowed);
            prop_assert!(!g.evaluate(tat, now + wait - 1, cost).allowed);
        }
    }

    #[test]
    fn allowed_iff_cost_fits_in_remaining((rate, per, burst) in policy(), arr in arrivals()) {
        let g = bucket(rate, per, burst);
        let (mut now, mut tat) = (0u64, None);
        for (gap, cost) in arr {
            now += gap;
            let e = g.evaluate(tat, now, cost);
            prop_assert_eq!(e.allowed, cost <= e.decision(false, false, NS).remaining);
            if e.allowed { tat = Some(e.new_tat); }
        }
    }

    /// Over any window [t_i, t_j] the admitted cost is ≤ burst + rate × (t_j − t_i) / per,
    /// checked in exact integers: admitted × per ≤ burst × per + rate × (t_j − t_i).
    #[test]
    fn admitted_never_exceeds_burst_plus_rate((rate, per, burst) in policy(), arr in arrivals()) {
        let g = bucket(rate, per, burst);
        let (mut now, mut tat) = (0u64, None);
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        for (gap, cost) in arr {
            now += gap / 16; // dense arrivals, so buckets actually empty
            let e = g.evaluate(tat, now, cost);
            if e.allowed {
                tat = Some(e.new_tat);
                admitted.push((now, cost));
            }
        }
        for i in 0..admitted.len() {
            let mut sum: u128 = 0;
            for j in i..admitted.len() {
                sum += u128::from(admitted[j].1);
                let span = u128::from(admitted[j].0 - admitted[i].0);
                let bound = u128::from(burst) * u128::from(per) + u128::from(rate) * span;
                prop_assert!(sum * u128::from(per) <= bound,
                    "window {i}..={j}: {sum} admitted, bound {bound}/{per}");
            }
        }
    }
}
