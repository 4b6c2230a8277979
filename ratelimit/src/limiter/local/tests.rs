use super::*;
use crate::clock::ManualClock;
use crate::key::Principal;
use crate::policy::Policy;

fn limiter(max_keys: usize, clock: Arc<ManualClock>) -> LocalLimiter {
    let config = LocalLimiterConfig {
        max_keys,
        shards: 4,
        share: 1,
    };
    LocalLimiter::with_config(config, clock)
}

fn check(key: &str, policy: &Arc<Policy>) -> [Check; 1] {
    [Check {
        key: LimitKey::custom("t", key),
        policy: policy.clone(),
        cost: 1,
    }]
}

#[test]
fn hard_cap_bounds_keys() {
    let clock = Arc::new(ManualClock::default());
    let l = limiter(100, clock);
    let p = Arc::new(Policy::try_new("t", 1, Duration::from_secs(60), 5).unwrap());
    for i in 0..10_000 {
        assert!(l.decide(&check(&i.to_string(), &p), true).is_allowed());
    }
    assert!(l.len() <= 100, "{} keys", l.len());
}

#[test]
fn full_buckets_are_swept() {
    let clock = Arc::new(ManualClock::default());
    let l = limiter(1_000_000, clock.clone());
    let p = Arc::new(Policy::try_new("t", 10, Duration::from_secs(1), 5).unwrap());
    for i in 0..1000 {
        l.decide(&check(&i.to_string(), &p), true);
    }
    assert_eq!(l.len(), 1000);
    clock.advance(Duration::from_millis(100));
    l.sweep();
    assert_eq!(l.len(), 0);
}

#[test]
fn share_divides_rate_and_burst() {
    let clock = Arc::new(ManualClock::default());
    let config = LocalLimiterConfig {
        share: 3,
        ..LocalLimiterConfig::default()
    };
    let l = LocalLimiter::with_config(config, clock.clone());
    let p = Arc::new(Policy::try_new("t", 30, Duration::from_secs(1), 9).unwrap());
    let admitted = (0..20)
        .filter(|_| l.decide(&check("k", &p), true).is_allowed())
        .count();
    assert_eq!(admitted, 3);
    clock.advance(Duration::from_millis(100)); // 30/3 = 10/s: one token per 100 ms
    assert!(l.decide(&check("k", &p), true).is_allowed());
    assert!(!l.decide(&check("k", &p), true).is_allowed());
}

#[test]
fn hard_cap_bounds_quota_counters() {
    let clock = Arc::new(ManualClock::default());
    let l = limiter(100, clock);
    let daily = Arc::new(Policy::calendar("daily_quota", 5, crate::Period::Day).unwrap());
    for i in 0..10_000 {
        let key = LimitKey::period(Principal::Tenant(&i.to_string()), crate::Period::Day);
        let c = [Check {
            key,
            policy: daily.clone(),
            cost: 1,
        }];
        assert!(l.decide(&c, true).is_allowed());
    }
    assert!(l.len() <= 100, "{} counters", l.len());
}

#[test]
fn counters_live_until_their_window_ends() {
    // 2026-11-21T23:59:00Z: the day ends in 60 s.
    let clock = Arc::new(ManualClock::new(Duration::from_secs(1_795_305_540)));
    let l = limiter(1_000_000, clock.clone());
    let daily = Arc::new(Policy::calendar("daily_quota", 5, crate::Period::Day).unwrap());
    for i in 0..1000 {
        let key = LimitKey::period(Principal::Tenant(&i.to_string()), crate::Period::Day);
        let c = [Check {
            key,
            policy: daily.clone(),
            cost: 1,
        }];
        l.decide(&c, true);
        if i == 500 {
            clock.advance(Duration::from_secs(30));
        }
    }
    // 1000 counters over 4 shards: each shard ran amortized sweeps while inserting (at 64,
    // 128 entries), some 30 s in; then an explicit one 1 s before midnight. Nothing may go.
    clock.advance(Duration::from_secs(29));
    l.sweep();
    assert_eq!(l.len(), 1000);
    clock.advance(Duration::from_secs(1));
    l.sweep();
    assert_eq!(l.len(), 0);
}
