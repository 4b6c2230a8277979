//! `cors` on a route: which browser origins may call it, validated once (docs/routing.md,
//! "CORS"). The answers themselves are `pipeline::cors`'s.

use std::time::Duration;

use http::{HeaderName, HeaderValue, Method};

use super::super::error::Issues;
use super::super::raw::RawCors;

/// Methods a preflight may ask for when `allow_methods` is not set.
const DEFAULT_METHODS: [Method; 6] = [
    Method::GET,
    Method::HEAD,
    Method::POST,
    Method::PUT,
    Method::PATCH,
    Method::DELETE,
];
/// Request headers a preflight may ask for when `allow_headers` is not set: what a client of
/// this gateway sends.
const DEFAULT_ALLOW_HEADERS: [&str; 5] = [
    "authorization",
    "content-type",
    "idempotency-key",
    "x-api-key",
    "x-request-id",
];
/// Response headers a page may read when `expose_headers` is not set: the rate-limit
/// guidance, the request id and the replay marker.
const DEFAULT_EXPOSE_HEADERS: [&str; 9] = [
    "ratelimit",
    "ratelimit-policy",
    "retry-after",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "x-request-id",
    "idempotent-replayed",
    "x-retry-exhausted",
];
/// Longest `max_age` (Chromium caps a preflight at 2 h, Firefox at 24 h).
const MAX_AGE_LIMIT: Duration = Duration::from_secs(24 * 3600);

/// A route's CORS policy.
#[derive(Debug, Clone)]
pub struct CorsSettings {
    origins: Vec<OriginRule>,
    /// Methods a preflight may ask for.
    pub methods: Vec<Method>,
    /// `Access-Control-Allow-Methods`.
    pub methods_value: HeaderValue,
    /// Request headers a preflight may ask for, lower case.
    pub headers: Vec<HeaderName>,
    /// `Access-Control-Allow-Headers`.
    pub headers_value: HeaderValue,
    /// `Access-Control-Expose-Headers`; `None` when empty.
    pub expose_value: Option<HeaderValue>,
    /// Whether cookies and credentials may be sent (`Access-Control-Allow-Credentials`).
    pub credentials: bool,
    /// `Access-Control-Max-Age`.
    pub max_age: HeaderValue,
}

/// One `allow_origins` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
enum OriginRule {
    /// `*`: any origin.
    Any,
    /// `https://app.example.com` (lower case, the port as written).
    Exact(String),
    /// `https://*.example.com`: the scheme, `.example.com`, and the port part (`:8443` or
    /// empty).
    Subdomains {
        scheme: String,
        suffix: String,
        port: String,
    },
}

impl CorsSettings {
    /// Whether a browser page at `origin` (the `Origin` field) may call the route.
    pub fn allows_origin(&self, origin: &[u8]) -> bool {
        let Ok(origin) = std::str::from_utf8(origin) else {
            return false;
        };
        let origin = origin.to_ascii_lowercase();
        self.origins.iter().any(|rule| rule.matches(&origin))
    }

    /// Whether `*` may be answered instead of echoing the origin (any origin, no
    /// credentials: the spec forbids `*` with credentials).
    pub fn any_origin(&self) -> bool {
        !self.credentials && self.origins.contains(&OriginRule::Any)
    }
}

impl OriginRule {
    fn matches(&self, origin: &str) -> bool {
        match self {
            Self::Any => true,
            Self::Exact(exact) => origin == exact,
            Self::Subdomains {
                scheme,
                suffix,
                port,
            } => {
                let Some(rest) = origin
                    .strip_prefix(scheme.as_str())
                    .and_then(|r| r.strip_prefix("://"))
                else {
                    return false;
                };
                let Some(host) = rest.strip_suffix(port.as_str()) else {
                    return false;
                };
                // At least one label before the suffix, and no port left in the host.
                host.len() > suffix.len()
                    && host.ends_with(suffix.as_str())
                    && !host.contains(':')
                    && !host.contains('/')
            }
        }
    }
}

/// Validates `cors` of the route at `path` (`routes[i]`).
pub(crate) fn cors(path: &str, raw: &RawCors, issues: &mut Issues) -> CorsSettings {
    let field = |name: &str| format!("{path}.cors.{name}");
    if raw.allow_origins.is_empty() {
        issues.push(
            field("allow_origins"),
            "is empty: list the origins that may call",
        );
    }
    let origins: Vec<OriginRule> = raw
        .allow_origins
        .iter()
        .enumerate()
        .filter_map(|(i, text)| match origin_rule(text) {
            Ok(rule) => Some(rule),
            Err(reason) => {
                issues.push(format!("{}[{i}]", field("allow_origins")), reason);
                None
            }
        })
        .collect();
    if raw.allow_credentials && origins.contains(&OriginRule::Any) {
        issues.push(
            field("allow_credentials"),
            "= true with allow_origins \"*\": browsers refuse credentials for any origin; list the origins",
        );
    }
    let methods: Vec<Method> = match &raw.allow_methods {
        None => DEFAULT_METHODS.to_vec(),
        Some(names) => names
            .iter()
            .enumerate()
            .filter_map(|(i, name)| {
                match Method::from_bytes(name.to_ascii_uppercase().as_bytes()) {
                    Ok(method) => Some(method),
                    Err(_) => {
                        issues.push(
                            format!("{}[{i}]", field("allow_methods")),
                            format!("= {name:?}: not a method"),
                        );
                        None
                    }
                }
            })
            .collect(),
    };
    let names = |list: &Option<Vec<String>>, default: &[&str], name: &str, issues: &mut Issues| {
        let list: Vec<String> = match list {
            Some(list) => list.clone(),
            None => default.iter().map(|s| (*s).to_owned()).collect(),
        };
        list.iter()
            .enumerate()
            .filter_map(|(i, text)| {
                match HeaderName::from_bytes(text.to_ascii_lowercase().as_bytes()) {
                    Ok(header) => Some(header),
                    Err(_) => {
                        issues.push(
                            format!("{}[{i}]", field(name)),
                            format!("= {text:?}: not a header name"),
                        );
                        None
                    }
                }
            })
            .collect::<Vec<HeaderName>>()
    };
    let headers = names(
        &raw.allow_headers,
        &DEFAULT_ALLOW_HEADERS,
        "allow_headers",
        issues,
    );
    let expose = names(
        &raw.expose_headers,
        &DEFAULT_EXPOSE_HEADERS,
        "expose_headers",
        issues,
    );
    let max_age = raw.max_age.get();
    if max_age > MAX_AGE_LIMIT {
        issues.push(
            field("max_age"),
            format!("= {}: allowed at most 24h", raw.max_age),
        );
    }
    let joined = |parts: Vec<&str>| HeaderValue::from_str(&parts.join(", ")).ok();
    CorsSettings {
        methods_value: joined(methods.iter().map(Method::as_str).collect())
            .unwrap_or(HeaderValue::from_static("GET")),
        headers_value: joined(headers.iter().map(HeaderName::as_str).collect())
            .unwrap_or(HeaderValue::from_static("")),
        expose_value: joined(expose.iter().map(HeaderName::as_str).collect())
            .filter(|v| !v.is_empty()),
        origins,
        methods,
        headers,
        credentials: raw.allow_credentials,
        max_age: HeaderValue::from(max_age.min(MAX_AGE_LIMIT).as_secs()),
    }
}

/// Parses one `allow_origins` entry: `*`, `scheme://host[:port]` or `scheme://*.domain[:port]`.
fn origin_rule(text: &str) -> Result<OriginRule, String> {
    if text == "*" {
        return Ok(OriginRule::Any);
    }
    let bad = |why: &str| {
        format!("= {text:?}: {why}; write \"https://app.example.com\", \"https://*.example.com\" or \"*\"")
    };
    let lower = text.to_ascii_lowercase();
    let Some((scheme, rest)) = lower.split_once("://") else {
        return Err(bad("no scheme"));
    };
    if !matches!(scheme, "http" | "https") {
        return Err(bad("the scheme is http or https"));
    }
    let (host, port) = match rest.rsplit_once(':') {
        Some((host, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => {
            (host, format!(":{port}"))
        }
        Some(_) => return Err(bad("a bad port")),
        None => (rest, String::new()),
    };
    let label_ok = |label: &str| {
        !label.is_empty()
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
    };
    if let Some(domain) = host.strip_prefix("*.") {
        if domain.split('.').all(label_ok) {
            return Ok(OriginRule::Subdomains {
                scheme: scheme.to_owned(),
                suffix: format!(".{domain}"),
                port,
            });
        }
        return Err(bad("a bad domain after *."));
    }
    let ip_or_host = host.parse::<std::net::Ipv4Addr>().is_ok() || host.split('.').all(label_ok);
    if !ip_or_host || host.contains('*') || host.contains('/') {
        return Err(bad(
            "a bad host (no path, no wildcard but a leading \"*.\")",
        ));
    }
    Ok(OriginRule::Exact(format!("{scheme}://{host}{port}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(origins: &[&str], credentials: bool) -> (CorsSettings, Issues) {
        let raw = RawCors {
            allow_origins: origins.iter().map(|s| (*s).to_owned()).collect(),
            allow_credentials: credentials,
            ..RawCors::default()
        };
        let mut issues = Issues::default();
        (cors("routes[0]", &raw, &mut issues), issues)
    }

    #[test]
    fn exact_and_subdomain_origins() {
        let (cors, issues) = settings(
            &["https://App.example.com", "https://*.example.org:8443"],
            false,
        );
        assert!(issues.is_empty(), "{issues:?}");
        assert!(cors.allows_origin(b"https://app.example.com"));
        assert!(cors.allows_origin(b"HTTPS://APP.EXAMPLE.COM"));
        assert!(!cors.allows_origin(b"http://app.example.com"), "scheme");
        assert!(!cors.allows_origin(b"https://app.example.com:444"), "port");
        assert!(!cors.allows_origin(b"https://app.example.com.evil.net"));
        assert!(cors.allows_origin(b"https://a.example.org:8443"));
        assert!(cors.allows_origin(b"https://a.b.example.org:8443"));
        assert!(
            !cors.allows_origin(b"https://example.org:8443"),
            "the domain itself"
        );
        assert!(
            !cors.allows_origin(b"https://a.example.org"),
            "port required"
        );
        assert!(!cors.allows_origin(b"https://evilexample.org:8443"));
        assert!(!cors.allows_origin(b"null"));
        assert!(!cors.any_origin());
    }

    #[test]
    fn any_origin_without_credentials_only() {
        let (cors, issues) = settings(&["*"], false);
        assert!(issues.is_empty());
        assert!(cors.any_origin() && cors.allows_origin(b"https://x.test"));
        let (_, issues) = settings(&["*"], true);
        assert_eq!(issues.paths(), ["routes[0].cors.allow_credentials"]);
    }

    #[test]
    fn bad_origins_name_their_entry() {
        let (_, issues) = settings(
            &[
                "app.example.com",
                "ftp://x.test",
                "https://x.test/path",
                "https://a.*.test",
            ],
            false,
        );
        assert_eq!(
            issues.paths(),
            [
                "routes[0].cors.allow_origins[0]",
                "routes[0].cors.allow_origins[1]",
                "routes[0].cors.allow_origins[2]",
                "routes[0].cors.allow_origins[3]"
            ]
        );
    }
}
