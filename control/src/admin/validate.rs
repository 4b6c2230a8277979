//! Reading admin request bodies and query strings field by field.
//!
//! Bodies are parsed as a JSON object and every field is checked before anything is written,
//! so one 422 lists *all* problems, each naming its field (`{"field": "rate", "reason": "must
//! be ≥ 1"}`), the way `portcullis check-config` does for the file. Unknown fields are
//! refused rather than ignored: a typo such as `"brust"` would otherwise silently keep the old
//! value.

use std::time::Duration;

use portcullis_ratelimit::{Policy, PolicyError};
use serde::Serialize;
use serde_json::{Map, Value};

/// Largest rate or burst, as in the configuration file.
pub(crate) const MAX_RATE: u64 = u32::MAX as u64;
/// Longest bucket period, as in the configuration file.
pub(crate) const MAX_PER: Duration = Duration::from_secs(366 * 86_400);
/// Largest daily/monthly quota or top-up amount (stored as a signed 64-bit integer).
pub(crate) const MAX_QUOTA: u64 = i64::MAX as u64;
/// Longest tenant display name, in characters.
pub(crate) const MAX_NAME_CHARS: usize = 200;
/// Longest route name accepted for an override.
pub(crate) const MAX_ROUTE_LEN: usize = 256;

/// One invalid input field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct FieldError {
    /// Field name (`rate`, `per`, …); `body` for the request body as a whole.
    pub(crate) field: String,
    /// What is wrong and what is allowed.
    pub(crate) reason: String,
}

/// A JSON object being read field by field; problems are collected, not returned early.
#[derive(Debug)]
pub(crate) struct Fields {
    map: Map<String, Value>,
    errors: Vec<FieldError>,
    query: bool,
}

/// A field of a partial update: absent (keep), `null` (clear) or a value (set).
pub(crate) type Patch<T> = Option<Option<T>>;

// === impl FieldError ===

impl FieldError {
    /// An error for `field`.
    pub(crate) fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

// === impl Fields ===

impl Fields {
    /// Parses a request body that must be one JSON object. An empty body is an empty object.
    pub(crate) fn parse(body: &[u8]) -> Result<Self, Vec<FieldError>> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(Self::from_map(Map::new()));
        }
        match serde_json::from_slice::<Value>(body) {
            Ok(Value::Object(map)) => Ok(Self::from_map(map)),
            Ok(_) => Err(vec![FieldError::new("body", "must be a JSON object")]),
            Err(err) => Err(vec![FieldError::new(
                "body",
                format!("invalid JSON: {err}"),
            )]),
        }
    }

    /// Fields from query-string pairs (values are strings; numbers are parsed from them).
    pub(crate) fn from_query(pairs: Vec<(String, String)>) -> Self {
        let mut fields = Self::from_map(Map::new());
        fields.query = true;
        for (name, value) in pairs {
            if fields.map.contains_key(&name) {
                fields.push(&name, "must appear at most once");
            }
            fields.map.insert(name, Value::String(value));
        }
        fields
    }

    fn from_map(map: Map<String, Value>) -> Self {
        Self {
            map,
            errors: Vec::new(),
            query: false,
        }
    }

    /// Records a problem with `field`.
    pub(crate) fn push(&mut self, field: &str, reason: impl Into<String>) {
        self.errors.push(FieldError::new(field, reason));
    }

    /// Whether the field is present (even as `null`).
    pub(crate) fn has(&self, name: &str) -> bool {
        self.map.contains_key(name)
    }

    /// An integer in `min..=max`; `null` is refused. Absent → `None`, an error when `required`.
    pub(crate) fn u64(&mut self, name: &str, min: u64, max: u64, required: bool) -> Option<u64> {
        match self.patch_u64(name, min, max) {
            Some(Some(v)) => Some(v),
            Some(None) if required => {
                self.push(name, "is required");
                None
            }
            Some(None) => {
                self.push(
                    name,
                    format!("must be an integer in {min}..={max}, not null"),
                );
                None
            }
            None if required && !self.errors.iter().any(|e| e.field == name) => {
                self.push(name, "is required");
                None
            }
            None => None,
        }
    }

    /// A partial-update integer: absent → keep, `null` → clear, else a value in `min..=max`.
    pub(crate) fn patch_u64(&mut self, name: &str, min: u64, max: u64) -> Patch<u64> {
        let value = self.map.remove(name)?;
        let number = match &value {
            Value::Null => return Some(None),
            Value::Number(n) => n.as_u64(),
            // Query strings carry numbers as text; JSON bodies must use numbers.
            Value::String(s) if self.query => s.trim().parse::<u64>().ok(),
            _ => None,
        };
        match number {
            Some(n) if n < min => self.push(name, format!("must be ≥ {min}")),
            Some(n) if n > max => self.push(name, format!("must be ≤ {max}")),
            Some(n) => return Some(Some(n)),
            None if value.as_i64().is_some() => self.push(name, format!("must be ≥ {min}")),
            None => self.push(name, format!("must be an integer in {min}..={max}")),
        }
        None
    }

    /// A duration string such as `"1s"`, whole milliseconds, in `min..=max`.
    pub(crate) fn duration(
        &mut self,
        name: &str,
        min: Duration,
        max: Duration,
    ) -> Option<Duration> {
        let value = self.map.remove(name)?;
        let Some(text) = value.as_str() else {
            self.push(
                name,
                "must be a duration string such as \"1s\" or \"250ms\"",
            );
            return None;
        };
        match humantime::parse_duration(text.trim()) {
            Ok(d) if d.subsec_nanos() % 1_000_000 != 0 => {
                self.push(name, "must be a whole number of milliseconds");
                None
            }
            Ok(d) if d < min || d > max => {
                self.push(
                    name,
                    format!(
                        "must be between {} and {}",
                        humantime::format_duration(min),
                        humantime::format_duration(max)
                    ),
                );
                None
            }
            Ok(d) => Some(d),
            Err(err) => {
                self.push(
                    name,
                    format!(
                        "invalid duration {text:?} ({err}); write e.g. \"1s\", \"250ms\", \"1h\""
                    ),
                );
                None
            }
        }
    }

    /// A partial-update duration: absent → keep, `null` → clear, else as [`Self::duration`].
    pub(crate) fn patch_duration(
        &mut self,
        name: &str,
        min: Duration,
        max: Duration,
    ) -> Patch<Duration> {
        match self.map.get(name)? {
            Value::Null => {
                self.map.remove(name);
                Some(None)
            }
            _ => self.duration(name, min, max).map(Some),
        }
    }

    /// A string field; absent or `null` → `None`.
    pub(crate) fn string(&mut self, name: &str) -> Option<String> {
        match self.map.remove(name)? {
            Value::Null => None,
            Value::String(s) => Some(s),
            _ => {
                self.push(name, "must be a string");
                None
            }
        }
    }

    /// A string field that must be present and not `null`.
    pub(crate) fn required_string(&mut self, name: &str) -> Option<String> {
        let value = self.string(name);
        if value.is_none() && !self.errors.iter().any(|e| e.field == name) {
            self.push(name, "is required");
        }
        value
    }

    /// A boolean field; absent → `None`.
    pub(crate) fn bool(&mut self, name: &str) -> Option<bool> {
        match self.map.remove(name)? {
            Value::Bool(b) => Some(b),
            _ => {
                self.push(name, "must be true or false");
                None
            }
        }
    }

    /// Refuses leftover (unknown) fields and returns every problem found.
    pub(crate) fn finish(mut self) -> Result<(), Vec<FieldError>> {
        let mut unknown: Vec<String> = self.map.keys().cloned().collect();
        unknown.sort();
        for name in unknown {
            self.push(&name, "unknown field");
        }
        if self.errors.is_empty() {
            Ok(())
        } else {
            Err(self.errors)
        }
    }
}

/// Tenant ids: 1–64 characters of `[A-Za-z0-9._-]`, as in the configuration file.
pub(crate) fn tenant_id(id: &str) -> Result<(), String> {
    let ok = (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err("must be 1–64 characters of [A-Za-z0-9._-]".to_owned())
    }
}

/// Display names: at most [`MAX_NAME_CHARS`] characters, no control characters.
pub(crate) fn name(name: &str) -> Result<(), String> {
    if name.chars().count() > MAX_NAME_CHARS {
        return Err(format!("must be at most {MAX_NAME_CHARS} characters"));
    }
    if name.chars().any(char::is_control) {
        return Err("must not contain control characters".to_owned());
    }
    Ok(())
}

/// Routes of overrides, by name (a route's prefix unless the configuration names it): must
/// name a route of the configuration (an override for a route that does not exist would
/// never apply, which is a silent footgun).
pub(crate) fn route(route: &str, configured: &[ConfiguredRoute]) -> Result<u32, String> {
    if route.is_empty() || route.len() > MAX_ROUTE_LEN {
        return Err(format!("must be 1–{MAX_ROUTE_LEN} bytes"));
    }
    match configured.iter().find(|r| r.name == route) {
        Some(r) => Ok(r.cost),
        None => {
            let known: Vec<&str> = configured.iter().map(|r| r.name.as_str()).collect();
            Err(format!(
                "no configured route has this name (configured: {})",
                known.join(", ")
            ))
        }
    }
}

/// A route of the configuration, as far as quota validation cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfiguredRoute {
    /// The route's name: its identity in overrides and rate-limit keys (the configured
    /// `name`, else its prefix, exact path or pattern).
    pub name: String,
    /// Tokens one request on it costs.
    pub cost: u32,
}

/// Checks a bucket the way the limiter will: a value the limiter refuses would leave the
/// tenant unlimited on that policy, and a burst below a route's cost would lock the tenant
/// out of that route forever. `min_burst` is the largest cost the bucket must admit.
pub(crate) fn bucket(rate: u64, per: Duration, burst: u64, min_burst: u32) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if burst < u64::from(min_burst) {
        errors.push(FieldError::new(
            "burst",
            format!("must be ≥ {min_burst}, the cost of one request on a configured route, or no request could ever be admitted"),
        ));
    }
    match Policy::try_new("tenant", rate, per, burst) {
        Ok(_) => {}
        Err(PolicyError::RefillTooLong { .. }) => errors.push(FieldError::new(
            "burst",
            "takes too long to refill at this rate (burst × per / rate must stay under ~8.9 years)",
        )),
        Err(PolicyError::ZeroBurst) => errors.push(FieldError::new("burst", "must be ≥ 1")),
        Err(PolicyError::ZeroPeriod) => {
            errors.push(FieldError::new("per", "must be longer than 0"))
        }
        Err(err) => errors.push(FieldError::new("rate", err.to_string())),
    }
    errors
}

/// Sanitises an `X-Admin-Actor` value for the audit log: visible ASCII letters, digits and
/// `._@:+-` only, at most 64 characters; `None` when nothing is left.
pub(crate) fn actor_suffix(raw: &[u8]) -> Option<String> {
    let clean: String = raw
        .iter()
        .filter(|b| b.is_ascii_alphanumeric() || b"._@:+-".contains(b))
        .take(64)
        .map(|b| char::from(*b))
        .collect();
    (!clean.is_empty()).then_some(clean)
}

#[cfg(test)]
mod tests;
