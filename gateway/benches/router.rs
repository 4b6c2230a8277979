//! What matching a request to its route costs among 1 000 routes, against today's linear
//! scan of 1 000 prefixes.
//!
//! | id | what |
//! |---|---|
//! | `linear/prefix-hit` | the old router: 1 000 prefixes sorted by length, scanned in order; a path whose prefix sorts last among equals |
//! | `linear/miss` | the same scan for a path no prefix matches (every prefix compared) |
//! | `indexed/prefix-hit` | the index: the same path among 1 000 mixed routes (hosts, prefixes, exact paths, patterns) |
//! | `indexed/pattern-hit` | `/api/svc997/42/items` → pattern `/api/svc997/{id}/items` |
//! | `indexed/exact-host-hit` | `h8.example.com` + `/api/svc998/status` → an exact path on an exact host |
//! | `indexed/wildcard-hit` | `x.example.com` + `/api/svc999/a/b` → a prefix on `*.example.com` (the exact host groups and wildcard suffixes tried first) |
//! | `indexed/miss` | a path no route matches (404): every host group and every segment boundary probed |
//!
//! The 1 000 routes: `i % 4` = 0 a prefix `/api/svc{i}` on any host; 1 a pattern
//! `/api/svc{i}/{id}/items`; 2 an exact `/api/svc{i}/status` on host `h{i % 10}.example.com`;
//! 3 a prefix `/api/svc{i}` on `*.example.com`. Before measuring, 10 000 lookups are run under
//! dhat's counting allocator and must allocate nothing.
//!
//! Run: `cargo bench -p portcullis-gateway --bench router -- --warm-up-time 1 --measurement-time 3`.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use http::{HeaderMap, Method};
use portcullis_gateway::config::Config;
use portcullis_gateway::router::{Lookup, RouteRequest, RouteTable};
use portcullis_retry::{BreakerConfig, BudgetConfig, UpstreamState};

// dhat's allocator passes straight through to the system allocator unless a profiler runs.
#[global_allocator]
static GLOBAL: dhat::Alloc = dhat::Alloc;

const ROUTES: usize = 1000;

fn table() -> RouteTable {
    let mut text =
        String::from("[[upstreams]]\nname = \"u\"\nendpoints = [\"http://127.0.0.1:9001\"]\n\n");
    for i in 0..ROUTES {
        let (path, hosts) = match i % 4 {
            0 => (format!("prefix = \"/api/svc{i}\""), String::new()),
            1 => (
                format!("pattern = \"/api/svc{i}/{{id}}/items\""),
                String::new(),
            ),
            2 => (
                format!("exact = \"/api/svc{i}/status\""),
                format!("hosts = [\"h{}.example.com\"]\n", i % 10),
            ),
            _ => (
                format!("prefix = \"/api/svc{i}\""),
                "hosts = [\"*.example.com\"]\n".to_owned(),
            ),
        };
        text.push_str(&format!(
            "[[routes]]\nname = \"r{i}\"\n{path}\n{hosts}upstream = \"u\"\n"
        ));
    }
    let config = Config::parse(&text, &HashMap::<String, String>::new()).unwrap();
    let dependency = Arc::new(UpstreamState::new(
        "u",
        1,
        false,
        BudgetConfig::default(),
        BreakerConfig::default(),
    ));
    RouteTable::new(&config.routes, &[dependency])
}

/// The router before this index: prefixes sorted longest first, the first that matches on a
/// segment boundary wins.
struct Linear {
    by_length: Vec<String>,
}

impl Linear {
    fn new() -> Self {
        let mut by_length: Vec<String> = (0..ROUTES).map(|i| format!("/api/svc{i}")).collect();
        by_length.sort_by_key(|p| std::cmp::Reverse(p.len()));
        Self { by_length }
    }

    fn find(&self, path: &str) -> Option<&str> {
        self.by_length
            .iter()
            .find(|prefix| match path.strip_prefix(prefix.as_str()) {
                Some(rest) => {
                    rest.is_empty()
                        || prefix.ends_with('/')
                        || rest.starts_with('/')
                        || rest.starts_with(';')
                }
                None => false,
            })
            .map(String::as_str)
    }
}

struct Case {
    id: &'static str,
    host: &'static str,
    path: &'static str,
    found: bool,
}

const CASES: &[Case] = &[
    Case {
        id: "prefix-hit",
        host: "127.0.0.1:8080",
        path: "/api/svc996/orders/123",
        found: true,
    },
    Case {
        id: "pattern-hit",
        host: "127.0.0.1:8080",
        path: "/api/svc997/42/items",
        found: true,
    },
    Case {
        id: "exact-host-hit",
        host: "h8.example.com",
        path: "/api/svc998/status",
        found: true,
    },
    Case {
        id: "wildcard-hit",
        host: "x.example.com",
        path: "/api/svc999/a/b",
        found: true,
    },
    Case {
        id: "miss",
        host: "h3.example.com",
        path: "/nothing/here/at/all",
        found: false,
    },
];

fn find<'t>(
    table: &'t RouteTable,
    method: &Method,
    headers: &HeaderMap,
    case: &Case,
) -> Lookup<'t> {
    table.find(&RouteRequest {
        method,
        authority: Some(case.host.as_bytes()),
        path: case.path,
        headers,
    })
}

fn bench(c: &mut Criterion) {
    let table = table();
    let linear = Linear::new();
    let method = Method::GET;
    let mut headers = HeaderMap::new();
    headers.insert("user-agent", "wrk".parse().unwrap());
    headers.insert("accept", "*/*".parse().unwrap());

    // Every case finds what it should, and no lookup allocates.
    for case in CASES {
        let hit = matches!(find(&table, &method, &headers, case), Lookup::Route(_));
        assert_eq!(hit, case.found, "{}", case.id);
    }
    assert_eq!(linear.find("/api/svc996/orders/123"), Some("/api/svc996"));
    {
        let _profiler = dhat::Profiler::builder().testing().build();
        let before = dhat::HeapStats::get().total_blocks;
        for _ in 0..2000 {
            for case in CASES {
                black_box(find(&table, &method, &headers, black_box(case)));
            }
        }
        let allocations = dhat::HeapStats::get().total_blocks - before;
        assert_eq!(allocations, 0, "route lookups allocated");
        println!("router: 10000 lookups, {allocations} allocations");
    }

    let mut group = c.benchmark_group("route");
    for (id, path) in [
        ("prefix-hit", "/api/svc996/orders/123"),
        ("miss", "/nothing/here/at/all"),
    ] {
        group.bench_function(BenchmarkId::new("linear", id), |b| {
            b.iter(|| linear.find(black_box(path)))
        });
    }
    for case in CASES {
        group.bench_function(BenchmarkId::new("indexed", case.id), |b| {
            b.iter(|| {
                matches!(
                    find(&table, &method, &headers, black_box(case)),
                    Lookup::Route(_)
                )
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
