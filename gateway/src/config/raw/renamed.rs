//! Fields renamed, kept working for one release: the old name is moved onto the new field
//! before validation, with a warning naming the new field; both names at once is an error.
//!
//! | old | new |
//! |---|---|
//! | `server.max_in_flight` | `server.load_shed_limit` (503 above it) |
//! | `tenants[].max_in_flight` | `tenants[].concurrency_limit` (429 above it) |
//! | `routes[].max_in_flight` | `routes[].concurrency_per_caller` (429 above it) |
//!
//! All three were `max_in_flight`, for three different limits.

use super::{RawConfig, DEFAULT_LOAD_SHED_LIMIT};

/// A field given by its old name: where, and the new name to use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Renamed {
    /// The old field's path, e.g. `routes[2].max_in_flight`.
    pub old: String,
    /// The new field's path.
    pub new: String,
}

impl std::fmt::Display for Renamed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} is deprecated: use {} (same meaning)",
            self.old, self.new
        )
    }
}

/// Moves every old name onto its new field. Returns the renames applied, and the fields set
/// under both names (`Err` with their old paths, each naming the new one).
pub fn apply(raw: &mut RawConfig) -> (Vec<Renamed>, Vec<Renamed>) {
    let (mut applied, mut both) = (Vec::new(), Vec::new());
    let mut note = |old: String, new: String, clash: bool| {
        let renamed = Renamed { old, new };
        if clash {
            both.push(renamed);
        } else {
            applied.push(renamed);
        }
    };
    if let Some(value) = raw.server.max_in_flight.take() {
        let clash = raw.server.load_shed_limit != DEFAULT_LOAD_SHED_LIMIT
            && raw.server.load_shed_limit != value;
        if !clash {
            raw.server.load_shed_limit = value;
        }
        note(
            "server.max_in_flight".into(),
            "server.load_shed_limit".into(),
            clash,
        );
    }
    for (i, tenant) in raw.tenants.iter_mut().enumerate() {
        if let Some(value) = tenant.max_in_flight.take() {
            let clash = tenant.concurrency_limit.is_some_and(|n| n != value);
            tenant.concurrency_limit.get_or_insert(value);
            note(
                format!("tenants[{i}].max_in_flight"),
                format!("tenants[{i}].concurrency_limit"),
                clash,
            );
        }
    }
    for (i, route) in raw.routes.iter_mut().enumerate() {
        if let Some(value) = route.max_in_flight.take() {
            let clash = route.concurrency_per_caller.is_some_and(|n| n != value);
            route.concurrency_per_caller.get_or_insert(value);
            note(
                format!("routes[{i}].max_in_flight"),
                format!("routes[{i}].concurrency_per_caller"),
                clash,
            );
        }
    }
    (applied, both)
}
