//! Route matching: the longest configured prefix wins, on a path-segment boundary (`/orders`
//! matches `/orders` and `/orders/7`, not `/ordersx`). Matching happens early in the stack
//! because rate limiting (cost, per-route limits) and idempotency (per-route settings) depend
//! on the route; the match goes into the request context, which every later layer reads.

use std::sync::Arc;

use axum::body::Body;
use http::Response;

use crate::config::RouteSettings;
use crate::pipeline::metrics::RouteMetrics;
use crate::pipeline::step::Finish;
use portcullis_retry::{Dependency, RetryTarget};

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

/// Routes ordered for longest-prefix matching.
#[derive(Debug, Clone)]
pub struct RouteTable {
    by_length: Arc<[Arc<Route>]>,
}

// === impl RouteTable ===

impl RouteTable {
    /// Builds the table from validated routes; `dependencies` are indexed like the upstreams.
    /// Routes whose upstream index has no dependency are skipped (validation prevents it).
    pub fn new(routes: &[RouteSettings], dependencies: &[Arc<Dependency>]) -> Self {
        let mut by_length: Vec<Arc<Route>> = routes
            .iter()
            .enumerate()
            .filter_map(|(index, settings)| {
                let dependency = dependencies.get(settings.upstream)?.clone();
                let label: Arc<str> = Arc::from(settings.prefix.as_str());
                Some(Arc::new(Route {
                    index,
                    metrics: RouteMetrics::new(label),
                    retry: RetryTarget {
                        policy: settings.retry.clone(),
                        dependency,
                        idempotent_route: settings.idempotent,
                    },
                    settings: settings.clone(),
                }))
            })
            .collect();
        by_length.sort_by_key(|route| std::cmp::Reverse(route.settings.prefix.len()));
        Self {
            by_length: by_length.into(),
        }
    }

    /// The longest route whose prefix matches `path` on a segment boundary.
    pub fn find(&self, path: &str) -> Option<&Arc<Route>> {
        self.by_length
            .iter()
            .find(|route| prefix_matches(&route.settings.prefix, path))
    }
}

/// A segment boundary follows the prefix: `/`, the end, or `;` — matrix parameters
/// (`/secure;jsessionid=1/pay`) that Java backends strip before routing, so the gateway's
/// route must be the one the backend serves.
fn prefix_matches(prefix: &str, path: &str) -> bool {
    match path.strip_prefix(prefix) {
        Some(rest) => {
            rest.is_empty()
                || prefix.ends_with('/')
                || rest.starts_with('/')
                || rest.starts_with(';')
        }
        None => false,
    }
}

/// For the observe layer outside: the route's metrics ride back on its response.
impl Finish for RouteMetrics {
    fn finish(self, mut response: Response<Body>) -> Response<Body> {
        response.extensions_mut().insert(self);
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_boundary_prefixes() {
        assert!(prefix_matches("/orders", "/orders"));
        assert!(prefix_matches("/orders", "/orders/7"));
        assert!(!prefix_matches("/orders", "/ordersx"));
        assert!(prefix_matches("/", "/anything"));
        assert!(prefix_matches("/api/", "/api/x"));
        assert!(!prefix_matches("/orders", "/"));
        // Matrix parameters end a segment, as Java backends read them.
        assert!(prefix_matches("/secure", "/secure;jsessionid=1/pay"));
        assert!(prefix_matches("/secure", "/secure;x"));
    }
}
