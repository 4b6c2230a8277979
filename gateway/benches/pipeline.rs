//! The request path in process: every layer of the assembled stack around an in-memory
//! upstream (no sockets, no pooled client), per request. Beside time, it counts heap
//! allocations per request (dhat's counting allocator): a number that does not move
//! with machine noise, for before/after comparisons of hot-path changes.
//!
//! | id | what (configurations as `bench/run.sh`'s) |
//! |---|---|
//! | `request/pass` | GET through a route with no policy |
//! | `request/rl` | GET of a tenant, tenant bucket + global ceiling (never rejected) |
//! | `request/keyed` | keyed POST, memory idempotency store, every key new |
//! | `request/rl-keyed` | the same with the tenant bucket and global ceiling |
//!
//! Run: `cargo bench -p portcullis-gateway --bench pipeline -- --warm-up-time 1 --measurement-time 3`.
//! The allocation counts are printed first (`allocations/request`); `PIPELINE_DHAT=<id>`
//! also writes that scenario's allocation sites to `dhat-heap.json` (dhat's viewer, or
//! any JSON tool, shows where they come from).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::HashMap;

use axum::body::Body;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use http::Request;
use http_body_util::BodyExt;
use portcullis_gateway::config::Config;
use portcullis_gateway::edge::listener::HttpService;
use tower::ServiceExt;

// dhat's allocator passes straight through to the system allocator unless a profiler runs;
// one runs only while allocations are counted, before the timings.
#[global_allocator]
static GLOBAL: dhat::Alloc = dhat::Alloc;

const KEY: &str = "pc-bench-0123456789abcdef";

fn config(rate_limit: bool, idempotency: bool) -> Config {
    let mut text = String::from(
        "[server]\nmax_in_flight = 100000\n\n[storage]\nmemory_max_bytes = 67108864\n\n",
    );
    if rate_limit {
        text.push_str(&format!(
            "[rate_limit]\nglobal = {{ rate = 1000000, per = \"1s\", burst = 1000000 }}\n\n\
             [[tenants]]\nid = \"bench\"\napi_keys = [\"{KEY}\"]\nrate = 1000000\nper = \"1s\"\nburst = 1000000\n\n"
        ));
    }
    text.push_str("[[upstreams]]\nname = \"backend\"\nendpoints = [\"http://127.0.0.1:9\"]\n\n");
    text.push_str("[[routes]]\nprefix = \"/\"\nupstream = \"backend\"\n");
    if idempotency {
        text.push_str("idempotency = { methods = [\"POST\", \"PATCH\"] }\n");
    }
    Config::parse(&text, &HashMap::<String, String>::new()).unwrap()
}

fn request(keyed: Option<u64>, tenant: bool) -> Request<Body> {
    let mut builder = Request::builder()
        .uri("/api/orders/123")
        .header("host", "127.0.0.1:8080")
        .header("user-agent", "wrk")
        .header("accept", "*/*");
    if tenant {
        builder = builder.header("authorization", format!("Bearer {KEY}"));
    }
    match keyed {
        None => builder.body(Body::empty()).unwrap(),
        Some(n) => builder
            .method("POST")
            .header("content-type", "application/json")
            .header("idempotency-key", format!("bench-key-{n:016}"))
            .header("content-length", "64")
            .body(Body::from(vec![b'x'; 64]))
            .unwrap(),
    }
}

async fn one(service: &HttpService, request: Request<Body>) {
    let response = service.clone().oneshot(request).await.unwrap();
    assert!(response.status().is_success(), "{}", response.status());
    let _ = response.into_body().collect().await.unwrap();
}

fn bench(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let scenarios: [(&str, bool, bool); 4] = [
        ("pass", false, false),
        ("rl", true, false),
        ("keyed", false, true),
        ("rl-keyed", true, true),
    ];
    let mut group = c.benchmark_group("request");
    group.throughput(Throughput::Elements(1));
    for (name, rate_limit, keyed) in scenarios {
        let scenario_dir = dir.path().join(name);
        std::fs::create_dir_all(&scenario_dir).unwrap();
        let service = runtime
            .block_on(portcullis_gateway::bench_pipeline(
                &config(rate_limit, keyed),
                &scenario_dir,
            ))
            .unwrap();
        let mut n = 0u64;
        let mut next = || {
            n += 1;
            request(keyed.then_some(n), rate_limit)
        };
        // Allocations per request, requests built outside the count.
        runtime.block_on(async {
            for _ in 0..100 {
                one(&service, next()).await;
            }
            let requests: Vec<_> = (0..1000).map(|_| next()).collect();
            // `PIPELINE_DHAT=<id>` writes that scenario's allocation sites to dhat-heap.json.
            let sites = std::env::var("PIPELINE_DHAT").is_ok_and(|id| id == name);
            let profiler = if sites {
                dhat::Profiler::builder().trim_backtraces(Some(12)).build()
            } else {
                dhat::Profiler::builder().testing().build()
            };
            let before = dhat::HeapStats::get().total_blocks;
            for request in requests {
                one(&service, request).await;
            }
            let per = (dhat::HeapStats::get().total_blocks - before) as f64 / 1000.0;
            drop(profiler);
            println!("allocations/request {name}: {per:.1}");
        });
        group.bench_function(name, |b| {
            b.to_async(&runtime).iter_batched(
                &mut next,
                |request| one(&service, request),
                criterion::BatchSize::SmallInput,
            )
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
