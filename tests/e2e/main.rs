//! End-to-end tests: the real `portcullis` binary, real Redis and PostgreSQL (started by
//! `scripts/test.sh`), and scripted upstreams, all over real sockets on loopback.

// Test code: a failed step should panic with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

// Proxying: methods, bodies, streaming, forwarded and hop-by-hop headers, request ids.
mod proxy_basics;
// Gateway-generated errors as problem+json (404, 413, 431, 502, 504, 400) and staying up.
mod bad_input;
// Invalid configuration refuses to start and names the field; check-config redacts secrets.
mod config_errors;
// SIGTERM drains in-flight requests; readiness flips first.
mod shutdown;
// The harness itself: real Redis, real PostgreSQL with migrations, gateway on both.
mod harness_services;
// The single retry layer: classification, safety ladder, Retry-After, endpoints, budget, breaker.
mod retry_classification;
// Tenant resolution: API keys (hashed), 401 for unknown keys, live revocation.
mod tenant_resolution;
// Idempotency-Key through the binary: single execution, replay, outcome table, scoping.
mod idempotency_replay;
// Idempotency across processes: shared Redis/Postgres, crash and lease takeover, store down.
mod idempotency_shared;
// Rate limiting: burst then 429, headers, cost, isolation, shadow, load shedding.
mod ratelimit_headers;
// Rate limiting shared through Redis: replicas, outage modes, recovery.
mod ratelimit_distributed;
// Hostile clients: slow heads, slow bodies, malformed HTTP.
mod chaos_clients;
// Stores failing under load: Redis paused/killed, PostgreSQL restarted.
mod chaos_stores;
// 10 000 keyed POSTs × 5 duplicates through faults and restarts: zero duplicate executions.
mod chaos_dedupe;
// scripts/cluster: 3 replicas + Redis + PostgreSQL + demo upstream as local processes.
mod cluster_script;
// Admin API: tenants/keys/quotas CRUD, auth, audit log, revocation and quota changes reaching replicas within 1 s, CLI.
mod admin_api;
// Daily/monthly quotas: enforced until UTC midnight, reset and top-up via the admin API.
mod quota_periods;
// Edge TLS and HTTP/2 from clients: h2 + HTTP/1.1 headers, certificate rotation, admin certificate, h2 limits, smuggling.
mod tls_edge;
// HTTPS upstreams: certificate errors never retried (502 naming the reason), CA bundles, mTLS, HTTP/2, handshake timeouts.
mod tls_upstream;
// Hop-by-hop headers at the edge: Connection cannot name away the gateway's headers; oversized chunked body → 413.
mod edge_hop_by_hop;
