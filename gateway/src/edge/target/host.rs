//! Host rules (RFC 9112 §3.2, RFC 9113 §8.3.1): which authority a request is for, and when
//! the fields that say so are missing, repeated, malformed or contradict each other.

use http::header::{self, HeaderMap, HeaderValue};
use http::{Uri, Version};

/// Why the request's authority cannot be trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum HostError {
    /// HTTP/1.1 (or HTTP/2 without `:authority`) and no `Host`.
    #[error("the request has no Host header field (required from HTTP/1.1 on, RFC 9112 §3.2)")]
    Missing,
    /// More than one `Host` field.
    #[error("the request has more than one Host header field")]
    Duplicate,
    /// Not `uri-host [ ":" port ]`.
    #[error("the Host is not a valid host name or IP literal with an optional port (1-65535)")]
    Invalid,
    /// `user@host` in the authority.
    #[error("the authority contains userinfo (user@host), which HTTP does not allow")]
    Userinfo,
    /// HTTP/2 `host` and `:authority` name different hosts.
    #[error("the host header field disagrees with the :authority pseudo-header")]
    Mismatch,
    /// Absolute-form with a scheme other than `http`/`https`.
    #[error("the absolute-form request target's scheme is neither http nor https")]
    Scheme,
}

// === impl HostError ===

impl HostError {
    /// A stable, machine-readable reason (the problem's `reason` member and metric label).
    pub(crate) fn code(self) -> &'static str {
        match self {
            Self::Missing => "missing-host",
            Self::Duplicate => "duplicate-host",
            Self::Invalid => "invalid-host",
            Self::Userinfo => "userinfo-in-authority",
            Self::Mismatch => "host-authority-mismatch",
            Self::Scheme => "unsupported-scheme",
        }
    }
}

/// Checks the authority fields of a request whose target has a path (origin- or
/// absolute-form). Returns the `Host` value the request must continue with when it differs
/// from the one it carries: an HTTP/1.x absolute-form target's authority wins over `Host`
/// (RFC 9112 §3.2.2).
pub(crate) fn check(
    version: Version,
    uri: &Uri,
    headers: &HeaderMap,
) -> Result<Option<HeaderValue>, HostError> {
    let mut fields = headers.get_all(header::HOST).iter();
    let host = fields.next();
    if fields.next().is_some() {
        return Err(HostError::Duplicate);
    }
    if let Some(host) = host {
        validate(host.as_bytes())?;
    }
    let http2 = version >= Version::HTTP_2;
    match uri.authority() {
        // HTTP/2 and later: `:authority`. `host` may repeat it, never contradict it.
        Some(authority) if http2 => {
            validate(authority.as_str().as_bytes())?;
            match host {
                Some(host)
                    if !host
                        .as_bytes()
                        .eq_ignore_ascii_case(authority.as_str().as_bytes()) =>
                {
                    Err(HostError::Mismatch)
                }
                _ => Ok(None),
            }
        }
        // HTTP/1.x absolute-form. Host is still required on HTTP/1.1 (and validated above), as
        // RFC 9112 §3.2 and nginx require, but the target's authority is the one used.
        Some(authority) => {
            if version == Version::HTTP_11 && host.is_none() {
                return Err(HostError::Missing);
            }
            let scheme = uri.scheme_str().unwrap_or_default();
            if !(scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https")) {
                return Err(HostError::Scheme);
            }
            validate(authority.as_str().as_bytes())?;
            if host.is_some_and(|host| host.as_bytes() == authority.as_str().as_bytes()) {
                return Ok(None);
            }
            HeaderValue::from_str(authority.as_str())
                .map(Some)
                .map_err(|_| HostError::Invalid)
        }
        // Origin-form: HTTP/1.0 may omit Host; HTTP/1.1 and HTTP/2 (nginx too) may not.
        None if host.is_none() && version >= Version::HTTP_11 => Err(HostError::Missing),
        None => Ok(None),
    }
}

/// `uri-host [ ":" port ]` (RFC 3986 §3.2.2–3.2.3), where the host is an IPv6 literal
/// (`[…]`), or a reg-name (which covers IPv4 addresses) that is not empty, as nginx refuses an
/// empty Host; a port has 1–5 digits and is at most 65535.
pub(crate) fn validate(authority: &[u8]) -> Result<(), HostError> {
    if authority.contains(&b'@') {
        return Err(HostError::Userinfo);
    }
    let port = if let Some(literal) = authority.strip_prefix(b"[") {
        let close = literal
            .iter()
            .position(|b| *b == b']')
            .ok_or(HostError::Invalid)?;
        let address = std::str::from_utf8(&literal[..close]).map_err(|_| HostError::Invalid)?;
        address
            .parse::<std::net::Ipv6Addr>()
            .map_err(|_| HostError::Invalid)?;
        match &literal[close + 1..] {
            [] => None,
            [b':', port @ ..] => Some(port),
            _ => return Err(HostError::Invalid),
        }
    } else {
        let (name, port) = match authority.iter().position(|b| *b == b':') {
            Some(colon) => (&authority[..colon], Some(&authority[colon + 1..])),
            None => (authority, None),
        };
        if name.is_empty() || !is_reg_name(name) {
            return Err(HostError::Invalid);
        }
        port
    };
    match port {
        None => Ok(()),
        Some(port) if is_port(port) => Ok(()),
        Some(_) => Err(HostError::Invalid),
    }
}

/// `reg-name = *( unreserved / pct-encoded / sub-delims )`.
fn is_reg_name(name: &[u8]) -> bool {
    let mut i = 0;
    while let Some(&byte) = name.get(i) {
        if byte == b'%' {
            let hex = |at: usize| name.get(at).is_some_and(u8::is_ascii_hexdigit);
            if !(hex(i + 1) && hex(i + 2)) {
                return false;
            }
            i += 3;
            continue;
        }
        let allowed = byte.is_ascii_alphanumeric()
            || matches!(
                byte,
                b'-' | b'.'
                    | b'_'
                    | b'~'
                    | b'!'
                    | b'$'
                    | b'&'
                    | b'\''
                    | b'('
                    | b')'
                    | b'*'
                    | b'+'
                    | b','
                    | b';'
                    | b'='
            );
        if !allowed {
            return false;
        }
        i += 1;
    }
    true
}

fn is_port(port: &[u8]) -> bool {
    (1..=5).contains(&port.len())
        && port.iter().all(u8::is_ascii_digit)
        && port.iter().fold(0u32, |n, d| n * 10 + u32::from(d - b'0')) <= 65535
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_authorities() {
        for host in [
            "example.com",
            "EXAMPLE.com.",
            "a-b_c~d",
            "127.0.0.1",
            "127.0.0.1:8080",
            "[::1]",
            "[2001:db8::1]:443",
            "xn--bcher-kva.example",
            "ex%41mple",
            "host:1",
            "host:65535",
        ] {
            assert_eq!(validate(host.as_bytes()), Ok(()), "{host}");
        }
    }

    #[test]
    fn invalid_authorities() {
        let cases = [
            ("", HostError::Invalid),
            (":80", HostError::Invalid),
            ("a b", HostError::Invalid),
            ("a/b", HostError::Invalid),
            ("a\\b", HostError::Invalid),
            ("host:", HostError::Invalid),
            ("host:65536", HostError::Invalid),
            ("host:123456", HostError::Invalid),
            ("host:8x", HostError::Invalid),
            ("host:80:80", HostError::Invalid),
            ("[::1", HostError::Invalid),
            ("[::1]x", HostError::Invalid),
            ("[zz]", HostError::Invalid),
            ("ex%4", HostError::Invalid),
            ("h\u{e9}", HostError::Invalid),
            ("user@host", HostError::Userinfo),
            ("user:pw@host:80", HostError::Userinfo),
        ];
        for (host, expected) in cases {
            assert_eq!(validate(host.as_bytes()), Err(expected), "{host:?}");
        }
    }

    fn headers(hosts: &[&str]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for host in hosts {
            map.append(header::HOST, HeaderValue::from_str(host).unwrap());
        }
        map
    }

    #[test]
    fn http1_rules() {
        let origin: Uri = "/a".parse().unwrap();
        let v11 = Version::HTTP_11;
        assert_eq!(check(v11, &origin, &headers(&["gw"])), Ok(None));
        assert_eq!(check(v11, &origin, &headers(&[])), Err(HostError::Missing));
        assert_eq!(
            check(v11, &origin, &headers(&["gw", "gw"])),
            Err(HostError::Duplicate)
        );
        assert_eq!(
            check(v11, &origin, &headers(&["u@gw"])),
            Err(HostError::Userinfo)
        );
        assert_eq!(check(Version::HTTP_10, &origin, &headers(&[])), Ok(None));

        let absolute: Uri = "http://api.example:8080/a".parse().unwrap();
        assert_eq!(
            check(v11, &absolute, &headers(&["other"])),
            Ok(Some(HeaderValue::from_static("api.example:8080")))
        );
        assert_eq!(
            check(v11, &absolute, &headers(&["api.example:8080"])),
            Ok(None)
        );
        assert_eq!(
            check(v11, &absolute, &headers(&[])),
            Err(HostError::Missing)
        );
        assert_eq!(
            check(Version::HTTP_10, &absolute, &headers(&[])),
            Ok(Some(HeaderValue::from_static("api.example:8080")))
        );
        let userinfo: Uri = "http://u:p@api.example/a".parse().unwrap();
        assert_eq!(
            check(v11, &userinfo, &headers(&["api.example"])),
            Err(HostError::Userinfo)
        );
        let ftp: Uri = "ftp://api.example/a".parse().unwrap();
        assert_eq!(
            check(v11, &ftp, &headers(&["api.example"])),
            Err(HostError::Scheme)
        );
    }

    #[test]
    fn http2_rules() {
        let v2 = Version::HTTP_2;
        let uri: Uri = "http://gw.test/a".parse().unwrap();
        assert_eq!(check(v2, &uri, &headers(&[])), Ok(None));
        assert_eq!(check(v2, &uri, &headers(&["GW.test"])), Ok(None));
        assert_eq!(
            check(v2, &uri, &headers(&["evil.test"])),
            Err(HostError::Mismatch)
        );
        let no_authority: Uri = "/a".parse().unwrap();
        assert_eq!(check(v2, &no_authority, &headers(&["gw"])), Ok(None));
        assert_eq!(
            check(v2, &no_authority, &headers(&[])),
            Err(HostError::Missing)
        );
    }
}
