//! Stage two: range and cross-reference checks, producing the runtime types.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

use super::backend::{DatabaseBackend, IdempotencyBackend, QueueBackend, StateBackend};
use super::bucket::bucket;
use super::error::ConfigError;
use super::error::Issues;
use super::raw::{self, RawBucket, RawConfig};
use super::routes::MAX_WEBSOCKETS;
use super::settings::*;
use super::upstream::{upstream, valid_id};
use portcullis_control::ENV_ADMIN_TOKEN;

/// Largest `server.critical_reserve`: normal requests always keep a tenth of the cap.
pub const MAX_CRITICAL_RESERVE: f64 = 0.9;

pub(super) fn validate(mut raw: RawConfig, env: &dyn Env) -> Result<Config, ConfigError> {
    let mut issues = Issues::default();
    let (renamed, both) = raw::renamed::apply(&mut raw);
    for clash in both {
        issues.push(
            clash.old,
            format!(
                "is the old name of {}, which is set too: keep only {}",
                clash.new, clash.new
            ),
        );
    }

    let server = server(&raw.server, &mut issues);
    let storage = storage(&raw.storage, &mut issues);
    let rate_limit = rate_limit(&raw.rate_limit, &mut issues);
    let tenants = tenants(&raw.tenants, &mut issues);
    let upstreams: Vec<UpstreamSettings> = raw
        .upstreams
        .iter()
        .enumerate()
        .map(|(i, u)| upstream(&format!("upstreams[{i}]"), u, &mut issues))
        .collect();
    let mut names = HashSet::new();
    for (i, u) in raw.upstreams.iter().enumerate() {
        if !names.insert(u.name.as_str()) {
            issues.push(
                format!("upstreams[{i}].name"),
                format!("= {:?}: duplicate upstream name", u.name),
            );
        }
    }
    let routes = super::routes::routes(&raw, &upstreams, env, &mut issues);
    // A tenant's own signature secret names a route that checks signatures.
    for (i, tenant) in raw.tenants.iter().enumerate() {
        for route in tenant.signature_secrets.keys() {
            let checks = routes
                .iter()
                .any(|r| &r.name == route && r.verify.is_some());
            if !checks {
                issues.push(
                    format!("tenants[{i}].signature_secrets.{route}"),
                    format!("no route named {route:?} with verify"),
                );
            }
        }
    }
    let auth = super::auth::auth(&raw.auth, &mut issues);
    let demo = DemoSettings {
        enabled: raw.demo.enabled,
        listen: socket_addr("demo.listen", &raw.demo.listen, &mut issues),
    };
    let telemetry = super::telemetry::validate(&raw.telemetry, &mut issues);
    let admin_token = env
        .get(ENV_ADMIN_TOKEN)
        .filter(|t| !t.is_empty())
        .map(|t| Secret::new(&t));
    if let Some(token) = &admin_token {
        if token.expose().len() < 16 {
            issues.push(ENV_ADMIN_TOKEN, "is too short: use at least 16 characters");
        }
    }

    // A request costing more than a bucket can ever hold would be refused forever.
    for (i, route) in routes.iter().enumerate() {
        let cost = u64::from(route.cost);
        let mut buckets: Vec<(String, u64)> = Vec::new();
        // Shadow policies never reject, so they cannot lock a route out.
        let enforced = |b: &Bucket| !b.shadow;
        buckets.extend(
            rate_limit
                .anonymous
                .filter(enforced)
                .map(|b| ("rate_limit.anonymous.burst".to_owned(), b.burst)),
        );
        buckets.extend(
            rate_limit
                .global
                .filter(enforced)
                .map(|b| ("rate_limit.global.burst".to_owned(), b.burst)),
        );
        buckets.extend(
            route
                .limit
                .filter(enforced)
                .map(|b| (format!("routes[{i}].limit.burst"), b.burst)),
        );
        for (t, tenant) in tenants.iter().enumerate() {
            buckets.push((format!("tenants[{t}].burst"), tenant.bucket.burst));
        }
        if let Some((field, burst)) = buckets.into_iter().find(|(_, burst)| cost > *burst) {
            issues.push(format!("routes[{i}].cost"), format!("= {cost}: must not exceed {field} ({burst}), or no request could ever be admitted"));
        }
    }

    issues.finish()?;
    Ok(Config {
        server,
        storage,
        rate_limit,
        tenants,
        upstreams,
        routes,
        demo,
        telemetry,
        admin_token,
        auth,
        discovery: super::balance::discovery(&raw.discovery),
        renamed,
    })
}

fn server(raw: &raw::RawServer, issues: &mut Issues) -> ServerSettings {
    let log_format = match raw.log_format.as_str() {
        "human" => LogFormat::Human,
        "json" => LogFormat::Json,
        other => {
            issues.push(
                "server.log_format",
                format!("= {other:?}: allowed \"human\" or \"json\""),
            );
            LogFormat::Human
        }
    };
    issues.range("server.max_body_bytes", raw.max_body_bytes, 1, 1 << 34);
    issues.range(
        "server.max_header_bytes",
        raw.max_header_bytes,
        1024,
        1 << 20,
    );
    issues.range("server.load_shed_limit", raw.load_shed_limit, 1, 1_000_000);
    // Written out rather than `range`, which a NaN would pass.
    if !(0.0..=MAX_CRITICAL_RESERVE).contains(&raw.critical_reserve) {
        issues.push(
            "server.critical_reserve",
            format!(
                "= {}: allowed 0.0..={MAX_CRITICAL_RESERVE}",
                raw.critical_reserve
            ),
        );
    }
    // Written out rather than `range`, which a NaN would pass.
    if !(0.0..=1.0).contains(&raw.caller_share) || raw.caller_share == 0.0 {
        issues.push(
            "server.caller_share",
            format!(
                "= {}: allowed above 0.0, up to 1.0 (1.0: no limit per caller)",
                raw.caller_share
            ),
        );
    }
    issues.range(
        "server.response_buffer_bytes",
        raw.response_buffer_bytes,
        8 * 1024,
        16 << 20,
    );
    issues.range("server.max_connections", raw.max_connections, 1, 1_000_000);
    issues.range("server.worker_threads", raw.worker_threads, 0, 1024);
    issues.duration_range(
        "server.shutdown_grace",
        raw.shutdown_grace.get(),
        Duration::ZERO,
        Duration::from_secs(600),
    );
    issues.duration_range(
        "server.header_read_timeout",
        raw.header_read_timeout.get(),
        Duration::from_millis(100),
        Duration::from_secs(300),
    );
    issues.duration_range(
        "server.keep_alive_timeout",
        raw.keep_alive_timeout.get(),
        Duration::from_secs(1),
        Duration::from_secs(3600),
    );
    issues.duration_range(
        "server.send_timeout",
        raw.send_timeout.get(),
        Duration::from_secs(1),
        Duration::from_secs(3600),
    );
    issues.duration_range(
        "server.body_read_timeout",
        raw.body_read_timeout.get(),
        Duration::from_secs(1),
        Duration::from_secs(3600),
    );
    issues.range(
        "server.request_buffer_bytes",
        raw.request_buffer_bytes,
        0,
        1 << 30,
    );
    let trusted_proxies = raw
        .trusted_proxies
        .iter()
        .enumerate()
        .filter_map(|(i, text)| {
            let parsed = text
                .parse::<ipnet::IpNet>()
                .or_else(|_| text.parse::<std::net::IpAddr>().map(ipnet::IpNet::from));
            match parsed {
                Ok(net) => Some(net),
                Err(_) => {
                    issues.push(
                        format!("server.trusted_proxies[{i}]"),
                        format!("= {text:?}: expected a CIDR such as \"10.0.0.0/8\" or an IP"),
                    );
                    None
                }
            }
        })
        .collect();
    ServerSettings {
        listen: socket_addr("server.listen", &raw.listen, issues),
        admin_listen: socket_addr("server.admin_listen", &raw.admin_listen, issues),
        max_body_bytes: raw.max_body_bytes,
        max_header_bytes: raw.max_header_bytes,
        load_shed_limit: raw.load_shed_limit,
        critical_reserve: raw.critical_reserve,
        caller_share: raw.caller_share,
        response_buffer_bytes: raw.response_buffer_bytes,
        trusted_proxies,
        shutdown_grace: raw.shutdown_grace.get(),
        header_read_timeout: raw.header_read_timeout.get(),
        keep_alive_timeout: raw.keep_alive_timeout.get(),
        send_timeout: raw.send_timeout.get(),
        max_connections: raw.max_connections,
        body_read_timeout: raw.body_read_timeout.get(),
        request_buffer_bytes: raw.request_buffer_bytes,
        log_format,
        worker_threads: raw.worker_threads,
        h2c: raw.h2c,
        watch_config: raw.watch_config,
        http2: super::tls::http2(raw, issues),
        tls: super::tls::listener_tls("server.tls", raw.tls.as_ref(), issues),
        admin_tls: super::tls::listener_tls("server.admin_tls", raw.admin_tls.as_ref(), issues),
    }
}

fn storage(raw: &raw::RawStorage, issues: &mut Issues) -> StorageSettings {
    let state = StateBackend::parse(&raw.state).unwrap_or_else(|reason| {
        issues.push("storage.state", reason);
        StateBackend::Memory
    });
    let idempotency = match &raw.idempotency {
        Some(text) => IdempotencyBackend::parse(text).unwrap_or_else(|reason| {
            issues.push("storage.idempotency", reason);
            IdempotencyBackend::Memory
        }),
        None => IdempotencyBackend::from(&state),
    };
    let database = DatabaseBackend::parse(&raw.database).unwrap_or_else(|reason| {
        issues.push("storage.database", reason);
        DatabaseBackend::Sqlite("portcullis.db".into())
    });
    let queue = match &raw.queue {
        Some(text) => QueueBackend::parse(text).unwrap_or_else(|reason| {
            issues.push("storage.queue", reason);
            QueueBackend::default_for(&database)
        }),
        None => QueueBackend::default_for(&database),
    };
    let queue_url = match (&raw.queue, &queue) {
        (Some(text), _) => Secret::new(text),
        (None, QueueBackend::Sqlite(path)) => Secret::new(&format!("sqlite://{}", path.display())),
        (None, QueueBackend::Postgres(url)) => Secret::new(url),
        (None, _) => Secret::new(""),
    };
    issues.range(
        "storage.memory_max_bytes",
        raw.memory_max_bytes,
        1 << 20,
        1 << 40,
    );
    issues.duration_range(
        "storage.state_timeout",
        raw.state_timeout.get(),
        Duration::from_millis(1),
        Duration::from_secs(5),
    );
    if let Some(size) = raw.postgres_pool_size {
        issues.range("storage.postgres_pool_size", size, 1, 256);
    }
    for (tenant, bytes) in &raw.memory_shares {
        issues.range(
            format!("storage.memory_shares.{tenant}"),
            *bytes,
            1 << 16,
            raw.memory_max_bytes,
        );
    }
    StorageSettings {
        state,
        idempotency,
        database,
        memory_max_bytes: raw.memory_max_bytes,
        memory_shares: raw.memory_shares.clone(),
        state_timeout: raw.state_timeout.get(),
        postgres_pool_size: raw.postgres_pool_size,
        queue,
        queue_url,
    }
}

fn rate_limit(raw: &raw::RawRateLimit, issues: &mut Issues) -> RateLimitSettings {
    let on_store_error = match raw.on_store_error.as_str() {
        "fail_open" => StoreErrorMode::FailOpen,
        "fail_closed" => StoreErrorMode::FailClosed,
        other => {
            issues.push(
                "rate_limit.on_store_error",
                format!("= {other:?}: allowed \"fail_open\" or \"fail_closed\""),
            );
            StoreErrorMode::FailOpen
        }
    };
    issues.range("rate_limit.replicas", raw.replicas, 1, 1000);
    // Written so that NaN fails too; 0 would mean leases of nothing (use "exact").
    if !(raw.max_overshoot > 0.0 && raw.max_overshoot <= 1.0) {
        issues.push(
            "rate_limit.max_overshoot",
            format!(
                "= {}: allowed above 0 and at most 1 (a fraction of each policy's limit)",
                raw.max_overshoot
            ),
        );
    }
    let sync = match raw.sync.as_str() {
        "exact" => SyncMode::Exact,
        "batched" => SyncMode::Batched {
            max_overshoot: raw.max_overshoot,
        },
        other => {
            issues.push(
                "rate_limit.sync",
                format!("= {other:?}: allowed \"exact\" or \"batched\""),
            );
            SyncMode::Exact
        }
    };
    RateLimitSettings {
        on_store_error,
        replicas: raw.replicas,
        sync,
        anonymous: raw
            .anonymous
            .as_ref()
            .map(|b| bucket("rate_limit.anonymous", b, issues)),
        global: raw
            .global
            .as_ref()
            .map(|b| bucket("rate_limit.global", b, issues)),
    }
}

fn tenants(raw: &[raw::RawTenant], issues: &mut Issues) -> Vec<TenantSettings> {
    let mut ids = HashSet::new();
    let mut keys = HashSet::new();
    raw.iter()
        .enumerate()
        .map(|(i, t)| {
            let path = format!("tenants[{i}]");
            if !valid_id(&t.id) {
                issues.push(
                    format!("{path}.id"),
                    format!("= {:?}: 1–64 characters of [A-Za-z0-9._-]", t.id),
                );
            }
            if !ids.insert(t.id.as_str()) {
                issues.push(
                    format!("{path}.id"),
                    format!("= {:?}: duplicate tenant id", t.id),
                );
            }
            for (k, key) in t.api_keys.iter().enumerate() {
                let kpath = format!("{path}.api_keys[{k}]");
                if key.len() < 8 || key.len() > 256 || !key.bytes().all(|b| b.is_ascii_graphic()) {
                    issues.push(
                        kpath.clone(),
                        "must be 8–256 visible ASCII characters (value not shown)",
                    );
                }
                if !keys.insert(key.as_str()) {
                    issues.push(kpath, "duplicate API key (value not shown)");
                }
            }
            let bucket = bucket(
                &path,
                &RawBucket {
                    rate: t.rate,
                    per: t.per,
                    burst: t.burst,
                    shadow: false,
                },
                issues,
            );
            for (name, quota) in [
                ("daily_quota", t.daily_quota),
                ("monthly_quota", t.monthly_quota),
            ] {
                if let Some(q) = quota {
                    issues.range(format!("{path}.{name}"), q, 1, i64::MAX as u64);
                }
            }
            if let Some(n) = t.concurrency_limit {
                let max = portcullis_control::MAX_TENANT_IN_FLIGHT;
                issues.range(format!("{path}.concurrency_limit"), n, 1, max);
            }
            if let Some(n) = t.max_websockets {
                issues.range(format!("{path}.max_websockets"), n, 1, MAX_WEBSOCKETS);
            }
            let mut websocket_bound =
                |field: &str, value: Option<super::duration::HumanDuration>| {
                    let value = value?.get();
                    issues.duration_range(
                        &format!("{path}.{field}"),
                        value,
                        Duration::from_millis(1),
                        portcullis_control::MAX_TENANT_WEBSOCKET_DURATION,
                    );
                    Some(value)
                };
            let websocket_idle_timeout =
                websocket_bound("websocket_idle_timeout", t.websocket_idle_timeout);
            let websocket_max_lifetime =
                websocket_bound("websocket_max_lifetime", t.websocket_max_lifetime);
            TenantSettings {
                id: t.id.clone(),
                api_keys: t.api_keys.iter().map(|k| Secret::new(k)).collect(),
                bucket,
                daily_quota: t.daily_quota,
                monthly_quota: t.monthly_quota,
                concurrency_limit: t.concurrency_limit,
                max_websockets: t.max_websockets,
                websocket_idle_timeout,
                websocket_max_lifetime,
            }
        })
        .collect()
}

fn socket_addr(path: &str, text: &str, issues: &mut Issues) -> SocketAddr {
    text.parse().unwrap_or_else(|_| {
        issues.push(
            path,
            format!("= {text:?}: expected host:port with an IP, e.g. \"127.0.0.1:8080\""),
        );
        SocketAddr::from(([127, 0, 0, 1], 0))
    })
}
