//! Which endpoint of an upstream gets the next attempt — separate from which connection
//! carries it (the pool's business).
//!
//! An upstream holds its [`EndpointSet`] in an `ArcSwap`: discovery ([`discovery`]) builds a
//! new set and swaps it in, carrying each staying endpoint's state (`Arc<EndpointState>`)
//! over, so in-flight counts, latency estimates and ejections survive a re-resolution.
//!
//! # Picking
//!
//! - `round_robin`: nginx's smooth weighted round robin. The sequence depends only on the
//!   weights, so it is computed once per set (length: sum of weights / their gcd) and a
//!   pick is one `fetch_add` and an index.
//! - `least_request`: power of two random choices (Mitzenmacher; Envoy's default
//!   `choice_count = 2`): the one of two random endpoints with fewer requests in flight per
//!   unit of weight.
//! - `peak_ewma`: two random choices compared by cost = latency EWMA × (in-flight + 1) /
//!   weight (linkerd, Finagle; constants in [`endpoint`]).
//!
//! The picked endpoint is kept when it is usable (not failed by active checks, not ejected)
//! and is not the endpoint the retry layer asked to avoid; that is the whole fast path: no
//! lock, no allocation, one clock read at most. Otherwise the slow path scans the set (bounded
//! by its size): when fewer than `panic_threshold` percent of the endpoints are usable it
//! balances over all of them (Envoy's panic mode: better to try a maybe-dead endpoint than to
//! refuse everything); else it takes the next usable endpoint in ring order (round robin) or
//! the cheapest usable one (the others).

mod balancer;
pub mod bench;
pub(crate) mod discovery;
pub(crate) mod endpoint;
pub(crate) mod health;
pub(crate) mod status;
#[cfg(test)]
mod tests;
pub(crate) mod timeout;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::config::{LoadBalancer, OutlierSettings};
pub(crate) use balancer::{Balancer, Picked};
pub(crate) use endpoint::{Address, Clock, Endpoint, EndpointLoad, EndpointState, Now, Outcome};
pub(crate) use health::Probe;

/// The endpoints of an upstream at one moment, with the balancer's position.
#[derive(Debug)]
pub(crate) struct EndpointSet {
    endpoints: Box<[Arc<Endpoint>]>,
    /// Smooth weighted round-robin order, as indices into `endpoints`.
    schedule: Box<[u32]>,
    next: AtomicUsize,
    /// State of the splitmix64 generator for the random choices.
    rng: AtomicU64,
    kind: LoadBalancer,
    panic_threshold: u8,
}

const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

// === impl EndpointSet ===

impl EndpointSet {
    /// A set over `endpoints`; `seed` seeds the random choices (fixed in tests).
    pub(crate) fn new(
        endpoints: Vec<Arc<Endpoint>>,
        kind: LoadBalancer,
        panic_threshold: u8,
        seed: u64,
    ) -> Self {
        let weights: Vec<u32> = endpoints.iter().map(|e| e.weight).collect();
        Self {
            schedule: smooth_schedule(&weights).into(),
            endpoints: endpoints.into(),
            next: AtomicUsize::new(0),
            rng: AtomicU64::new(seed),
            kind,
            panic_threshold,
        }
    }

    /// The endpoints, in order.
    pub(crate) fn endpoints(&self) -> &[Arc<Endpoint>] {
        &self.endpoints
    }

    /// Picks the endpoint for the next attempt, avoiding the endpoint with id `avoid` when
    /// there is another choice. `None` only for an empty set.
    #[inline]
    pub(crate) fn pick(&self, avoid: Option<usize>, now: &mut Now<'_>) -> Option<&Arc<Endpoint>> {
        let n = self.endpoints.len();
        if n <= 1 {
            return self.endpoints.first();
        }
        let first = match self.kind {
            LoadBalancer::RoundRobin => {
                let i = self.next.fetch_add(1, Ordering::Relaxed) % self.schedule.len();
                self.schedule[i] as usize
            }
            LoadBalancer::LeastRequest | LoadBalancer::PeakEwma => {
                let (a, b) = self.two_choices(n);
                if self.cost(a, now) <= self.cost(b, now) {
                    a
                } else {
                    b
                }
            }
        };
        let endpoint = &self.endpoints[first];
        if Some(endpoint.state.id) != avoid && endpoint.state.usable(now) {
            return Some(endpoint);
        }
        Some(self.pick_slow(first, avoid, now))
    }

    /// The slow path (module docs): panic mode, or the next / cheapest usable endpoint.
    #[cold]
    fn pick_slow(&self, first: usize, avoid: Option<usize>, now: &mut Now<'_>) -> &Arc<Endpoint> {
        let n = self.endpoints.len();
        let usable = self
            .endpoints
            .iter()
            .filter(|e| e.state.usable(now))
            .count();
        let panic = self.in_panic(usable);
        if panic && Some(self.endpoints[first].state.id) != avoid {
            return &self.endpoints[first];
        }
        let candidate = |i: usize, now: &mut Now<'_>| {
            let e = &self.endpoints[i];
            Some(e.state.id) != avoid && (panic || e.state.usable(now))
        };
        let ring = (1..n).map(|k| (first + k) % n);
        let chosen = match self.kind {
            LoadBalancer::RoundRobin => ring.clone().find(|&i| candidate(i, now)),
            LoadBalancer::LeastRequest | LoadBalancer::PeakEwma => {
                let mut best: Option<(usize, f64)> = None;
                for i in std::iter::once(first).chain(ring.clone()) {
                    if candidate(i, now) {
                        let cost = self.cost(i, now);
                        if best.is_none_or(|(_, c)| cost < c) {
                            best = Some((i, cost));
                        }
                    }
                }
                best.map(|(i, _)| i)
            }
        };
        // Panic mode, or nothing but the avoided endpoint left: `first` is as good as any.
        let index = chosen.unwrap_or_else(|| {
            if panic {
                first
            } else {
                ring.clone()
                    .chain(std::iter::once(first))
                    .find(|&i| self.endpoints[i].state.usable(now))
                    .unwrap_or(first)
            }
        });
        &self.endpoints[index]
    }

    /// Whether `usable` endpoints out of the set's are too few: picks then ignore health.
    pub(crate) fn in_panic(&self, usable: usize) -> bool {
        usable == 0 || usable * 100 < usize::from(self.panic_threshold) * self.endpoints.len()
    }

    /// Two distinct random indices below `n` (n ≥ 2), from one splitmix64 draw.
    #[inline]
    fn two_choices(&self, n: usize) -> (usize, usize) {
        let mut z = self
            .rng
            .fetch_add(GOLDEN_GAMMA, Ordering::Relaxed)
            .wrapping_add(GOLDEN_GAMMA);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        let a = (z as u32 as usize) % n;
        let mut b = ((z >> 32) as usize) % (n - 1);
        if b >= a {
            b += 1;
        }
        (a, b)
    }

    /// The balancer's cost of sending to endpoint `i` (lower is better).
    #[inline]
    fn cost(&self, i: usize, now: &mut Now<'_>) -> f64 {
        let e = &self.endpoints[i];
        let load = (e.state.in_flight() + 1) as f64;
        let per_weight = load / f64::from(e.weight.max(1));
        match self.kind {
            LoadBalancer::PeakEwma => e.state.ewma(now.get()) * per_weight,
            _ => per_weight,
        }
    }

    /// Records an attempt's outcome on `endpoint`, ejecting it when it crossed the failure
    /// threshold and the ejected share stays within `max_ejected_percent`. Returns the
    /// ejection's end when it was ejected.
    pub(crate) fn record(
        &self,
        endpoint: &Endpoint,
        outcome: Outcome,
        outlier: &OutlierSettings,
        clock: &Clock,
    ) -> Option<endpoint::Nanos> {
        if !endpoint.state.record(outcome, outlier) {
            return None;
        }
        let now = clock.now();
        let n = self.endpoints.len();
        let ejected = self
            .endpoints
            .iter()
            .filter(|e| e.state.ejected_until(now).is_some())
            .count();
        // Never eject beyond the cap: with one endpoint (or 50 % of two) that means the last
        // endpoint is never ejected; it would only trigger panic mode anyway.
        if (ejected + 1) * 100 > usize::from(outlier.max_ejected_percent) * n {
            return None;
        }
        endpoint.state.eject(now, outlier)
    }

    /// Whether at least one endpoint is usable now (for `/readyz`).
    pub(crate) fn any_usable(&self, clock: &Clock) -> bool {
        let mut now = Now::new(clock);
        self.endpoints.iter().any(|e| e.state.usable(&mut now))
    }
}

/// Resolves host names once, then starts each upstream's discovery and health-check tasks;
/// all stop when `stop` turns true.
pub(crate) async fn start<U: Probe>(
    upstreams: &[Arc<U>],
    stop: &tokio::sync::watch::Receiver<bool>,
) {
    for upstream in upstreams {
        let balancer = upstream.balancer();
        if balancer.sources().dynamic() {
            let mut file = discovery::initial_file_state(balancer.name(), balancer.sources()).await;
            balancer.refresh(&mut file).await;
            tokio::spawn(discover(upstream.clone(), file, stop.clone()));
        }
        if balancer.health_check().is_some() {
            tokio::spawn(health::run(upstream.clone(), stop.clone()));
        }
    }
}

/// Keeps `upstream`'s endpoints current until `stop` turns true (the first refresh is done
/// before serving, by [`start`]).
async fn discover<U: Probe>(
    upstream: Arc<U>,
    mut file: discovery::FileState,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let interval = upstream.balancer().sources().interval;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        upstream.balancer().refresh(&mut file).await;
    }
}

/// nginx's smooth weighted round robin, unrolled into one period: each step adds every
/// endpoint's weight to its current value, picks the largest, and subtracts the total from
/// it. Weights are divided by their gcd first, so equal weights give a period of `n`.
pub(crate) fn smooth_schedule(weights: &[u32]) -> Vec<u32> {
    let g = weights.iter().copied().fold(0, gcd).max(1);
    let weights: Vec<i64> = weights.iter().map(|&w| i64::from(w.max(1) / g)).collect();
    let total: i64 = weights.iter().sum();
    let mut current = vec![0i64; weights.len()];
    let mut schedule = Vec::with_capacity(usize::try_from(total).unwrap_or(0));
    for _ in 0..total {
        let mut best = 0;
        for (i, w) in weights.iter().enumerate() {
            current[i] += w;
            if current[i] > current[best] {
                best = i;
            }
        }
        current[best] -= total;
        schedule.push(best as u32);
    }
    if schedule.is_empty() {
        schedule.push(0);
    }
    schedule
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}
