//! A configured route as every layer sees it once the router picked it: its settings, what
//! the retry layer needs, and its request metrics, registered once.

use std::sync::{Arc, OnceLock};

use metrics::SharedString;
use portcullis_retry::RetryTarget;

use crate::config::RouteSettings;

/// A configured route.
#[derive(Debug)]
pub struct Route {
    /// Position in the configuration.
    pub index: usize,
    /// The validated settings.
    pub settings: RouteSettings,
    /// What the retry layer needs: the route's policy and its upstream's shared state.
    pub retry: RetryTarget,
    /// Request counters and latency, registered once.
    pub metrics: RouteMetrics,
}

/// Request metrics of one route, registered once: recording is then an atomic add, with no
/// label formatting or registry lookup per request. Clones share them (one `Arc`).
#[derive(Debug, Clone)]
pub struct RouteMetrics(Arc<Registered>);

#[derive(Debug)]
struct Registered {
    label: Arc<str>,
    latency: metrics::Histogram,
    /// One counter per status code 100..=599, registered on first use.
    by_status: Box<[OnceLock<metrics::Counter>]>,
}

impl RouteMetrics {
    /// Metrics labelled `route = label`.
    pub fn new(label: Arc<str>) -> Self {
        let latency = metrics::histogram!("http_request_duration_seconds", "route" => SharedString::from(label.clone()));
        Self(Arc::new(Registered {
            label,
            latency,
            by_status: (100..600).map(|_| OnceLock::new()).collect(),
        }))
    }

    /// The `route` label.
    pub fn label(&self) -> &str {
        &self.0.label
    }

    /// The `route` label, shared.
    pub(crate) fn label_arc(&self) -> Arc<str> {
        self.0.label.clone()
    }

    /// Counts one answer with `status` that took `elapsed`.
    pub fn record(&self, status: u16, elapsed: std::time::Duration) {
        let this = &self.0;
        this.latency.record(elapsed.as_secs_f64());
        let Some(slot) = usize::from(status)
            .checked_sub(100)
            .and_then(|i| this.by_status.get(i))
        else {
            return;
        };
        slot.get_or_init(|| {
            metrics::counter!(
                "http_requests_total",
                "route" => SharedString::from(this.label.clone()),
                "status" => status.to_string()
            )
        })
        .increment(1);
    }
}
