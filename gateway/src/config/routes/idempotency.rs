//! A route's `idempotency` table: methods, key and response bounds, record lifetime and
//! lease, and what a duplicate of a request still in flight gets.

use std::time::Duration;

use portcullis_retry::RetryPolicy;

use crate::config::error::Issues;
use crate::config::raw::RawIdempotency;
use crate::config::{HumanDuration, IdempotencySettings, InFlightMode};

/// Idempotency records are kept at least this long: a client may retry for a day (docs/retry-policy.md).
const MIN_IDEMPOTENCY_TTL: Duration = Duration::from_secs(24 * 3600);

/// Checks `routes[i].idempotency` (`path`); `retry`: the route's retry policy, whose total
/// the lease must cover.
pub(super) fn idempotency(
    path: &str,
    raw: &RawIdempotency,
    retry: &RetryPolicy,
    issues: &mut Issues,
) -> IdempotencySettings {
    let methods = raw
        .methods
        .iter()
        .enumerate()
        .filter_map(
            |(i, m)| match http::Method::from_bytes(m.to_ascii_uppercase().as_bytes()) {
                Ok(method) => Some(method),
                Err(_) => {
                    issues.push(
                        format!("{path}.methods[{i}]"),
                        format!("= {m:?}: not an HTTP method"),
                    );
                    None
                }
            },
        )
        .collect();
    if raw.ttl.get() < MIN_IDEMPOTENCY_TTL {
        issues.push(
            format!("{path}.ttl"),
            format!(
                "= {}: must be at least 24h: clients may retry an operation for a day",
                raw.ttl
            ),
        );
    }
    issues.range(format!("{path}.max_key_length"), raw.max_key_length, 1, 255);
    issues.range(
        format!("{path}.max_response_bytes"),
        raw.max_response_bytes,
        0,
        64 << 20,
    );
    if raw.lease.get() < retry.total() || raw.lease >= raw.ttl {
        issues.push(
            format!("{path}.lease"),
            format!(
                "= {}: must be ≥ the retry total ({}) and shorter than ttl ({})",
                raw.lease,
                HumanDuration(retry.total()),
                raw.ttl
            ),
        );
    }
    let on_in_flight = match raw.on_in_flight.as_str() {
        "reject" => InFlightMode::Reject,
        "wait" => {
            issues.duration_range(
                &format!("{path}.wait_timeout"),
                raw.wait_timeout.get(),
                Duration::from_millis(10),
                Duration::from_secs(60),
            );
            InFlightMode::Wait(raw.wait_timeout.get())
        }
        other => {
            issues.push(
                format!("{path}.on_in_flight"),
                format!("= {other:?}: allowed \"reject\" or \"wait\""),
            );
            InFlightMode::Reject
        }
    };
    IdempotencySettings {
        methods,
        require_key: raw.require_key,
        ttl: raw.ttl.get(),
        on_in_flight,
        lease: raw.lease.get(),
        max_key_length: raw.max_key_length,
        max_response_bytes: raw.max_response_bytes,
    }
}
