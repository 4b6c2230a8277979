use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::*;
use crate::clock::ManualClock;
use crate::limiter::{LocalLimiter, LocalLimiterConfig};

fn policy(rate: u64, per: Duration, burst: u64) -> Arc<Policy> {
    Arc::new(Policy::try_new("global", rate, per, burst).unwrap())
}

fn check(key: &LimitKey, policy: &Arc<Policy>, cost: u32) -> Check {
    Check {
        key: key.clone(),
        policy: policy.clone(),
        cost,
    }
}

fn config(max_overshoot: f64, replicas: u32) -> BatchedConfig {
    BatchedConfig {
        max_overshoot,
        replicas,
        ..BatchedConfig::default()
    }
}

/// A store that can be made to fail, counting the calls that reached it.
#[derive(Debug)]
struct Store {
    local: LocalLimiter,
    failing: AtomicBool,
    calls: std::sync::atomic::AtomicU64,
}

#[async_trait]
impl Limiter for Store {
    async fn check(&self, checks: &[Check]) -> Result<Verdict, LimiterError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if self.failing.load(Ordering::Relaxed) {
            return Err(LimiterError::Protocol("down".into()));
        }
        self.local.check(checks).await
    }
    async fn peek(&self, checks: &[Check]) -> Result<Verdict, LimiterError> {
        self.local.peek(checks).await
    }
    async fn reset(&self, checks: &[Check]) -> Result<(), LimiterError> {
        self.local.reset(checks).await
    }
    async fn give_back(&self, check: &Check, amount: u64) -> Result<Decision, LimiterError> {
        self.local.give_back(check, amount).await
    }
}

struct Setup {
    clock: Arc<ManualClock>,
    store: Arc<Store>,
}

fn setup() -> Setup {
    let clock = Arc::new(ManualClock::default());
    let store = Arc::new(Store {
        local: LocalLimiter::with_config(LocalLimiterConfig::default(), clock.clone()),
        failing: AtomicBool::new(false),
        calls: Default::default(),
    });
    Setup { clock, store }
}

impl Setup {
    fn batched(&self, config: BatchedConfig) -> BatchedLimiter {
        BatchedLimiter::with_clock(self.store.clone(), config, self.clock.clone()).unwrap()
    }

    fn calls(&self) -> u64 {
        self.store.calls.load(Ordering::Relaxed)
    }

    /// Tokens left in the shared bucket.
    async fn shared(&self, c: &Check) -> u64 {
        let v = self.store.peek(std::slice::from_ref(c)).await.unwrap();
        v.decisions()[0].remaining
    }
}

#[test]
fn lease_size_follows_the_overshoot_budget() {
    let sec = Duration::from_secs(1);
    let c = config(0.05, 3);
    assert_eq!(
        c.lease_size(&policy(1_000_000, sec, 1_000_000)),
        Some(16_666)
    );
    // Below 2 tokens: exact.
    assert_eq!(c.lease_size(&policy(100, sec, 119)), None);
    assert_eq!(c.lease_size(&policy(100, sec, 120)), Some(2));
    let shadow = Policy::try_new("s", 1000, sec, 1000)
        .unwrap()
        .with_shadow(true);
    assert_eq!(config(1.0, 1).lease_size(&shadow), None);
    let quota = Policy::calendar("q", 1000, crate::Period::Day).unwrap();
    assert_eq!(config(1.0, 1).lease_size(&quota), None);
}

#[test]
fn overshoot_outside_its_range_is_refused() {
    let s = setup();
    for bad in [0.0, -0.1, 1.5, f64::NAN] {
        let r = BatchedLimiter::with_clock(s.store.clone(), config(bad, 1), s.clock.clone());
        assert!(matches!(r, Err(LimiterError::Config(_))), "{bad}");
    }
}

#[tokio::test]
async fn small_limits_stay_exact() {
    let s = setup();
    let b = s.batched(config(0.05, 3));
    let p = policy(10, Duration::from_secs(10), 10);
    let c = check(&LimitKey::global(), &p, 1);
    for i in 0..10 {
        assert!(b
            .check(std::slice::from_ref(&c))
            .await
            .unwrap()
            .is_allowed());
        assert_eq!(s.shared(&c).await, 9 - i);
    }
    assert!(!b
        .check(std::slice::from_ref(&c))
        .await
        .unwrap()
        .is_allowed());
    assert_eq!(s.calls(), 11);
    assert_eq!(b.leased_tokens(), 0);
}

#[tokio::test]
async fn decides_locally_from_a_lease_and_refills_it_ahead() {
    let s = setup();
    let b = s.batched(config(0.1, 1));
    let p = policy(1000, Duration::from_secs(1000), 1000); // no refill to speak of
    let c = check(&LimitKey::global(), &p, 1);
    let v = b.check(std::slice::from_ref(&c)).await.unwrap();
    assert!(v.is_allowed());
    // One call leased 100 tokens; this request spent one.
    assert_eq!(
        (s.calls(), s.shared(&c).await, b.leased_tokens()),
        (1, 900, 99)
    );
    // Reported as exact mode would: 999 left (900 shared + 99 leased).
    assert_eq!(v.decisions()[0].remaining, 999);
    for _ in 0..74 {
        assert!(b
            .check(std::slice::from_ref(&c))
            .await
            .unwrap()
            .is_allowed());
    }
    assert_eq!((s.calls(), b.leased_tokens()), (1, 25));
    // The next one leaves 24, under a quarter of the lease: a top-up of 76 starts in the
    // background while this request is admitted locally.
    assert!(b
        .check(std::slice::from_ref(&c))
        .await
        .unwrap()
        .is_allowed());
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        (s.calls(), s.shared(&c).await, b.leased_tokens()),
        (2, 824, 100)
    );
    let v = b.check(std::slice::from_ref(&c)).await.unwrap();
    assert_eq!(
        v.decisions()[0].remaining,
        1000 - 77,
        "as exact mode would report"
    );
    assert_eq!(s.calls(), 2);
}

#[tokio::test]
async fn a_rejected_request_consumes_nothing_from_the_lease() {
    let s = setup();
    let b = s.batched(config(0.1, 1));
    let global = policy(1000, Duration::from_secs(1000), 1000);
    let tenant = policy(1, Duration::from_secs(1000), 1); // exact
    let g = check(&LimitKey::global(), &global, 1);
    let t = check(&LimitKey::custom("t", "a"), &tenant, 1);
    assert!(b.check(&[t.clone(), g.clone()]).await.unwrap().is_allowed());
    assert_eq!(b.leased_tokens(), 99);
    let v = b.check(&[t.clone(), g.clone()]).await.unwrap();
    assert!(!v.is_allowed());
    assert!(v.decisions()[0].blocks());
    assert!(v.retry_after() > Duration::from_secs(900));
    assert_eq!(b.leased_tokens(), 99, "the reservation was put back");
    assert_eq!(s.shared(&g).await, 900);
}

#[tokio::test]
async fn a_top_up_that_does_not_fit_takes_what_is_left() {
    let s = setup();
    let b = s.batched(config(1.0, 1));
    let p = policy(10, Duration::from_secs(1000), 10);
    let c = check(&LimitKey::global(), &p, 1);
    // Another replica spent 5: a lease of 10 no longer fits; the 5 left are leased instead.
    let five = check(&LimitKey::global(), &p, 5);
    assert!(s.store.check(&[five]).await.unwrap().is_allowed());
    let v = b.check(std::slice::from_ref(&c)).await.unwrap();
    assert!(v.is_allowed());
    assert_eq!(v.decisions()[0].remaining, 4);
    assert_eq!(
        (s.calls(), s.shared(&c).await, b.leased_tokens()),
        (3, 0, 4)
    );
    for _ in 0..4 {
        assert!(b
            .check(std::slice::from_ref(&c))
            .await
            .unwrap()
            .is_allowed());
    }
    assert_eq!(s.calls(), 3);
    let v = b.check(std::slice::from_ref(&c)).await.unwrap();
    assert!(!v.is_allowed());
    // The refused top-up already told all: one call, and Retry-After for one token (one
    // emission interval), not for a lease of 10.
    assert_eq!(v.retry_after(), Duration::from_secs(100));
    assert_eq!(s.calls(), 4);
}

#[tokio::test]
async fn the_lease_makes_up_what_the_bucket_lacks() {
    let s = setup();
    let b = s.batched(config(0.5, 1)); // leases of 5
    let p = policy(10, Duration::from_secs(1000), 10);
    let heavy = check(&LimitKey::global(), &p, 3);
    // 5 leased, 3 spent (lease 2); 3 more leased, 3 spent (lease 2): 4 left in all.
    for expected in [7, 4] {
        let v = b.check(std::slice::from_ref(&heavy)).await.unwrap();
        assert_eq!(v.decisions()[0].remaining, expected);
    }
    assert_eq!((s.shared(&heavy).await, b.leased_tokens()), (2, 2));
    // 2 from the bucket + 2 from the lease serve a request of 3, as exact mode would.
    let v = b.check(std::slice::from_ref(&heavy)).await.unwrap();
    assert!(v.is_allowed());
    assert_eq!(v.decisions()[0].remaining, 1);
    let v = b.check(std::slice::from_ref(&heavy)).await.unwrap();
    assert!(!v.is_allowed());
    assert_eq!(v.decisions()[0].remaining, 1);
    assert_eq!((s.shared(&heavy).await, b.leased_tokens()), (1, 0));
}

#[tokio::test]
async fn a_failed_store_call_puts_reservations_back() {
    let s = setup();
    let b = s.batched(config(0.1, 1));
    let global = policy(1000, Duration::from_secs(1000), 1000);
    let tenant = policy(10, Duration::from_secs(1000), 10);
    let g = check(&LimitKey::global(), &global, 1);
    let t = check(&LimitKey::custom("t", "a"), &tenant, 1);
    assert!(b
        .check(std::slice::from_ref(&g))
        .await
        .unwrap()
        .is_allowed());
    s.store.failing.store(true, Ordering::Relaxed);
    assert!(b.check(&[t, g.clone()]).await.is_err());
    assert_eq!(b.leased_tokens(), 99);
    // The lease is not stuck "topping up": decisions from it go on.
    s.store.failing.store(false, Ordering::Relaxed);
    assert!(b
        .check(std::slice::from_ref(&g))
        .await
        .unwrap()
        .is_allowed());
    assert_eq!(b.leased_tokens(), 98);
}

#[tokio::test]
async fn idle_leases_are_returned_and_release_returns_all() {
    let s = setup();
    let b = s.batched(config(0.1, 1));
    let p = policy(1000, Duration::from_secs(1000), 1000);
    let c = check(&LimitKey::global(), &p, 1);
    let other = check(&LimitKey::custom("t", "b"), &p, 1);
    assert!(b
        .check(std::slice::from_ref(&c))
        .await
        .unwrap()
        .is_allowed());
    assert_eq!(s.shared(&c).await, 900);
    s.clock.advance(Duration::from_millis(1500));
    // Any later decision sweeps the expired lease and returns its 99 tokens.
    assert!(b
        .check(std::slice::from_ref(&other))
        .await
        .unwrap()
        .is_allowed());
    for _ in 0..100 {
        if s.shared(&c).await >= 999 {
            break;
        }
        tokio::task::yield_now().await;
    }
    // 900 + 99 returned + 1.5 refilled (1 per second), capped at the burst.
    assert_eq!(s.shared(&c).await, 1000);
    assert_eq!(b.leased_tokens(), 99);
    b.release().await;
    assert_eq!((b.leased_tokens(), s.shared(&other).await), (0, 999));
}

/// Three replicas sharing one bucket, driven far over its rate for 10 s: the fleet admits
/// at most the advertised bound, and no less than exact mode minus the leases.
#[tokio::test]
async fn three_replicas_stay_within_the_overshoot_bound() {
    let s = setup();
    let overshoot = 0.05;
    let replicas: Vec<BatchedLimiter> = (0..3).map(|_| s.batched(config(overshoot, 3))).collect();
    let (rate, burst) = (10_000u64, 10_000u64);
    let p = policy(rate, Duration::from_secs(1), burst);
    let c = check(&LimitKey::global(), &p, 1);
    let steps = 1_000usize; // 10 ms each: 10 s
    let mut per_step = Vec::with_capacity(steps);
    for _ in 0..steps {
        // 150 requests per replica per 10 ms: 4.5× the rate.
        let mut admitted = 0u64;
        for _ in 0..150 {
            for r in &replicas {
                if r.check(std::slice::from_ref(&c))
                    .await
                    .unwrap()
                    .is_allowed()
                {
                    admitted += 1;
                }
            }
        }
        per_step.push(admitted);
        s.clock.advance(Duration::from_millis(10));
    }
    // Every window of 0.1 s, 1 s and 5 s, wherever it starts: GCRA's bound plus the
    // overshoot budget (5 % of the burst).
    for len in [10usize, 100, 500] {
        let window_rate = rate * len as u64 / 100;
        let bound = (burst as f64 * (1.0 + overshoot)) as u64 + window_rate;
        for w in per_step.windows(len) {
            let admitted: u64 = w.iter().sum();
            assert!(admitted <= bound, "{admitted} > {bound} over {len} steps");
        }
    }
    // Over the whole run, no less than exact mode (burst + 10 s of refill) minus what the
    // three leases may hold (166 each) and one token per top-up of rounding.
    let admitted: u64 = per_step.iter().sum();
    let exact = burst + rate * 10;
    assert!(admitted >= exact - 3 * 166, "{admitted} < {exact} - leases");
    assert!(admitted <= exact + 500, "{admitted}");
}

#[tokio::test]
async fn a_lease_in_use_is_kept_past_its_ttl() {
    let s = setup();
    let b = s.batched(config(0.1, 1));
    let p = policy(1000, Duration::from_secs(1000), 1000);
    let c = check(&LimitKey::global(), &p, 1);
    for _ in 0..4 {
        assert!(b
            .check(std::slice::from_ref(&c))
            .await
            .unwrap()
            .is_allowed());
        s.clock.advance(Duration::from_millis(600));
    }
    // 1.8 s after the top-up, never idle for 1 s: one store call, the lease still here.
    assert_eq!((s.calls(), b.leased_tokens()), (1, 96));
}
