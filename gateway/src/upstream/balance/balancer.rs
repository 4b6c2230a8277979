//! [`Balancer`]: one upstream's endpoints (replaceable at run time by discovery), how it
//! picks among them and ejects outliers. The proxy holds one per upstream beside its
//! connection pool; discovery and the health checks work on it alone.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use http::Uri;
use portcullis_retry::UpstreamState;

use super::discovery::{self, FileState, Sources};
use super::{Address, Clock, Endpoint, EndpointSet, EndpointState, Now, Outcome};
use crate::config::{HealthCheckSettings, LoadBalancer, OutlierSettings, UpstreamSettings};

/// One upstream's endpoint set and balancing state.
#[derive(Debug)]
pub(crate) struct Balancer {
    name: Arc<str>,
    set: ArcSwap<EndpointSet>,
    clock: Clock,
    load_balancer: LoadBalancer,
    panic_threshold: u8,
    outlier: OutlierSettings,
    health_check: Option<HealthCheckSettings>,
    sources: Sources,
    state: Arc<UpstreamState>,
    /// Seeds each new set's random choices.
    seed: AtomicU64,
}

// === impl Balancer ===

impl Balancer {
    /// The balancer of validated settings; until discovery's first refresh, names stand for
    /// themselves (resolved at connect).
    pub(crate) fn new(
        settings: &UpstreamSettings,
        hosts_file: Option<&Path>,
        state: Arc<UpstreamState>,
    ) -> Self {
        let entries: Vec<(Uri, u32)> = settings
            .endpoints
            .iter()
            .cloned()
            .zip(settings.weights.iter().copied().chain(std::iter::repeat(1)))
            .collect();
        let sources = Sources {
            entries,
            file: settings.endpoints_file.clone(),
            interval: settings.resolve_interval,
            hosts_file: hosts_file.map(Into::into),
        };
        let initial: Vec<Arc<Endpoint>> = sources
            .entries
            .iter()
            .filter_map(|(uri, weight)| {
                Some(Arc::new(Endpoint {
                    address: discovery::literal(uri)?,
                    weight: *weight,
                    state: Arc::new(EndpointState::new()),
                }))
            })
            .collect();
        let seed = AtomicU64::new(rand::random());
        let set = EndpointSet::new(
            initial,
            settings.load_balancer,
            settings.panic_threshold,
            seed.fetch_add(1, Ordering::Relaxed),
        );
        Self {
            name: settings.name.as_str().into(),
            set: ArcSwap::from_pointee(set),
            clock: Clock::new(),
            load_balancer: settings.load_balancer,
            panic_threshold: settings.panic_threshold,
            outlier: settings.outlier,
            health_check: settings.health_check.clone(),
            sources,
            state,
            seed,
        }
    }

    /// The upstream's name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The current endpoint set (a snapshot: discovery may swap in another meanwhile).
    pub(crate) fn endpoint_set(&self) -> Arc<EndpointSet> {
        self.set.load_full()
    }

    /// Where the endpoints come from.
    pub(crate) fn sources(&self) -> &Sources {
        &self.sources
    }

    /// The active health check settings, when configured.
    pub(crate) fn health_check(&self) -> Option<&HealthCheckSettings> {
        self.health_check.as_ref()
    }

    /// The retry layer's state of this upstream (budget, breaker).
    pub(crate) fn state(&self) -> &Arc<UpstreamState> {
        &self.state
    }

    /// The load balancer in use.
    pub(crate) fn load_balancer(&self) -> LoadBalancer {
        self.load_balancer
    }

    /// The upstream's clock (ejection times are on it).
    pub(crate) fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Whether at least one endpoint is usable now (`/readyz`).
    pub(crate) fn any_usable(&self) -> bool {
        self.set.load().any_usable(&self.clock)
    }

    /// The endpoint for the next attempt, avoiding `avoid` when another is usable.
    pub(crate) fn pick(&self, avoid: Option<usize>) -> Option<Picked> {
        let set = self.set.load();
        let mut now = Now::new(&self.clock);
        let endpoint = set.pick(avoid, &mut now)?.clone();
        Some(Picked {
            endpoint,
            among_several: set.endpoints().len() > 1,
        })
    }

    /// Swaps in a new endpoint list unless it equals the current one; endpoints that stay
    /// keep their state.
    pub(crate) fn replace_endpoints(&self, next: Vec<(Address, u32)>) {
        let current = self.set.load();
        let same = current.endpoints().len() == next.len()
            && current
                .endpoints()
                .iter()
                .zip(&next)
                .all(|(e, (a, w))| e.address == *a && e.weight == *w);
        if same {
            return;
        }
        let mut carried = carried_states(&current);
        let endpoints: Vec<Arc<Endpoint>> = next
            .into_iter()
            .map(|(address, weight)| {
                let state = carried
                    .remove(&address)
                    .unwrap_or_else(|| Arc::new(EndpointState::new()));
                Arc::new(Endpoint {
                    address,
                    weight,
                    state,
                })
            })
            .collect();
        tracing::info!(
            upstream = %self.name,
            endpoints = ?endpoints.iter().map(|e| e.address.url()).collect::<Vec<_>>(),
            "endpoints changed"
        );
        self.state.set_endpoints(endpoints.len());
        let set = EndpointSet::new(
            endpoints,
            self.load_balancer,
            self.panic_threshold,
            self.seed.fetch_add(1, Ordering::Relaxed),
        );
        self.set.store(Arc::new(set));
    }

    /// Re-reads the endpoints file and re-resolves names, then swaps in the result if it
    /// changed (see [`discovery`]).
    pub(crate) async fn refresh(&self, file: &mut FileState) {
        let current = self.endpoint_set();
        let next =
            discovery::next_endpoints(&self.name, &self.sources, current.endpoints(), file).await;
        if let Some(next) = next {
            self.replace_endpoints(next);
        }
    }

    /// Feeds an attempt's outcome to passive health.
    pub(crate) fn record(&self, endpoint: &Endpoint, outcome: Outcome) {
        let set = self.set.load();
        if let Some(until) = set.record(endpoint, outcome, &self.outlier, &self.clock) {
            tracing::warn!(
                upstream = %self.name,
                endpoint = %endpoint.address.url(),
                ejected_for_ms = self.clock.until(until).as_millis() as u64,
                ejections = endpoint.state.ejections(),
                "outlier ejected"
            );
        }
    }
}

/// Maps addresses to the state they had in `current`, for carrying it over.
fn carried_states(current: &EndpointSet) -> HashMap<Address, Arc<EndpointState>> {
    current
        .endpoints()
        .iter()
        .map(|e| (e.address.clone(), e.state.clone()))
        .collect()
}

/// An endpoint picked for an attempt.
pub(crate) struct Picked {
    pub(crate) endpoint: Arc<Endpoint>,
    /// Whether the set had others to choose from: only then does the retry layer need to
    /// know which endpoint answered (to avoid it on the next attempt).
    pub(crate) among_several: bool,
}
