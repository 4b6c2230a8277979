//! `delivery = { … }` on a route: asynchronous delivery (docs/async-delivery.md). The
//! schedule's own checks live with the schedule (`portcullis_retry::DeliverySchedule`); this
//! module names the fields and checks the dedupe source and the queue's pace.

use std::time::Duration;

use portcullis_retry::{DeliverySchedule, DEFAULT_MAX_RETRIES, DEFAULT_SCHEDULE, MAX_AGE_CAP};

use crate::config::error::Issues;
use crate::config::raw::RawDelivery;

/// Shortest `dedupe_window`: event consumers deduplicate for at least seven days.
pub const MIN_DEDUPE_WINDOW: Duration = Duration::from_secs(7 * 24 * 3600);

/// Longest `dedupe_window`.
const MAX_DEDUPE_WINDOW: Duration = Duration::from_secs(90 * 24 * 3600);

/// Default `max_in_flight` of a route's queue.
pub const DEFAULT_DELIVERY_IN_FLIGHT: u32 = 16;

/// Largest `max_in_flight` of a route's queue.
const MAX_DELIVERY_IN_FLIGHT: u32 = 10_000;

/// Largest `max_rate`, deliveries per second.
const MAX_DELIVERY_RATE: f64 = 1_000_000.0;

/// Default `alert_timeout`: the whole alert POST, connect to answer.
pub const DEFAULT_ALERT_TIMEOUT: Duration = Duration::from_secs(5);

/// Allowed `alert_timeout`.
const MIN_ALERT_TIMEOUT: Duration = Duration::from_millis(100);
const MAX_ALERT_TIMEOUT: Duration = Duration::from_secs(60);

/// Where the dedupe key of an accepted request comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DedupeSource {
    /// The `Idempotency-Key` header.
    IdempotencyKey,
    /// A header, such as a provider's delivery id.
    Header(http::HeaderName),
    /// A JSON pointer (RFC 6901) into the body.
    Json(String),
}

/// A route's validated `delivery = { mode = "async", … }`.
#[derive(Debug, Clone)]
pub struct DeliverySettings {
    /// When failed deliveries are retried, and when a message is dead.
    pub schedule: DeliverySchedule,
    /// The dedupe key's source.
    pub dedupe: DedupeSource,
    /// How long a dedupe record is kept.
    pub dedupe_window: Duration,
    /// Deliveries started per second, at most; `None`: no pace.
    pub max_rate: Option<f64>,
    /// Deliveries in flight at once, at most.
    pub max_in_flight: u32,
    /// Where each dead letter is announced; `None`: no alert webhook.
    pub alert: Option<AlertWebhook>,
}

/// `alert_webhook` and `alert_timeout`: a URL POSTed on each dead letter.
#[derive(Debug, Clone)]
pub struct AlertWebhook {
    /// The webhook's address.
    pub uri: http::Uri,
    /// Client configuration (system roots) for `https://`.
    pub tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    /// The whole POST, connect to answer, at most.
    pub timeout: Duration,
}

/// `delivery` at `path` (`routes[i].delivery`): `None` for `mode = "sync"`.
pub(crate) fn delivery(
    path: &str,
    raw: &RawDelivery,
    issues: &mut Issues,
) -> Option<DeliverySettings> {
    match raw.mode.as_str() {
        "async" => {}
        "sync" => {
            let set = [
                ("max_retries", raw.max_retries.is_some()),
                ("schedule", raw.schedule.is_some()),
                ("max_age", raw.max_age.is_some()),
                ("dedupe", raw.dedupe.is_some()),
                ("dedupe_window", raw.dedupe_window.is_some()),
                ("max_rate", raw.max_rate.is_some()),
                ("max_in_flight", raw.max_in_flight.is_some()),
                ("alert_webhook", raw.alert_webhook.is_some()),
                ("alert_timeout", raw.alert_timeout.is_some()),
            ];
            for (field, _) in set.iter().filter(|(_, set)| *set) {
                issues.push(format!("{path}.{field}"), "needs mode = \"async\"");
            }
            return None;
        }
        other => {
            issues.push(
                format!("{path}.mode"),
                format!("= {other:?}: allowed \"sync\" or \"async\""),
            );
            return None;
        }
    }
    let steps = raw.schedule.as_ref().map_or_else(
        || DEFAULT_SCHEDULE.to_vec(),
        |s| s.iter().map(|d| d.get()).collect(),
    );
    let schedule = DeliverySchedule::new(
        steps,
        raw.max_retries.unwrap_or(DEFAULT_MAX_RETRIES),
        raw.max_age.map_or(MAX_AGE_CAP, |d| d.get()),
    )
    .unwrap_or_else(|errors| {
        for error in errors {
            issues.push(format!("{path}.{}", error.field()), error.to_string());
        }
        DeliverySchedule::default()
    });
    let dedupe = dedupe(path, raw.dedupe.as_deref(), issues);
    let dedupe_window = raw.dedupe_window.map_or(MIN_DEDUPE_WINDOW, |d| d.get());
    issues.duration_range(
        &format!("{path}.dedupe_window"),
        dedupe_window,
        MIN_DEDUPE_WINDOW,
        MAX_DEDUPE_WINDOW,
    );
    if let Some(rate) = raw.max_rate {
        if !(rate > 0.0 && rate <= MAX_DELIVERY_RATE) {
            issues.push(
                format!("{path}.max_rate"),
                format!("= {rate}: allowed more than 0 and at most {MAX_DELIVERY_RATE}"),
            );
        }
    }
    let max_in_flight = raw.max_in_flight.unwrap_or(DEFAULT_DELIVERY_IN_FLIGHT);
    issues.range(
        format!("{path}.max_in_flight"),
        max_in_flight,
        1,
        MAX_DELIVERY_IN_FLIGHT,
    );
    let alert = alert(path, raw, issues);
    Some(DeliverySettings {
        schedule,
        dedupe,
        dedupe_window,
        max_rate: raw.max_rate,
        max_in_flight,
        alert,
    })
}

/// `alert_webhook` (an `http://` or `https://` URL with a host; `https://` verified
/// against the system roots) and `alert_timeout`, which needs it.
fn alert(path: &str, raw: &RawDelivery, issues: &mut Issues) -> Option<AlertWebhook> {
    let timeout = raw.alert_timeout.map_or(DEFAULT_ALERT_TIMEOUT, |d| d.get());
    let Some(text) = raw.alert_webhook.as_deref() else {
        if raw.alert_timeout.is_some() {
            issues.push(format!("{path}.alert_timeout"), "needs alert_webhook");
        }
        return None;
    };
    issues.duration_range(
        &format!("{path}.alert_timeout"),
        timeout,
        MIN_ALERT_TIMEOUT,
        MAX_ALERT_TIMEOUT,
    );
    match alert_uri(text) {
        Ok((uri, tls)) => Some(AlertWebhook { uri, tls, timeout }),
        Err(message) => {
            issues.push(format!("{path}.alert_webhook"), message);
            None
        }
    }
}

type AlertTarget = (http::Uri, Option<std::sync::Arc<rustls::ClientConfig>>);

fn alert_uri(text: &str) -> Result<AlertTarget, String> {
    let uri: http::Uri = text
        .parse()
        .map_err(|e| format!("= {text:?}: not a URL ({e})"))?;
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("= {text:?}: the URL needs a host"));
    }
    let tls = match uri.scheme_str() {
        Some("http") => None,
        Some("https") => {
            let roots = crate::tls::system_roots().map_err(|e| format!("= {text:?}: {e}"))?;
            let config = crate::tls::upstream_client_config(roots, None, false)
                .map_err(|e| format!("= {text:?}: {e}"))?;
            Some(config)
        }
        _ => return Err(format!("= {text:?}: allowed http:// or https://")),
    };
    Ok((uri, tls))
}

/// `dedupe`: `"idempotency-key"` (the default), `"header:NAME"` or `"json:/pointer"`.
fn dedupe(path: &str, raw: Option<&str>, issues: &mut Issues) -> DedupeSource {
    let field = format!("{path}.dedupe");
    let text = raw.unwrap_or("idempotency-key");
    if text == "idempotency-key" {
        return DedupeSource::IdempotencyKey;
    }
    if let Some(name) = text.strip_prefix("header:") {
        return match http::HeaderName::from_bytes(name.trim().as_bytes()) {
            Ok(name) => DedupeSource::Header(name),
            Err(_) => {
                issues.push(field, format!("= {text:?}: {name:?} is not a header name"));
                DedupeSource::IdempotencyKey
            }
        };
    }
    if let Some(pointer) = text.strip_prefix("json:") {
        if pointer.starts_with('/') {
            return DedupeSource::Json(pointer.to_owned());
        }
        issues.push(
            field,
            format!("= {text:?}: a JSON pointer starts with '/', e.g. \"json:/id\""),
        );
        return DedupeSource::IdempotencyKey;
    }
    issues.push(
        field,
        format!("= {text:?}: allowed \"idempotency-key\", \"header:NAME\" or \"json:/pointer\""),
    );
    DedupeSource::IdempotencyKey
}
