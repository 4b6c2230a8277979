//! Service discovery: where an upstream's endpoint set comes from, and the task that keeps
//! it current.
//!
//! - An `http://` endpoint given with a host name (`http://orders.internal:8080`) becomes
//!   one endpoint per A/AAAA record of the name (Envoy's `STRICT_DNS`), re-resolved every
//!   `resolve_interval`; each keeps `Host: orders.internal:8080`. The system resolver
//!   (`getaddrinfo`) reports no TTL, so the interval is the refresh period. A name that
//!   fails to resolve keeps its previous addresses (and logs why), so a resolver hiccup
//!   never empties an upstream. `https://` names are not expanded: the TLS handshake
//!   needs the name (SNI, certificate), so they are resolved at connect time as before.
//! - `[discovery] hosts_file` names a hosts-style file (`IP name…` per line) read at every
//!   resolution before the system resolver: names it lists resolve to its addresses only.
//!   Tests point it at a file they rewrite; operators can use it to pin names.
//! - `endpoints_file`: one `URL [weight]` per line, `#` comments, re-read every
//!   `resolve_interval`; host names in it are resolved as above. A file that cannot be read
//!   or parsed keeps the last good set and logs why (once per bad version).
//!
//! A new set is swapped in only when the addresses or weights changed; endpoints that stay
//! keep their state (in-flight, latency, health, ejections).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::uri::{Authority, Scheme};
use http::{HeaderValue, Uri};

use super::Address;

/// Bound on one name's resolution.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// What an upstream's endpoints are made of.
#[derive(Debug, Clone)]
pub(crate) struct Sources {
    /// `endpoints` from the configuration, with weights.
    pub(crate) entries: Vec<(Uri, u32)>,
    /// `endpoints_file`.
    pub(crate) file: Option<PathBuf>,
    /// `resolve_interval`.
    pub(crate) interval: Duration,
    /// `[discovery] hosts_file`.
    pub(crate) hosts_file: Option<PathBuf>,
}

// === impl Sources ===

impl Sources {
    /// Whether anything can change at run time (a file, or a name to re-resolve).
    pub(crate) fn dynamic(&self) -> bool {
        self.file.is_some() || self.entries.iter().any(|(uri, _)| expands(uri))
    }
}

/// Why a discovery refresh kept the previous set.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DiscoveryError {
    /// The endpoints file could not be read.
    #[error("endpoints_file {path:?}: cannot read: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The endpoints file is malformed.
    #[error("endpoints_file {path:?}: {reason}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Which line and why.
        reason: String,
    },
}

/// Remembers the last file text seen, so a bad file is logged once, not every interval.
#[derive(Debug, Default)]
pub(crate) struct FileState {
    last_text: Option<String>,
    good: Vec<(Uri, u32)>,
}

/// The endpoints `sources` name now (`file` caches the endpoints file), each name resolved
/// again; `current` stands in for a name that fails to resolve. `None` when nothing was
/// found: the caller keeps the previous set. `upstream` names it in logs.
pub(crate) async fn next_endpoints(
    upstream: &str,
    sources: &Sources,
    current: &[Arc<super::Endpoint>],
    file: &mut FileState,
) -> Option<Vec<(Address, u32)>> {
    if let Some(path) = &sources.file {
        if let Err(err) = read_file(path, file).await {
            tracing::warn!(upstream, %err, "endpoints_file: keeping the last good endpoints");
        }
    }
    let mut next: Vec<(Address, u32)> = Vec::new();
    for (uri, weight) in sources.entries.iter().chain(&file.good) {
        match addresses(uri, sources.hosts_file.as_deref()).await {
            Ok(list) => next.extend(list.into_iter().map(|a| (a, *weight))),
            Err(err) => {
                tracing::warn!(upstream, endpoint = %uri, %err, "cannot resolve; keeping its previous addresses");
                next.extend(
                    current
                        .iter()
                        .filter(|e| Some(&e.address.host) == host_header(uri).as_ref())
                        .map(|e| (e.address.clone(), *weight)),
                );
            }
        }
    }
    // Duplicates (the same address twice) would be one pool entry counted twice.
    let mut seen = std::collections::HashSet::new();
    next.retain(|(a, _)| seen.insert(a.clone()));
    if next.is_empty() {
        tracing::warn!(
            upstream,
            "discovery found no endpoint; keeping the previous ones"
        );
        return None;
    }
    Some(next)
}

async fn read_file(path: &Path, state: &mut FileState) -> Result<(), DiscoveryError> {
    let text = tokio::fs::read_to_string(path)
        .await
        .map_err(|source| DiscoveryError::Read {
            path: path.to_owned(),
            source,
        })?;
    if state.last_text.as_deref() == Some(text.as_str()) {
        return Ok(());
    }
    let parsed = crate::config::parse_endpoints_file(&text);
    state.last_text = Some(text);
    state.good = parsed.map_err(|reason| DiscoveryError::Parse {
        path: path.to_owned(),
        reason,
    })?;
    Ok(())
}

/// Loads the file at start-up (validation already parsed it once).
pub(crate) async fn initial_file_state(upstream: &str, sources: &Sources) -> FileState {
    let mut state = FileState::default();
    if let Some(path) = &sources.file {
        if let Err(err) = read_file(path, &mut state).await {
            tracing::warn!(upstream, %err, "endpoints_file");
        }
    }
    state
}

/// Whether `uri` is an `http://` endpoint with a host name (not an IP literal).
fn expands(uri: &Uri) -> bool {
    uri.scheme() == Some(&Scheme::HTTP)
        && uri.host().is_some_and(|h| {
            h.trim_start_matches('[')
                .trim_end_matches(']')
                .parse::<IpAddr>()
                .is_err()
        })
}

fn host_header(uri: &Uri) -> Option<HeaderValue> {
    HeaderValue::from_str(uri.authority()?.as_str()).ok()
}

/// The address of an endpoint URI as configured (no resolution).
pub(crate) fn literal(uri: &Uri) -> Option<Address> {
    Some(Address {
        scheme: uri.scheme()?.clone(),
        authority: uri.authority()?.clone(),
        host: host_header(uri)?,
    })
}

/// The addresses `uri` stands for: itself, or one per record of its host name.
async fn addresses(uri: &Uri, hosts_file: Option<&Path>) -> Result<Vec<Address>, std::io::Error> {
    let invalid =
        |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidInput, what.to_owned());
    if !expands(uri) {
        return literal(uri)
            .map(|a| vec![a])
            .ok_or_else(|| invalid("not host:port"));
    }
    let host = uri.host().ok_or_else(|| invalid("no host"))?;
    let port = uri.port_u16().unwrap_or(80);
    let header = host_header(uri).ok_or_else(|| invalid("bad host"))?;
    let ips = resolve(host, port, hosts_file).await?;
    let scheme = uri.scheme().cloned().unwrap_or(Scheme::HTTP);
    let mut out = Vec::with_capacity(ips.len());
    for ip in ips {
        let text = match ip {
            IpAddr::V4(v4) => format!("{v4}:{port}"),
            IpAddr::V6(v6) => format!("[{v6}]:{port}"),
        };
        let authority: Authority = text.parse().map_err(|_| invalid("bad address"))?;
        out.push(Address {
            scheme: scheme.clone(),
            authority,
            host: header.clone(),
        });
    }
    if out.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "no address records",
        ));
    }
    Ok(out)
}

/// All addresses of `host`: from the hosts file when it lists the name, else the system
/// resolver.
async fn resolve(
    host: &str,
    port: u16,
    hosts_file: Option<&Path>,
) -> Result<Vec<IpAddr>, std::io::Error> {
    if let Some(path) = hosts_file {
        let text = tokio::fs::read_to_string(path).await?;
        let listed = hosts_lookup(&text, host);
        if !listed.is_empty() {
            return Ok(listed);
        }
    }
    let found = tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host((host, port)))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "resolution timed out"))??;
    let mut ips: Vec<IpAddr> = found.map(|a| a.ip()).collect();
    ips.sort();
    ips.dedup();
    Ok(ips)
}

/// The addresses a hosts-style text gives `host` (case-insensitive, in file order).
pub(crate) fn hosts_lookup(text: &str, host: &str) -> Vec<IpAddr> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or_default();
        let mut words = line.split_whitespace();
        let Some(ip) = words.next().and_then(|w| w.parse::<IpAddr>().ok()) else {
            continue;
        };
        if words.any(|name| name.eq_ignore_ascii_case(host)) && !out.contains(&ip) {
            out.push(ip);
        }
    }
    out
}
