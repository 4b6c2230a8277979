//! Bearer-token authentication of every admin request, and the audit actor.
//!
//! The presented token and the configured one are both hashed with SHA-256 and the digests
//! compared with `subtle`'s constant-time equality: comparing digests of equal length hides
//! the configured token's length too, which a plain constant-time comparison of the raw
//! strings would leak by returning early on a length mismatch.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::IntoResponse;
use http::{header, HeaderMap, HeaderName, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::error::AdminError;
use super::validate::actor_suffix;
use super::{Actor, AdminState};

/// Optional header naming the person or system behind a change, recorded in the audit log
/// after the fixed `admin-token` actor (there is one shared token, so this is a label the
/// caller asserts, not an identity the gateway verified).
pub(crate) static X_ADMIN_ACTOR: HeaderName = HeaderName::from_static("x-admin-actor");

/// The actor of every change made with the admin token.
pub(crate) const TOKEN_ACTOR: &str = "admin-token";

/// SHA-256 of the configured token; the plaintext is not kept by the admin API.
#[derive(Clone)]
pub(crate) struct TokenDigest([u8; 32]);

// === impl TokenDigest ===

impl TokenDigest {
    pub(crate) fn new(token: &str) -> Self {
        Self(Sha256::digest(token.as_bytes()).into())
    }

    /// Constant-time check of a presented token.
    pub(crate) fn matches(&self, presented: &str) -> bool {
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        digest.ct_eq(&self.0).into()
    }
}

/// Middleware: 401 problem+json unless `Authorization: Bearer <token>` matches; otherwise
/// records the [`Actor`] and passes the request on.
pub(crate) async fn require_token(
    State(state): State<AdminState>,
    mut request: Request,
    next: Next,
) -> Response<Body> {
    let authorized = bearer(request.headers()).is_some_and(|t| state.token.matches(t));
    if !authorized {
        metrics::counter!("admin_auth_failures_total").increment(1);
        // The presented value is never logged: it may be a real token with a typo.
        tracing::warn!(path = %request.uri().path(), "admin request refused: missing or invalid token");
        return AdminError::Unauthorized.into_response();
    }
    let actor = match request
        .headers()
        .get(&X_ADMIN_ACTOR)
        .and_then(|v| actor_suffix(v.as_bytes()))
    {
        Some(who) => format!("{TOKEN_ACTOR}:{who}"),
        None => TOKEN_ACTOR.to_owned(),
    };
    request.extensions_mut().insert(Actor(actor));
    next.run(request).await
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_comparison() {
        let digest = TokenDigest::new("a-long-admin-token");
        assert!(digest.matches("a-long-admin-token"));
        assert!(!digest.matches("a-long-admin-tokeN"));
        assert!(!digest.matches(""));
        assert!(!digest.matches("a-long-admin-token-and-more"));
    }

    #[test]
    fn bearer_scheme_only() {
        let mut headers = HeaderMap::new();
        assert_eq!(bearer(&headers), None);
        headers.insert(header::AUTHORIZATION, "Basic abc".parse().unwrap());
        assert_eq!(bearer(&headers), None);
        headers.insert(header::AUTHORIZATION, "bearer  tok ".parse().unwrap());
        assert_eq!(bearer(&headers), Some("tok"));
    }
}
