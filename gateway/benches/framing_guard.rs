//! What the request-smuggling guard adds to reading a connection, per request.
//!
//! | id | what |
//! |---|---|
//! | `read/direct` | a pipelined stream of requests read straight from memory (the baseline) |
//! | `read/guarded` | the same stream through `FramingGuard`: every head parsed, bodies followed |
//!
//! The stream is 64 requests like the load scenario's (a GET with wrk's headers, a keyed
//! POST with a 64-byte Content-Length body, a 64-byte chunked POST), read through an 8 KiB
//! buffer as hyper reads. Per-request cost = time per iteration / 64.
//!
//! Run: `cargo bench -p portcullis-gateway --bench framing_guard -- --warm-up-time 1 --measurement-time 3`.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use futures_util::FutureExt;
use portcullis_gateway::edge::framing::FramingGuard;
use tokio::io::{AsyncRead, AsyncReadExt};

const REQUESTS: usize = 64;

fn stream() -> Vec<u8> {
    let body = "x".repeat(64);
    let get = "GET /api/orders/123 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: wrk\r\nAccept: */*\r\nX-API-Key: acme-key-0001\r\n\r\n".to_owned();
    let post = format!("POST /api/orders HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nContent-Type: application/json\r\nIdempotency-Key: 6f1c2a9e-3b7d-4e0f-9a51-0c8d2e4b7f13\r\nX-API-Key: acme-key-0001\r\nContent-Length: 64\r\n\r\n{body}");
    let chunked = format!("POST /api/orders HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nTransfer-Encoding: chunked\r\n\r\n40\r\n{body}\r\n0\r\n\r\n");
    [get, post, chunked]
        .iter()
        .cycle()
        .take(REQUESTS)
        .flat_map(|r| r.bytes())
        .collect()
}

/// Reads everything from `reader` through an 8 KiB buffer; the bytes read.
fn drain(mut reader: impl AsyncRead + Unpin) -> usize {
    let mut buf = vec![0u8; 8192];
    let mut total = 0;
    loop {
        let n = reader
            .read(&mut buf)
            .now_or_never()
            .expect("memory never blocks")
            .unwrap();
        if n == 0 {
            return total;
        }
        black_box(&buf[..n]);
        total += n;
    }
}

fn bench(c: &mut Criterion) {
    let bytes = stream();
    let mut group = c.benchmark_group("read");
    group.throughput(Throughput::Elements(REQUESTS as u64));
    group.bench_function("direct", |b| {
        b.iter(|| {
            let read = drain(black_box(&bytes[..]));
            assert_eq!(read, bytes.len());
            read
        })
    });
    group.bench_function("guarded", |b| {
        b.iter(|| {
            let read = drain(FramingGuard::new(
                black_box(&bytes[..]),
                64 * 1024,
                portcullis_gateway::edge::listener::Activity::new(),
            ));
            assert_eq!(read, bytes.len());
            read
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
