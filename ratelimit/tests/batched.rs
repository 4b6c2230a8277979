//! Three gateway replicas in batched mode sharing one real Redis (`PORTCULLIS_TEST_REDIS_URL`,
//! exported by `scripts/test.sh`): each is its own [`RedisLimiter`] (own connection) wrapped
//! in a [`BatchedLimiter`] configured for 3 replicas. Driven far beyond a global bucket's
//! limit, the fleet admits no more than the advertised bound and no less than the leases
//! explain, with far fewer scripts run than requests decided.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use portcullis_ratelimit::{
    BatchedConfig, BatchedLimiter, Check, LimitKey, Limiter, Policy, RedisLimiter,
    RedisLimiterConfig,
};
use portcullis_redis::{ConnectOptions, RedisClient, RedisConnection};

const REPLICAS: u32 = 3;
const MAX_OVERSHOOT: f64 = 0.05;
const RATE: u64 = 5_000; // per second
const BURST: u64 = 20_000;
const BELOW: u64 = 5_000; // requests per replica in phase 1 (3/4 of the burst in all)
const OVER: u64 = 15_000; // then per replica in phase 2 (2.25× the burst in all)

/// Every replica decides `n` requests concurrently with the others; the number admitted.
async fn drive(replicas: &[Arc<BatchedLimiter>], check: &Check, n: u64) -> u64 {
    let mut tasks = tokio::task::JoinSet::new();
    for replica in replicas {
        let (replica, check) = (replica.clone(), check.clone());
        tasks.spawn(async move {
            let mut admitted = 0u64;
            for _ in 0..n {
                let verdict = replica.check(std::slice::from_ref(&check)).await.unwrap();
                admitted += u64::from(verdict.is_allowed());
            }
            admitted
        });
    }
    let mut admitted = 0;
    while let Some(n) = tasks.join_next().await {
        admitted += n.unwrap();
    }
    admitted
}

/// Redis server time in microseconds: the clock the buckets refill on.
async fn server_micros(conn: &mut RedisConnection) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(conn).await.unwrap();
    secs * 1_000_000 + micros
}

/// Scripts run so far (`EVALSHA` + `EVAL`), from `INFO commandstats`.
async fn scripts_run(conn: &mut RedisConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_stay_within_the_advertised_bound() {
    let url = std::env::var("PORTCULLIS_TEST_REDIS_URL")
        .expect("PORTCULLIS_TEST_REDIS_URL is not set (scripts/test.sh exports it)");
    let prefix = format!("test:{:016x}:", rand::random::<u64>());
    let mut conn = RedisClient::single(&url, &ConnectOptions::with_timeout(Duration::from_secs(2)))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let policy = Arc::new(Policy::try_new("global", RATE, Duration::from_secs(1), BURST).unwrap());
    let check = Check {
        key: LimitKey::global(),
        policy,
        cost: 1,
    };
    let replicas: Vec<Arc<BatchedLimiter>> = (0..REPLICAS)
        .map(|_| {
            let store = RedisLimiter::open(
                &url,
                RedisLimiterConfig {
                    timeout: Duration::from_secs(2),
                    key_prefix: prefix.clone(),
                },
            )
            .unwrap();
            let config = BatchedConfig {
                max_overshoot: MAX_OVERSHOOT,
                replicas: REPLICAS,
                ..BatchedConfig::default()
            };
            Arc::new(BatchedLimiter::new(Arc::new(store), config).unwrap())
        })
        .collect();
    let lease = (MAX_OVERSHOOT * BURST as f64 / f64::from(REPLICAS)) as u64;

    let started = server_micros(&mut conn).await;
    // Phase 1, far below the limit: 3 × 5 000 requests fit in the burst; admitted from
    // leases of 333, so about 45 scripts instead of 15 000.
    let scripts_before = scripts_run(&mut conn).await;
    let first = drive(&replicas, &check, BELOW).await;
    let scripts = scripts_run(&mut conn).await - scripts_before;
    let decided = u64::from(REPLICAS) * BELOW;
    assert_eq!(first, decided, "below the limit everything is admitted");
    assert!(
        scripts * 20 < decided,
        "{scripts} scripts for {decided} decisions"
    );
    // Phase 2, far over it: 3 × 15 000 more. Near its limit the bucket never holds a lease's
    // worth, so replicas decide exactly there (one script per decision, as exact mode).
    let second = drive(&replicas, &check, OVER).await;
    let elapsed_micros = server_micros(&mut conn).await - started;
    let admitted = first + second;

    // Upper bound: GCRA's burst + rate × elapsed, plus the overshoot budget (5 % of the
    // burst, shared by the three replicas' leases). Elapsed time is an input here, read
    // from the server clock the bucket runs on, never asserted.
    let refill = RATE * elapsed_micros / 1_000_000 + 1;
    let bound = (BURST as f64 * (1.0 + MAX_OVERSHOOT)) as u64 + refill;
    eprintln!(
        "admitted {admitted} in {elapsed_micros} µs (bound {bound}); phase 1: {scripts} scripts"
    );
    assert!(admitted <= bound, "admitted {admitted} > bound {bound}");
    // Lower bound: demand (3.25× the burst) exceeds the burst, so at least the burst was
    // admitted, less what the leases may still hold unspent.
    let leased: u64 = replicas.iter().map(|r| r.leased_tokens()).sum();
    assert!(leased <= u64::from(REPLICAS) * lease);
    assert!(
        admitted + u64::from(REPLICAS) * lease >= BURST,
        "admitted {admitted}: under-admission beyond the leases"
    );
    for replica in &replicas {
        replica.release().await;
    }
}
