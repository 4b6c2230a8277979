//! `verify = { … }` on a route: the inbound signature scheme and its secret, read from the
//! environment once, at start-up (`pipeline::signature` checks requests against it).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;

use crate::config::error::Issues;
use crate::config::raw::{RawTenant, RawVerify};
use crate::config::settings::Env;

/// Default `tolerance`: how far a signed timestamp may be from the gateway's clock.
pub const DEFAULT_SIGNATURE_TOLERANCE: Duration = Duration::from_secs(300);

/// Longest `tolerance`.
const MAX_SIGNATURE_TOLERANCE: Duration = Duration::from_secs(3600);

/// How a route's requests are signed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignatureScheme {
    /// `X-Hub-Signature-256: sha256=<hex>`, HMAC-SHA256 of the raw body.
    HmacSha256,
    /// `Stripe-Signature: t=<unix>,v1=<hex>[,v1=…]`, HMAC-SHA256 of `"{t}.{body}"`.
    Stripe,
    /// Standard Webhooks: `webhook-id`, `webhook-timestamp`, `webhook-signature: v1,<base64>
    /// …`, HMAC-SHA256 of `"{id}.{timestamp}.{body}"` with the key of `whsec_<base64>`.
    StandardWebhooks,
}

impl SignatureScheme {
    /// The name in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::HmacSha256 => "hmac-sha256",
            Self::Stripe => "stripe",
            Self::StandardWebhooks => "standard-webhooks",
        }
    }

    fn default_header(self) -> &'static str {
        match self {
            Self::HmacSha256 => "x-hub-signature-256",
            Self::Stripe => "stripe-signature",
            Self::StandardWebhooks => "webhook-signature",
        }
    }
}

/// An HMAC key; its `Debug` never shows it.
#[derive(Clone)]
pub struct SigningKey(Arc<[u8]>);

impl SigningKey {
    /// The key bytes; read only where a signature is computed.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("\"<redacted>\"")
    }
}

/// A route's validated `verify`.
#[derive(Debug, Clone)]
pub struct VerifySettings {
    /// The scheme.
    pub scheme: SignatureScheme,
    /// The header holding the signature.
    pub header: http::HeaderName,
    /// The HMAC key.
    pub key: SigningKey,
    /// Largest difference between a signed timestamp and the gateway's clock.
    pub tolerance: Duration,
    /// The variable the key was read from (for messages; never the key).
    pub secret_env: String,
    /// Keys of the file tenants that carry their own secret for this route
    /// (`tenants[].signature_secrets`), by tenant id: for them it replaces [`Self::key`].
    pub tenant_keys: HashMap<String, SigningKey>,
}

impl VerifySettings {
    /// The key a request of `tenant` (`None`: anonymous) is checked with: the tenant's own,
    /// else the route's.
    pub fn key_for(&self, tenant: Option<&str>) -> &SigningKey {
        tenant
            .and_then(|id| self.tenant_keys.get(id))
            .unwrap_or(&self.key)
    }
}

/// `verify` at `path` (`routes[i].verify`) of the route named `route`, its secret and those
/// of the `tenants` that carry one for it read from `env`.
pub(crate) fn verify(
    path: &str,
    route: &str,
    raw: &RawVerify,
    tenants: &[RawTenant],
    env: &dyn Env,
    issues: &mut Issues,
) -> Option<Arc<VerifySettings>> {
    let scheme = match raw.scheme.as_str() {
        "hmac-sha256" => SignatureScheme::HmacSha256,
        "stripe" => SignatureScheme::Stripe,
        "standard-webhooks" => SignatureScheme::StandardWebhooks,
        other => {
            issues.push(
                format!("{path}.scheme"),
                format!(
                    "= {other:?}: allowed \"hmac-sha256\", \"stripe\" or \"standard-webhooks\""
                ),
            );
            return None;
        }
    };
    let header_text = raw.header.as_deref().unwrap_or(scheme.default_header());
    let header = http::HeaderName::from_bytes(header_text.trim().as_bytes())
        .map_err(|_| {
            issues.push(
                format!("{path}.header"),
                format!("= {header_text:?}: not a header name"),
            );
        })
        .ok();
    let tolerance = match (scheme, raw.tolerance) {
        (SignatureScheme::HmacSha256, Some(_)) => {
            issues.push(
                format!("{path}.tolerance"),
                "hmac-sha256 signs no timestamp: tolerance needs scheme \"stripe\" or \"standard-webhooks\"",
            );
            DEFAULT_SIGNATURE_TOLERANCE
        }
        (_, Some(t)) => {
            issues.duration_range(
                &format!("{path}.tolerance"),
                t.get(),
                Duration::from_secs(1),
                MAX_SIGNATURE_TOLERANCE,
            );
            t.get()
        }
        (_, None) => DEFAULT_SIGNATURE_TOLERANCE,
    };
    let key = secret(
        format!("{path}.secret_env"),
        scheme,
        &raw.secret_env,
        env,
        issues,
    );
    let mut tenant_keys = HashMap::new();
    for (i, tenant) in tenants.iter().enumerate() {
        if let Some(name) = tenant.signature_secrets.get(route) {
            let field = format!("tenants[{i}].signature_secrets.{route}");
            if let Some(key) = secret(field, scheme, name, env, issues) {
                tenant_keys.insert(tenant.id.clone(), key);
            }
        }
    }
    Some(Arc::new(VerifySettings {
        scheme,
        header: header?,
        key: key?,
        tolerance,
        secret_env: raw.secret_env.clone(),
        tenant_keys,
    }))
}

/// The key held by the variable `name`: its bytes, or for Standard Webhooks the base64 after
/// `whsec_`. A missing, empty or malformed secret is reported on `field`, never shown.
fn secret(
    field: String,
    scheme: SignatureScheme,
    name: &str,
    env: &dyn Env,
    issues: &mut Issues,
) -> Option<SigningKey> {
    let Some(value) = env.get(name).filter(|v| !v.is_empty()) else {
        issues.push(
            field,
            format!("= {name:?}: the environment variable is not set (or empty)"),
        );
        return None;
    };
    let bytes = match scheme {
        SignatureScheme::StandardWebhooks => {
            let text = value.strip_prefix("whsec_").unwrap_or(&value);
            match base64::engine::general_purpose::STANDARD.decode(text.trim()) {
                Ok(bytes) if !bytes.is_empty() => bytes,
                _ => {
                    issues.push(
                        field,
                        format!("= {name:?}: the variable must hold whsec_<base64>"),
                    );
                    return None;
                }
            }
        }
        SignatureScheme::HmacSha256 | SignatureScheme::Stripe => value.into_bytes(),
    };
    Some(SigningKey(Arc::from(bytes)))
}
