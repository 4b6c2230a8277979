//! The fallback wrapper against an unreachable Redis (a closed loopback port), against a
//! primary that fails on demand (circuit logic on a manual clock), and across a real
//! redis-server being killed and restarted (recovery without restarting anything).

// Test helpers outside #[test] fns panic on purpose, like the tests themselves.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use portcullis_ratelimit::{
    Check, Decision, FailMode, FallbackConfig, FallbackLimiter, LimitKey, Limiter, LimiterError,
    LocalLimiter, ManualClock, Period, Policy, Principal, RedisLimiter, RedisLimiterConfig,
    Verdict,
};

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

fn unreachable_redis() -> Arc<dyn Limiter> {
    // Nothing listens there once the listener is dropped: connection refused.
    let config = RedisLimiterConfig {
        timeout: Duration::from_millis(50),
        key_prefix: String::new(),
    };
    let url = format!("redis://127.0.0.1:{}", free_port());
    Arc::new(RedisLimiter::open(&url, config).unwrap())
}

fn checks(policy: Policy) -> [Check; 1] {
    [Check {
        key: LimitKey::tenant("acme"),
        policy: Arc::new(policy),
        cost: 1,
    }]
}

fn tenant_policy() -> Policy {
    Policy::try_new("tenant", 10, Duration::from_secs(1), 10).unwrap()
}

fn wrapper(primary: Arc<dyn Limiter>, mode: FailMode, clock: &Arc<ManualClock>) -> FallbackLimiter {
    let config = FallbackConfig {
        mode,
        replicas: 2,
        cool_down: Duration::from_secs(1),
        ..FallbackConfig::default()
    };
    FallbackLimiter::with_clock(primary, config, clock.clone())
}

#[tokio::test]
async fn fail_open_admits_the_local_share() {
    let clock = Arc::new(ManualClock::default());
    let limiter = wrapper(unreachable_redis(), FailMode::Open, &clock);
    let c = checks(tenant_policy());
    let mut admitted = 0;
    for _ in 0..20 {
        admitted += usize::from(limiter.check(&c).await.unwrap().is_allowed());
    }
    // burst 10 shared by 2 replicas: this one admits 5.
    assert_eq!(admitted, 5);
    assert!(limiter.is_degraded());
}

#[tokio::test]
async fn fail_closed_answers_an_error_promptly() {
    let clock = Arc::new(ManualClock::default());
    let limiter = wrapper(unreachable_redis(), FailMode::Closed, &clock);
    let c = checks(tenant_policy());
    let err = limiter.check(&c).await.unwrap_err();
    assert!(err.is_transient(), "{err}");
    // Within the cool-down the store is not even tried.
    match limiter.check(&c).await.unwrap_err() {
        LimiterError::CircuitOpen { retry_in } => assert!(retry_in <= Duration::from_secs(1)),
        other => panic!("expected CircuitOpen, got {other}"),
    }
}

#[tokio::test]
async fn a_policy_can_fail_closed_under_an_open_wrapper() {
    let clock = Arc::new(ManualClock::default());
    let limiter = wrapper(unreachable_redis(), FailMode::Open, &clock);
    let strict = tenant_policy().with_on_store_error(FailMode::Closed);
    assert!(limiter.check(&checks(strict.clone())).await.is_err());
    // A shadow policy never fails closed: it must not be able to block traffic.
    let shadow = strict.with_shadow(true);
    assert!(limiter.check(&checks(shadow)).await.unwrap().is_allowed());
}

/// A primary that fails while `down` is set, counting calls.
#[derive(Debug, Default)]
struct Switchable {
    down: AtomicBool,
    calls: AtomicUsize,
    inner: LocalLimiter,
}

#[async_trait]
impl Limiter for Switchable {
    async fn check(&self, checks: &[Check]) -> Result<Verdict, LimiterError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.down.load(Ordering::SeqCst) {
            return Err(LimiterError::Timeout(Duration::from_millis(50)));
        }
        self.inner.check(checks).await
    }

    async fn peek(&self, checks: &[Check]) -> Result<Verdict, LimiterError> {
        self.inner.peek(checks).await
    }

    async fn reset(&self, checks: &[Check]) -> Result<(), LimiterError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.down.load(Ordering::SeqCst) {
            return Err(LimiterError::Timeout(Duration::from_millis(50)));
        }
        self.inner.reset(checks).await
    }

    async fn give_back(&self, check: &Check, amount: u64) -> Result<Decision, LimiterError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.down.load(Ordering::SeqCst) {
            return Err(LimiterError::Timeout(Duration::from_millis(50)));
        }
        self.inner.give_back(check, amount).await
    }
}

#[tokio::test]
async fn circuit_skips_the_store_then_probes_and_recovers() {
    let clock = Arc::new(ManualClock::default());
    let primary = Arc::new(Switchable::default());
    primary.down.store(true, Ordering::SeqCst);
    let limiter = wrapper(primary.clone(), FailMode::Open, &clock);
    let c = checks(tenant_policy());

    assert!(limiter.check(&c).await.unwrap().is_allowed());
    for _ in 0..10 {
        limiter.check(&c).await.unwrap();
    }
    assert_eq!(
        primary.calls.load(Ordering::SeqCst),
        1,
        "skipped during the cool-down"
    );

    clock.advance(Duration::from_secs(1));
    limiter.check(&c).await.unwrap();
    assert_eq!(
        primary.calls.load(Ordering::SeqCst),
        2,
        "one probe after the cool-down"
    );
    assert!(limiter.is_degraded());

    primary.down.store(false, Ordering::SeqCst);
    clock.advance(Duration::from_secs(1));
    limiter.check(&c).await.unwrap();
    assert!(
        !limiter.is_degraded(),
        "a successful probe closes the circuit"
    );
    limiter.check(&c).await.unwrap();
    assert_eq!(
        primary.calls.load(Ordering::SeqCst),
        4,
        "every request uses the store again"
    );
}

#[tokio::test]
async fn admin_operations_need_the_primary() {
    let clock = Arc::new(ManualClock::default());
    let primary = Arc::new(Switchable::default());
    let limiter = wrapper(primary.clone(), FailMode::Open, &clock);
    let quota = Arc::new(Policy::calendar("daily_quota", 3, Period::Day).unwrap());
    let c = [Check {
        key: LimitKey::period(Principal::Tenant("acme"), Period::Day),
        policy: quota,
        cost: 1,
    }];
    for _ in 0..3 {
        assert!(limiter.check(&c).await.unwrap().is_allowed());
    }
    assert!(!limiter.check(&c).await.unwrap().is_allowed());
    assert_eq!(limiter.give_back(&c[0], 2).await.unwrap().remaining, 2);
    limiter.reset(&c).await.unwrap();
    assert_eq!(limiter.peek(&c).await.unwrap().decisions()[0].remaining, 3);

    primary.down.store(true, Ordering::SeqCst);
    // Fail open: the local stand-in enforces this replica's share, 3 / 2 replicas = 1.
    assert!(limiter.check(&c).await.unwrap().is_allowed());
    assert!(limiter.is_degraded());
    assert!(!limiter.check(&c).await.unwrap().is_allowed());
    // An operator's reset must not silently land in a local table nobody else sees.
    assert!(matches!(
        limiter.reset(&c).await,
        Err(LimiterError::CircuitOpen { .. })
    ));
    assert!(matches!(
        limiter.give_back(&c[0], 1).await,
        Err(LimiterError::CircuitOpen { .. })
    ));
}

/// A redis-server child on `port`, killed on drop.
struct RedisChild(Child);

impl RedisChild {
    async fn start(port: u16) -> Self {
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
            ])
            .args(["--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server must be installed");
        // Guard first: a panic below still kills and reaps the child.
        let guard = Self(child);
        let url = format!("redis://127.0.0.1:{port}");
        let client = redis::Client::open(url).unwrap();
        for _ in 0..100 {
            if let Ok(mut conn) = client.get_multiplexed_async_connection().await {
                if redis::cmd("PING")
                    .query_async::<String>(&mut conn)
                    .await
                    .is_ok()
                {
                    return guard;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("redis-server on port {port} did not become ready within 5 s");
    }

    fn stop(mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for RedisChild {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovers_when_redis_comes_back() {
    let port = free_port();
    let server = RedisChild::start(port).await;
    let url = format!("redis://127.0.0.1:{port}");
    let config = RedisLimiterConfig {
        timeout: Duration::from_millis(500),
        key_prefix: String::new(),
    };
    let redis = Arc::new(RedisLimiter::open(&url, config).unwrap());
    let fallback = FallbackConfig {
        cool_down: Duration::from_millis(100),
        ..FallbackConfig::default()
    };
    let limiter = FallbackLimiter::new(redis, fallback);
    let c = checks(Policy::try_new("tenant", 1, Duration::from_secs(60), 100).unwrap());

    assert!(limiter.check(&c).await.unwrap().is_allowed());
    assert!(!limiter.is_degraded());

    server.stop();
    assert!(
        limiter.check(&c).await.unwrap().is_allowed(),
        "fail open while down"
    );
    assert!(limiter.is_degraded());

    let _server = RedisChild::start(port).await;
    let mut recovered = false;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        limiter.check(&c).await.unwrap();
        if !limiter.is_degraded() {
            recovered = true;
            break;
        }
    }
    assert!(
        recovered,
        "shared limiting did not resume within 7.5 s of Redis returning"
    );
    // The decision went to the new server: the tenant's bucket lives there now.
    let mut conn = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let exists: bool = redis::cmd("EXISTS")
        .arg(LimitKey::tenant("acme").as_str())
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(exists);
}
