//! Tenant resolution: who is calling?
//!
//! - `X-API-Key: …`, or else `Authorization: Bearer …`, names a tenant through the SHA-256 of
//!   the key. A known, active key → [`Caller::Tenant`]; the credential is removed before the
//!   request goes upstream (backends get `X-Portcullis-Tenant` instead, never the key).
//! - A key that is unknown, revoked or belongs to a disabled tenant → 401 problem+json. It is
//!   never treated as anonymous, so a bad key cannot spend someone else's quota.
//! - No key → [`Caller::Anonymous`], limited per client IP, which honours
//!   `X-Forwarded-For` only from `server.trusted_proxies`.
//!
//! The caller is resolved once per request, into the request context
//! ([`crate::pipeline::resolve`]).
//!
//! With `[auth.jwt]`, a bearer value shaped like a JWT is verified as one instead
//! ([`crate::pipeline::jwt`]); other bearer values are still API keys.
//!
//! When both headers are present `X-API-Key` wins. Without `[auth.jwt]` the `Authorization`
//! beside it is passed through untouched, so backends can keep their own bearer tokens. With
//! `[auth.jwt]` a backend may take any bearer token that reaches it as verified by the
//! gateway, so every `Authorization: Bearer` value the gateway did not verify is removed
//! (the one beside `X-API-Key`, a second `Authorization` field, one on an anonymous request);
//! other schemes (`Basic`, …) still pass. A verified JWT goes upstream only with
//! `forward_token = true`, and then only the value that was verified.
//!
//! Tenants come from the control plane's [`Directory`] snapshot (`portcullis-control`); this
//! layer only reads it.

use axum::body::Body;
use http::{header, HeaderName, HeaderValue, Response, StatusCode};
use portcullis_control::Directory;
use sha2::{Digest, Sha256};

use portcullis_problem::Problem;

use crate::pipeline::jwt::{JwtAuth, JwtError, Verified};
use crate::plumbing::context::Caller;
use crate::plumbing::headers::{X_API_KEY, X_PORTCULLIS_TENANT};

/// The caller a request's credentials name, its credential replaced by
/// `X-Portcullis-Tenant` (see the module docs); `Err` is the 401 answer. Part of building the
/// request context (`context::Resolve`).
#[allow(clippy::result_large_err)] // the answer goes straight back to the client
pub(crate) fn resolve_caller(
    directory: &Directory,
    jwt: Option<&JwtAuth>,
    headers: &mut http::HeaderMap,
) -> Result<Caller, Response<Body>> {
    // Only the gateway says who the tenant is.
    headers.remove(&X_PORTCULLIS_TENANT);
    if let Some(jwt) = jwt {
        jwt.strip_claim_headers(headers);
        if let Some(verified) = jwt.presented(headers).map(|t| jwt.verify(t, directory)) {
            return jwt_caller(jwt, verified, headers);
        }
    }
    // No JWT is verified on this request: with `[auth.jwt]`, no bearer token goes upstream
    // as if it were (a bearer API key is removed with its header below).
    let strip_unverified = |headers: &mut http::HeaderMap| {
        if jwt.is_some() {
            strip_bearer_tokens(headers);
        }
    };
    let Some((source, key)) = presented_key(headers) else {
        strip_unverified(headers);
        return Ok(Caller::Anonymous);
    };
    let hash: [u8; 32] = Sha256::digest(key.as_bytes()).into();
    let snapshot = directory.load();
    match snapshot.by_key_hash(&hash) {
        Some(tenant) if !tenant.disabled => {
            headers.remove(source);
            strip_unverified(headers);
            if let Ok(value) = HeaderValue::from_str(&tenant.id) {
                headers.insert(X_PORTCULLIS_TENANT.clone(), value);
            }
            Ok(Caller::Tenant(tenant.clone()))
        }
        _ => {
            metrics::counter!("tenant_auth_failures_total").increment(1);
            Err(unauthorized())
        }
    }
}

/// The caller a bearer JWT names (see `crate::pipeline::jwt`): its tenant and claim headers
/// set, the token removed unless `forward_token`; a refused token is a 401, never anonymous.
#[allow(clippy::result_large_err)] // the answer goes straight back to the client
fn jwt_caller(
    jwt: &JwtAuth,
    verified: Result<Verified, JwtError>,
    headers: &mut http::HeaderMap,
) -> Result<Caller, Response<Body>> {
    match verified {
        Ok(Verified {
            tenant,
            headers: claims,
        }) => {
            // Only the value that was verified (the first) may go upstream, never a second
            // `Authorization` field beside it.
            let token = headers.remove(header::AUTHORIZATION);
            if let Some(token) = token.filter(|_| jwt.forward_token()) {
                headers.insert(header::AUTHORIZATION, token);
            }
            if let Ok(value) = HeaderValue::from_str(&tenant.id) {
                headers.insert(X_PORTCULLIS_TENANT.clone(), value);
            }
            for (name, value) in claims {
                headers.insert(name, value);
            }
            Ok(Caller::Tenant(tenant))
        }
        Err(err) => {
            metrics::counter!("tenant_auth_failures_total").increment(1);
            metrics::counter!("jwt_refused_total", "reason" => err.reason()).increment(1);
            Err(err.into_response())
        }
    }
}

/// The API key and the header it came in: `X-API-Key` first, then `Authorization: Bearer`.
fn presented_key(headers: &http::HeaderMap) -> Option<(HeaderName, String)> {
    if let Some(value) = headers.get(&X_API_KEY) {
        return Some((
            X_API_KEY.clone(),
            value.to_str().unwrap_or("\u{0}").trim().to_owned(),
        ));
    }
    let auth = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = auth.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| (header::AUTHORIZATION, token.trim().to_owned()))
}

/// Whether a request presents a credential the gateway checks: `X-API-Key`, or an
/// `Authorization: Bearer` (an API key or a JWT). What a blocked address may no longer send
/// (`crate::pipeline::auth_failures`).
pub(crate) fn presents_credential(headers: &http::HeaderMap) -> bool {
    headers.contains_key(&X_API_KEY) || headers.get(header::AUTHORIZATION).is_some_and(is_bearer)
}

/// Removes every `Authorization` value whose scheme is `Bearer` (case-insensitive, followed
/// by any whitespace or nothing), keeping the others in order; a no-op without one.
fn strip_bearer_tokens(headers: &mut http::HeaderMap) {
    if !headers.get_all(header::AUTHORIZATION).iter().any(is_bearer) {
        return;
    }
    let others: Vec<HeaderValue> = headers
        .get_all(header::AUTHORIZATION)
        .iter()
        .filter(|value| !is_bearer(value))
        .cloned()
        .collect();
    headers.remove(header::AUTHORIZATION);
    for value in others {
        headers.append(header::AUTHORIZATION, value);
    }
}

/// Whether an `Authorization` value uses the `Bearer` scheme, however it is spaced.
fn is_bearer(value: &HeaderValue) -> bool {
    let bytes = value.as_bytes().trim_ascii_start();
    let scheme = bytes
        .split(|b| b.is_ascii_whitespace())
        .next()
        .unwrap_or_default();
    scheme.eq_ignore_ascii_case(b"bearer")
}

fn unauthorized() -> Response<Body> {
    let mut response = Problem::new(
        StatusCode::UNAUTHORIZED,
        "invalid-api-key",
        "Invalid API key",
        "the API key is unknown, revoked or disabled; send a valid key in X-API-Key or Authorization: Bearer, or none for anonymous access",
    )
    .into_response();
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"portcullis\""),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_sources_in_order() {
        let mut headers = http::HeaderMap::new();
        assert!(presented_key(&headers).is_none());
        headers.insert(header::AUTHORIZATION, "Bearer abc".parse().unwrap());
        assert_eq!(presented_key(&headers).unwrap().1, "abc");
        headers.insert(&X_API_KEY, "xyz".parse().unwrap());
        let (source, key) = presented_key(&headers).unwrap();
        assert_eq!((source, key.as_str()), (X_API_KEY.clone(), "xyz"));
        let mut basic = http::HeaderMap::new();
        basic.insert(header::AUTHORIZATION, "Basic Zm9v".parse().unwrap());
        assert!(
            presented_key(&basic).is_none(),
            "non-bearer Authorization is the backend's business"
        );
    }

    #[test]
    fn bearer_values_are_stripped_and_other_schemes_kept() {
        let mut headers = http::HeaderMap::new();
        for value in [
            "Basic Zm9v",
            "Bearer a.b.c",
            "bearer\tx",
            "  BEARER y",
            "Digest d",
        ] {
            headers.append(header::AUTHORIZATION, value.parse().unwrap());
        }
        strip_bearer_tokens(&mut headers);
        let left: Vec<_> = headers.get_all(header::AUTHORIZATION).iter().collect();
        assert_eq!(left, ["Basic Zm9v", "Digest d"]);
        let mut none = http::HeaderMap::new();
        none.insert(header::AUTHORIZATION, "Bearerx y".parse().unwrap());
        strip_bearer_tokens(&mut none);
        assert_eq!(
            none.len(),
            1,
            "another scheme that starts with the same letters"
        );
    }

    proptest::proptest! {
        #[test]
        fn key_extraction_never_panics(auth in proptest::collection::vec(proptest::num::u8::ANY, 0..80),
                                       api in proptest::collection::vec(proptest::num::u8::ANY, 0..80)) {
            let mut headers = http::HeaderMap::new();
            if let Ok(v) = HeaderValue::from_bytes(&auth) { headers.insert(header::AUTHORIZATION, v); }
            let _ = presented_key(&headers);
            if let Ok(v) = HeaderValue::from_bytes(&api) { headers.insert(&X_API_KEY, v); }
            let _ = presented_key(&headers);
        }
    }
}
