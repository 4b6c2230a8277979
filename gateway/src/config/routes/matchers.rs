//! A route's request matchers besides its path: hosts, methods and header fields.

use crate::config::error::Issues;
use crate::config::raw::RawHeaderMatch;
use crate::config::routes::rules::{HeaderRule, HeaderValueRule, HostRule};

/// `hosts`: every entry parsed, the invalid ones reported (`path` is `routes[i].hosts`).
pub(super) fn hosts(path: &str, raw: &[String], issues: &mut Issues) -> Vec<HostRule> {
    raw.iter()
        .enumerate()
        .filter_map(|(h, text)| match HostRule::parse(text) {
            Ok(rule) => Some(rule),
            Err(why) => {
                issues.push(format!("{path}[{h}]"), format!("= {text:?}: {why}"));
                None
            }
        })
        .collect()
}

/// `methods`: each parsed (any case) and listed once (`path` is `routes[i].methods`).
pub(super) fn methods(path: &str, raw: &[String], issues: &mut Issues) -> Vec<http::Method> {
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

/// `headers`: every entry checked, the valid ones kept (`path` is `routes[i].headers`).
pub(super) fn headers(path: &str, raw: &[RawHeaderMatch], issues: &mut Issues) -> Vec<HeaderRule> {
    raw.iter()
        .enumerate()
        .filter_map(|(h, m)| header_rule(&format!("{path}[{h}]"), m, issues))
        .collect()
}

/// One `headers` entry: a field name and exactly one of `value` or `regex`.
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
