//! `request_headers` and `response_headers` on a route (Kong's request/response
//! transformer, Envoy's `request_headers_to_add`): `set` replaces a field, `add` appends one,
//! `remove` deletes one, applied in that order (remove, then set, then add). Values may name
//! `${request_id}`, `${tenant}` (empty for an anonymous caller), `${client_ip}` and
//! `${route}`.
//!
//! The gateway's own fields cannot be touched: a rule naming one is refused at start-up
//! ([`PROTECTED`], [`PROTECTED_PREFIXES`]), in either direction, so a rule can neither forge
//! nor remove the idempotency key, the tenant, the request id, the forwarded chain, the
//! rate-limit fields or `Retry-After`, nor any framing or hop-by-hop field.

use std::collections::BTreeMap;
use std::net::IpAddr;

use http::header::{HeaderMap, HeaderName, HeaderValue};

use crate::config::error::Issues;
use crate::config::raw::RawHeaderRules;

/// Fields no rule may name: the ones the gateway sets or relies on, and the ones that frame
/// a message or describe one connection.
pub(crate) const PROTECTED: [&str; 20] = [
    "idempotency-key",
    "idempotent-replayed",
    "x-request-id",
    "x-request-deadline",
    "x-retry-attempt",
    "forwarded",
    "retry-after",
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
    "proxy-authorization",
    "proxy-authenticate",
    "grpc-timeout",
    "grpc-status",
];

/// Families of fields no rule may name: the gateway's own (`X-Portcullis-Tenant`), the
/// forwarded chain and the rate-limit fields (`X-RateLimit-*`, `RateLimit`,
/// `RateLimit-Policy`).
pub(crate) const PROTECTED_PREFIXES: [&str; 4] =
    ["x-portcullis-", "x-forwarded-", "x-ratelimit-", "ratelimit"];

/// One direction's validated rules.
#[derive(Debug, Clone, Default)]
pub struct HeaderRules {
    remove: Vec<HeaderName>,
    set: Vec<(HeaderName, Template)>,
    add: Vec<(HeaderName, Template)>,
}

/// A value, with its variables resolved per request.
#[derive(Debug, Clone)]
enum Template {
    /// No variable: built once.
    Fixed(HeaderValue),
    Parts(Vec<Part>),
}

#[derive(Debug, Clone)]
enum Part {
    Text(String),
    RequestId,
    Tenant,
    ClientIp,
    Route,
}

/// What the variables stand for, for one request.
#[derive(Debug, Clone, Copy)]
pub struct HeaderVars<'a> {
    /// `${request_id}`: the request's `X-Request-Id`.
    pub request_id: Option<&'a HeaderValue>,
    /// `${tenant}`: the tenant id, or none for an anonymous caller.
    pub tenant: Option<&'a str>,
    /// `${client_ip}`: the client address the gateway believes.
    pub client_ip: IpAddr,
    /// `${route}`: the route's name.
    pub route: &'a str,
}

// === impl HeaderRules ===

impl HeaderRules {
    /// Applies the rules to `headers`: remove, then set, then add. A value whose variables
    /// make it invalid (never for the gateway's own values) is skipped.
    pub fn apply(&self, headers: &mut HeaderMap, vars: &HeaderVars<'_>) {
        for name in &self.remove {
            headers.remove(name);
        }
        for (name, template) in &self.set {
            if let Some(value) = template.render(vars) {
                headers.insert(name.clone(), value);
            }
        }
        for (name, template) in &self.add {
            if let Some(value) = template.render(vars) {
                headers.append(name.clone(), value);
            }
        }
    }
}

// === impl Template ===

impl Template {
    fn render(&self, vars: &HeaderVars<'_>) -> Option<HeaderValue> {
        let parts = match self {
            Self::Fixed(value) => return Some(value.clone()),
            Self::Parts(parts) => parts,
        };
        let mut out = Vec::with_capacity(64);
        for part in parts {
            match part {
                Part::Text(text) => out.extend_from_slice(text.as_bytes()),
                Part::RequestId => {
                    out.extend_from_slice(vars.request_id.map_or(&[][..], HeaderValue::as_bytes));
                }
                Part::Tenant => out.extend_from_slice(vars.tenant.unwrap_or("").as_bytes()),
                Part::ClientIp => out.extend_from_slice(vars.client_ip.to_string().as_bytes()),
                Part::Route => out.extend_from_slice(vars.route.as_bytes()),
            }
        }
        HeaderValue::from_bytes(&out).ok()
    }

    /// Parses `text`: `${name}` for the four variables, everything else literal.
    fn parse(text: &str) -> Result<Self, String> {
        let mut parts = Vec::new();
        let mut rest = text;
        while let Some(start) = rest.find("${") {
            if start > 0 {
                parts.push(Part::Text(rest[..start].to_owned()));
            }
            let after = &rest[start + 2..];
            let end = after.find('}').ok_or("an unclosed ${")?;
            parts.push(match &after[..end] {
                "request_id" => Part::RequestId,
                "tenant" => Part::Tenant,
                "client_ip" => Part::ClientIp,
                "route" => Part::Route,
                other => {
                    return Err(format!(
                        "unknown variable ${{{other}}} (request_id, tenant, client_ip, route)"
                    ))
                }
            });
            rest = &after[end + 1..];
        }
        if !rest.is_empty() {
            parts.push(Part::Text(rest.to_owned()));
        }
        if parts.iter().all(|p| matches!(p, Part::Text(_))) {
            return HeaderValue::from_str(text)
                .map(Self::Fixed)
                .map_err(|_| "not a valid header value".to_owned());
        }
        for part in &parts {
            if let Part::Text(text) = part {
                HeaderValue::from_str(text).map_err(|_| "not a valid header value".to_owned())?;
            }
        }
        Ok(Self::Parts(parts))
    }
}

/// Whether a rule may name `name` (lower case).
pub(crate) fn is_protected(name: &str) -> bool {
    PROTECTED.contains(&name) || PROTECTED_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// Validates one direction's rules (`path` is `routes[i].request_headers` or
/// `routes[i].response_headers`); every issue names its field.
pub(super) fn header_rules(path: &str, raw: &RawHeaderRules, issues: &mut Issues) -> HeaderRules {
    let remove = raw
        .remove
        .iter()
        .enumerate()
        .filter_map(|(i, text)| rule_name(format!("{path}.remove[{i}]"), text, issues))
        .collect();
    let set = rule_values(&format!("{path}.set"), &raw.set, issues);
    let add = rule_values(&format!("{path}.add"), &raw.add, issues);
    HeaderRules { remove, set, add }
}

/// `set` or `add`: each name checked, each value parsed.
fn rule_values(
    path: &str,
    map: &BTreeMap<String, String>,
    issues: &mut Issues,
) -> Vec<(HeaderName, Template)> {
    let mut out = Vec::new();
    for (text, value) in map {
        let field = format!("{path}.{text}");
        let Some(name) = rule_name(field.clone(), text, issues) else {
            continue;
        };
        match Template::parse(value) {
            Ok(template) => out.push((name, template)),
            Err(why) => issues.push(field, format!("= {value:?}: {why}")),
        }
    }
    out
}

/// A field name a rule may use, or the issue why not.
fn rule_name(field: String, text: &str, issues: &mut Issues) -> Option<HeaderName> {
    match HeaderName::from_bytes(text.as_bytes()) {
        Ok(name) if is_protected(name.as_str()) => {
            issues.push(
                field,
                format!(
                    "= {text:?}: the gateway's own field (or a framing one); no rule may set, add or remove it"
                ),
            );
            None
        }
        Ok(name) => Some(name),
        Err(_) => {
            issues.push(field, format!("= {text:?}: not a header name"));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(set: &[(&str, &str)], add: &[(&str, &str)], remove: &[&str]) -> (HeaderRules, Issues) {
        let raw = RawHeaderRules {
            set: set
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            add: add
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            remove: remove.iter().map(|s| s.to_string()).collect(),
        };
        let mut issues = Issues::default();
        let rules = header_rules("routes[0].request_headers", &raw, &mut issues);
        (rules, issues)
    }

    #[test]
    fn variables_are_filled_per_request_in_order_remove_set_add() {
        let (rules, issues) = rules(
            &[
                ("x-env", "prod"),
                (
                    "x-who",
                    "${tenant}@${client_ip} on ${route} (${request_id})",
                ),
            ],
            &[("x-env", "extra")],
            &["x-internal"],
        );
        assert!(issues.finish().is_ok());
        let mut headers = HeaderMap::new();
        headers.insert("x-internal", HeaderValue::from_static("secret"));
        headers.insert("x-env", HeaderValue::from_static("client"));
        let id = HeaderValue::from_static("req-1");
        let vars = HeaderVars {
            request_id: Some(&id),
            tenant: Some("acme"),
            client_ip: "192.0.2.7".parse().unwrap(),
            route: "orders",
        };
        rules.apply(&mut headers, &vars);
        assert!(headers.get("x-internal").is_none());
        let env: Vec<_> = headers.get_all("x-env").iter().collect();
        assert_eq!(env, ["prod", "extra"]);
        assert_eq!(headers["x-who"], "acme@192.0.2.7 on orders (req-1)");
    }

    #[test]
    fn the_gateways_fields_and_bad_values_are_refused_naming_the_field() {
        let (_, issues) = rules(
            &[
                ("X-Forwarded-For", "1.2.3.4"),
                ("x-a", "${nope}"),
                ("x-b", "bad\nvalue"),
            ],
            &[("x-ratelimit-remaining", "999"), ("retry-after", "1")],
            &[
                "Idempotency-Key",
                "x-portcullis-tenant",
                "x-request-id",
                "bad name",
            ],
        );
        let paths = issues.finish().unwrap_err().paths();
        for want in [
            "routes[0].request_headers.set.X-Forwarded-For",
            "routes[0].request_headers.set.x-a",
            "routes[0].request_headers.set.x-b",
            "routes[0].request_headers.add.x-ratelimit-remaining",
            "routes[0].request_headers.add.retry-after",
            "routes[0].request_headers.remove[0]",
            "routes[0].request_headers.remove[1]",
            "routes[0].request_headers.remove[2]",
            "routes[0].request_headers.remove[3]",
        ] {
            assert!(paths.iter().any(|p| p == want), "{want} in {paths:?}");
        }
    }
}
