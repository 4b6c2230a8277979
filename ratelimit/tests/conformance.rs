//! One suite, every backend: each `async fn` below is a behaviour every [`Limiter`] must
//! have; `conformance!` expands each into one `#[tokio::test]` per backend.
//!
//! - `local`: [`LocalLimiter`] on a [`ManualClock`]; time moves only when a test says so.
//! - `redis`: [`RedisLimiter`] against the real redis-server at `PORTCULLIS_TEST_REDIS_URL`
//!   (exported by `scripts/test.sh`). Redis decides on its own clock, so "advance" is a real
//!   sleep plus a small margin, and policies are chosen so that refill is either irrelevant
//!   (one token per 10 s) or measured in a few hundred milliseconds. Each test uses a random
//!   key prefix; nothing is flushed.

// Test helpers outside #[test] fns panic on purpose, like the tests themselves.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use portcullis_ratelimit::{
    Check, LimitKey, Limiter, LocalLimiter, LocalLimiterConfig, ManualClock, Policy, RedisLimiter,
    RedisLimiterConfig, Verdict,
};

/// Slack added to real sleeps against Redis: server time keeps running between calls.
const REDIS_MARGIN: Duration = Duration::from_millis(30);

enum Backend {
    Local {
        limiter: Arc<LocalLimiter>,
        clock: Arc<ManualClock>,
    },
    Redis {
        limiter: Arc<RedisLimiter>,
        conn: ::redis::aio::MultiplexedConnection,
        prefix: String,
    },
}

struct Harness {
    backend: Backend,
    scope: String,
}

impl Harness {
    fn local() -> Self {
        let clock = Arc::new(ManualClock::default());
        let limiter = LocalLimiter::with_config(LocalLimiterConfig::default(), clock.clone());
        Self {
            backend: Backend::Local {
                limiter: Arc::new(limiter),
                clock,
            },
            scope: format!("t{:016x}", rand::random::<u64>()),
        }
    }

    async fn redis() -> Self {
        let url = std::env::var("PORTCULLIS_TEST_REDIS_URL").expect(
            "PORTCULLIS_TEST_REDIS_URL is not set: the redis conformance tests need a real \
             redis-server (scripts/test.sh starts one and exports the URL)",
        );
        let prefix = format!("test:{:016x}:", rand::random::<u64>());
        // Generous: these tests are about semantics, not latency, and CI machines are busy.
        let config = RedisLimiterConfig {
            timeout: Duration::from_secs(2),
            key_prefix: prefix.clone(),
        };
        let limiter = RedisLimiter::open(&url, config).unwrap();
        let client = ::redis::Client::open(url.as_str()).unwrap();
        let conn = client
            .get_multiplexed_async_connection()
            .await
            .unwrap_or_else(|e| panic!("cannot reach redis at {url}: {e}"));
        Self {
            backend: Backend::Redis {
                limiter: Arc::new(limiter),
                conn,
                prefix,
            },
            scope: "t".into(),
        }
    }

    fn limiter(&self) -> Arc<dyn Limiter> {
        match &self.backend {
            Backend::Local { limiter, .. } => limiter.clone(),
            Backend::Redis { limiter, .. } => limiter.clone(),
        }
    }

    fn key(&self, name: &str) -> LimitKey {
        LimitKey::custom(&self.scope, name)
    }

    /// Lets `d` pass for the backend's clock (at least `d`).
    async fn advance(&self, d: Duration) {
        match &self.backend {
            Backend::Local { clock, .. } => clock.advance(d),
            Backend::Redis { .. } => tokio::time::sleep(d + REDIS_MARGIN).await,
        }
    }

    /// How many of `keys` the backend still keeps state for.
    async fn tracked(&self, keys: &[LimitKey]) -> usize {
        match &self.backend {
            Backend::Local { limiter, .. } => {
                limiter.sweep();
                keys.iter().filter(|k| limiter.contains(k)).count()
            }
            Backend::Redis { conn, prefix, .. } => {
                let names: Vec<String> = keys.iter().map(|k| format!("{prefix}{k}")).collect();
                let mut conn = conn.clone();
                ::redis::cmd("EXISTS")
                    .arg(&names)
                    .query_async(&mut conn)
                    .await
                    .unwrap()
            }
        }
    }

    /// The expiry the backend set on `key` (Redis `PTTL`); `None` for backends without one.
    async fn ttl(&self, key: &LimitKey) -> Option<Duration> {
        match &self.backend {
            Backend::Local { .. } => None,
            Backend::Redis { conn, prefix, .. } => {
                let mut conn = conn.clone();
                let ms: i64 = ::redis::cmd("PTTL")
                    .arg(format!("{prefix}{key}"))
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                assert!(ms > 0, "key {key} has no expiry (PTTL {ms})");
                Some(Duration::from_millis(ms.unsigned_abs()))
            }
        }
    }
}

fn policy(name: &str, rate: u64, per_ms: u64, burst: u64) -> Arc<Policy> {
    Arc::new(Policy::try_new(name, rate, Duration::from_millis(per_ms), burst).unwrap())
}

/// One token per 10 s: refill cannot interfere with a test lasting milliseconds.
fn slow(burst: u64) -> Arc<Policy> {
    policy("slow", 1, 10_000, burst)
}

fn check(key: &LimitKey, policy: &Arc<Policy>, cost: u32) -> Check {
    Check {
        key: key.clone(),
        policy: policy.clone(),
        cost,
    }
}

async fn decide(h: &Harness, checks: &[Check]) -> Verdict {
    h.limiter().check(checks).await.unwrap()
}

// === behaviours ===

async fn burst_admitted_then_rejected(h: Harness) {
    let p = slow(5);
    let k = [check(&h.key("burst"), &p, 1)];
    for expected_remaining in (0..5).rev() {
        let v = decide(&h, &k).await;
        assert!(v.is_allowed());
        assert_eq!(v.decisions()[0].remaining, expected_remaining);
        assert_eq!(v.decisions()[0].limit, 5);
    }
    let v = decide(&h, &k).await;
    assert!(!v.is_allowed());
    let d = v.decisions()[0];
    assert_eq!(d.remaining, 0);
    assert!(d.retry_after > Duration::ZERO && d.retry_after <= Duration::from_secs(10));
    assert!(d.retry_after_secs() >= 1);
}

async fn rejected_request_consumes_nothing(h: Harness) {
    let (wide, narrow) = (slow(5), policy("narrow", 1, 10_000, 2));
    let checks = [
        check(&h.key("wide"), &wide, 1),
        check(&h.key("narrow"), &narrow, 1),
    ];
    assert!(decide(&h, &checks).await.is_allowed());
    assert!(decide(&h, &checks).await.is_allowed());
    for _ in 0..10 {
        let v = decide(&h, &checks).await;
        assert!(!v.is_allowed());
        assert!(v.decisions()[0].allowed && !v.decisions()[1].allowed);
    }
    // Ten rejections later the wide bucket has lost only the two admitted tokens.
    let v = h.limiter().peek(&checks[..1]).await.unwrap();
    assert_eq!(v.decisions()[0].remaining, 3);
}

async fn cost_weights_consume_tokens(h: Harness) {
    let p = slow(10);
    let key = h.key("cost");
    let heavy = [check(&key, &p, 3)];
    for expected in [7, 4, 1] {
        let v = decide(&h, &heavy).await;
        assert!(v.is_allowed());
        assert_eq!(v.decisions()[0].remaining, expected);
    }
    let v = decide(&h, &heavy).await;
    assert!(!v.is_allowed(), "3 tokens requested, 1 left");
    assert_eq!(v.decisions()[0].remaining, 1);
    assert!(decide(&h, &[check(&key, &p, 1)]).await.is_allowed());
}

async fn retry_after_is_accurate(h: Harness) {
    let p = policy("fast", 5, 1_000, 1); // one token per 200 ms
    let k = [check(&h.key("retry"), &p, 1)];
    assert!(decide(&h, &k).await.is_allowed());
    let d = decide(&h, &k).await.decisions()[0];
    assert!(!d.allowed);
    assert!(d.retry_after > Duration::ZERO && d.retry_after <= Duration::from_millis(200));
    assert_eq!(d.retry_after_secs(), 1);
    h.advance(d.retry_after).await;
    assert!(
        decide(&h, &k).await.is_allowed(),
        "admitted after Retry-After"
    );
}

async fn keys_are_isolated(h: Harness) {
    let p = slow(2);
    let (a, b) = (h.key("tenant-a"), h.key("tenant-b"));
    for _ in 0..2 {
        assert!(decide(&h, &[check(&a, &p, 1)]).await.is_allowed());
    }
    assert!(!decide(&h, &[check(&a, &p, 1)]).await.is_allowed());
    let v = decide(&h, &[check(&b, &p, 1)]).await;
    assert!(v.is_allowed());
    assert_eq!(v.decisions()[0].remaining, 1);
}

async fn tokens_refill_over_time(h: Harness) {
    let p = policy("refill", 10, 1_000, 2); // one token per 100 ms
    let k = [check(&h.key("refill"), &p, 1)];
    assert!(decide(&h, &k).await.is_allowed());
    assert!(decide(&h, &k).await.is_allowed());
    assert!(!decide(&h, &k).await.is_allowed());
    h.advance(Duration::from_millis(100)).await;
    assert!(decide(&h, &k).await.is_allowed());
    assert!(!decide(&h, &k).await.is_allowed());
    h.advance(Duration::from_millis(200)).await;
    assert!(decide(&h, &k).await.is_allowed());
    assert!(decide(&h, &k).await.is_allowed());
}

async fn peek_does_not_consume(h: Harness) {
    let p = slow(3);
    let k = [check(&h.key("peek"), &p, 1)];
    for _ in 0..5 {
        let v = h.limiter().peek(&k).await.unwrap();
        assert!(v.is_allowed());
        assert_eq!(v.decisions()[0].remaining, 3);
    }
    decide(&h, &k).await;
    let v = h.limiter().peek(&k).await.unwrap();
    assert_eq!(v.decisions()[0].remaining, 2);
    let heavy = [check(&h.key("peek"), &p, 3)];
    let v = h.limiter().peek(&heavy).await.unwrap();
    assert!(!v.is_allowed(), "peek reports a would-be rejection");
    assert!(v.decisions()[0].retry_after > Duration::ZERO);
}

async fn state_expires_once_the_bucket_is_full(h: Harness) {
    let p = policy("expiring", 10, 1_000, 5); // 100 ms per token
    let keys = [h.key("e1"), h.key("e2"), h.key("e3")];
    for key in &keys {
        decide(&h, &[check(key, &p, 2)]).await;
    }
    assert_eq!(h.tracked(&keys).await, 3);
    if let Some(ttl) = h.ttl(&keys[0]).await {
        assert!(
            ttl <= Duration::from_millis(200),
            "expiry {ttl:?} beyond the refill"
        );
    }
    h.advance(Duration::from_millis(200)).await;
    assert_eq!(h.tracked(&keys).await, 0, "full buckets are forgotten");
}

async fn shadow_policy_never_blocks(h: Harness) {
    let enforced = slow(5);
    let shadow = Arc::new(
        Policy::try_new("shadow", 1, Duration::from_secs(10), 1)
            .unwrap()
            .with_shadow(true),
    );
    let checks = [
        check(&h.key("enf"), &enforced, 1),
        check(&h.key("shadow"), &shadow, 1),
    ];
    for i in 0..3 {
        let v = decide(&h, &checks).await;
        assert!(v.is_allowed(), "request {i}");
        let s = v.decisions()[1];
        assert!(s.shadow);
        assert_eq!(s.allowed, i == 0, "the shadow bucket admits only the first");
    }
    let v = h.limiter().peek(&checks).await.unwrap();
    assert_eq!(v.decisions()[0].remaining, 2);
    assert_eq!(v.decisions()[1].remaining, 0);
}

async fn concurrent_requests_never_overspend(h: Harness) {
    let p = slow(10);
    let key = h.key("race");
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..50 {
        let (limiter, c) = (h.limiter(), [check(&key, &p, 1)]);
        tasks.spawn(async move { limiter.check(&c).await.unwrap().is_allowed() });
    }
    let mut admitted = 0;
    while let Some(ok) = tasks.join_next().await {
        admitted += usize::from(ok.unwrap());
    }
    assert_eq!(admitted, 10);
}

macro_rules! conformance {
    ($($behaviour:ident),* $(,)?) => {
        mod local {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $behaviour() {
                    super::$behaviour(super::Harness::local()).await;
                }
            )*
        }
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $behaviour() {
                    super::$behaviour(super::Harness::redis().await).await;
                }
            )*
        }
    };
}

conformance!(
    burst_admitted_then_rejected,
    rejected_request_consumes_nothing,
    cost_weights_consume_tokens,
    retry_after_is_accurate,
    keys_are_isolated,
    tokens_refill_over_time,
    peek_does_not_consume,
    state_expires_once_the_bucket_is_full,
    shadow_policy_never_blocks,
    concurrent_requests_never_overspend,
);
