//! The non-path conditions of a route: `hosts`, `headers` (and the request host they are
//! compared with). `methods` need no type of their own.

use http::{HeaderMap, HeaderName};

/// Longest host name compared (RFC 1035: 253 characters, plus a trailing dot and an IPv6
/// literal's brackets fit too). A longer `Host` matches only routes without `hosts`.
pub(crate) const MAX_HOST_LEN: usize = 256;

/// One entry of a route's `hosts`, in lower case, without port or trailing dot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostRule {
    /// `api.example.com`.
    Exact(String),
    /// `*.example.com`, kept as the suffix `.example.com`: matches any host that ends with it
    /// and has at least one more label (`a.example.com`, `a.b.example.com`, not
    /// `example.com`), as nginx's `server_name` and Envoy's domains do.
    Wildcard(String),
}

/// One entry of a route's `headers`.
#[derive(Debug, Clone)]
pub struct HeaderRule {
    /// The field name.
    pub name: HeaderName,
    /// What its value must be.
    pub value: HeaderValueRule,
}

/// How a header's value is compared.
#[derive(Debug, Clone)]
pub enum HeaderValueRule {
    /// Byte for byte, case-sensitive (as Envoy's `exact_match`).
    Exact(Box<[u8]>),
    /// The regex finds a match in the value (anchor it with `^…$` for the whole value).
    Regex(regex::bytes::Regex),
}

/// Why a `hosts` entry is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HostRuleError {
    /// Empty, or a character a host name cannot hold.
    #[error("not a host name: letters, digits, '-', '_' and '.' between non-empty labels, or an [IPv6] literal")]
    Invalid,
    /// `host:port`.
    #[error("has a port: the port is ignored when matching, leave it out")]
    Port,
    /// `example.com.`.
    #[error("ends with '.': the trailing dot is ignored when matching, leave it out")]
    TrailingDot,
    /// `*` alone, or `*` elsewhere than a leading `*.`.
    #[error("a wildcard is a leading '*.' followed by a host name (`*.example.com`); omit `hosts` to match every host")]
    Wildcard,
}

// === impl HostRule ===

impl HostRule {
    /// Parses `api.example.com`, `*.example.com` or `[::1]` (case-insensitive).
    pub fn parse(text: &str) -> Result<Self, HostRuleError> {
        let lower = text.to_ascii_lowercase();
        if let Some(name) = lower.strip_prefix("*.") {
            check_name(name)?;
            return Ok(Self::Wildcard(format!(".{name}")));
        }
        if lower.contains('*') {
            return Err(HostRuleError::Wildcard);
        }
        check_name(&lower)?;
        Ok(Self::Exact(lower))
    }
}

fn check_name(name: &str) -> Result<(), HostRuleError> {
    if let Some(literal) = name.strip_prefix('[') {
        return match literal.split_once(']') {
            Some((address, "")) if address.parse::<std::net::Ipv6Addr>().is_ok() => Ok(()),
            Some((_, port)) if port.starts_with(':') => Err(HostRuleError::Port),
            _ => Err(HostRuleError::Invalid),
        };
    }
    if name.contains(':') {
        return Err(HostRuleError::Port);
    }
    if name.len() > 1 && name.ends_with('.') {
        return Err(HostRuleError::TrailingDot);
    }
    let label_ok = |label: &str| {
        !label.is_empty()
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    if name.len() >= MAX_HOST_LEN || !name.split('.').all(label_ok) {
        return Err(HostRuleError::Invalid);
    }
    Ok(())
}

// === impl HeaderRule ===

impl HeaderRule {
    /// The request satisfies this rule: the field is present once and its value matches. A
    /// field sent twice never matches (Envoy matches the values joined by `,`, which an exact
    /// value without a comma never equals): two values cannot both pick one route.
    pub(crate) fn matches(&self, headers: &HeaderMap) -> bool {
        let mut values = headers.get_all(&self.name).iter();
        let (Some(value), None) = (values.next(), values.next()) else {
            return false;
        };
        match &self.value {
            HeaderValueRule::Exact(want) => value.as_bytes() == &want[..],
            HeaderValueRule::Regex(regex) => regex.is_match(value.as_bytes()),
        }
    }
}

/// The request's host as routes compare it, written into `buf`: the `Host` (or `:authority`)
/// the edge validated, without its port and one trailing dot, in lower case
/// (`API.Example.com.:8080` → `api.example.com`). `None` when there is none to compare, or
/// it is too long for any route's `hosts`.
pub(crate) fn host_key<'b>(authority: &[u8], buf: &'b mut [u8; MAX_HOST_LEN]) -> Option<&'b str> {
    let host = if authority.starts_with(b"[") {
        let close = authority.iter().position(|b| *b == b']')?;
        &authority[..=close]
    } else {
        match authority.iter().rposition(|b| *b == b':') {
            Some(colon) => &authority[..colon],
            None => authority,
        }
    };
    let host = host.strip_suffix(b".").unwrap_or(host);
    if host.is_empty() || host.len() > buf.len() {
        return None;
    }
    let out = &mut buf[..host.len()];
    out.copy_from_slice(host);
    out.make_ascii_lowercase();
    std::str::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_parse_lower_case_and_refuse_ports_dots_and_stray_wildcards() {
        assert_eq!(
            HostRule::parse("API.example.com"),
            Ok(HostRule::Exact("api.example.com".into()))
        );
        assert_eq!(
            HostRule::parse("*.Example.com"),
            Ok(HostRule::Wildcard(".example.com".into()))
        );
        assert_eq!(
            HostRule::parse("[::1]"),
            Ok(HostRule::Exact("[::1]".into()))
        );
        for (text, want) in [
            ("api.example.com:8080", HostRuleError::Port),
            ("[::1]:80", HostRuleError::Port),
            ("api.example.com.", HostRuleError::TrailingDot),
            ("*", HostRuleError::Wildcard),
            ("a.*.com", HostRuleError::Wildcard),
            ("*example.com", HostRuleError::Wildcard),
            ("", HostRuleError::Invalid),
            ("a..b", HostRuleError::Invalid),
            ("a b", HostRuleError::Invalid),
            ("*.", HostRuleError::Invalid),
        ] {
            assert_eq!(HostRule::parse(text), Err(want), "{text:?}");
        }
    }

    #[test]
    fn request_hosts_lose_port_trailing_dot_and_case() {
        let mut buf = [0; MAX_HOST_LEN];
        for (raw, want) in [
            ("API.Example.COM", Some("api.example.com")),
            ("api.example.com.", Some("api.example.com")),
            ("api.example.com.:8443", Some("api.example.com")),
            ("api.example.com:80", Some("api.example.com")),
            ("[::1]:8080", Some("[::1]")),
            ("127.0.0.1:80", Some("127.0.0.1")),
            ("", None),
            (":80", None),
        ] {
            assert_eq!(host_key(raw.as_bytes(), &mut buf), want, "{raw:?}");
        }
        let long = "a".repeat(MAX_HOST_LEN + 1);
        assert_eq!(host_key(long.as_bytes(), &mut buf), None);
    }

    #[test]
    fn header_rules_need_exactly_one_matching_field() {
        let exact = HeaderRule {
            name: HeaderName::from_static("x-version"),
            value: HeaderValueRule::Exact((*b"2").into()),
        };
        let regex = HeaderRule {
            name: HeaderName::from_static("x-tenant"),
            value: HeaderValueRule::Regex(regex::bytes::Regex::new("^eu-").unwrap()),
        };
        let mut headers = HeaderMap::new();
        assert!(!exact.matches(&headers));
        headers.insert("x-version", "2".parse().unwrap());
        headers.insert("x-tenant", "eu-west".parse().unwrap());
        assert!(exact.matches(&headers));
        assert!(regex.matches(&headers));
        headers.insert("x-tenant", "us-eu-1".parse().unwrap());
        assert!(!regex.matches(&headers));
        headers.insert("x-version", "20".parse().unwrap());
        assert!(!exact.matches(&headers));
        headers.insert("x-version", "2".parse().unwrap());
        headers.append("x-version", "2".parse().unwrap());
        assert!(!exact.matches(&headers), "a repeated field never matches");
    }
}
