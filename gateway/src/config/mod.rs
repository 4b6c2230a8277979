//! Configuration: one TOML file, parsed once, validated fully, then frozen.
//!
//! Stage one ([`raw`]) is serde with `deny_unknown_fields` and documented defaults. Stage two
//! ([`Config::from_raw`]) checks every range and cross-reference and produces the runtime
//! types below; every problem is reported with its field path (`routes[2].retry.max_retries
//! = 7: allowed 0..=5`) and the binary refuses to start. Secrets (API keys, URL passwords,
//! the admin token) never appear in `Debug` output or in `check-config`.

mod auth;
mod backend;
mod balance;
mod bucket;
mod duration;
mod error;
pub mod raw;
pub(crate) mod routes;
mod settings;
pub mod telemetry;
mod tls;
mod upstream;
mod validate;

use std::path::Path;

pub use auth::AuthSettings;
pub use backend::{redact_url, DatabaseBackend, IdempotencyBackend, QueueBackend, StateBackend};
pub use balance::{
    DiscoverySettings, HealthCheckSettings, LoadBalancer, OutlierSettings, MAX_WEIGHT,
};
pub use duration::{AttemptTimeout, HumanDuration};
pub use error::{ConfigError, ConfigIssue};
pub use portcullis_retry::{BreakerConfig, BudgetConfig, RetryPolicy};
use raw::RawConfig;
pub use raw::DEFAULT_TLS_HANDSHAKE_TIMEOUT;
pub use routes::cors::CorsSettings;
pub use routes::delivery::{AlertWebhook, DedupeSource, DeliverySettings, MIN_DEDUPE_WINDOW};
pub use routes::header_rules::{HeaderRules, HeaderVars};
pub use routes::pattern::{PathRule, Pattern};
pub use routes::rules::{HeaderRule, HeaderValueRule, HostRule};
pub use routes::verify::{SignatureScheme, SigningKey, VerifySettings};
pub use settings::{
    Bucket, Config, DemoSettings, Env, IdempotencySettings, InFlightMode, LogFormat, Priority,
    ProcessEnv, RateLimitSettings, RouteSettings, Secret, ServerSettings, StorageSettings,
    StoreErrorMode, SyncMode, TenantSettings, UpstreamSettings, WebSocketSettings,
};
pub use telemetry::TelemetrySettings;
pub use tls::{Http2Settings, UpstreamTls};
pub use upstream::parse_endpoints_file;

/// Environment variable holding the admin API bearer token.
pub use portcullis_control::ENV_ADMIN_TOKEN;

// === impl Config ===

impl Config {
    /// Reads, parses and validates a file.
    pub fn load(path: &Path, env: &dyn Env) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text, env)
    }

    /// Parses and validates TOML text.
    pub fn parse(text: &str, env: &dyn Env) -> Result<Self, ConfigError> {
        Self::from_raw(parse_raw(text)?, env)
    }

    /// Validates stage-one values into runtime types.
    pub fn from_raw(raw: RawConfig, env: &dyn Env) -> Result<Self, ConfigError> {
        validate::validate(raw, env)
    }
}

/// Parses TOML into the stage-one structs; errors carry the field path.
pub fn parse_raw(text: &str) -> Result<RawConfig, ConfigError> {
    let deserializer = toml::Deserializer::new(text);
    serde_path_to_error::deserialize(deserializer).map_err(|err| {
        let path = err.path().to_string();
        let path = if path == "." || path.is_empty() {
            "<root>".to_owned()
        } else {
            path
        };
        let message = err.inner().message().to_owned();
        let location = err
            .inner()
            .span()
            .map(|span| format!(" (at byte {})", span.start))
            .unwrap_or_default();
        ConfigError::Parse {
            path,
            message: format!("{message}{location}"),
        }
    })
}

/// An alert webhook URL as printed: scheme and authority only, since the path of a
/// webhook URL is often its secret (`https://hooks.example/***`).
fn redact_webhook(text: &str) -> String {
    match text.parse::<http::Uri>() {
        Ok(uri) => match (uri.scheme_str(), uri.authority()) {
            (Some(scheme), Some(authority)) => {
                let host = authority.as_str().rsplit('@').next().unwrap_or_default();
                format!("{scheme}://{host}/***")
            }
            _ => "***".to_owned(),
        },
        Err(_) => "***".to_owned(),
    }
}

/// The effective configuration as TOML, defaults filled in and secrets redacted.
pub fn effective_toml(text: &str) -> Result<String, ConfigError> {
    let mut raw = parse_raw(text)?;
    // Printed under the current names (a clash was refused by the validation before this).
    raw::renamed::apply(&mut raw);
    for tenant in &mut raw.tenants {
        for key in &mut tenant.api_keys {
            *key = "<redacted>".into();
        }
    }
    raw.storage.state = redact_url(&raw.storage.state);
    raw.storage.database = redact_url(&raw.storage.database);
    raw.storage.idempotency = raw.storage.idempotency.as_deref().map(redact_url);
    raw.storage.queue = raw.storage.queue.as_deref().map(redact_url);
    for route in &mut raw.routes {
        if let Some(delivery) = route.delivery.as_mut() {
            delivery.alert_webhook = delivery.alert_webhook.as_deref().map(redact_webhook);
        }
    }
    toml::to_string_pretty(&raw).map_err(|e| ConfigError::Parse {
        path: "<root>".into(),
        message: e.to_string(),
    })
}

#[cfg(test)]
mod tests;
