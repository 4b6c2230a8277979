//! Validation of `[[upstreams]]` and of the retry settings routes inherit from them. Ranges
//! for retry, budget and breaker are owned by the retry layer's own `try_new` constructors;
//! this module only adds the field path.

use std::time::Duration;

use super::balance::{self, MAX_WEIGHT};
use super::duration::AttemptTimeout;
use super::error::Issues;
use super::raw::{RawAdaptive, RawHedge, RawRetry, RawRouteRetry, RawUpstream};
use super::settings::UpstreamSettings;
use portcullis_retry::{
    AdaptiveConfig, BreakerConfig, BudgetConfig, HedgeAfter, InvalidRetryConfig, Jitter,
    RetryParams, RetryPolicy,
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
    if raw.endpoints.is_empty() && raw.endpoints_file.is_none() {
        issues.push(
            format!("{path}.endpoints"),
            "is empty: at least one \"http://host:port\" or \"https://host:port\" (or an endpoints_file) is required",
        );
    }
    let mut endpoints: Vec<http::Uri> = Vec::with_capacity(raw.endpoints.len());
    let mut weights = Vec::with_capacity(raw.endpoints.len());
    for (i, entry) in raw.endpoints.iter().enumerate() {
        let weight = entry.weight();
        if !(1..=MAX_WEIGHT).contains(&weight) {
            issues.push(
                format!("{path}.endpoints[{i}].weight"),
                format!("= {weight}: allowed 1..={MAX_WEIGHT}"),
            );
        }
        match endpoint(entry.url()) {
            Ok(uri) => {
                endpoints.push(uri);
                weights.push(weight.clamp(1, MAX_WEIGHT));
            }
            Err(reason) => issues.push(format!("{path}.endpoints[{i}]"), reason),
        }
    }
    // The file must be good at start-up; later bad versions keep the last good set.
    let mut file_endpoints = Vec::new();
    if let Some(file) = &raw.endpoints_file {
        match std::fs::read_to_string(file)
            .map_err(|e| format!("= {file:?}: cannot read: {e}"))
            .and_then(|text| parse_endpoints_file(&text).map_err(|e| format!("= {file:?}: {e}")))
        {
            Ok(list) => file_endpoints = list.into_iter().map(|(uri, _)| uri).collect(),
            Err(reason) => issues.push(format!("{path}.endpoints_file"), reason),
        }
    }
    issues.duration_range(
        &format!("{path}.resolve_interval"),
        raw.resolve_interval.get(),
        Duration::from_millis(10),
        Duration::from_secs(86_400),
    );
    issues.range(
        format!("{path}.panic_threshold"),
        raw.panic_threshold,
        0,
        100,
    );
    let (lo, hi) = CONNECT_TIMEOUT_RANGE;
    issues.duration_range(
        &format!("{path}.connect_timeout"),
        raw.connect_timeout.get(),
        lo,
        hi,
    );
    match raw.attempt_timeout {
        AttemptTimeout::Fixed(fixed) => {
            issues.duration_range(
                &format!("{path}.attempt_timeout"),
                fixed.get(),
                Duration::from_millis(10),
                Duration::from_secs(300),
            );
        }
        AttemptTimeout::Auto => {
            issues.duration_range(
                &format!("{path}.attempt_timeout_max"),
                raw.attempt_timeout_max.get(),
                Duration::from_millis(10),
                Duration::from_secs(300),
            );
            issues.duration_range(
                &format!("{path}.attempt_timeout_floor"),
                raw.attempt_timeout_floor.get(),
                Duration::from_millis(1),
                raw.attempt_timeout_max.get(),
            );
        }
    }
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
            .and_then(|config| config.with_max_wait(b.max_wait.get()))
            .map_err(|err| report(issues, &format!("{path}.adaptive"), err))
            .ok(),
    };
    let all: Vec<http::Uri> = endpoints.iter().chain(&file_endpoints).cloned().collect();
    let tls = super::tls::upstream_tls(path, raw, &all, issues);
    UpstreamSettings {
        name: raw.name.clone(),
        endpoints,
        connect_timeout: raw.connect_timeout.get(),
        attempt_timeout: attempt_timeout(raw),
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
        weights,
        load_balancer: balance::load_balancer(path, &raw.load_balancer, issues),
        health_check: balance::health_check(path, raw.health_check.as_ref(), issues),
        outlier: balance::outlier(path, &raw.outlier, issues),
        panic_threshold: raw.panic_threshold,
        endpoints_file: raw.endpoints_file.as_ref().map(std::path::PathBuf::from),
        resolve_interval: raw.resolve_interval.get(),
    }
}

/// Parses an `endpoints_file`: one endpoint per line, `URL [weight]`; blank lines and lines
/// starting with `#` are ignored. Any bad line fails the whole file (a half-read file must
/// not shrink the set).
pub fn parse_endpoints_file(text: &str) -> Result<Vec<(http::Uri, u32)>, String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut words = line.split_whitespace();
        let url = words.next().unwrap_or_default();
        let uri = endpoint(url).map_err(|e| format!("line {}: {e}", n + 1))?;
        let weight = match words.next() {
            None => 1,
            Some(w) => w
                .strip_prefix("weight=")
                .unwrap_or(w)
                .parse::<u32>()
                .ok()
                .filter(|w| (1..=MAX_WEIGHT).contains(w))
                .ok_or_else(|| format!("line {}: weight {w:?}: allowed 1..={MAX_WEIGHT}", n + 1))?,
        };
        if words.next().is_some() {
            return Err(format!("line {}: expected \"URL [weight]\"", n + 1));
        }
        out.push((uri, weight));
    }
    if out.is_empty() {
        return Err("lists no endpoint".into());
    }
    Ok(out)
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
        attempt_timeout: attempt_timeout(raw),
        auto_attempt_timeout_floor: match raw.attempt_timeout {
            AttemptTimeout::Fixed(_) => None,
            // Out-of-range floors are reported above, with the upstream's field path.
            AttemptTimeout::Auto => Some(
                raw.attempt_timeout_floor
                    .get()
                    .min(raw.attempt_timeout_max.get())
                    .max(Duration::from_millis(1)),
            ),
        },
        // Hedging is per route (`with_hedge`).
        hedge_after: None,
    }
}

/// The fixed timeout, or the ceiling of the learned one.
fn attempt_timeout(raw: &RawUpstream) -> Duration {
    match raw.attempt_timeout {
        AttemptTimeout::Fixed(fixed) => fixed.get(),
        AttemptTimeout::Auto => raw.attempt_timeout_max.get(),
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

/// A route's policy with its `hedge = { after = … }`: a percentile of the upstream's
/// measured latency (`"p95"`), or a fixed delay between 1 ms and 30 s.
pub(super) fn with_hedge(
    path: &str,
    policy: RetryPolicy,
    hedge: Option<&RawHedge>,
    issues: &mut Issues,
) -> RetryPolicy {
    let Some(hedge) = hedge else {
        return policy;
    };
    let text = hedge.after.trim();
    let after = if text.starts_with('p') {
        text.parse::<HedgeAfter>().map_err(|err| err.allowed)
    } else {
        humantime::parse_duration(text)
            .map_err(|e| format!("a percentile \"p50\" to \"p99.9\", or a duration ({e})"))
            .and_then(|d| {
                if (Duration::from_millis(1)..=Duration::from_secs(30)).contains(&d) {
                    Ok(HedgeAfter::Fixed(d))
                } else {
                    Err("a duration from 1ms to 30s".to_owned())
                }
            })
    };
    match after {
        Ok(after) => {
            let mut params = policy.params().clone();
            params.hedge_after = Some(after);
            RetryPolicy::try_new(params).unwrap_or(policy)
        }
        Err(allowed) => {
            issues.push(
                format!("{path}.after"),
                format!("= {text:?}: allowed {allowed}"),
            );
            policy
        }
    }
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
