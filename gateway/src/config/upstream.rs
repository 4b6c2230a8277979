//! Validation of `[[upstreams]]` and of the retry settings routes inherit from them. Ranges
//! for retry, budget and breaker are owned by the retry layer's own `try_new` constructors;
//! this module only adds the field path.

use std::time::Duration;

use super::error::Issues;
use super::raw::{RawAdaptive, RawRetry, RawRouteRetry, RawUpstream};
use super::UpstreamSettings;
use portcullis_retry::{
    AdaptiveConfig, BreakerConfig, BudgetConfig, InvalidRetryConfig, Jitter, RetryParams,
    RetryPolicy,
};

/// Contract: connect timeouts between 1 and 3 s.
const CONNECT_TIMEOUT_RANGE: (Duration, Duration) =
    (Duration::from_secs(1), Duration::from_secs(3));

pub(super) fn upstream(path: &str, raw: &RawUpstream, issues: &mut Issues) -> UpstreamSettings {
    if !valid_id(&raw.name) {
        issues.push(
            format!("{path}.name"),
            format!("= {:?}: 1–64 characters of [A-Za-z0-9._-]", raw.name),
        );
    }
    if raw.endpoints.is_empty() {
        issues.push(
            format!("{path}.endpoints"),
            "is empty: at least one \"http://host:port\" or \"https://host:port\" is required",
        );
    }
    let endpoints: Vec<http::Uri> = raw
        .endpoints
        .iter()
        .enumerate()
        .filter_map(|(i, text)| match endpoint(text) {
            Ok(uri) => Some(uri),
            Err(reason) => {
                issues.push(format!("{path}.endpoints[{i}]"), reason);
                None
            }
        })
        .collect();
    let (lo, hi) = CONNECT_TIMEOUT_RANGE;
    issues.duration_range(
        &format!("{path}.connect_timeout"),
        raw.connect_timeout.get(),
        lo,
        hi,
    );
    issues.duration_range(
        &format!("{path}.attempt_timeout"),
        raw.attempt_timeout.get(),
        Duration::from_millis(10),
        Duration::from_secs(300),
    );
    issues.range(
        format!("{path}.pool_max_idle"),
        raw.pool_max_idle,
        0,
        100_000,
    );

    let retry_path = format!("{path}.retry");
    let retry = policy(
        &retry_path,
        upstream_params(&retry_path, raw, issues),
        issues,
    );
    let budget = BudgetConfig::try_new(
        raw.retry.budget_percent,
        raw.retry.budget_window.get(),
        raw.retry.budget_min_retries_per_second,
    )
    .unwrap_or_else(|err| {
        report(issues, &retry_path, err);
        BudgetConfig::default()
    });
    let b = &raw.circuit_breaker;
    let circuit_breaker = BreakerConfig::try_new(
        b.failure_rate,
        b.min_requests,
        b.window.get(),
        b.open_for.get(),
        b.half_open_probes,
        b.min_callers,
    )
    .unwrap_or_else(|err| {
        report(issues, &format!("{path}.circuit_breaker"), err);
        BreakerConfig::default()
    });
    issues.duration_range(
        &format!("{retry_path}.client_retry_window"),
        raw.retry.client_retry_window.get(),
        Duration::ZERO,
        Duration::from_secs(300),
    );
    let adaptive = match &raw.adaptive {
        RawAdaptive::Off => None,
        RawAdaptive::On(b) => AdaptiveConfig::try_new(b.min_rate, b.max_rate, b.latency_tolerance)
            .map_err(|err| report(issues, &format!("{path}.adaptive"), err))
            .ok(),
    };
    let tls = super::tls::upstream_tls(path, raw, &endpoints, issues);
    UpstreamSettings {
        name: raw.name.clone(),
        endpoints,
        connect_timeout: raw.connect_timeout.get(),
        attempt_timeout: raw.attempt_timeout.get(),
        dedupes_idempotency_keys: raw.dedupes_idempotency_keys,
        retry,
        budget,
        client_retry_window: raw.retry.client_retry_window.get(),
        adaptive,
        circuit_breaker,
        pool_max_idle: raw.pool_max_idle,
        tls,
        tls_handshake_timeout: raw.tls_handshake_timeout.get(),
        http2: raw.http2,
    }
}

fn upstream_params(path: &str, raw: &RawUpstream, issues: &mut Issues) -> RetryParams {
    let r: &RawRetry = &raw.retry;
    RetryParams {
        max_retries: r.max_retries,
        base: r.base.get(),
        cap: r.cap.get(),
        total: r.total.get(),
        jitter: jitter(path, &r.jitter, issues),
        body_replay_limit: r.body_replay_limit,
        attempt_timeout: raw.attempt_timeout.get(),
    }
}

/// The upstream's policy with a route's overrides applied.
pub(super) fn route_retry(
    path: &str,
    inherited: Option<&RetryPolicy>,
    overrides: Option<&RawRouteRetry>,
    issues: &mut Issues,
) -> RetryPolicy {
    let mut params = inherited.map(|p| p.params().clone()).unwrap_or_default();
    let Some(o) = overrides else {
        return inherited.cloned().unwrap_or_default();
    };
    if let Some(v) = o.max_retries {
        params.max_retries = v;
    }
    if let Some(v) = o.base {
        params.base = v.get();
    }
    if let Some(v) = o.cap {
        params.cap = v.get();
    }
    if let Some(v) = o.total {
        params.total = v.get();
    }
    if let Some(v) = &o.jitter {
        params.jitter = jitter(path, v, issues);
    }
    if let Some(v) = o.body_replay_limit {
        params.body_replay_limit = v;
    }
    policy(path, params, issues)
}

fn policy(path: &str, params: RetryParams, issues: &mut Issues) -> RetryPolicy {
    RetryPolicy::try_new(params).unwrap_or_else(|err| {
        report(issues, path, err);
        RetryPolicy::default()
    })
}

fn jitter(path: &str, text: &str, issues: &mut Issues) -> Jitter {
    text.parse().unwrap_or_else(|err| {
        report(issues, path, err);
        Jitter::Full
    })
}

fn report(issues: &mut Issues, path: &str, err: InvalidRetryConfig) {
    issues.push(
        format!("{path}.{}", err.field),
        format!("= {}: allowed {}", err.value, err.allowed),
    );
}

fn endpoint(text: &str) -> Result<http::Uri, String> {
    let uri: http::Uri = text
        .parse()
        .map_err(|e| format!("= {text:?}: not a URI ({e})"))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err(format!(
            "= {text:?}: allowed schemes \"http\" and \"https\""
        ));
    }
    if uri.authority().is_none() {
        return Err(format!("= {text:?}: host and port are required"));
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err(format!(
            "= {text:?}: an endpoint is scheme://host:port without a path"
        ));
    }
    Ok(uri)
}

/// An identifier in configuration (upstream names, tenant ids): 1–64 of `A-Z a-z 0-9 . _ -`.
pub(super) fn valid_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}
