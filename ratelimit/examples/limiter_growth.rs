//! Cost growth of the local limiter as tenants grow: decision time and resident memory for
//! 1, 1 000, 10 000 and 100 000 tenants, each with its own bucket, checked in random order.
//!
//! `cargo run --release -p portcullis-ratelimit --example limiter_growth`
//!
//! Numbers go to BENCHMARKS.md ("Cost growth"). This is a measurement, not a test: it asserts
//! nothing and prints one line per size.
#![allow(
    clippy::disallowed_types,
    clippy::disallowed_methods,
    clippy::unwrap_used,
    missing_docs
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use portcullis_ratelimit::{Check, LimitKey, Limiter, LocalLimiter, Policy};
use rand::{Rng, SeedableRng};

const DECISIONS: usize = 2_000_000;

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .map(str::to_owned)
        })
        .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    // A slow refill keeps every bucket below full, so none is swept and each tenant really
    // occupies the table (a full bucket is dropped: it carries no information).
    let policy = Arc::new(Policy::try_new("tenant", 1, Duration::from_secs(1), 1_000).unwrap());
    println!("| tenants | ns per decision | RSS (MiB) | tracked keys |");
    println!("|---:|---:|---:|---:|");
    for tenants in [1usize, 1_000, 10_000, 100_000] {
        let limiter = LocalLimiter::new();
        let keys: Vec<LimitKey> = (0..tenants)
            .map(|t| LimitKey::tenant(&format!("tenant-{t}")))
            .collect();
        let before = rss_kib();
        let mut rng = rand::rngs::StdRng::seed_from_u64(42);
        // Touch every tenant once so the table holds them all, then measure steady state.
        for key in &keys {
            let check = [Check {
                key: key.clone(),
                policy: policy.clone(),
                cost: 1,
            }];
            limiter.check(&check).await.unwrap();
        }
        let started = Instant::now();
        for _ in 0..DECISIONS {
            let key = &keys[rng.gen_range(0..tenants)];
            let check = [Check {
                key: key.clone(),
                policy: policy.clone(),
                cost: 1,
            }];
            limiter.check(&check).await.unwrap();
        }
        let per = started.elapsed().as_nanos() as f64 / DECISIONS as f64;
        let grown = rss_kib().saturating_sub(before);
        println!(
            "| {tenants} | {per:.0} | {:.1} | {} |",
            grown as f64 / 1024.0,
            limiter.len()
        );
    }
}
