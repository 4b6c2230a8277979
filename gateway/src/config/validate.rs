//! Stage two: range and cross-reference checks, producing the runtime types.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::time::Duration;

use super::error::Issues;
use super::raw::{RawBucket, RawConfig, RawHeaderMatch, RawIdempotency, RawRoute};
use super::upstream::{route_retry, upstream, valid_id, with_hedge};
use super::*;

/// Seed 002 R-6: idempotency records are kept at least this long.
pub const MIN_IDEMPOTENCY_TTL: Duration = Duration::from_secs(24 * 3600);
/// Largest `server.critical_reserve`: normal requests always keep a tenth of the cap.
pub const MAX_CRITICAL_RESERVE: f64 = 0.9;
/// Largest per-caller `routes[].max_in_flight` (the global cap's own ceiling).
pub const MAX_ROUTE_IN_FLIGHT: u32 = 1_000_000;

pub(super) fn validate(raw: RawConfig, env: &dyn Env) -> Result<Config, ConfigError> {
    let mut issues = Issues::default();

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
    let routes = routes(&raw, &upstreams, &mut issues);
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
    issues.range("server.max_in_flight", raw.max_in_flight, 1, 1_000_000);
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
        max_in_flight: raw.max_in_flight,
        critical_reserve: raw.critical_reserve,
        trusted_proxies,
        shutdown_grace: raw.shutdown_grace.get(),
        header_read_timeout: raw.header_read_timeout.get(),
        keep_alive_timeout: raw.keep_alive_timeout.get(),
        send_timeout: raw.send_timeout.get(),
        max_connections: raw.max_connections,
        body_read_timeout: raw.body_read_timeout.get(),
        log_format,
        worker_threads: raw.worker_threads,
        h2c: raw.h2c,
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
    StorageSettings {
        state,
        idempotency,
        database,
        memory_max_bytes: raw.memory_max_bytes,
        state_timeout: raw.state_timeout.get(),
        postgres_pool_size: raw.postgres_pool_size,
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

fn bucket(path: &str, raw: &RawBucket, issues: &mut Issues) -> Bucket {
    issues.range(format!("{path}.rate"), raw.rate, 1, u32::MAX as u64);
    issues.range(format!("{path}.burst"), raw.burst, 1, u32::MAX as u64);
    issues.duration_range(
        &format!("{path}.per"),
        raw.per.get(),
        Duration::from_millis(1),
        Duration::from_secs(366 * 86_400),
    );
    // The limiter's own limits (at most one token per nanosecond, a full refill within
    // 2^48 µs, or 2^52 ns above one token per µs): refused here rather than dropped with a warning at start-up.
    if raw.rate >= 1 && raw.burst >= 1 && !raw.per.get().is_zero() {
        if let Err(err) =
            portcullis_ratelimit::Policy::try_new("check", raw.rate, raw.per.get(), raw.burst)
        {
            issues.push(
                path.to_owned(),
                format!(
                    "= {{ rate = {}, per = {}, burst = {} }}: {err}",
                    raw.rate, raw.per, raw.burst
                ),
            );
        }
    }
    Bucket {
        rate: raw.rate,
        per: raw.per.get(),
        burst: raw.burst,
        shadow: raw.shadow,
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
            if let Some(n) = t.max_in_flight {
                let max = portcullis_control::MAX_TENANT_IN_FLIGHT;
                issues.range(format!("{path}.max_in_flight"), n, 1, max);
            }
            TenantSettings {
                id: t.id.clone(),
                api_keys: t.api_keys.iter().map(|k| Secret::new(k)).collect(),
                bucket,
                daily_quota: t.daily_quota,
                monthly_quota: t.monthly_quota,
                max_in_flight: t.max_in_flight,
            }
        })
        .collect()
}

fn routes(
    raw: &RawConfig,
    upstreams: &[UpstreamSettings],
    issues: &mut Issues,
) -> Vec<RouteSettings> {
    // Name → the field that gave it, for the duplicate message.
    let mut names: HashMap<String, String> = HashMap::new();
    raw.routes
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let path = format!("routes[{i}]");
            let rule = route_path(&path, r, issues);
            let (name, name_field) = match &r.name {
                Some(name) => {
                    if name.is_empty()
                        || name.len() > MAX_ROUTE_NAME_LEN
                        || !name.bytes().all(|b| b.is_ascii_graphic())
                    {
                        issues.push(
                            format!("{path}.name"),
                            format!("= {name:?}: 1–{MAX_ROUTE_NAME_LEN} visible ASCII characters"),
                        );
                    }
                    (name.clone(), format!("{path}.name"))
                }
                None => (
                    rule.text().to_owned(),
                    format!("{path}.{}", rule.field()),
                ),
            };
            if let Some(first) = names.get(&name) {
                let hint = if r.name.is_some() {
                    String::new()
                } else {
                    format!(" (a route's name defaults to its {}; give one of them a `name`)", rule.field())
                };
                issues.push(
                    if r.name.is_some() { format!("{path}.name") } else { name_field.clone() },
                    format!("= {name:?}: route name already used by {first}{hint}"),
                );
            } else {
                names.insert(name.clone(), name_field);
            }
            let hosts = r
                .hosts
                .iter()
                .enumerate()
                .filter_map(|(h, text)| match HostRule::parse(text) {
                    Ok(rule) => Some(rule),
                    Err(why) => {
                        issues.push(format!("{path}.hosts[{h}]"), format!("= {text:?}: {why}"));
                        None
                    }
                })
                .collect();
            let methods = methods(&format!("{path}.methods"), &r.methods, issues);
            let headers = r
                .headers
                .iter()
                .enumerate()
                .filter_map(|(h, m)| header_rule(&format!("{path}.headers[{h}]"), m, issues))
                .collect();
            let rewrite = rewrite(&path, r, &rule, issues);
            let upstream = raw
                .upstreams
                .iter()
                .position(|u| u.name == r.upstream)
                .unwrap_or_else(|| {
                    issues.push(
                        format!("{path}.upstream"),
                        format!("= {:?}: no [[upstreams]] entry has this name", r.upstream),
                    );
                    0
                });
            issues.range(format!("{path}.cost"), r.cost, 1, 1_000_000);
            if let Some(n) = r.max_in_flight {
                issues.range(format!("{path}.max_in_flight"), n, 1, MAX_ROUTE_IN_FLIGHT);
            }
            let priority = match r.priority.as_deref() {
                None | Some("normal") => Priority::Normal,
                Some("critical") => Priority::Critical,
                Some(other) => {
                    issues.push(
                        format!("{path}.priority"),
                        format!("= {other:?}: allowed \"normal\" or \"critical\""),
                    );
                    Priority::Normal
                }
            };
            // `timeout` is the route's whole-request deadline: the retry policy's `total`.
            let mut overrides = r.retry.clone();
            if let Some(timeout) = r.timeout {
                if overrides.as_ref().is_some_and(|o| o.total.is_some()) {
                    issues.push(
                        format!("{path}.timeout"),
                        format!("= {timeout}: set either timeout or retry.total, not both (they are the same deadline)"),
                    );
                } else {
                    issues.duration_range(
                        &format!("{path}.timeout"),
                        timeout.get(),
                        Duration::from_millis(1),
                        MAX_ROUTE_TIMEOUT,
                    );
                    if !timeout.get().is_zero() && timeout.get() <= MAX_ROUTE_TIMEOUT {
                        overrides.get_or_insert_with(Default::default).total = Some(timeout);
                    }
                }
            }
            let retry = Arc::new(with_hedge(
                &format!("{path}.hedge"),
                route_retry(
                    &format!("{path}.retry"),
                    upstreams.get(upstream).map(|u| &u.retry),
                    overrides.as_ref(),
                    issues,
                ),
                r.hedge.as_ref(),
                issues,
            ));
            let idempotency = r
                .idempotency
                .as_ref()
                .map(|idem| idempotency(&format!("{path}.idempotency"), idem, &retry, issues));
            RouteSettings {
                name,
                path: rule,
                hosts,
                methods,
                headers,
                upstream,
                cost: r.cost,
                limit: r
                    .limit
                    .as_ref()
                    .map(|b| bucket(&format!("{path}.limit"), b, issues)),
                idempotent: r.idempotent,
                rewrite,
                retry,
                idempotency,
                max_in_flight: r.max_in_flight,
                priority,
            }
        })
        .collect()
}

/// Longest route `timeout`: the contract's bound on a synchronous call's total duration.
const MAX_ROUTE_TIMEOUT: Duration = Duration::from_secs(30);

/// Longest route name (the admin API's limit on a route in quota overrides).
const MAX_ROUTE_NAME_LEN: usize = 256;

/// Exactly one of `prefix`, `exact`, `pattern`, in the normal form requests are matched in.
fn route_path(path: &str, r: &RawRoute, issues: &mut Issues) -> PathRule {
    let given: Vec<(&str, &String)> = [
        ("prefix", r.prefix.as_ref()),
        ("exact", r.exact.as_ref()),
        ("pattern", r.pattern.as_ref()),
    ]
    .into_iter()
    .filter_map(|(field, text)| Some((field, text?)))
    .collect();
    let Some(&(field, text)) = given.first() else {
        issues.push(
            format!("{path}.prefix"),
            "is missing: set exactly one of prefix, exact or pattern",
        );
        return PathRule::Prefix("/".into());
    };
    for (other, _) in &given[1..] {
        issues.push(
            format!("{path}.{other}"),
            format!("is set together with {field}: set exactly one of prefix, exact or pattern"),
        );
    }
    let field_path = format!("{path}.{field}");
    match field {
        "exact" => {
            if let Err(why) = Pattern::check_exact(text) {
                issues.push(field_path, format!("= {text:?}: {why}"));
            }
            PathRule::Exact(text.clone())
        }
        "pattern" => match Pattern::parse(text) {
            Ok(pattern) => PathRule::Pattern(pattern),
            Err(why) => {
                issues.push(field_path, format!("= {text:?}: {why}"));
                PathRule::Exact(text.clone())
            }
        },
        _ => {
            if !text.starts_with('/') {
                issues.push(field_path, format!("= {text:?}: must start with '/'"));
            } else {
                // Requests are matched in normal form; a prefix in another form never matches.
                match crate::edge::target::normalize_path(text) {
                    Ok(std::borrow::Cow::Borrowed(_)) => {}
                    Ok(normal) => issues.push(
                        field_path,
                        format!(
                            "= {text:?}: not in normal form (requests are matched after normalisation); write {normal:?}"
                        ),
                    ),
                    Err(why) => issues.push(field_path, format!("= {text:?}: {why}")),
                }
            }
            PathRule::Prefix(text.clone())
        }
    }
}

/// `rewrite` or `strip_prefix` (the same as `rewrite = "/"`), on a prefix or exact route.
fn rewrite(path: &str, r: &RawRoute, rule: &PathRule, issues: &mut Issues) -> Option<String> {
    let rewrite = match (&r.rewrite, r.strip_prefix) {
        (Some(_), true) => {
            issues.push(
                format!("{path}.rewrite"),
                "is set together with strip_prefix = true: strip_prefix is rewrite = \"/\"; set one",
            );
            return None;
        }
        (Some(text), false) => {
            let ok = text.starts_with('/')
                && !text.contains(['?', '#'])
                && matches!(
                    crate::edge::target::normalize_path(text),
                    Ok(std::borrow::Cow::Borrowed(_))
                );
            if !ok {
                issues.push(
                    format!("{path}.rewrite"),
                    format!(
                        "= {text:?}: a path starting with '/', in normal form, without '?' or '#'"
                    ),
                );
            }
            text.clone()
        }
        (None, true) => "/".to_owned(),
        (None, false) => return None,
    };
    if let PathRule::Pattern(_) = rule {
        let field = if r.rewrite.is_some() {
            "rewrite"
        } else {
            "strip_prefix"
        };
        issues.push(
            format!("{path}.{field}"),
            "applies to prefix and exact routes only (a pattern has no fixed prefix to replace)",
        );
    }
    Some(rewrite)
}

fn methods(path: &str, raw: &[String], issues: &mut Issues) -> Vec<http::Method> {
    let mut methods: Vec<http::Method> = Vec::new();
    for (i, m) in raw.iter().enumerate() {
        // Methods are case-sensitive tokens (RFC 9110 §9.1); the standard ones are upper case.
        match http::Method::from_bytes(m.to_ascii_uppercase().as_bytes()) {
            Ok(method) if !methods.contains(&method) => methods.push(method),
            Ok(_) => issues.push(format!("{path}[{i}]"), format!("= {m:?}: listed twice")),
            Err(_) => issues.push(
                format!("{path}[{i}]"),
                format!("= {m:?}: not an HTTP method"),
            ),
        }
    }
    methods
}

fn header_rule(path: &str, raw: &RawHeaderMatch, issues: &mut Issues) -> Option<HeaderRule> {
    let name = match http::HeaderName::from_bytes(raw.name.as_bytes()) {
        Ok(name) => Some(name),
        Err(_) => {
            issues.push(
                format!("{path}.name"),
                format!("= {:?}: not a header field name", raw.name),
            );
            None
        }
    };
    let value = match (&raw.value, &raw.regex) {
        (Some(value), None) => {
            if http::HeaderValue::from_str(value).is_err() {
                issues.push(
                    format!("{path}.value"),
                    format!("= {value:?}: not a valid header value"),
                );
            }
            Some(HeaderValueRule::Exact(value.as_bytes().into()))
        }
        (None, Some(regex)) => match regex::bytes::RegexBuilder::new(regex)
            .size_limit(1 << 20)
            .build()
        {
            Ok(compiled) => Some(HeaderValueRule::Regex(compiled)),
            Err(why) => {
                issues.push(format!("{path}.regex"), format!("= {regex:?}: {why}"));
                None
            }
        },
        (Some(_), Some(_)) => {
            issues.push(
                format!("{path}.regex"),
                "is set together with value: set exactly one of value or regex",
            );
            None
        }
        (None, None) => {
            issues.push(
                format!("{path}.value"),
                "is missing: set exactly one of value or regex",
            );
            None
        }
    };
    Some(HeaderRule {
        name: name?,
        value: value?,
    })
}

fn idempotency(
    path: &str,
    raw: &RawIdempotency,
    retry: &RetryPolicy,
    issues: &mut Issues,
) -> IdempotencySettings {
    let methods = raw
        .methods
        .iter()
        .enumerate()
        .filter_map(
            |(i, m)| match http::Method::from_bytes(m.to_ascii_uppercase().as_bytes()) {
                Ok(method) => Some(method),
                Err(_) => {
                    issues.push(
                        format!("{path}.methods[{i}]"),
                        format!("= {m:?}: not an HTTP method"),
                    );
                    None
                }
            },
        )
        .collect();
    if raw.ttl.get() < MIN_IDEMPOTENCY_TTL {
        issues.push(
            format!("{path}.ttl"),
            format!("= {}: must be at least 24h (seed 002 R-6)", raw.ttl),
        );
    }
    issues.range(format!("{path}.max_key_length"), raw.max_key_length, 1, 255);
    issues.range(
        format!("{path}.max_response_bytes"),
        raw.max_response_bytes,
        0,
        64 << 20,
    );
    if raw.lease.get() < retry.total() || raw.lease >= raw.ttl {
        issues.push(
            format!("{path}.lease"),
            format!(
                "= {}: must be ≥ the retry total ({}) and shorter than ttl ({})",
                raw.lease,
                HumanDuration(retry.total()),
                raw.ttl
            ),
        );
    }
    let on_in_flight = match raw.on_in_flight.as_str() {
        "reject" => InFlightMode::Reject,
        "wait" => {
            issues.duration_range(
                &format!("{path}.wait_timeout"),
                raw.wait_timeout.get(),
                Duration::from_millis(10),
                Duration::from_secs(60),
            );
            InFlightMode::Wait(raw.wait_timeout.get())
        }
        other => {
            issues.push(
                format!("{path}.on_in_flight"),
                format!("= {other:?}: allowed \"reject\" or \"wait\""),
            );
            InFlightMode::Reject
        }
    };
    IdempotencySettings {
        methods,
        require_key: raw.require_key,
        ttl: raw.ttl.get(),
        on_in_flight,
        lease: raw.lease.get(),
        max_key_length: raw.max_key_length,
        max_response_bytes: raw.max_response_bytes,
    }
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
