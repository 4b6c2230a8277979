//! `[auth.jwt]`: tenants identified by bearer JWTs (stage one and stage two together, so the
//! whole feature's configuration is one file). The request-path side is
//! `crate::pipeline::jwt`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;
use serde::{Deserialize, Serialize};

use super::duration::HumanDuration;
use super::error::Issues;
use crate::pipeline::jwt::{Algorithm, JwksLocation, JwtSettings, KeySet};
use crate::plumbing::client::CLIENT_ADDRESS_FIELDS;

/// Default `auth.jwt.algorithms`: every asymmetric algorithm the gateway verifies.
pub const DEFAULT_JWT_ALGORITHMS: [&str; 3] = ["RS256", "ES256", "EdDSA"];
/// Default `auth.jwt.clock_skew`: tolerance on `exp` and `nbf` (Kong and Envoy use 60 s).
pub const DEFAULT_JWT_CLOCK_SKEW: HumanDuration = HumanDuration::secs(60);
/// Default `auth.jwt.jwks_refresh_interval`: how long fetched keys are used before a refetch.
pub const DEFAULT_JWKS_REFRESH_INTERVAL: HumanDuration = HumanDuration::secs(300);
/// Default `auth.jwt.jwks_refresh_cooldown`: at most one unknown-`kid` refresh this often.
pub const DEFAULT_JWKS_REFRESH_COOLDOWN: HumanDuration = HumanDuration::secs(30);
/// Default `auth.jwt.jwks_timeout`: bound on one JWKS fetch (connect, TLS, response).
pub const DEFAULT_JWKS_TIMEOUT: HumanDuration = HumanDuration::secs(5);

/// Headers `claims_to_headers` may not name: the gateway's own, framing and credentials.
const RESERVED_HEADERS: &[&str] = &[
    "authorization",
    "connection",
    "content-length",
    "content-type",
    "host",
    "idempotency-key",
    "keep-alive",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "x-api-key",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
    "x-portcullis-tenant",
    "x-request-deadline",
    "x-request-id",
];

/// Default `auth.failure_limit`: failed authentications per client address and window before
/// that address gets 429s (a person mistyping a key never sends 20 in a minute).
pub const DEFAULT_AUTH_FAILURE_LIMIT: u32 = 20;
/// Default `auth.failure_window`: the window `failure_limit` counts in, and the longest block.
pub const DEFAULT_AUTH_FAILURE_WINDOW: HumanDuration = HumanDuration::secs(60);

/// `[auth]`.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawAuth {
    /// Tenants from bearer JWTs; absent → only API keys identify tenants.
    pub jwt: Option<RawJwt>,
    /// Failed authentications (bad API key or JWT) one client address may make per
    /// `failure_window` before its credentials are refused with 429; 0 turns the limit off.
    pub failure_limit: u32,
    /// The window `failure_limit` counts in.
    pub failure_window: HumanDuration,
}

impl Default for RawAuth {
    fn default() -> Self {
        Self {
            jwt: None,
            failure_limit: DEFAULT_AUTH_FAILURE_LIMIT,
            failure_window: DEFAULT_AUTH_FAILURE_WINDOW,
        }
    }
}

/// `[auth.jwt]`.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawJwt {
    /// Required `iss`.
    pub issuer: String,
    /// Accepted `aud` values; the token's must intersect.
    pub audiences: Vec<String>,
    /// JWKS over `http://` or `https://` (exactly one of `jwks_url`, `jwks_file`).
    #[serde(default)]
    pub jwks_url: Option<String>,
    /// JWKS in a local file, re-read when it changes.
    #[serde(default)]
    pub jwks_file: Option<PathBuf>,
    /// Accepted `alg` values among RS256, ES256, EdDSA.
    #[serde(default = "default_algorithms")]
    pub algorithms: Vec<String>,
    /// Tolerance on `exp` and `nbf`.
    #[serde(default = "default_skew")]
    pub clock_skew: HumanDuration,
    /// The claim holding the tenant id.
    pub tenant_claim: String,
    /// Claim → header forwarded upstream (client-sent headers of those names are removed).
    #[serde(default)]
    pub claims_to_headers: BTreeMap<String, String>,
    /// Forward the `Authorization` header upstream after verification.
    #[serde(default)]
    pub forward_token: bool,
    /// Keys are refetched this often (a file is also re-read as soon as it changes).
    #[serde(default = "default_refresh_interval")]
    pub jwks_refresh_interval: HumanDuration,
    /// Minimum time between two refreshes triggered by tokens with an unknown `kid`.
    #[serde(default = "default_refresh_cooldown")]
    pub jwks_refresh_cooldown: HumanDuration,
    /// Bound on one JWKS fetch.
    #[serde(default = "default_timeout")]
    pub jwks_timeout: HumanDuration,
}

fn default_algorithms() -> Vec<String> {
    DEFAULT_JWT_ALGORITHMS.map(String::from).to_vec()
}
fn default_skew() -> HumanDuration {
    DEFAULT_JWT_CLOCK_SKEW
}
fn default_refresh_interval() -> HumanDuration {
    DEFAULT_JWKS_REFRESH_INTERVAL
}
fn default_refresh_cooldown() -> HumanDuration {
    DEFAULT_JWKS_REFRESH_COOLDOWN
}
fn default_timeout() -> HumanDuration {
    DEFAULT_JWKS_TIMEOUT
}

/// Validated `[auth]`.
#[derive(Debug, Clone)]
pub struct AuthSettings {
    /// Bearer JWTs, when configured.
    pub jwt: Option<Arc<JwtSettings>>,
    /// Failed authentications per client address and window; 0: no limit.
    pub failure_limit: u32,
    /// The window `failure_limit` counts in.
    pub failure_window: Duration,
}

impl Default for AuthSettings {
    fn default() -> Self {
        Self {
            jwt: None,
            failure_limit: DEFAULT_AUTH_FAILURE_LIMIT,
            failure_window: DEFAULT_AUTH_FAILURE_WINDOW.get(),
        }
    }
}

/// The longest `auth.failure_window`: an address is never blocked for longer than a day.
const MAX_AUTH_FAILURE_WINDOW: Duration = Duration::from_secs(24 * 3600);

pub(super) fn auth(raw: &RawAuth, issues: &mut Issues) -> AuthSettings {
    let window = raw.failure_window.get();
    if raw.failure_limit > 0
        && (window < Duration::from_secs(1) || window > MAX_AUTH_FAILURE_WINDOW)
    {
        issues.push(
            "auth.failure_window",
            format!(
                "= {}: must be between 1s and 24h (or set auth.failure_limit = 0 to turn the limit off)",
                raw.failure_window
            ),
        );
    }
    AuthSettings {
        jwt: raw
            .jwt
            .as_ref()
            .map(|jwt| Arc::new(validate_jwt("auth.jwt", jwt, issues))),
        failure_limit: raw.failure_limit,
        failure_window: window,
    }
}

fn validate_jwt(path: &str, raw: &RawJwt, issues: &mut Issues) -> JwtSettings {
    if raw.issuer.trim().is_empty() {
        issues.push(format!("{path}.issuer"), "is empty: name the tokens' `iss`");
    }
    if raw.audiences.is_empty() || raw.audiences.iter().any(|a| a.is_empty()) {
        issues.push(
            format!("{path}.audiences"),
            "must list at least one non-empty audience (the token's `aud` must contain one)",
        );
    }
    if !claim_name(&raw.tenant_claim) {
        issues.push(
            format!("{path}.tenant_claim"),
            format!(
                "= {:?}: 1–64 characters of [A-Za-z0-9_.:-]",
                raw.tenant_claim
            ),
        );
    }
    let algorithms = algorithms(path, &raw.algorithms, issues);
    let (jwks, initial_keys) = location(path, raw, issues);
    let claims_to_headers = claims_to_headers(path, &raw.claims_to_headers, issues);
    issues.duration_range(
        &format!("{path}.clock_skew"),
        raw.clock_skew.get(),
        Duration::ZERO,
        Duration::from_secs(600),
    );
    issues.duration_range(
        &format!("{path}.jwks_refresh_interval"),
        raw.jwks_refresh_interval.get(),
        Duration::from_secs(1),
        Duration::from_secs(24 * 3600),
    );
    issues.duration_range(
        &format!("{path}.jwks_refresh_cooldown"),
        raw.jwks_refresh_cooldown.get(),
        Duration::from_secs(1),
        Duration::from_secs(3600),
    );
    issues.duration_range(
        &format!("{path}.jwks_timeout"),
        raw.jwks_timeout.get(),
        Duration::from_millis(100),
        Duration::from_secs(60),
    );
    JwtSettings {
        issuer: raw.issuer.clone(),
        audiences: raw.audiences.clone(),
        jwks,
        initial_keys,
        algorithms,
        clock_skew: raw.clock_skew.get(),
        tenant_claim: raw.tenant_claim.clone(),
        claims_to_headers,
        forward_token: raw.forward_token,
        refresh_interval: raw.jwks_refresh_interval.get(),
        refresh_cooldown: raw.jwks_refresh_cooldown.get(),
        fetch_timeout: raw.jwks_timeout.get(),
    }
}

fn claim_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.:-".contains(&b))
}

fn algorithms(path: &str, names: &[String], issues: &mut Issues) -> Vec<Algorithm> {
    if names.is_empty() {
        issues.push(
            format!("{path}.algorithms"),
            "is empty: allowed any of \"RS256\", \"ES256\", \"EdDSA\"",
        );
    }
    let mut out = Vec::new();
    for (i, name) in names.iter().enumerate() {
        match Algorithm::from_name(name) {
            Some(alg) if !out.contains(&alg) => out.push(alg),
            Some(_) => {}
            None => {
                let why = if name.eq_ignore_ascii_case("none") || name.starts_with("HS") {
                    "unsigned and shared-secret tokens are never accepted"
                } else {
                    "not supported"
                };
                issues.push(
                    format!("{path}.algorithms[{i}]"),
                    format!("= {name:?}: {why}; allowed \"RS256\", \"ES256\", \"EdDSA\""),
                );
            }
        }
    }
    out
}

fn location(path: &str, raw: &RawJwt, issues: &mut Issues) -> (JwksLocation, Option<Arc<KeySet>>) {
    let placeholder = JwksLocation::File(PathBuf::new());
    match (&raw.jwks_url, &raw.jwks_file) {
        (Some(url), None) => match jwks_url(url) {
            Ok(location) => (location, None),
            Err(reason) => {
                issues.push(format!("{path}.jwks_url"), reason);
                (placeholder, None)
            }
        },
        (None, Some(file)) => {
            // Read now, so a missing or broken file refuses to start instead of refusing
            // every token; later changes are picked up by the refresher.
            let keys = std::fs::read(file)
                .map_err(|e| e.to_string())
                .and_then(|bytes| KeySet::parse(&bytes).map_err(|e| e.to_string()));
            match keys {
                Ok(keys) => (JwksLocation::File(file.clone()), Some(Arc::new(keys))),
                Err(reason) => {
                    issues.push(
                        format!("{path}.jwks_file"),
                        format!("= {:?}: {reason}", file.display()),
                    );
                    (placeholder, None)
                }
            }
        }
        _ => {
            issues.push(
                format!("{path}.jwks_url"),
                "and jwks_file: set exactly one of them",
            );
            (placeholder, None)
        }
    }
}

fn jwks_url(text: &str) -> Result<JwksLocation, String> {
    let uri: http::Uri = text
        .parse()
        .map_err(|e| format!("= {text:?}: not a URL ({e})"))?;
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("= {text:?}: the URL needs a host"));
    }
    let tls = match uri.scheme_str() {
        Some("http") => None,
        Some("https") => {
            let roots = crate::tls::system_roots().map_err(|e| format!("= {text:?}: {e}"))?;
            let config = crate::tls::upstream_client_config(roots, None, false)
                .map_err(|e| format!("= {text:?}: {e}"))?;
            Some(config)
        }
        _ => return Err(format!("= {text:?}: allowed http:// or https://")),
    };
    Ok(JwksLocation::Url { uri, tls })
}

fn claims_to_headers(
    path: &str,
    map: &BTreeMap<String, String>,
    issues: &mut Issues,
) -> Vec<(String, HeaderName)> {
    let mut out = Vec::new();
    for (claim, header) in map {
        let field = format!("{path}.claims_to_headers.{claim}");
        if !claim_name(claim) {
            issues.push(
                &field,
                "names an invalid claim: 1–64 characters of [A-Za-z0-9_.:-]",
            );
            continue;
        }
        match HeaderName::from_bytes(header.as_bytes()) {
            Ok(name)
                if RESERVED_HEADERS.contains(&name.as_str())
                    || CLIENT_ADDRESS_FIELDS.contains(&name.as_str()) =>
            {
                issues.push(
                    field,
                    format!("= {header:?}: reserved (the gateway or HTTP framing owns it)"),
                );
            }
            Ok(name) if out.iter().any(|(_, n)| *n == name) => {
                issues.push(field, format!("= {header:?}: another claim maps to it"))
            }
            Ok(name) => out.push((claim.clone(), name)),
            Err(_) => issues.push(field, format!("= {header:?}: not a valid header name")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(extra: &str) -> RawJwt {
        toml::from_str(&format!(
            "issuer = \"https://idp\"\naudiences = [\"api\"]\ntenant_claim = \"org_id\"\n{extra}"
        ))
        .unwrap()
    }

    fn paths(raw: &RawJwt) -> Vec<String> {
        let mut issues = Issues::default();
        validate_jwt("auth.jwt", raw, &mut issues);
        match issues.finish() {
            Ok(()) => Vec::new(),
            Err(err) => err.paths(),
        }
    }

    #[test]
    fn defaults_and_a_valid_url() {
        let raw = raw("jwks_url = \"http://127.0.0.1:9/jwks\"");
        assert!(paths(&raw).is_empty());
        let mut issues = Issues::default();
        let settings = validate_jwt("auth.jwt", &raw, &mut issues);
        assert_eq!(settings.algorithms, Algorithm::ALL.to_vec());
        assert_eq!(settings.clock_skew, Duration::from_secs(60));
        assert!(!settings.forward_token);
    }

    #[test]
    fn refusals_name_the_field() {
        let cases = [
            ("", "auth.jwt.jwks_url"),
            (
                "jwks_url = \"http://a/\"\njwks_file = \"/x\"",
                "auth.jwt.jwks_url",
            ),
            ("jwks_url = \"ftp://a/\"", "auth.jwt.jwks_url"),
            (
                "jwks_file = \"/nonexistent/jwks.json\"",
                "auth.jwt.jwks_file",
            ),
            (
                "jwks_url = \"http://a/\"\nalgorithms = [\"none\"]",
                "auth.jwt.algorithms[0]",
            ),
            (
                "jwks_url = \"http://a/\"\nalgorithms = [\"RS256\", \"HS256\"]",
                "auth.jwt.algorithms[1]",
            ),
            (
                "jwks_url = \"http://a/\"\nclock_skew = \"1h\"",
                "auth.jwt.clock_skew",
            ),
            (
                "jwks_url = \"http://a/\"\nclaims_to_headers = { sub = \"x-portcullis-tenant\" }",
                "auth.jwt.claims_to_headers.sub",
            ),
            (
                "jwks_url = \"http://a/\"\nclaims_to_headers = { sub = \"bad header\" }",
                "auth.jwt.claims_to_headers.sub",
            ),
        ];
        for (extra, field) in cases {
            assert_eq!(paths(&raw(extra)), vec![field.to_owned()], "{extra}");
        }
    }
}
