//! Local decision cost, uncontended and with 2 threads, against a `Mutex<HashMap>` baseline.
//!
//! | id | what |
//! |---|---|
//! | `local/1 key` | one hot key: hash + lock + GCRA + write, through the async trait |
//! | `local/2 keys` | two buckets, all-or-nothing (the multi-check path: two locks) |
//! | `local/1 key + daily quota` | a bucket and a calendar quota, all-or-nothing (the same path, plus a wall-clock read and the window arithmetic) |
//! | `local/1M keys` | random keys out of 1 000 000 (cache misses dominate) |
//! | `local/1M keys, 2 threads` | same, two threads at once (time per decision per thread) |
//! | `mutex_hashmap/…` | one `Mutex<HashMap<String, u64>>`, same GCRA arithmetic |
//!
//! Run: `cargo bench -p portcullis-ratelimit -- --warm-up-time 1 --measurement-time 3`.
//! Goal: ≤ 100 ns per uncontended decision. Fixed seed (42) so runs compare.

// Benchmarks measure wall time by definition; the workspace ban on std::time::Instant is for
// library code, which must use an injected clock.
#![allow(
    clippy::disallowed_methods,
    clippy::disallowed_types,
    clippy::unwrap_used,
    missing_docs
)]

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use futures_util::FutureExt;
use portcullis_ratelimit::gcra::Gcra;
use portcullis_ratelimit::{
    Check, LimitKey, Limiter, LocalLimiter, LocalLimiterConfig, Period, Policy, Principal,
    SystemClock,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const SEED: u64 = 42;
const KEYS: usize = 1_000_000;

fn policy() -> Arc<Policy> {
    // Fast enough that most decisions admit and write, like a healthy tenant.
    Arc::new(Policy::try_new("tenant", 1_000_000, Duration::from_secs(1), 1_000_000).unwrap())
}

fn keys() -> Vec<LimitKey> {
    let mut rng = StdRng::seed_from_u64(SEED);
    (0..KEYS)
        .map(|_| LimitKey::ip(std::net::Ipv4Addr::from(rng.gen::<u32>()).into()))
        .collect()
}

fn limiter() -> LocalLimiter {
    let config = LocalLimiterConfig {
        max_keys: 2 * KEYS,
        ..LocalLimiterConfig::default()
    };
    LocalLimiter::with_config(config, Arc::new(SystemClock))
}

fn decide(limiter: &LocalLimiter, check: &[Check]) -> bool {
    // The local limiter never awaits: the future completes on first poll.
    matches!(limiter.check(check).now_or_never(), Some(Ok(v)) if v.is_allowed())
}

/// The naive baseline: one map, one lock, same arithmetic, same clock source.
struct Baseline {
    map: Mutex<HashMap<String, u64>>,
    origin: Instant,
}

impl Baseline {
    fn new() -> Self {
        Self {
            map: Mutex::new(HashMap::new()),
            origin: Instant::now(),
        }
    }

    fn decide(&self, key: &LimitKey, policy: &Policy) -> bool {
        let now = self.origin.elapsed().as_nanos() as u64;
        let gcra = Gcra::new(policy.interval_nanos(), policy.burst());
        let mut map = self.map.lock().unwrap();
        let stored = map.get(key.as_str()).copied();
        let e = gcra.evaluate(stored, now, 1);
        if e.allowed {
            match map.get_mut(key.as_str()) {
                Some(tat) => *tat = e.new_tat,
                None => {
                    map.insert(key.as_str().to_owned(), e.new_tat);
                }
            }
        }
        e.allowed
    }
}

fn checks_for(keys: &[LimitKey], policy: &Arc<Policy>) -> Vec<[Check; 1]> {
    keys.iter()
        .map(|k| {
            [Check {
                key: k.clone(),
                policy: policy.clone(),
                cost: 1,
            }]
        })
        .collect()
}

/// Runs `iters` operations on each of `threads` threads; returns the wall time.
fn threaded(threads: usize, iters: u64, op: impl Fn(usize, u64) + Sync) -> Duration {
    let barrier = Barrier::new(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (barrier, op) = (&barrier, &op);
                s.spawn(move || {
                    barrier.wait();
                    let start = Instant::now();
                    for i in 0..iters {
                        op(t, i);
                    }
                    start.elapsed()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .max()
            .unwrap_or_default()
    })
}

fn bench(c: &mut Criterion) {
    let policy = policy();
    let keys = keys();
    let checks = checks_for(&keys, &policy);
    let mut rng = StdRng::seed_from_u64(SEED);
    let order: Vec<usize> = (0..KEYS).map(|_| rng.gen_range(0..KEYS)).collect();
    let pick = |t: usize, i: u64| order[(i as usize).wrapping_mul(2).wrapping_add(t) % KEYS];

    let mut group = c.benchmark_group("decision");

    let local = limiter();
    group.bench_function(BenchmarkId::new("local", "1 key"), |b| {
        b.iter(|| black_box(decide(&local, &checks[0])))
    });
    let daily = Arc::new(Policy::calendar("daily_quota", 1 << 40, Period::Day).unwrap());
    let with_quota = [
        checks[0][0].clone(),
        Check {
            key: LimitKey::period(Principal::Tenant("bench"), Period::Day),
            policy: daily,
            cost: 1,
        },
    ];
    let two_buckets = [checks[0][0].clone(), checks[1][0].clone()];
    group.bench_function(BenchmarkId::new("local", "2 keys"), |b| {
        b.iter(|| black_box(decide(&local, &two_buckets)))
    });
    group.bench_function(BenchmarkId::new("local", "1 key + daily quota"), |b| {
        b.iter(|| black_box(decide(&local, &with_quota)))
    });
    let baseline = Baseline::new();
    group.bench_function(BenchmarkId::new("mutex_hashmap", "1 key"), |b| {
        b.iter(|| black_box(baseline.decide(&keys[0], &policy)))
    });

    let local = limiter();
    group.bench_function(BenchmarkId::new("local", "1M keys"), |b| {
        b.iter_custom(|iters| {
            threaded(1, iters, |t, i| {
                black_box(decide(&local, &checks[pick(t, i)]));
            })
        })
    });
    let baseline = Baseline::new();
    group.bench_function(BenchmarkId::new("mutex_hashmap", "1M keys"), |b| {
        b.iter_custom(|iters| {
            threaded(1, iters, |t, i| {
                black_box(baseline.decide(&keys[pick(t, i)], &policy));
            })
        })
    });

    group.bench_function(BenchmarkId::new("local", "1M keys, 2 threads"), |b| {
        b.iter_custom(|iters| {
            threaded(2, iters, |t, i| {
                black_box(decide(&local, &checks[pick(t, i)]));
            })
        })
    });
    group.bench_function(
        BenchmarkId::new("mutex_hashmap", "1M keys, 2 threads"),
        |b| {
            b.iter_custom(|iters| {
                threaded(2, iters, |t, i| {
                    black_box(baseline.decide(&keys[pick(t, i)], &policy));
                })
            })
        },
    );
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
