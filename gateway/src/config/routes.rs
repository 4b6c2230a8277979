//! Validation of `[[routes]]`: the path rule (prefix, exact or pattern), hosts, methods,
//! headers, rewrite, timeout, hedging, concurrency and priority, and idempotency settings.
//! Every issue names its field (`routes[3].pattern`).

pub(crate) mod cors;
pub(crate) mod delivery;
pub(crate) mod header_rules;
mod idempotency;
mod matchers;
mod path;
pub(crate) mod pattern;
pub(crate) mod rules;
pub(crate) mod verify;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::bucket::bucket;
use super::error::Issues;
use super::raw::{RawConfig, RawRoute};
use super::settings::*;
use super::upstream::{route_retry, with_hedge};
use crate::config::routes::pattern::PathRule;
use header_rules::header_rules;
use idempotency::idempotency;
use matchers::{headers, hosts, methods};
use path::{rewrite, route_path};
use portcullis_retry::RetryPolicy;

/// Largest `routes[].concurrency_per_caller` (the global cap's own ceiling).
pub const MAX_ROUTE_IN_FLIGHT: u32 = 1_000_000;

/// Largest `max_websockets` (routes and tenants).
pub const MAX_WEBSOCKETS: u32 = 1_000_000;

/// Default `websocket_idle_timeout`: nginx's `proxy_read_timeout`.
pub const DEFAULT_WEBSOCKET_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Longest `websocket_idle_timeout` and `websocket_max_lifetime`.
const MAX_WEBSOCKET_DURATION: Duration = Duration::from_secs(7 * 24 * 3600);

/// Longest route `timeout`: the contract's bound on a synchronous call's total duration.
const MAX_ROUTE_TIMEOUT: Duration = Duration::from_secs(30);

/// Longest route name (the admin API's limit on a route in quota overrides).
const MAX_ROUTE_NAME_LEN: usize = 256;

/// Every `[[routes]]` entry, in order.
pub(super) fn routes(
    raw: &RawConfig,
    upstreams: &[UpstreamSettings],
    env: &dyn Env,
    issues: &mut Issues,
) -> Vec<RouteSettings> {
    // Name → the field that gave it, for the duplicate message; and how many unnamed routes
    // share each path text (their default names would collide: see `route_name`).
    let mut names: HashMap<String, String> = HashMap::new();
    let mut shared: HashMap<&str, usize> = HashMap::new();
    for r in raw.routes.iter().filter(|r| r.name.is_none()) {
        if let Some(text) = [&r.prefix, &r.exact, &r.pattern]
            .into_iter()
            .flatten()
            .next()
        {
            *shared.entry(text.as_str()).or_default() += 1;
        }
    }
    raw.routes
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let path = format!("routes[{i}]");
            route(&path, r, raw, upstreams, env, &shared, &mut names, issues)
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
/// One `[[routes]]` entry at `path` (`routes[i]`); `names`: the names of the routes before
/// it; `shared`: how many unnamed routes have each path text.
fn route(
    path: &str,
    r: &RawRoute,
    raw: &RawConfig,
    upstreams: &[UpstreamSettings],
    env: &dyn Env,
    shared: &HashMap<&str, usize>,
    names: &mut HashMap<String, String>,
    issues: &mut Issues,
) -> RouteSettings {
    let rule = route_path(path, r, issues);
    let name = route_name(path, r, &rule, shared, names, issues);
    let hosts = hosts(&format!("{path}.hosts"), &r.hosts, issues);
    let methods = methods(&format!("{path}.methods"), &r.methods, issues);
    let headers = headers(&format!("{path}.headers"), &r.headers, issues);
    let rewrite = rewrite(path, r, &rule, issues);
    let upstream = upstream_index(path, r, raw, issues);
    issues.range(format!("{path}.cost"), r.cost, 1, 1_000_000);
    if let Some(n) = r.concurrency_per_caller {
        issues.range(
            format!("{path}.concurrency_per_caller"),
            n,
            1,
            MAX_ROUTE_IN_FLIGHT,
        );
    }
    let priority = priority(path, r, issues);
    let retry = retry(path, r, upstreams.get(upstream), issues);
    let idempotency = r
        .idempotency
        .as_ref()
        .map(|idem| idempotency(&format!("{path}.idempotency"), idem, &retry, issues));
    let request_headers = r
        .request_headers
        .as_ref()
        .map(|raw| header_rules(&format!("{path}.request_headers"), raw, issues));
    let response_headers = r
        .response_headers
        .as_ref()
        .map(|raw| header_rules(&format!("{path}.response_headers"), raw, issues));
    let verify = r.verify.as_ref().and_then(|v| {
        verify::verify(
            &format!("{path}.verify"),
            &name,
            v,
            &raw.tenants,
            env,
            issues,
        )
    });
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
        concurrency_per_caller: r.concurrency_per_caller,
        cors: r
            .cors
            .as_ref()
            .map(|raw| Arc::new(cors::cors(path, raw, issues))),
        priority,
        request_headers,
        response_headers,
        websocket: websocket(path, r, upstreams.get(upstream), issues),
        delivery: r.delivery.as_ref().and_then(|raw| {
            let settings = delivery::delivery(&format!("{path}.delivery"), raw, issues)?;
            if r.idempotency.is_some() {
                issues.push(
                    format!("{path}.idempotency"),
                    "an asynchronous route dedupes with delivery.dedupe (\"idempotency-key\" by default)",
                );
            }
            if r.websocket {
                issues.push(
                    format!("{path}.delivery.mode"),
                    "= \"async\": a WebSocket route cannot be delivered later",
                );
            }
            Some(Arc::new(settings))
        }),
        verify,
    }
}

/// `websocket = true` and its limits; the limits without it, or toward an upstream a tunnel
/// cannot reach, are refused.
fn websocket(
    path: &str,
    r: &RawRoute,
    upstream: Option<&UpstreamSettings>,
    issues: &mut Issues,
) -> Option<WebSocketSettings> {
    if !r.websocket {
        for (field, set) in [
            ("websocket_idle_timeout", r.websocket_idle_timeout.is_some()),
            ("websocket_max_lifetime", r.websocket_max_lifetime.is_some()),
            ("max_websockets", r.max_websockets.is_some()),
        ] {
            if set {
                issues.push(format!("{path}.{field}"), "needs websocket = true");
            }
        }
        return None;
    }
    if let Some(upstream) = upstream {
        if upstream.http2 || upstream.tls.is_some() {
            issues.push(
                format!("{path}.websocket"),
                format!(
                    "= true: upstream {:?} is HTTP/2 or https; WebSocket tunnels need a plain HTTP/1.1 upstream",
                    upstream.name
                ),
            );
        }
    }
    let mut duration = |field: &str, value: Option<crate::config::duration::HumanDuration>| {
        let value = value?.get();
        issues.duration_range(
            &format!("{path}.{field}"),
            value,
            Duration::from_millis(1),
            MAX_WEBSOCKET_DURATION,
        );
        Some(value)
    };
    let idle_timeout = duration("websocket_idle_timeout", r.websocket_idle_timeout)
        .unwrap_or(DEFAULT_WEBSOCKET_IDLE_TIMEOUT);
    let max_lifetime = duration("websocket_max_lifetime", r.websocket_max_lifetime);
    if let Some(n) = r.max_websockets {
        issues.range(format!("{path}.max_websockets"), n, 1, MAX_WEBSOCKETS);
    }
    Some(WebSocketSettings {
        idle_timeout,
        max_lifetime,
        max_open: r.max_websockets,
    })
}

/// The route's name (`name`, or by default the text of its path rule), reported when
/// invalid or already taken by an earlier route in `names`, to which it is then added.
///
/// When several unnamed routes share a path text (`shared`), each of them that has hosts
/// or methods is named by the path qualified by them (`/@api.example.com#GET,HEAD`), so
/// routes on one path for different hosts or methods need no `name`, and a catch-all among
/// them keeps the plain path. A path used once keeps the plain path as its name. Routes that
/// differ only in `headers` still need a `name`.
fn route_name(
    path: &str,
    r: &RawRoute,
    rule: &PathRule,
    shared: &HashMap<&str, usize>,
    names: &mut HashMap<String, String>,
    issues: &mut Issues,
) -> String {
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
        None => {
            let plain = rule.text().to_owned();
            let name = match qualified(&plain, r) {
                Some(qualified) if shared.get(plain.as_str()).is_some_and(|n| *n > 1) => qualified,
                _ => plain,
            };
            (name, format!("{path}.{}", rule.field()))
        }
    };
    if let Some(first) = names.get(&name) {
        let hint = if r.name.is_some() {
            String::new()
        } else {
            format!(
                " (a route's name defaults to its {}, qualified by its hosts and methods; \
                 give one of them a `name`)",
                rule.field()
            )
        };
        issues.push(
            if r.name.is_some() {
                format!("{path}.name")
            } else {
                name_field.clone()
            },
            format!("= {name:?}: route name already used by {first}{hint}"),
        );
    } else {
        names.insert(name.clone(), name_field);
    }
    name
}

/// `path` qualified by the route's hosts (`@a,b`) and methods (`#GET,HEAD`), lower- and
/// upper-cased as they match; `None` when the route has neither, or the result would be
/// longer than a name may be.
fn qualified(path: &str, r: &RawRoute) -> Option<String> {
    if r.hosts.is_empty() && r.methods.is_empty() {
        return None;
    }
    let mut name = path.to_owned();
    if !r.hosts.is_empty() {
        let hosts: Vec<String> = r.hosts.iter().map(|h| h.to_ascii_lowercase()).collect();
        name = format!("{name}@{}", hosts.join(","));
    }
    if !r.methods.is_empty() {
        let methods: Vec<String> = r.methods.iter().map(|m| m.to_ascii_uppercase()).collect();
        name = format!("{name}#{}", methods.join(","));
    }
    (name.len() <= MAX_ROUTE_NAME_LEN && name.bytes().all(|b| b.is_ascii_graphic())).then_some(name)
}

/// The index of the `[[upstreams]]` entry the route names (0, reported, when none does).
fn upstream_index(path: &str, r: &RawRoute, raw: &RawConfig, issues: &mut Issues) -> usize {
    raw.upstreams
        .iter()
        .position(|u| u.name == r.upstream)
        .unwrap_or_else(|| {
            issues.push(
                format!("{path}.upstream"),
                format!("= {:?}: no [[upstreams]] entry has this name", r.upstream),
            );
            0
        })
}

/// `priority`: `normal` (the default) or `critical`.
fn priority(path: &str, r: &RawRoute, issues: &mut Issues) -> Priority {
    match r.priority.as_deref() {
        None | Some("normal") => Priority::Normal,
        Some("critical") => Priority::Critical,
        Some(other) => {
            issues.push(
                format!("{path}.priority"),
                format!("= {other:?}: allowed \"normal\" or \"critical\""),
            );
            Priority::Normal
        }
    }
}

/// The route's retry policy: its upstream's, with the route's `retry`, `timeout` and `hedge`
/// applied.
fn retry(
    path: &str,
    r: &RawRoute,
    upstream: Option<&UpstreamSettings>,
    issues: &mut Issues,
) -> Arc<RetryPolicy> {
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
    Arc::new(with_hedge(
        &format!("{path}.hedge"),
        route_retry(
            &format!("{path}.retry"),
            upstream.map(|u| &u.retry),
            overrides.as_ref(),
            issues,
        ),
        r.hedge.as_ref(),
        issues,
    ))
}
