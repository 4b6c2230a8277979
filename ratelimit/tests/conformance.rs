//! One suite, every backend: each `async fn` below is a behaviour every [`Limiter`] must
//! have; `conformance!` expands each into one `#[tokio::test]` per backend.
//!
//! - `local`: [`LocalLimiter`] on a [`ManualClock`]; time moves only when a test says so.
//! - `redis`: [`RedisLimiter`] against the real redis-server at `PORTCULLIS_TEST_REDIS_URL`
//!   (exported by `scripts/test.sh`). Redis decides on its own clock, so "advance" is a real
//!   sleep plus a small margin, and policies are chosen so that refill is either irrelevant
//!   (one token per 10 s) or measured in a few hundred milliseconds. Each test uses a random
//!   key prefix; nothing is flushed.
//! - `redis_cluster`: the same against the real 3-master Redis Cluster at
//!   `PORTCULLIS_TEST_REDIS_CLUSTER_URL` (`redis-cluster://h:p,…`, also from `scripts/test.sh`).
//!   Keys with different hash tags land on different masters, so the behaviours mixing them
//!   (quotas beside buckets, `rejection_in_one_slot_consumes_nothing_in_another`) exercise
//!   the per-slot decision and its refund. Without the variable these tests print a note and
//!   pass: a plain `cargo test -p portcullis-ratelimit` has no cluster.
//!
//! Calendar quota windows come from the limiter's clock in both backends, so both get a
//! [`ManualClock`] starting at [`START`] (one minute before a UTC midnight), and
//! [`Harness::advance_calendar`] moves it without sleeping. On Redis that moves only the
//! calendar (buckets run on server time); locally it moves both, so the quota behaviours use
//! buckets that a minute's refill cannot confuse, or check them before moving.

// Test helpers outside #[test] fns panic on purpose, like the tests themselves.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use portcullis_ratelimit::limiter::QUOTA_TTL_MARGIN;
use portcullis_ratelimit::{
    BatchedConfig, BatchedLimiter, Check, LimitKey, Limiter, LocalLimiter, LocalLimiterConfig,
    ManualClock, Period, Policy, Principal, RedisLimiter, RedisLimiterConfig, Verdict,
};
use portcullis_redis::{ConnectOptions, RedisClient, RedisConnection};

/// Slack added to real sleeps against Redis: server time keeps running between calls.
const REDIS_MARGIN: Duration = Duration::from_millis(30);

/// Where every harness clock starts: 2026-11-21T23:59:00Z, 60 s before a UTC midnight and
/// 9 days 60 s before the end of the month.
const START: Duration = Duration::from_secs(1_795_305_540);
/// The day and month window ids at [`START`], and the next day's.
const DAY: u64 = 20_261_121;
const NEXT_DAY: u64 = 20_261_122;
const MONTH: u64 = 202_611;
/// Time from [`START`] to the next midnight.
const TO_MIDNIGHT: Duration = Duration::from_secs(60);

// One per test: the size of the Redis variant's connection handle does not matter.
#[allow(clippy::large_enum_variant)]
enum Backend {
    Local {
        limiter: Arc<LocalLimiter>,
    },
    Redis {
        limiter: Arc<RedisLimiter>,
        conn: RedisConnection,
        prefix: String,
    },
}

struct Harness {
    backend: Backend,
    /// Set: decisions go through this wrapper of the backend's limiter (the batched one).
    wrapper: Option<Arc<dyn Limiter>>,
    clock: Arc<ManualClock>,
    scope: String,
}

impl Harness {
    fn local() -> Self {
        let clock = Arc::new(ManualClock::new(START));
        let limiter = LocalLimiter::with_config(LocalLimiterConfig::default(), clock.clone());
        Self {
            backend: Backend::Local {
                limiter: Arc::new(limiter),
            },
            clock,
            scope: format!("t{:016x}", rand::random::<u64>()),
            wrapper: None,
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
        let clock = Arc::new(ManualClock::new(START));
        let limiter = RedisLimiter::open(&url, config)
            .unwrap()
            .with_clock(clock.clone());
        let client =
            RedisClient::single(&url, &ConnectOptions::with_timeout(Duration::from_secs(2)))
                .unwrap();
        let conn = client
            .connect()
            .await
            .unwrap_or_else(|e| panic!("cannot reach redis at {url}: {e}"));
        Self {
            backend: Backend::Redis {
                limiter: Arc::new(limiter),
                conn,
                prefix,
            },
            clock,
            scope: "t".into(),
            wrapper: None,
        }
    }

    /// `None` (with a note) when no cluster URL is set.
    async fn redis_cluster() -> Option<Self> {
        let Ok(url) = std::env::var("PORTCULLIS_TEST_REDIS_CLUSTER_URL") else {
            eprintln!(
                "PORTCULLIS_TEST_REDIS_CLUSTER_URL is not set: skipping the Redis Cluster \
                 instantiation (scripts/test.sh starts a 3-master cluster and exports it)"
            );
            return None;
        };
        let nodes: Vec<String> = url
            .trim_start_matches("redis-cluster://")
            .split(',')
            .map(|n| format!("redis://{n}"))
            .collect();
        let prefix = format!("test:{:016x}:", rand::random::<u64>());
        let config = RedisLimiterConfig {
            timeout: Duration::from_secs(2),
            key_prefix: prefix.clone(),
        };
        let clock = Arc::new(ManualClock::new(START));
        let limiter = RedisLimiter::open_cluster(&nodes, config)
            .unwrap()
            .with_clock(clock.clone());
        let conn = RedisClient::cluster(
            &nodes,
            &ConnectOptions::with_timeout(Duration::from_secs(2)),
        )
        .unwrap()
        .connect()
        .await
        .unwrap_or_else(|e| panic!("cannot reach the redis cluster at {url}: {e}"));
        Some(Self {
            backend: Backend::Redis {
                limiter: Arc::new(limiter),
                conn,
                prefix,
            },
            clock,
            scope: "t".into(),
            wrapper: None,
        })
    }

    /// The backend wrapped in a [`BatchedLimiter`] leasing half of each burst (one
    /// replica): buckets of 4 tokens or more are decided from leases.
    fn batched(mut self) -> Self {
        let config = BatchedConfig {
            max_overshoot: 0.5,
            replicas: 1,
            ..BatchedConfig::default()
        };
        let batched = BatchedLimiter::with_clock(self.limiter(), config, self.clock.clone());
        self.wrapper = Some(Arc::new(batched.unwrap()));
        self
    }

    fn limiter(&self) -> Arc<dyn Limiter> {
        if let Some(wrapper) = &self.wrapper {
            return wrapper.clone();
        }
        match &self.backend {
            Backend::Local { limiter, .. } => limiter.clone(),
            Backend::Redis { limiter, .. } => limiter.clone(),
        }
    }

    fn key(&self, name: &str) -> LimitKey {
        LimitKey::custom(&self.scope, name)
    }

    /// A key under another hash tag than [`Harness::key`]'s (another slot on a cluster).
    fn other_tag_key(&self, name: &str) -> LimitKey {
        LimitKey::custom(&format!("{}-other", self.scope), name)
    }

    /// A calendar quota key of a tenant named after the test scope and `name`.
    fn quota_key(&self, name: &str, period: Period) -> LimitKey {
        LimitKey::period(Principal::Tenant(&format!("{}-{name}", self.scope)), period)
    }

    /// Lets `d` pass for the backend's clock (at least `d`).
    async fn advance(&self, d: Duration) {
        match &self.backend {
            Backend::Local { .. } => self.clock.advance(d),
            Backend::Redis { .. } => tokio::time::sleep(d + REDIS_MARGIN).await,
        }
    }

    /// Moves the limiter's clock, which places calendar windows, by `d` without sleeping.
    /// Locally this is the bucket clock too; Redis buckets stay on server time.
    fn advance_calendar(&self, d: Duration) {
        self.clock.advance(d);
    }

    /// Whether the backend holds a counter for `key` in window `window`. Locally: any
    /// window of `key`, after a sweep (the local table is not addressable by window).
    async fn has_counter(&self, key: &LimitKey, window: u64) -> bool {
        match &self.backend {
            Backend::Local { limiter } => {
                limiter.sweep();
                limiter.contains(key)
            }
            Backend::Redis { conn, prefix, .. } => {
                let mut conn = conn.clone();
                ::redis::cmd("EXISTS")
                    .arg(format!("{prefix}{key}:{window}"))
                    .query_async::<bool>(&mut conn)
                    .await
                    .unwrap()
            }
        }
    }

    /// Redis `PTTL` of `key`'s counter for `window`; `None` locally.
    async fn counter_ttl(&self, key: &LimitKey, window: u64) -> Option<Duration> {
        match &self.backend {
            Backend::Local { .. } => None,
            Backend::Redis { conn, prefix, .. } => {
                let mut conn = conn.clone();
                let ms: i64 = ::redis::cmd("PTTL")
                    .arg(format!("{prefix}{key}:{window}"))
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                assert!(ms > 0, "counter {key}:{window} has no expiry (PTTL {ms})");
                Some(Duration::from_millis(ms.unsigned_abs()))
            }
        }
    }

    /// How many of `keys` the backend still keeps state for.
    async fn tracked(&self, keys: &[LimitKey]) -> usize {
        match &self.backend {
            Backend::Local { limiter } => {
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

fn quota(name: &str, limit: u64, period: Period) -> Arc<Policy> {
    Arc::new(Policy::calendar(name, limit, period).unwrap())
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

/// On a cluster the two keys live in different slots (the shape of a caller's bucket and
/// the global ceiling): each slot decides alone, and a slot that admitted is refunded when
/// the other refused. Either order of the refusing slot.
async fn rejection_in_one_slot_consumes_nothing_in_another(h: Harness) {
    let (wide, narrow) = (slow(5), policy("narrow", 1, 10_000, 2));
    for (name, narrow_first) in [("a", false), ("b", true)] {
        let wide_key = h.key(&format!("wide-{name}"));
        let narrow_key = h.other_tag_key(&format!("narrow-{name}"));
        let (w, n) = (check(&wide_key, &wide, 1), check(&narrow_key, &narrow, 1));
        let checks = if narrow_first { [n, w] } else { [w, n] };
        let (wide_at, narrow_at) = if narrow_first { (1, 0) } else { (0, 1) };
        assert!(decide(&h, &checks).await.is_allowed());
        assert!(decide(&h, &checks).await.is_allowed());
        for _ in 0..10 {
            let v = decide(&h, &checks).await;
            assert!(!v.is_allowed());
            let d = v.decisions();
            assert!(d[wide_at].allowed && !d[narrow_at].allowed);
            assert_eq!(d[wide_at].remaining, 3, "reported as not consumed");
        }
        let v = h.limiter().peek(&checks[wide_at..=wide_at]).await.unwrap();
        assert_eq!(v.decisions()[0].remaining, 3, "ten refusals later ({name})");
    }
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

/// 100 000 000 tokens per second (10 ns each) on every backend: nanosecond ticks, exact in
/// the Redis script's doubles. A full burst of 10⁶ is taken at once; the next one waits
/// exactly 10 ns per missing token (refill since the first decision included).
async fn fleet_scale_rates_are_exact(h: Harness) {
    let p = Arc::new(
        Policy::try_new("global", 100_000_000, Duration::from_secs(1), 1_000_000).unwrap(),
    );
    let all = [check(&h.key("fleet"), &p, 1_000_000)];
    let v = decide(&h, &all).await;
    assert!(v.is_allowed());
    assert_eq!(v.decisions()[0].remaining, 0);
    let v = decide(&h, &all).await;
    assert!(!v.is_allowed());
    let d = v.decisions()[0];
    assert!(d.remaining < 1_000_000);
    let wait = Duration::from_nanos((1_000_000 - d.remaining) * 10);
    assert!(
        d.retry_after <= wait && wait - d.retry_after < Duration::from_nanos(10),
        "{d:?}"
    );
}

// === calendar quotas ===

async fn quota_exhausted_rejects_until_window_end(h: Harness) {
    let daily = quota("daily_quota", 3, Period::Day);
    let k = [check(&h.quota_key("a", Period::Day), &daily, 1)];
    for expected_remaining in [2, 1, 0] {
        let d = decide(&h, &k).await.decisions()[0];
        assert!(d.allowed);
        assert_eq!((d.limit, d.remaining), (3, expected_remaining));
        assert_eq!(d.reset_after, TO_MIDNIGHT, "the counter resets at midnight");
    }
    let v = decide(&h, &k).await;
    assert!(!v.is_allowed());
    let d = v.decisions()[0];
    assert_eq!(d.remaining, 0);
    assert_eq!(d.retry_after, TO_MIDNIGHT);
    assert_eq!(d.retry_after_secs(), 60);

    h.advance_calendar(Duration::from_secs(59));
    let d = decide(&h, &k).await.decisions()[0];
    assert!(!d.allowed, "still the same day at 23:59:59");
    assert_eq!(d.retry_after_secs(), 1);
    h.advance_calendar(Duration::from_secs(1));
    let d = decide(&h, &k).await.decisions()[0];
    assert!(d.allowed, "admitted again at midnight");
    assert_eq!(d.remaining, 2);
    assert_eq!(d.reset_after, Duration::from_secs(86_400));
}

async fn rejection_by_bucket_consumes_no_quota(h: Harness) {
    let (bucket, daily) = (slow(2), quota("daily_quota", 10, Period::Day));
    let checks = [
        check(&h.key("bucket"), &bucket, 1),
        check(&h.quota_key("b", Period::Day), &daily, 1),
    ];
    assert!(decide(&h, &checks).await.is_allowed());
    assert!(decide(&h, &checks).await.is_allowed());
    for _ in 0..5 {
        let v = decide(&h, &checks).await;
        assert!(!v.is_allowed());
        assert!(!v.decisions()[0].allowed && v.decisions()[1].allowed);
        assert_eq!(
            v.reported(),
            Some(0),
            "the bucket is what the client must wait for"
        );
    }
    let v = h.limiter().peek(&checks[1..]).await.unwrap();
    assert_eq!(
        v.decisions()[0].remaining,
        8,
        "only admitted requests count"
    );
}

async fn rejection_by_quota_consumes_no_tokens(h: Harness) {
    let (bucket, daily) = (slow(10), quota("daily_quota", 2, Period::Day));
    let checks = [
        check(&h.key("bucket"), &bucket, 1),
        check(&h.quota_key("c", Period::Day), &daily, 1),
    ];
    assert!(decide(&h, &checks).await.is_allowed());
    assert!(decide(&h, &checks).await.is_allowed());
    for _ in 0..5 {
        let v = decide(&h, &checks).await;
        assert!(!v.is_allowed());
        assert!(v.decisions()[0].allowed && !v.decisions()[1].allowed);
        assert_eq!(v.reported(), Some(1));
        assert_eq!(v.retry_after(), TO_MIDNIGHT);
    }
    let v = h.limiter().peek(&checks[..1]).await.unwrap();
    assert_eq!(
        v.decisions()[0].remaining,
        8,
        "refused requests took no tokens"
    );
}

async fn new_window_starts_fresh(h: Harness) {
    let (daily, monthly) = (
        quota("daily_quota", 2, Period::Day),
        quota("monthly_quota", 10, Period::Month),
    );
    let (day_key, month_key) = (
        h.quota_key("d", Period::Day),
        h.quota_key("d", Period::Month),
    );
    let checks = [check(&day_key, &daily, 1), check(&month_key, &monthly, 1)];
    assert!(decide(&h, &checks).await.is_allowed());
    assert!(decide(&h, &checks).await.is_allowed());
    let v = decide(&h, &checks).await;
    assert!(!v.is_allowed(), "daily quota spent");
    assert_eq!(v.decisions()[1].remaining, 8, "the month was not charged");

    h.advance_calendar(TO_MIDNIGHT);
    let v = decide(&h, &checks).await;
    assert!(v.is_allowed());
    assert_eq!(v.decisions()[0].remaining, 1, "a new day starts from zero");
    assert_eq!(v.decisions()[1].remaining, 7, "the month keeps counting");
    assert!(h.has_counter(&day_key, NEXT_DAY).await);
    assert!(h.has_counter(&month_key, MONTH).await);
}

async fn reset_and_give_back(h: Harness) {
    let (bucket, daily) = (slow(5), quota("daily_quota", 5, Period::Day));
    let checks = [
        check(&h.key("bucket"), &bucket, 1),
        check(&h.quota_key("e", Period::Day), &daily, 1),
    ];
    for _ in 0..3 {
        assert!(decide(&h, &checks).await.is_allowed());
    }
    let limiter = h.limiter();
    let d = limiter.give_back(&checks[1], 2).await.unwrap();
    assert_eq!((d.limit, d.remaining), (5, 4));
    assert!(d.allowed && d.reset_after == TO_MIDNIGHT);
    let d = limiter.give_back(&checks[1], 100).await.unwrap();
    assert_eq!(d.remaining, 5, "used never goes below 0");
    let d = limiter.give_back(&checks[0], 1).await.unwrap();
    assert_eq!(d.remaining, 3);
    let d = limiter.give_back(&checks[0], 100).await.unwrap();
    assert_eq!(d.remaining, 5, "capped at the burst");

    for _ in 0..5 {
        assert!(decide(&h, &checks).await.is_allowed());
    }
    assert!(!decide(&h, &checks).await.is_allowed());
    limiter.reset(&checks).await.unwrap();
    let v = limiter.peek(&checks).await.unwrap();
    assert!(v.is_allowed());
    assert_eq!(v.decisions()[0].remaining, 5, "bucket refilled");
    assert_eq!(v.decisions()[1].remaining, 5, "quota back to 0 used");
    limiter.reset(&checks).await.unwrap();
    let d = limiter.give_back(&checks[1], 1).await.unwrap();
    assert_eq!(d.remaining, 5, "nothing to give back");
}

async fn peek_reports_quota_without_consuming(h: Harness) {
    let daily = quota("daily_quota", 3, Period::Day);
    let key = h.quota_key("f", Period::Day);
    let k = [check(&key, &daily, 1)];
    for _ in 0..5 {
        let d = h.limiter().peek(&k).await.unwrap().decisions()[0];
        assert!(d.allowed);
        assert_eq!((d.limit, d.remaining), (3, 3));
        assert_eq!(d.reset_after, TO_MIDNIGHT);
    }
    decide(&h, &k).await;
    let d = h.limiter().peek(&k).await.unwrap().decisions()[0];
    assert_eq!(d.remaining, 2);
    let heavy = [check(&key, &daily, 3)];
    let d = h.limiter().peek(&heavy).await.unwrap().decisions()[0];
    assert!(!d.allowed, "peek reports a would-be rejection");
    assert_eq!(d.retry_after, TO_MIDNIGHT);
    let d = h.limiter().peek(&k).await.unwrap().decisions()[0];
    assert_eq!(d.remaining, 2, "peeking consumed nothing");
}

async fn counters_expire_after_window(h: Harness) {
    let (daily, monthly) = (
        quota("daily_quota", 5, Period::Day),
        quota("monthly_quota", 5, Period::Month),
    );
    let (day_key, month_key) = (
        h.quota_key("g", Period::Day),
        h.quota_key("g", Period::Month),
    );
    decide(&h, &[check(&day_key, &daily, 1)]).await;
    decide(&h, &[check(&month_key, &monthly, 1)]).await;
    if let Some(ttl) = h.counter_ttl(&day_key, DAY).await {
        // Lives until the window ends (PTTL has lost a few real ms since the write)...
        assert!(ttl > TO_MIDNIGHT, "expires at {ttl:?}, before midnight");
        // ...and not much longer.
        assert!(ttl <= TO_MIDNIGHT + QUOTA_TTL_MARGIN, "expiry {ttl:?}");
    }
    if let Some(ttl) = h.counter_ttl(&month_key, MONTH).await {
        let to_december = Duration::from_secs(9 * 86_400) + TO_MIDNIGHT;
        assert!(ttl > to_december && ttl <= to_december + QUOTA_TTL_MARGIN);
    }
    // A minute short of the window's end, the sweep must keep a live counter; locally
    // the buckets' "TAT in the past" rule would have dropped it.
    h.advance_calendar(TO_MIDNIGHT - Duration::from_secs(1));
    assert!(h.has_counter(&day_key, DAY).await, "live counter dropped");
    let d = h
        .limiter()
        .peek(&[check(&day_key, &daily, 1)])
        .await
        .unwrap();
    assert_eq!(d.decisions()[0].remaining, 4);
    h.advance_calendar(Duration::from_secs(1));
    if matches!(h.backend, Backend::Local { .. }) {
        assert!(
            !h.has_counter(&day_key, DAY).await,
            "ended window forgotten"
        );
        assert!(
            h.has_counter(&month_key, MONTH).await,
            "the month is still live"
        );
    }
}

async fn concurrent_requests_never_overspend_quota(h: Harness) {
    let daily = quota("daily_quota", 10, Period::Day);
    let key = h.quota_key("race", Period::Day);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..50 {
        let (limiter, c) = (h.limiter(), [check(&key, &daily, 1)]);
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
        mod redis_cluster {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $behaviour() {
                    if let Some(h) = super::Harness::redis_cluster().await {
                        super::$behaviour(h).await;
                    }
                }
            )*
        }
    };
}

/// The same behaviours through a [`BatchedLimiter`] (see [`Harness::batched`]): every
/// behaviour holds except the exact count under concurrency, which leases relax (tokens in a
/// lease being topped up are not available to the requests racing it), replaced by its bound.
macro_rules! batched_conformance {
    ($($behaviour:ident),* $(,)?) => {
        mod batched_local {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $behaviour() {
                    super::$behaviour(super::Harness::local().batched()).await;
                }
            )*
        }
        mod batched_redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $behaviour() {
                    super::$behaviour(super::Harness::redis().await.batched()).await;
                }
            )*
        }
        mod batched_redis_cluster {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $behaviour() {
                    if let Some(h) = super::Harness::redis_cluster().await {
                        super::$behaviour(h.batched()).await;
                    }
                }
            )*
        }
    };
}

/// Batched: 50 concurrent requests on a bucket of 10 never overspend it; the lease being
/// topped up (5 tokens) may leave up to that many unused while the racing requests, decided
/// exactly, find the shared bucket empty.
async fn concurrent_requests_stay_within_the_leases(h: Harness) {
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
    assert!((5..=10).contains(&admitted), "{admitted}");
}

batched_conformance!(
    burst_admitted_then_rejected,
    rejected_request_consumes_nothing,
    rejection_in_one_slot_consumes_nothing_in_another,
    cost_weights_consume_tokens,
    retry_after_is_accurate,
    keys_are_isolated,
    tokens_refill_over_time,
    peek_does_not_consume,
    state_expires_once_the_bucket_is_full,
    shadow_policy_never_blocks,
    concurrent_requests_stay_within_the_leases,
    quota_exhausted_rejects_until_window_end,
    rejection_by_bucket_consumes_no_quota,
    rejection_by_quota_consumes_no_tokens,
    new_window_starts_fresh,
    reset_and_give_back,
    peek_reports_quota_without_consuming,
    counters_expire_after_window,
    concurrent_requests_never_overspend_quota,
    fleet_scale_rates_are_exact,
);

conformance!(
    burst_admitted_then_rejected,
    rejected_request_consumes_nothing,
    rejection_in_one_slot_consumes_nothing_in_another,
    cost_weights_consume_tokens,
    retry_after_is_accurate,
    keys_are_isolated,
    tokens_refill_over_time,
    peek_does_not_consume,
    state_expires_once_the_bucket_is_full,
    shadow_policy_never_blocks,
    concurrent_requests_never_overspend,
    quota_exhausted_rejects_until_window_end,
    rejection_by_bucket_consumes_no_quota,
    rejection_by_quota_consumes_no_tokens,
    new_window_starts_fresh,
    reset_and_give_back,
    peek_reports_quota_without_consuming,
    counters_expire_after_window,
    concurrent_requests_never_overspend_quota,
    fleet_scale_rates_are_exact,
);
