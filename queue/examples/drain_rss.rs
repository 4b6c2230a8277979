//! Drains a backlog and prints the process's resident memory as it goes, to show that
//! leasing does not load the backlog (`bench/queue.sh` style, run by hand):
//!
//! ```text
//! cargo run --release -p portcullis-queue --example drain_rss -- URL BACKLOG
//! ```
//!
//! Enqueues BACKLOG messages (512-byte bodies, 16 at a time), then leases batches of 256 and
//! records each delivered, printing `drained=N rss_kib=R` every tenth of the backlog.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use futures_util::future::join_all;
use portcullis_queue::{connect, Attempt, AttemptOutcome, ConnectOptions, NewMessage};

fn rss_kib() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let url = args.first().expect("URL BACKLOG").clone();
    let backlog: u64 = args.get(1).expect("URL BACKLOG").parse().expect("BACKLOG");
    assert!((1..=10_000_000).contains(&backlog));
    let options = ConnectOptions {
        timeout: Duration::from_secs(30),
        pool_size: 16,
    };
    let queue = connect(&url, &options).await.expect("connect");
    let body = bytes::Bytes::from(vec![b'x'; 512]);
    let mut sent = 0;
    while sent < backlog {
        let n = (backlog - sent).min(16);
        let batch = (0..n).map(|_| {
            queue.enqueue(NewMessage {
                queue: "drain".into(),
                tenant: None,
                dedupe: None,
                method: "POST".into(),
                path_and_query: "/hook".into(),
                headers: vec![],
                body: body.clone(),
                delay: Duration::ZERO,
            })
        });
        for r in join_all(batch).await {
            r.expect("enqueue");
        }
        sent += n;
    }
    println!("enqueued={backlog} rss_kib={}", rss_kib());
    let step = (backlog / 10).max(1);
    let mut drained = 0u64;
    let mut next_report = step;
    // Bounded: every round drains at least one message or stops.
    for _ in 0..backlog + 1 {
        let leased = queue
            .lease("drain", 256, Duration::from_secs(60))
            .await
            .expect("lease");
        if leased.is_empty() {
            break;
        }
        let done = leased.iter().map(|l| {
            let attempt = Attempt {
                at_ms: 0,
                outcome: AttemptOutcome::Status(200),
                latency_ms: 1,
            };
            queue.delivered(&l.id, l.token, attempt)
        });
        for r in join_all(done).await {
            r.expect("delivered");
        }
        drained += leased.len() as u64;
        if drained >= next_report {
            println!("drained={drained} rss_kib={}", rss_kib());
            next_report += step;
        }
    }
    println!("drained={drained} rss_kib={} (end)", rss_kib());
}
