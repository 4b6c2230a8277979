//! `[telemetry]`: trace export over OTLP/HTTP, the access log, and which tenants get their
//! own metric series.

use serde::{Deserialize, Serialize};

use super::error::Issues;

/// Head sampling ratio for new traces when the file sets none: one in ten. A trace continued
/// from a trusted caller follows the caller's sampled flag instead (parent-based).
pub const DEFAULT_SAMPLING_RATIO: f64 = 0.1;

/// Most tenants that get their own metric label; each costs a few series per metric.
pub const MAX_TENANT_LABELS: usize = 100;

/// `[telemetry]` as written.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawTelemetry {
    /// OTLP/HTTP collector base URL (`http://127.0.0.1:4318`); spans are posted to
    /// `{otlp_endpoint}/v1/traces`. Absent: no spans are recorded or exported.
    pub otlp_endpoint: Option<String>,
    /// Fraction of new traces sampled, 0.0–1.0.
    pub sampling_ratio: f64,
    /// `service.name` of the exported spans.
    pub service_name: String,
    /// Tenants with their own `tenant` label in the per-tenant metrics; the rest are `other`.
    pub tenant_labels: Vec<String>,
    /// One access-log line per request (target `portcullis::access`, level `info`).
    pub access_log: bool,
    /// Log the query string with the path (off: queries often carry tokens).
    pub access_log_query: bool,
}

impl Default for RawTelemetry {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            sampling_ratio: DEFAULT_SAMPLING_RATIO,
            service_name: "portcullis".into(),
            tenant_labels: Vec::new(),
            access_log: true,
            access_log_query: false,
        }
    }
}

/// Validated `[telemetry]`.
#[derive(Debug, Clone, PartialEq)]
pub struct TelemetrySettings {
    /// Collector base URL, without a trailing slash; `None` → tracing export is off.
    pub otlp_endpoint: Option<String>,
    /// Head sampling ratio for new traces.
    pub sampling_ratio: f64,
    /// `service.name`.
    pub service_name: String,
    /// Tenants with their own metric label.
    pub tenant_labels: Vec<String>,
    /// Access log on.
    pub access_log: bool,
    /// Query string logged.
    pub access_log_query: bool,
}

impl Default for TelemetrySettings {
    fn default() -> Self {
        validate(&RawTelemetry::default(), &mut Issues::default())
    }
}

/// Checks `[telemetry]`, recording every problem in `issues`.
pub(super) fn validate(raw: &RawTelemetry, issues: &mut Issues) -> TelemetrySettings {
    let otlp_endpoint = raw
        .otlp_endpoint
        .as_deref()
        .and_then(|text| match url::Url::parse(text) {
            Ok(url) if matches!(url.scheme(), "http" | "https") && url.host().is_some() => {
                Some(text.trim_end_matches('/').to_owned())
            }
            _ => {
                issues.push(
                    "telemetry.otlp_endpoint",
                    format!("= {text:?}: expected an http:// or https:// URL with a host"),
                );
                None
            }
        });
    if !(0.0..=1.0).contains(&raw.sampling_ratio) {
        issues.push(
            "telemetry.sampling_ratio",
            format!("= {}: allowed 0.0..=1.0", raw.sampling_ratio),
        );
    }
    if raw.tenant_labels.len() > MAX_TENANT_LABELS {
        issues.push(
            "telemetry.tenant_labels",
            format!(
                "has {} entries: allowed at most {MAX_TENANT_LABELS} (the rest are labelled \"other\")",
                raw.tenant_labels.len()
            ),
        );
    }
    for (i, label) in raw.tenant_labels.iter().enumerate() {
        if matches!(label.as_str(), "" | "other" | "anonymous") {
            issues.push(
                format!("telemetry.tenant_labels[{i}]"),
                format!("= {label:?}: reserved or empty"),
            );
        }
    }
    if raw.service_name.is_empty() {
        issues.push("telemetry.service_name", "is empty");
    }
    TelemetrySettings {
        otlp_endpoint,
        sampling_ratio: raw.sampling_ratio.clamp(0.0, 1.0),
        service_name: raw.service_name.clone(),
        tenant_labels: raw.tenant_labels.clone(),
        access_log: raw.access_log,
        access_log_query: raw.access_log_query,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(raw: RawTelemetry) -> (TelemetrySettings, Vec<String>) {
        let mut issues = Issues::default();
        let settings = validate(&raw, &mut issues);
        let paths = match issues.finish() {
            Ok(()) => Vec::new(),
            Err(super::super::ConfigError::Invalid(list)) => {
                list.into_iter().map(|issue| issue.path).collect()
            }
            Err(other) => panic!("unexpected {other}"),
        };
        (settings, paths)
    }

    #[test]
    fn defaults_are_off_with_access_log_on() {
        let (settings, issues) = check(RawTelemetry::default());
        assert!(issues.is_empty());
        assert_eq!(settings.otlp_endpoint, None);
        assert!(settings.access_log && !settings.access_log_query);
        assert_eq!(settings.sampling_ratio, DEFAULT_SAMPLING_RATIO);
    }

    #[test]
    fn bad_values_name_their_field() {
        let (_, issues) = check(RawTelemetry {
            otlp_endpoint: Some("127.0.0.1:4318".into()),
            sampling_ratio: 1.5,
            tenant_labels: vec!["other".into()],
            ..RawTelemetry::default()
        });
        assert_eq!(
            issues,
            [
                "telemetry.otlp_endpoint",
                "telemetry.sampling_ratio",
                "telemetry.tenant_labels[0]"
            ]
        );
    }

    #[test]
    fn endpoint_loses_its_trailing_slash() {
        let (settings, issues) = check(RawTelemetry {
            otlp_endpoint: Some("http://127.0.0.1:4318/".into()),
            ..RawTelemetry::default()
        });
        assert!(issues.is_empty());
        assert_eq!(
            settings.otlp_endpoint.as_deref(),
            Some("http://127.0.0.1:4318")
        );
    }
}
