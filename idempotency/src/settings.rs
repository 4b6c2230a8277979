//! Per-request settings, produced by the caller's extractor closure.

use std::sync::Arc;
use std::time::Duration;

use http::Method;

use crate::key::{DEFAULT_MAX_KEY_LEN, MAX_KEY_LEN_LIMIT};

/// Minimum (and default) retention of completed records: a day, the span within which a
/// client may retry an operation (docs/retry-policy.md).
pub const MIN_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// Default lease: the retry layer's default total deadline (30 s) plus 5 s for body
/// buffering and store round trips (see [`IdempotencySettings::lease`]).
pub const DEFAULT_LEASE: Duration = Duration::from_secs(35);

/// Default bound for [`OnInFlight::Wait`].
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(10);

/// Default request-body buffering limit for fingerprinting (1 MiB).
pub const DEFAULT_MAX_BODY_BYTES: usize = 1 << 20;

/// Default largest response stored for replay (1 MiB).
pub const DEFAULT_MAX_STORED_RESPONSE_BYTES: usize = 1 << 20;

/// What to do with a duplicate that arrives while the first copy is still running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnInFlight {
    /// Answer 409 + `Retry-After` at once (Stripe's behaviour; the default).
    Reject,
    /// Poll the store (with jittered backoff, 25 ms doubling to 1 s) for up to this long,
    /// then replay the first copy's response; 409 if it is still running by then.
    Wait(Duration),
}

/// How the layer treats one request. Returned by the extractor; `None` means the request is
/// passed through untouched (no buffering, no store access).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencySettings {
    /// Tenant the request belongs to: part of the record scope and of the fingerprint.
    /// Shared, like the route and methods, so that an extractor hands out per-route
    /// templates without copying strings per request.
    pub tenant: Arc<str>,
    /// Route identifier: part of the record scope.
    pub route: Arc<str>,
    /// Methods that are deduplicated (default POST, PATCH); others pass through.
    pub methods: Arc<[Method]>,
    /// Refuse requests without a key (400) instead of passing them through.
    pub require_key: bool,
    /// Retention of records after completion. Values below [`MIN_TTL`] are raised to it.
    pub ttl: Duration,
    /// How long the first copy holds the key before a duplicate may take it over. It must
    /// exceed the longest time the request can take downstream (the retry layer's total
    /// deadline, 30 s by default, plus response buffering), or a slow-but-alive request
    /// can be executed twice. Capped at `ttl`.
    pub lease: Duration,
    /// Duplicate-while-in-flight policy.
    pub on_in_flight: OnInFlight,
    /// Longest accepted key (default 64, at most 255).
    pub max_key_len: usize,
    /// Largest request body buffered for fingerprinting; larger keyed requests get 413.
    pub max_body_bytes: usize,
    /// Largest response body stored for replay; larger responses are streamed through and
    /// recorded as "too large" (duplicates get 409, never a second execution).
    pub max_stored_response_bytes: usize,
    /// The upstream deduplicates on the forwarded `Idempotency-Key` itself, so ambiguous
    /// failures (500/502/504, lost responses) release the key instead of being stored.
    pub upstream_dedupes_keys: bool,
    /// Keep `Set-Cookie` in stored responses (default). Turn it off for a scope several
    /// users may share, such as anonymous callers keyed by client address: a replay must
    /// never hand one user the session cookie set for another. The first caller still
    /// receives the upstream's `Set-Cookie`.
    pub replay_set_cookie: bool,
}

/// A setting outside its allowed range (for validating configuration at start-up).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} = {value}: {allowed}")]
pub struct SettingsError {
    /// Name of the offending field.
    pub field: &'static str,
    /// The value given.
    pub value: String,
    /// The allowed range.
    pub allowed: &'static str,
}

// === impl IdempotencySettings ===

impl IdempotencySettings {
    /// Defaults for a tenant and route: POST and PATCH, key optional, 24 h retention,
    /// 35 s lease, reject duplicates in flight, 64-character keys, 1 MiB bodies.
    pub fn new(tenant: impl Into<Arc<str>>, route: impl Into<Arc<str>>) -> Self {
        Self {
            tenant: tenant.into(),
            route: route.into(),
            methods: Arc::new([Method::POST, Method::PATCH]),
            require_key: false,
            ttl: MIN_TTL,
            lease: DEFAULT_LEASE,
            on_in_flight: OnInFlight::Reject,
            max_key_len: DEFAULT_MAX_KEY_LEN,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_stored_response_bytes: DEFAULT_MAX_STORED_RESPONSE_BYTES,
            upstream_dedupes_keys: false,
            replay_set_cookie: true,
        }
    }

    /// Checks every range; configuration loaders call this at start-up so a bad value
    /// refuses to start instead of being silently corrected by [`effective`](Self::effective).
    pub fn validate(&self) -> Result<(), SettingsError> {
        let err = |field, value: String, allowed| {
            Err(SettingsError {
                field,
                value,
                allowed,
            })
        };
        if self.ttl < MIN_TTL {
            return err("ttl", format!("{:?}", self.ttl), "at least 24h");
        }
        if self.lease.is_zero() || self.lease >= self.ttl {
            return err(
                "lease",
                format!("{:?}", self.lease),
                "greater than 0 and below ttl",
            );
        }
        if !(1..=MAX_KEY_LEN_LIMIT).contains(&self.max_key_len) {
            return err(
                "max_key_len",
                self.max_key_len.to_string(),
                "allowed 1..=255",
            );
        }
        if self.methods.is_empty() {
            return err("methods", "[]".to_owned(), "at least one method");
        }
        if let OnInFlight::Wait(d) = self.on_in_flight {
            if d.is_zero() || d > self.lease {
                return err(
                    "on_in_flight.wait",
                    format!("{d:?}"),
                    "greater than 0, at most the lease",
                );
            }
        }
        Ok(())
    }

    /// The settings as enforced at runtime: retention raised to [`MIN_TTL`], lease capped at
    /// the retention and at least 1 ms, key length clamped to `1..=255`.
    pub fn effective(mut self) -> Self {
        self.ttl = self.ttl.max(MIN_TTL);
        self.lease = self.lease.clamp(Duration::from_millis(1), self.ttl);
        self.max_key_len = self.max_key_len.clamp(1, MAX_KEY_LEN_LIMIT);
        self
    }
}

/// Decides per request whether and how it is deduplicated: `None` passes it through
/// untouched. Typically reads the tenant and route the gateway put in the extensions.
pub type ExtractSettings =
    Arc<dyn Fn(&http::request::Parts) -> Option<IdempotencySettings> + Send + Sync>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_ranges_are_checked() {
        let s = IdempotencySettings::new("t", "/r");
        assert_eq!(s.validate(), Ok(()));
        let mut bad = s.clone();
        bad.ttl = Duration::from_secs(3600);
        assert_eq!(bad.validate().unwrap_err().field, "ttl");
        assert_eq!(bad.clone().effective().ttl, MIN_TTL);
        let mut bad = s.clone();
        bad.max_key_len = 256;
        assert_eq!(bad.validate().unwrap_err().field, "max_key_len");
        let mut bad = s.clone();
        bad.lease = MIN_TTL;
        assert!(bad.validate().is_err());
        let mut bad = s;
        bad.on_in_flight = OnInFlight::Wait(Duration::from_secs(3600));
        assert!(bad.validate().is_err());
    }
}
