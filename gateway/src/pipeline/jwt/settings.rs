//! What the verifier is configured with: validated `[auth.jwt]` (built by
//! `crate::config`, which reads and checks the file; this side only consumes it).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;

use super::jwk::{Algorithm, KeySet};

/// Where the key set comes from.
#[derive(Debug, Clone)]
pub enum JwksLocation {
    /// Fetched over HTTP(S); `tls` is set for `https://`.
    Url {
        /// The JWKS address.
        uri: http::Uri,
        /// Client configuration (system roots) for `https://`.
        tls: Option<Arc<rustls::ClientConfig>>,
    },
    /// Read from this file.
    File(PathBuf),
}

/// Validated `[auth.jwt]`.
#[derive(Debug, Clone)]
pub struct JwtSettings {
    /// Required `iss`.
    pub issuer: String,
    /// Accepted audiences.
    pub audiences: Vec<String>,
    /// Key set source.
    pub jwks: JwksLocation,
    /// The file's keys as read at start-up (`None` for a URL: fetched in the background).
    pub initial_keys: Option<Arc<KeySet>>,
    /// Accepted algorithms.
    pub algorithms: Vec<Algorithm>,
    /// Tolerance on `exp` / `nbf`.
    pub clock_skew: Duration,
    /// The claim naming the tenant.
    pub tenant_claim: String,
    /// Claims forwarded as headers.
    pub claims_to_headers: Vec<(String, HeaderName)>,
    /// Keep `Authorization` on the forwarded request.
    pub forward_token: bool,
    /// Periodic refetch.
    pub refresh_interval: Duration,
    /// Unknown-`kid` refresh rate limit.
    pub refresh_cooldown: Duration,
    /// One fetch's bound.
    pub fetch_timeout: Duration,
}
