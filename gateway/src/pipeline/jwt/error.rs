//! Why a bearer token was refused, and the one 401 answer every refusal gets.

use axum::body::Body;
use http::{header, HeaderValue, Response, StatusCode};
use portcullis_problem::Problem;

/// A bearer JWT that does not identify a tenant. Every kind is a 401 with
/// `WWW-Authenticate: Bearer error="invalid_token"` (RFC 6750 §3.1); the message is the
/// `error_description` and the problem's `detail`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum JwtError {
    /// Not three base64url segments with JSON header and payload.
    #[error("the token is not a well-formed signed JWT")]
    Malformed,
    /// `alg` is not among `auth.jwt.algorithms` (`none` and HS* never are).
    #[error("the token's signing algorithm is not accepted")]
    Algorithm,
    /// A `crit` header extension: the gateway understands none (RFC 7515 §4.1.11).
    #[error("the token requires a header extension the gateway does not support")]
    Critical,
    /// No key of the issuer's set has the token's `kid` and algorithm.
    #[error("no key of the issuer's key set matches the token")]
    UnknownKey,
    /// The signature does not verify.
    #[error("the token's signature is invalid")]
    Signature,
    /// `exp` (plus the clock skew) has passed, or there is no `exp`.
    #[error("the token has expired or has no expiry")]
    Expired,
    /// `nbf` (minus the clock skew) is still ahead.
    #[error("the token is not valid yet")]
    NotYetValid,
    /// `iss` is not the configured issuer.
    #[error("the token was issued by another issuer")]
    Issuer,
    /// No `aud` value is among the configured audiences.
    #[error("the token is not meant for this audience")]
    Audience,
    /// The tenant claim is absent or not a string.
    #[error("the token has no string tenant claim")]
    MissingTenant,
    /// The tenant claim names no active tenant.
    #[error("the token's tenant is unknown or disabled")]
    UnknownTenant,
}

// === impl JwtError ===

impl JwtError {
    /// A short stable label (metrics).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Malformed => "malformed",
            Self::Algorithm => "algorithm",
            Self::Critical => "critical",
            Self::UnknownKey => "unknown_key",
            Self::Signature => "signature",
            Self::Expired => "expired",
            Self::NotYetValid => "not_yet_valid",
            Self::Issuer => "issuer",
            Self::Audience => "audience",
            Self::MissingTenant => "missing_tenant",
            Self::UnknownTenant => "unknown_tenant",
        }
    }

    /// The 401 problem+json answer.
    pub fn into_response(self) -> Response<Body> {
        let description = self.to_string();
        let mut response = Problem::new(
            StatusCode::UNAUTHORIZED,
            "invalid-token",
            "Invalid bearer token",
            format!("{description}; send a valid token in Authorization: Bearer, or an API key"),
        )
        .with("error", "invalid_token")
        .into_response();
        // The messages are fixed ASCII without quotes, so the quoted-string is always valid.
        let challenge = format!(
            "Bearer realm=\"portcullis\", error=\"invalid_token\", error_description=\"{description}\""
        );
        if let Ok(value) = HeaderValue::from_str(&challenge) {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, value);
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_refusal_is_a_401_challenge() {
        for err in [
            JwtError::Malformed,
            JwtError::Algorithm,
            JwtError::Critical,
            JwtError::UnknownKey,
            JwtError::Signature,
            JwtError::Expired,
            JwtError::NotYetValid,
            JwtError::Issuer,
            JwtError::Audience,
            JwtError::MissingTenant,
            JwtError::UnknownTenant,
        ] {
            let description = err.to_string();
            assert!(!description.contains('"') && !description.contains('\\'));
            let response = err.into_response();
            assert_eq!(response.status(), 401);
            let challenge = response.headers()[header::WWW_AUTHENTICATE]
                .to_str()
                .unwrap();
            assert!(challenge.starts_with("Bearer realm=\"portcullis\", error=\"invalid_token\""));
            assert!(challenge.contains(&description));
        }
    }
}
