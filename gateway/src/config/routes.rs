//! Validation of `[[routes]]`: the path rule (prefix, exact or pattern), hosts, methods,
//! headers, rewrite, timeout, hedging, concurrency and priority, and idempotency settings.
//! Every issue names its field (`routes[3].pattern`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::bucket::bucket;
use super::duration::HumanDuration;
use super::error::Issues;
use super::raw::{RawConfig, RawHeaderMatch, RawIdempotency, RawRoute};
use super::settings::*;
use super::upstream::{route_retry, with_hedge};
use crate::pipeline::router::pattern::{PathRule, Pattern};
use crate::pipeline::router::rules::{HeaderRule, HeaderValueRule, HostRule};
use portcullis_retry::RetryPolicy;

/// Seed 002 R-6: idempotency records are kept at least this long.
pub const MIN_IDEMPOTENCY_TTL: Duration = Duration::from_secs(24 * 3600);
/// Largest per-caller `routes[].max_in_flight` (the global cap's own ceiling).
pub const MAX_ROUTE_IN_FLIGHT: u32 = 1_000_000;
pub(super) fn routes(
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
