//! Route matching: which configured route a request belongs to, decided once, early in the
//! stack, because rate limiting (cost, per-route limits), idempotency (per-route settings)
//! and the retry layer (deadline, upstream) depend on it. The match goes into the request
//! context, which every later layer reads.
//!
//! # Most specific wins
//!
//! A route matches when every condition it sets holds: `hosts` (one of them), the path
//! (`prefix`, `exact` or `pattern`), every `headers` entry, and `methods` (one of them).
//! Among the routes that match, the most specific wins, by this total order:
//!
//! 1. host: an exact host, then a wildcard (the longest suffix first), then routes without
//!    `hosts` — as Envoy picks the virtual host and nginx the `server` before any path. A
//!    host group with no matching route falls through to the next, so a catch-all route
//!    without `hosts` still serves a known host's other paths;
//! 2. path kind: `exact`, then `pattern`, then `prefix`;
//! 3. path length: for patterns more literal segments, then a literal earlier
//!    (`/orders/{id}` before `/{kind}/7`), then a fixed length before a `{*rest}`; for
//!    prefixes the longest (today's rule);
//! 4. more `headers` matchers;
//! 5. restricted `methods` before none;
//! 6. file order.
//!
//! A request that some route matches in every respect but the method, when no route
//! matches it fully, is answered 405 with `Allow` (the union of those routes' methods);
//! with no such route, 404.
//!
//! # Cost
//!
//! No linear scan: routes are indexed by host (hash maps of exact hosts and of wildcard
//! suffixes), then by path (a segment trie for `exact` and `pattern`, a hash map of prefixes
//! probed at the path's segment boundaries, longest first; see [`index`]). Matching
//! allocates nothing: the host is lower-cased into a stack buffer.

mod index;

use rustc_hash::FxHashMap as HashMap;
use std::sync::Arc;

use http::{HeaderMap, Method};

use self::index::{Group, PathRank};
use crate::config::routes::rules::{host_key, MAX_HOST_LEN};
use crate::config::HostRule;
use crate::config::RouteSettings;
use crate::plumbing::route::{Route, RouteMetrics};
use portcullis_retry::{RetryTarget, UpstreamState};

/// The configured routes, indexed by host and path.
#[derive(Debug, Clone)]
pub struct RouteTable {
    inner: Arc<Index>,
}

#[derive(Debug)]
struct Index {
    routes: Box<[Arc<Route>]>,
    exact_hosts: HashMap<Box<str>, Group>,
    /// By suffix: `.example.com` for `*.example.com`.
    wildcard_hosts: HashMap<Box<str>, Group>,
    any_host: Group,
    ranks: Box<[PathRank]>,
}

/// What a request is matched on.
#[derive(Debug, Clone, Copy)]
pub struct RouteRequest<'a> {
    /// The method.
    pub method: &'a Method,
    /// The authority (`Host` or `:authority`) as the edge validated it, port included.
    pub authority: Option<&'a [u8]>,
    /// The normalised path.
    pub path: &'a str,
    /// The header fields.
    pub headers: &'a HeaderMap,
}

/// The outcome of matching a request.
#[derive(Debug)]
pub enum Lookup<'a> {
    /// The most specific route that matches everything.
    Route(&'a Arc<Route>),
    /// No route matches, but some would with another method (405 with `Allow`).
    MethodNotAllowed,
    /// No route matches (404).
    NotFound,
}

// === impl RouteRequest ===

impl<'a> RouteRequest<'a> {
    /// The parts of `request` that routes match on.
    pub fn of<B>(request: &'a http::Request<B>) -> Self {
        // The edge checked both and rewrote `Host` for absolute-form; HTTP/2 may carry only
        // `:authority`.
        let authority = request
            .headers()
            .get(http::header::HOST)
            .map(http::HeaderValue::as_bytes)
            .or_else(|| request.uri().authority().map(|a| a.as_str().as_bytes()));
        Self {
            method: request.method(),
            authority,
            path: request.uri().path(),
            headers: request.headers(),
        }
    }
}

// === impl RouteTable ===

impl RouteTable {
    /// Builds the table from validated routes and each upstream's retry state, indexed as the
    /// configuration's upstreams. Routes whose upstream index has no state are skipped
    /// (validation prevents it).
    pub fn new(routes: &[RouteSettings], states: &[Arc<UpstreamState>]) -> Self {
        let routes: Vec<Arc<Route>> = routes
            .iter()
            .enumerate()
            .filter_map(|(index, settings)| {
                let state = states.get(settings.upstream)?.clone();
                let label: Arc<str> = Arc::from(settings.name.as_str());
                Some(Arc::new(Route {
                    index,
                    metrics: RouteMetrics::new(label),
                    retry: RetryTarget {
                        policy: settings.retry.clone(),
                        route_latency: Some(state.route_latency(&settings.name)),
                        upstream: state,
                        idempotent_route: settings.idempotent,
                    },
                    settings: settings.clone(),
                }))
            })
            .collect();
        let ranks: Box<[PathRank]> = routes
            .iter()
            .map(|route| PathRank::of(&route.settings.path))
            .collect();
        let mut exact_hosts: HashMap<Box<str>, Group> = HashMap::default();
        let mut wildcard_hosts: HashMap<Box<str>, Group> = HashMap::default();
        let mut any_host = Group::default();
        for (slot, route) in routes.iter().enumerate() {
            let Ok(slot) = u32::try_from(slot) else {
                break;
            };
            let path = &route.settings.path;
            if route.settings.hosts.is_empty() {
                any_host.insert(slot, path);
            }
            for host in &route.settings.hosts {
                let group = match host {
                    HostRule::Exact(name) => exact_hosts.entry(name.as_str().into()),
                    HostRule::Wildcard(suffix) => wildcard_hosts.entry(suffix.as_str().into()),
                };
                group.or_default().insert(slot, path);
            }
        }
        // Within one path: more header matchers, then restricted methods, then file order.
        let order = |a: &u32, b: &u32| {
            let key = |slot: &u32| {
                routes.get(*slot as usize).map(|route| {
                    let s = &route.settings;
                    (
                        std::cmp::Reverse(s.headers.len()),
                        s.methods.is_empty(),
                        route.index,
                    )
                })
            };
            key(a).cmp(&key(b))
        };
        for group in exact_hosts
            .values_mut()
            .chain(wildcard_hosts.values_mut())
            .chain(std::iter::once(&mut any_host))
        {
            group.sort(&order);
        }
        Self {
            inner: Arc::new(Index {
                routes: routes.into(),
                exact_hosts,
                wildcard_hosts,
                any_host,
                ranks,
            }),
        }
    }

    /// Every route, in configuration order.
    pub(crate) fn routes(&self) -> &[Arc<Route>] {
        &self.inner.routes
    }

    /// The most specific route matching `request` (the order is in the module
    /// documentation). Allocates nothing.
    pub fn find(&self, request: &RouteRequest<'_>) -> Lookup<'_> {
        let mut method_mismatch = false;
        match self.search(request, &mut |_| method_mismatch = true) {
            Some(route) => Lookup::Route(route),
            None if method_mismatch => Lookup::MethodNotAllowed,
            None => Lookup::NotFound,
        }
    }

    /// The methods that would have matched a request [`find`](Self::find) answered
    /// `MethodNotAllowed`, sorted: the 405's `Allow`. Only on that path, so it may allocate.
    pub fn allowed_methods(&self, request: &RouteRequest<'_>) -> Vec<Method> {
        let mut allowed: Vec<Method> = Vec::new();
        self.search(request, &mut |route| {
            for method in &route.settings.methods {
                if !allowed.contains(method) {
                    allowed.push(method.clone());
                }
            }
        });
        allowed.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        allowed
    }

    /// Host groups in order (exact host, wildcard suffixes longest first, any host); in
    /// each, the best `exact`/`pattern` route, else the longest prefix's first route that
    /// matches. `method_miss` sees every route that matched all but the method.
    fn search<'t>(
        &'t self,
        request: &RouteRequest<'_>,
        method_miss: &mut dyn FnMut(&Route),
    ) -> Option<&'t Arc<Route>> {
        let index = &*self.inner;
        let mut buf = [0u8; MAX_HOST_LEN];
        let host = request
            .authority
            .and_then(|authority| host_key(authority, &mut buf));
        if let Some(host) = host {
            if let Some(group) = index.exact_hosts.get(host) {
                if let Some(route) = self.search_group(group, request, method_miss) {
                    return Some(route);
                }
            }
            if !index.wildcard_hosts.is_empty() {
                // `a.b.example.com` tries `.b.example.com`, `.example.com`, `.com`: the
                // longest wildcard first, and never the whole name.
                for (dot, _) in host.match_indices('.').filter(|(i, _)| *i > 0) {
                    if let Some(group) = index.wildcard_hosts.get(&host[dot..]) {
                        if let Some(route) = self.search_group(group, request, method_miss) {
                            return Some(route);
                        }
                    }
                }
            }
        }
        self.search_group(&index.any_host, request, method_miss)
    }

    fn search_group<'t>(
        &'t self,
        group: &Group,
        request: &RouteRequest<'_>,
        method_miss: &mut dyn FnMut(&Route),
    ) -> Option<&'t Arc<Route>> {
        let mut best: Option<(PathRank, &'t Arc<Route>)> = None;
        group.visit_trie(request.path, &mut |candidates| {
            // The candidates of one node are in order: the first that matches is its best.
            if let Some((rank, route)) = self.first_match(candidates, request, method_miss) {
                match best {
                    Some((have, _)) if have >= rank => {}
                    _ => best = Some((rank, route)),
                }
            }
        });
        if let Some((_, route)) = best {
            return Some(route);
        }
        let mut found = None;
        group.visit_prefixes(request.path, &mut |candidates| {
            found = self
                .first_match(candidates, request, method_miss)
                .map(|(_, route)| route);
            found.is_some()
        });
        found
    }

    fn first_match<'t>(
        &'t self,
        candidates: &[u32],
        request: &RouteRequest<'_>,
        method_miss: &mut dyn FnMut(&Route),
    ) -> Option<(PathRank, &'t Arc<Route>)> {
        let index = &*self.inner;
        for &slot in candidates {
            let (Some(route), Some(rank)) = (
                index.routes.get(slot as usize),
                index.ranks.get(slot as usize),
            ) else {
                continue;
            };
            let settings = &route.settings;
            if !settings
                .headers
                .iter()
                .all(|rule| rule.matches(request.headers))
            {
                continue;
            }
            if settings.methods.is_empty() || settings.methods.contains(request.method) {
                return Some((*rank, route));
            }
            method_miss(route);
        }
        None
    }
}

#[cfg(test)]
mod tests;
