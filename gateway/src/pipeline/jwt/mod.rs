//! Tenants from bearer JWTs (`[auth.jwt]`), beside API keys.
//!
//! `Authorization: Bearer <token>` where the token is shaped like a JWT (three base64url
//! segments, the first a JSON header naming `alg`) is verified here; any other bearer value
//! is an API key as before, and `X-API-Key` still wins over `Authorization`. A bearer
//! token the gateway did not verify never goes upstream (see `crate::pipeline::tenant`).
//!
//! A JWT identifies a tenant when its signature verifies with a key of the issuer's JWKS
//! ([`keys`]: cached, refreshed in the background, and at most once per cooldown on an
//! unknown `kid`), its `exp`/`nbf` hold within `clock_skew`, `iss` is the issuer, `aud`
//! names one of `audiences`, and `tenant_claim` names an active tenant of the directory.
//! That tenant's quotas then apply exactly as for its API keys. Anything else is a 401
//! with `WWW-Authenticate: Bearer error="invalid_token"` — never anonymous, so a broken
//! token cannot fall back to the anonymous per-IP budget.
//!
//! On success the request goes upstream with `X-Portcullis-Tenant` and the
//! `claims_to_headers` headers, and without `Authorization` unless `forward_token = true`
//! (Envoy's `jwt_authn` strips it by default too; Kong forwards it), and then only the
//! verified value. The headers named in
//! `claims_to_headers` are removed from *every* request first, so no client can forge them.
//!
//! Verification is synchronous (inside `context::Resolve`), on the cached keys. The one
//! wait — refreshing keys for an unknown `kid` — happens in [`JwtKeysLayer`] just before,
//! and only for such requests.

mod error;
mod fetch;
mod jwk;
mod keys;
mod layer;
mod settings;
mod token;

use std::sync::Arc;
use std::time::UNIX_EPOCH;

use http::{header, HeaderMap, HeaderName, HeaderValue};
use portcullis_control::{Directory, Tenant};
use portcullis_problem::clock::{SystemWallClock, WallClock};

pub use error::JwtError;
pub use jwk::{Algorithm, KeySet};
use keys::KeyCache;
pub(crate) use layer::JwtKeysLayer;
pub use settings::{JwksLocation, JwtSettings};
use token::{check_claims, claim_header_text, looks_like_jwt, Parsed, Rules};

/// The `[auth.jwt]` verifier with its key cache; shared by the pipeline's layers.
pub(crate) struct JwtAuth {
    settings: Arc<JwtSettings>,
    keys: Arc<KeyCache>,
    clock: Arc<dyn WallClock>,
}

/// A verified token: the tenant and the headers its claims become.
#[derive(Debug)]
pub(crate) struct Verified {
    pub(crate) tenant: Arc<Tenant>,
    pub(crate) headers: Vec<(HeaderName, HeaderValue)>,
}

// === impl JwtAuth ===

impl JwtAuth {
    /// The verifier for `settings`; its background refresher runs until the verifier is
    /// dropped (so it needs no shutdown signal of its own). Must run inside the runtime.
    pub(crate) fn start(settings: Arc<JwtSettings>) -> Arc<Self> {
        let this = Arc::new(Self::new(settings, Arc::new(SystemWallClock)));
        tokio::spawn(KeyCache::keep_fresh(
            Arc::downgrade(&this.keys),
            this.settings.refresh_interval,
        ));
        this
    }

    fn new(settings: Arc<JwtSettings>, clock: Arc<dyn WallClock>) -> Self {
        let source: Box<dyn fetch::JwksSource> = match &settings.jwks {
            JwksLocation::Url { uri, tls } => Box::new(fetch::UrlSource::new(
                uri.clone(),
                tls.clone(),
                settings.fetch_timeout,
            )),
            JwksLocation::File(path) => Box::new(fetch::FileSource::new(path.clone())),
        };
        let initial = settings
            .initial_keys
            .as_deref()
            .cloned()
            .unwrap_or_default();
        let keys = Arc::new(KeyCache::new(source, initial, settings.refresh_cooldown));
        Self {
            settings,
            keys,
            clock,
        }
    }

    /// Removes client-sent headers that only verified claims may set.
    pub(crate) fn strip_claim_headers(&self, headers: &mut HeaderMap) {
        for (_, name) in &self.settings.claims_to_headers {
            headers.remove(name);
        }
    }

    /// The bearer JWT this request presents, if it is to be verified here: no `X-API-Key`
    /// (which wins), and an `Authorization: Bearer` value shaped like a JWT.
    pub(crate) fn presented<'h>(&self, headers: &'h HeaderMap) -> Option<&'h str> {
        if headers.contains_key(&crate::plumbing::headers::X_API_KEY) {
            return None;
        }
        let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
        let (scheme, token) = value.split_once(' ')?;
        let token = token.trim();
        (scheme.eq_ignore_ascii_case("bearer") && looks_like_jwt(token)).then_some(token)
    }

    /// The `kid` of a presented token whose key the cache does not hold (an accepted
    /// algorithm only: other tokens are refused without touching the key set).
    pub(crate) fn unknown_kid(&self, headers: &HeaderMap) -> Option<String> {
        let parsed = Parsed::parse(self.presented(headers)?).ok()?;
        let alg = Algorithm::from_name(&parsed.header.alg)?;
        if !self.settings.algorithms.contains(&alg) {
            return None;
        }
        let kid = parsed.header.kid?;
        (!self.keys.knows(&kid)).then_some(kid)
    }

    /// Verifies `token` and resolves its tenant in `directory`.
    pub(crate) fn verify(&self, token: &str, directory: &Directory) -> Result<Verified, JwtError> {
        let parsed = Parsed::parse(token)?;
        let alg = Algorithm::from_name(&parsed.header.alg)
            .filter(|alg| self.settings.algorithms.contains(alg))
            .ok_or(JwtError::Algorithm)?;
        let signature = parsed.signature()?;
        let keys = self.keys.keys();
        let mut candidates = keys
            .candidates(alg, parsed.header.kid.as_deref())
            .peekable();
        if candidates.peek().is_none() {
            return Err(JwtError::UnknownKey);
        }
        if !candidates.any(|key| key.verify(parsed.signing_input.as_bytes(), &signature)) {
            return Err(JwtError::Signature);
        }
        let claims = parsed.claims()?;
        let now = self
            .clock
            .now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let rules = Rules {
            issuer: &self.settings.issuer,
            audiences: &self.settings.audiences,
            skew_secs: self.settings.clock_skew.as_secs(),
            tenant_claim: &self.settings.tenant_claim,
        };
        let tenant_id = check_claims(&claims, rules, now)?;
        let tenant = directory
            .load()
            .by_id(&tenant_id)
            .filter(|t| !t.disabled)
            .cloned()
            .ok_or(JwtError::UnknownTenant)?;
        let headers = self
            .settings
            .claims_to_headers
            .iter()
            .filter_map(|(claim, name)| {
                let text = claim_header_text(claims.get(claim)?)?;
                // A claim that is not a valid field value (control characters) is dropped.
                Some((name.clone(), HeaderValue::from_str(&text).ok()?))
            })
            .collect();
        Ok(Verified { tenant, headers })
    }

    /// Whether `Authorization` goes upstream after verification.
    pub(crate) fn forward_token(&self) -> bool {
        self.settings.forward_token
    }
}

impl std::fmt::Debug for JwtAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtAuth")
            .field("issuer", &self.settings.issuer)
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
