//! Enqueue load for `bench/queue.sh`: CLIENTS tasks call `Queue::enqueue` back to back for
//! SECONDS (each waits for its answer: a closed loop), then it prints the count and the rate.
//!
//! ```text
//! cargo run --release -p portcullis-queue --example enqueue_load -- URL CLIENTS SECONDS BODY [dedupe]
//! ```
//!
//! URL is any `storage.queue` URL; BODY is the body size in bytes; `dedupe` gives every
//! message a unique dedupe key (the dedupe record is then written in the same step).
//! Output, one line: `enqueued=N seconds=S rate=R errors=E`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use portcullis_queue::{connect, ConnectOptions, Dedupe, NewMessage};
use tokio::time::Instant;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: enqueue_load URL CLIENTS SECONDS BODY_BYTES [dedupe]";
    let url = args.first().expect(usage).clone();
    let clients: u32 = args.get(1).expect(usage).parse().expect("CLIENTS");
    let seconds: u64 = args.get(2).expect(usage).parse().expect("SECONDS");
    let body: usize = args.get(3).expect(usage).parse().expect("BODY_BYTES");
    let dedupe = args.get(4).is_some_and(|a| a == "dedupe");
    assert!(
        (1..=1024).contains(&clients) && (1..=600).contains(&seconds),
        "{usage}"
    );

    let options = ConnectOptions {
        timeout: Duration::from_secs(10),
        pool_size: clients,
    };
    let queue = connect(&url, &options).await.expect("connect");
    let body = bytes::Bytes::from(vec![b'x'; body]);
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + Duration::from_secs(seconds);
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let (queue, body, done, errors) =
                (queue.clone(), body.clone(), done.clone(), errors.clone());
            tokio::spawn(async move {
                let mut n = 0u64;
                while Instant::now() < deadline {
                    n += 1;
                    let message = NewMessage {
                        queue: "bench".into(),
                        tenant: Some("bench".into()),
                        dedupe: dedupe.then(|| Dedupe {
                            key: format!("{c}-{n}-{:x}", rand::random::<u64>()),
                            window: Duration::from_secs(3600),
                        }),
                        method: "POST".into(),
                        path_and_query: "/hooks/in".into(),
                        headers: vec![(b"content-type".to_vec(), b"application/json".to_vec())],
                        body: body.clone(),
                        delay: Duration::ZERO,
                    };
                    match queue.enqueue(message).await {
                        Ok(_) => done.fetch_add(1, Ordering::Relaxed),
                        Err(_) => errors.fetch_add(1, Ordering::Relaxed),
                    };
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("task");
    }
    let secs = start.elapsed().as_secs_f64();
    let n = done.load(Ordering::Relaxed);
    println!(
        "enqueued={n} seconds={secs:.2} rate={:.0} errors={}",
        n as f64 / secs,
        errors.load(Ordering::Relaxed)
    );
}
