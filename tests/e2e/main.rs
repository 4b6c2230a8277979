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
// Zero-downtime binary upgrade: SIGUSR2 and `portcullis upgrade --pid` hand the sockets to a successor under an open-loop load, 0 failed requests; a failing successor changes nothing.
mod upgrade;
// Live reload of the configuration file: SIGHUP, admin endpoint, file watcher; nothing dropped, state carried over.
mod reload;
// WebSocket tunnels with the stock Python websockets library: echo, caps, idle, lifetime, drain.
mod websocket;
// The harness itself: real Redis, real PostgreSQL with migrations, gateway on both.
mod harness_services;
// The single retry layer: classification, safety ladder, Retry-After, endpoints, budget, breaker.
mod retry_classification;
// gRPC through the gateway (tonic on both sides): status ladder, grpc-timeout, refusals as grpc-status.
mod grpc;
// gRPC with stock grpcio client and server (Python scripts in grpcio/): every call kind, h2c and TLS upstreams, retries only where safe.
mod grpc_stock;
// Header rules on a route (request_headers / response_headers): upstream and client views, the gateway's fields protected.
mod routing_header_rules;
// Adaptive throttling: 429s teach a rate, refusals at the edge (503 upstream-throttled), recovery, shared through Redis.
mod adaptive;
// Circuit breaker at the edge: one caller's failures never open it for everyone; an outage seen by many does.
mod edge_breaker;
// Tenant resolution: API keys (hashed), 401 for unknown keys, live revocation.
mod tenant_resolution;
// Idempotency-Key through the binary: single execution, replay, outcome table, scoping.
mod idempotency_replay;
// Idempotency shares: one tenant filling the memory store leaves another's records replayable.
mod idempotency_shares;
// A keyed POST whose attempt timed out: 504 at once, 409 while the exchange runs on, then the real answer replayed; one execution.
mod idempotency_late_answers;
// Idempotency across processes: shared Redis/Postgres, crash and lease takeover, store down.
mod idempotency_shared;
// PostgreSQL idempotency store through the binary: pool size bounds connections, database restart.
mod idempotency_postgres_pool;
// Rate limiting: burst then 429, headers (draft t, violated-policies), cost, isolation, shadow, load shedding.
mod ratelimit_headers;
// Concurrency limits: a tenant's concurrency_limit and a route's concurrency_per_caller (429 concurrency-limited), priority shedding of normal routes first.
mod concurrency;
// Rate limiting shared through Redis: replicas, outage modes, recovery.
mod ratelimit_distributed;
// Batched rate limiting: 3 replicas leasing a global ceiling from Redis within the overshoot; leases returned on shutdown.
mod ratelimit_batched;
// State on a real Redis Cluster: shared limits, global ceiling refunds, replays, a master killed under load.
mod storage_redis_cluster;
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
// Admin console: CSP and security headers on its assets, not on the proxy port, and headless Chromium driving it (login, tenant, quota, keys, 429 chart).
mod console;
// Daily/monthly quotas: enforced until UTC midnight, reset and top-up via the admin API.
mod quota_periods;
// Edge TLS and HTTP/2 from clients: h2 + HTTP/1.1 headers, certificate rotation, admin certificate, h2 limits, smuggling.
mod tls_edge;
// Connections from hostile or careless clients: ALPN vs bytes, h2c off, silent connections, keep-alive, head deadlines, connection cap.
mod edge_connections;
// Fair in-flight: one tenant's stalled HTTP/2 streams or unread HTTP/1.1 responses leave other tenants served; stalled streams reset at send_timeout; memory per stalled stream bounded.
mod edge_fairness;
// Answers given before the body is read (413, 429, 401) reach clients that send the whole body first.
mod edge_early_answers;
// Request buffering: a trickled body that stops half-way gets 408 and never reaches the upstream.
mod edge_request_buffering;
// HTTPS upstreams: certificate errors never retried (502 naming the reason), CA bundles, mTLS, HTTP/2, handshake timeouts.
mod tls_upstream;
// The request target: path normalisation before routing, Host rules (RFC 9112 §3.2), HTTP/2 :authority.
mod edge_paths;
// Telemetry: W3C trace context (trusted peers only), OTLP span tree of a retried keyed POST, JSON access log, dashboard metric names.
mod telemetry;
// Hop-by-hop headers at the edge: Connection cannot name away the gateway's headers; oversized chunked body → 413.
mod edge_hop_by_hop;
// JWT tenants: RS256/ES256/EdDSA via a JWKS upstream, claim headers, key rotation, refresh rate limit, 401 invalid_token, quotas.
mod auth_jwt;
// Credentials and client identity end at the edge: unverified bearer tokens and client-address fields from untrusted peers never reach the backend; key guessing gets 429.
mod edge_credentials;
// Start-up and shutdown messages: errors naming the field and the path once, banner after the listeners, one log stream, drain lines naming the listener.
mod startup_messages;
// The README's and docs pages' `sh test` blocks, verbatim, against the embedded default on its default ports; their relative links resolve.
mod readme;
// CORS at the edge from headless Chromium: allowed and refused origins, preflights answered without reaching the upstream or charging the tenant.
mod cors;
// Rules over the repository's files: data-plane folders import only downward; sources cite only what the repository holds.
mod repository;
// docs/configuration.md documents exactly the fields the configuration parser accepts.
mod config_reference;
// TLS to Redis: rediss:// to a redis-server on its TLS port only, certificate from a test CA; limits and replays through it.
mod storage_redis_tls;
// deploy/kubernetes/ through scripts/check-kubernetes: ports, probes, config paths and the drain agree with the configuration; each rule catches its mistake.
mod kubernetes;
// Endpoint health: a killed endpoint ejected (no client errors, no retries to it), active checks down and up, /readyz and /admin/v1/upstreams.
mod upstream_health;
// Attempt timeouts are outlier failures: an endpoint that stalls is ejected after its consecutive timeouts.
mod outlier_timeouts;
// Load balancing: weighted round robin, least_request and peak_ewma sending less to a slow endpoint.
mod upstream_balance;
// Service discovery: endpoints_file rewritten without restart, host names re-resolved through a hosts file.
mod upstream_discovery;
// The plain HTTP/1.1 upstream pool: keep-alive reuse, connections the upstream closed never handed out, clients gone mid-body.
mod upstream_pool;
// Routing by host, method, headers and path (exact > pattern > prefix), 405, rewrite, per-route timeout, odd spellings.
mod routing;
// Inbound signatures (hmac-sha256, stripe, standard-webhooks): valid forwarded byte for byte; forged, stale, missing → 401, never forwarded, no rate-limit token spent.
mod inbound_signatures;
// /readyz over a private PostgreSQL: a read-only directory database and a stopped idempotency store each turn it 503 within 2 s, named.
mod readiness_postgres;
// Asynchronous routes on SQLite: 202 before delivery, dedupe, the retry schedule from the upstream's timestamps, dead letters, SIGKILL and restart.
mod async_delivery;
// deploy/prometheus/portcullis-alerts.yml passes `promtool check rules` (dead letters, oldest pending message).
mod alert_rules;
// Asynchronous routes on PostgreSQL (scripts/test.sh) and Redis (a private redis-server); a queue that goes away → 503.
mod async_delivery_engines;
// Asynchronous delivery under chaos: 10 000 messages, a 30 %-failing deduplicating backend, two SIGKILLs and a Redis restart: each executed once, only the built-to-fail dead.
mod async_delivery_chaos;
// The alert webhook of an asynchronous route: each dead letter POSTed without payload or credentials; a hung or unreachable webhook never holds up delivery, counted and logged.
mod async_delivery_alerts;
