//! Metric names and the per-policy handles, through the `metrics` facade.
//!
//! The crate records into whatever recorder the process installed (the gateway installs a
//! Prometheus one); with none installed every call is a no-op.
//!
//! | name | kind | labels |
//! |---|---|---|
//! | `ratelimit_decisions_total` | counter | `policy`, `outcome` = `allowed` \| `rejected` \| `shadow_rejected` \| `error` |
//! | `ratelimit_shadow_rejections_total` | counter | `policy` |
//! | `ratelimit_fallback_activations_total` | counter | (none): circuit opened, i.e. the store started failing |
//! | `ratelimit_fallback_decisions_total` | counter | `mode` = `open` \| `closed`: decisions made without the store |
//! | `ratelimit_redis_decision_seconds` | histogram | `op` = `check` \| `peek` |
//!
//! `outcome` is each policy's own verdict on the request: in a request rejected by `tenant`,
//! `global` may still count `allowed` (it would have admitted it; nothing was consumed).

use metrics::{Counter, SharedString};

/// Counter: one per policy per decision, labelled `policy` and `outcome`.
pub const DECISIONS_TOTAL: &str = "ratelimit_decisions_total";
/// Counter: a shadow policy that would have rejected, labelled `policy`.
pub const SHADOW_REJECTIONS_TOTAL: &str = "ratelimit_shadow_rejections_total";
/// Counter: the fallback circuit opened (the shared store started failing).
pub const FALLBACK_ACTIVATIONS_TOTAL: &str = "ratelimit_fallback_activations_total";
/// Counter: decisions made while the shared store was unavailable, labelled `mode`.
pub const FALLBACK_DECISIONS_TOTAL: &str = "ratelimit_fallback_decisions_total";
/// Histogram (seconds): latency of one Redis decision round trip, labelled `op`.
pub const REDIS_DECISION_SECONDS: &str = "ratelimit_redis_decision_seconds";

/// Counter handles for one policy, registered once instead of looked up per request
/// (a label lookup in the recorder costs a hash and a lock on every decision).
#[derive(Clone)]
pub(crate) struct PolicyMetrics {
    pub(crate) allowed: Counter,
    pub(crate) rejected: Counter,
    pub(crate) shadow_rejected: Counter,
    pub(crate) error: Counter,
    pub(crate) shadow_rejections: Counter,
}

// === impl PolicyMetrics ===

impl PolicyMetrics {
    pub(crate) fn new(policy: &str) -> Self {
        let name: SharedString = policy.to_owned().into();
        let decisions = |outcome: &'static str| metrics::counter!(DECISIONS_TOTAL, "policy" => name.clone(), "outcome" => outcome);
        Self {
            allowed: decisions("allowed"),
            rejected: decisions("rejected"),
            shadow_rejected: decisions("shadow_rejected"),
            error: decisions("error"),
            shadow_rejections: metrics::counter!(SHADOW_REJECTIONS_TOTAL, "policy" => name.clone()),
        }
    }
}
