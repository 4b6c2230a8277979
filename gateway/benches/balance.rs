//! What picking an endpoint costs per attempt, against a naive baseline.
//!
//! | id | what |
//! |---|---|
//! | `pick/mutex_swrr/N` | baseline: nginx's smooth weighted round robin under a `Mutex` (nginx's own shape, a lock per pick) |
//! | `pick/round_robin/N` | the precomputed smooth weighted schedule: one `fetch_add` and an index |
//! | `pick/least_request/N` | two random choices by in-flight per weight |
//! | `pick/peak_ewma/N` | two random choices by decayed latency × (in-flight + 1) per weight (one clock read) |
//! | `pick/round_robin_avoid/N` | round robin with the retry layer's avoid hint hit a third of the time |
//!
//! N endpoints with weights 1, 2, 3 …, all healthy, single thread, fixed RNG seed (42).
//!
//! Run: `cargo bench -p portcullis-gateway --bench balance -- --warm-up-time 1 --measurement-time 3`.
//!
//! Measured (2-core VM shared with other builds, commit of this file), ns per pick for
//! N = 3 / 16 / 100: mutex_swrr 15 / 62 / 294; round_robin 11 / 9 / 11; round_robin_avoid
//! 15 / 12; least_request 65 / 45; peak_ewma 158 / 137. Benches build with the
//! dev-dependencies' tokio `test-util`, whose `Instant::now` consults the pausable clock
//! under a lock: peak_ewma's one clock read costs more here than in the binary.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::hint::black_box;
use std::sync::Mutex;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use portcullis_gateway::BenchBalance;

/// nginx's algorithm as written: all current weights under one lock.
struct MutexSwrr {
    state: Mutex<Vec<(i64, i64)>>,
}

impl MutexSwrr {
    fn new(n: usize) -> Self {
        Self {
            state: Mutex::new((0..n).map(|i| ((i % 3) as i64 + 1, 0)).collect()),
        }
    }

    fn pick(&self) -> usize {
        let mut state = self.state.lock().unwrap();
        let total: i64 = state.iter().map(|(w, _)| w).sum();
        let mut best = 0;
        for i in 0..state.len() {
            state[i].1 += state[i].0;
            if state[i].1 > state[best].1 {
                best = i;
            }
        }
        state[best].1 -= total;
        best
    }
}

fn pick(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let mut group = c.benchmark_group("pick");
    for n in [3u16, 16, 100] {
        let baseline = MutexSwrr::new(usize::from(n));
        group.bench_function(BenchmarkId::new("mutex_swrr", n), |b| {
            b.iter(|| black_box(baseline.pick()))
        });
        for kind in ["round_robin", "least_request", "peak_ewma"] {
            let set = BenchBalance::new(kind, n);
            group.bench_function(BenchmarkId::new(kind, n), |b| {
                b.iter(|| black_box(set.pick(None)))
            });
        }
        let set = BenchBalance::new("round_robin", n);
        let avoid = set.pick(None);
        group.bench_function(BenchmarkId::new("round_robin_avoid", n), |b| {
            let mut i = 0u32;
            b.iter(|| {
                i = i.wrapping_add(1);
                black_box(set.pick(i.is_multiple_of(3).then_some(avoid)))
            })
        });
    }
    group.finish();
}

criterion_group!(benches, pick);
criterion_main!(benches);
