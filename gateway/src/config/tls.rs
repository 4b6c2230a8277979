//! `[server.tls]`, `[server.admin_tls]`, `[server.http2]`, `server.h2c` and the TLS/HTTP/2
//! fields of `[[upstreams]]`: the stage-one structs and their validation. PEM files are read
//! here, so a missing or broken file refuses start-up (and `check-config`) with the field
//! path and the file path.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::ServerName;

use super::error::Issues;
use super::raw::{RawListenerTls, RawServer, RawUpstream, RawUpstreamTls};
use crate::tls::{self, ClientIdentity, PemRole, ReloadableCert, TlsError};

/// Validated `[server.http2]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Http2Settings {
    /// SETTINGS_MAX_CONCURRENT_STREAMS.
    pub max_concurrent_streams: u32,
    /// SETTINGS_MAX_HEADER_LIST_SIZE.
    pub max_header_list_size: u32,
    /// SETTINGS_INITIAL_WINDOW_SIZE.
    pub initial_stream_window_size: u32,
    /// Connection receive window.
    pub initial_connection_window_size: u32,
}

/// Validated TLS of one upstream, ready to connect with.
#[derive(Debug, Clone)]
pub struct UpstreamTls {
    /// Roots, client identity and ALPN.
    pub client_config: Arc<rustls::ClientConfig>,
    /// SNI override; `None` → the endpoint's host.
    pub server_name: Option<ServerName<'static>>,
}

const WINDOW_MIN: u32 = 65_535;
const WINDOW_MAX: u32 = (1 << 31) - 1;

pub(super) fn listener_tls(
    path: &'static str,
    raw: Option<&RawListenerTls>,
    issues: &mut Issues,
) -> Option<Arc<ReloadableCert>> {
    let raw = raw?;
    match ReloadableCert::load(path, Path::new(&raw.cert), Path::new(&raw.key)) {
        Ok(cert) => Some(Arc::new(cert)),
        Err(err) => {
            let (field, why) = tls_issue(path, "cert", "key", &err);
            issues.push(field, why);
            None
        }
    }
}

pub(super) fn http2(raw: &RawServer, issues: &mut Issues) -> Http2Settings {
    let h = &raw.http2;
    let p = "server.http2";
    issues.range(
        format!("{p}.max_concurrent_streams"),
        h.max_concurrent_streams,
        1,
        10_000,
    );
    issues.range(
        format!("{p}.max_header_list_size"),
        h.max_header_list_size,
        1024,
        1 << 20,
    );
    issues.range(
        format!("{p}.initial_stream_window_size"),
        h.initial_stream_window_size,
        WINDOW_MIN,
        WINDOW_MAX,
    );
    issues.range(
        format!("{p}.initial_connection_window_size"),
        h.initial_connection_window_size,
        WINDOW_MIN,
        WINDOW_MAX,
    );
    Http2Settings {
        max_concurrent_streams: h.max_concurrent_streams,
        max_header_list_size: h.max_header_list_size,
        initial_stream_window_size: h.initial_stream_window_size,
        initial_connection_window_size: h.initial_connection_window_size,
    }
}

/// Validates an upstream's TLS fields; `Some` when it has an `https://` endpoint.
pub(super) fn upstream_tls(
    path: &str,
    raw: &RawUpstream,
    endpoints: &[http::Uri],
    issues: &mut Issues,
) -> Option<UpstreamTls> {
    issues.duration_range(
        &format!("{path}.tls_handshake_timeout"),
        raw.tls_handshake_timeout.get(),
        Duration::from_millis(100),
        Duration::from_secs(30),
    );
    let https = endpoints.iter().any(|u| u.scheme_str() == Some("https"));
    let tls_path = format!("{path}.tls");
    let defaults = RawUpstreamTls::default();
    match (&raw.tls, https) {
        (Some(_), false) => {
            issues.push(
                tls_path,
                "is set but no endpoint is https://, so it would never be used",
            );
            None
        }
        (None, false) => None,
        (t, true) => upstream_config(
            &tls_path,
            t.as_ref().unwrap_or(&defaults),
            raw.http2,
            issues,
        ),
    }
}

fn upstream_config(
    path: &str,
    t: &RawUpstreamTls,
    http2: bool,
    issues: &mut Issues,
) -> Option<UpstreamTls> {
    // Problems of this table, pushed at the end; any of them means no client config.
    let mut found: Vec<(String, String)> = Vec::new();
    let roots = match &t.ca {
        Some(ca) => match tls::load_certificates(Path::new(ca), PemRole::Certificate) {
            Ok(certs) => {
                let mut store = rustls::RootCertStore::empty();
                let (added, _) = store.add_parsable_certificates(certs);
                if added == 0 {
                    found.push((
                        format!("{path}.ca"),
                        format!("= {ca:?}: no usable CA certificate in the bundle"),
                    ));
                }
                Some(Arc::new(store))
            }
            Err(err) => {
                found.push((format!("{path}.ca"), format!("= {ca:?}: {}", reason(&err))));
                None
            }
        },
        None => match tls::system_roots() {
            Ok(roots) => Some(roots),
            Err(reason) => {
                found.push((format!("{path}.ca"), format!("is not set and {reason}")));
                None
            }
        },
    };
    let identity = match (&t.client_cert, &t.client_key) {
        (None, None) => None,
        (Some(cert), Some(key)) => {
            let chain = tls::load_certificates(Path::new(cert), PemRole::Certificate);
            let key_der = tls::load_private_key(Path::new(key));
            match (chain, key_der) {
                (Ok(chain), Ok(key)) => Some(ClientIdentity { chain, key }),
                (chain, key) => {
                    for err in [chain.err(), key.err()].into_iter().flatten() {
                        found.push(tls_issue(path, "client_cert", "client_key", &err));
                    }
                    None
                }
            }
        }
        (Some(_), None) => {
            found.push((
                format!("{path}.client_key"),
                "is missing: client_cert needs its key".into(),
            ));
            None
        }
        (None, Some(_)) => {
            found.push((
                format!("{path}.client_cert"),
                "is missing: client_key needs its certificate".into(),
            ));
            None
        }
    };
    let mut server_name = None;
    if let Some(name) = &t.server_name {
        match ServerName::try_from(name.clone()) {
            Ok(parsed) => server_name = Some(parsed),
            Err(_) => found.push((
                format!("{path}.server_name"),
                format!("= {name:?}: not a DNS name or IP address"),
            )),
        }
    }
    let built = match roots {
        Some(roots) if found.is_empty() => tls::upstream_client_config(roots, identity, http2)
            .map_err(|err| {
                // rustls checks the client key against the certificate here.
                let field = if t.client_cert.is_some() {
                    "client_key"
                } else {
                    "ca"
                };
                found.push((
                    format!("{path}.{field}"),
                    format!("refused by rustls: {err}"),
                ));
            })
            .ok(),
        _ => None,
    };
    for (field, why) in found {
        issues.push(field, why);
    }
    built.map(|client_config| UpstreamTls {
        client_config,
        server_name,
    })
}

/// `(field path, reason)` of a PEM problem: the field of the file it is about, its path.
fn tls_issue(path: &str, cert: &str, key: &str, err: &TlsError) -> (String, String) {
    let (field, file) = match err {
        TlsError::Read {
            path: file, role, ..
        }
        | TlsError::Invalid {
            path: file, role, ..
        }
        | TlsError::Rejected {
            path: file, role, ..
        } => (
            if *role == PemRole::Key { key } else { cert },
            file.display().to_string(),
        ),
    };
    (
        format!("{path}.{field}"),
        format!("= {file:?}: {}", reason(err)),
    )
}

/// The error without its leading file path (the issue names the file itself).
fn reason(err: &TlsError) -> String {
    match err {
        TlsError::Read { source, .. } => format!("cannot read: {source}"),
        TlsError::Invalid { reason, .. } => reason.clone(),
        TlsError::Rejected { source, .. } => format!("refused: {source}"),
    }
}

#[cfg(test)]
mod tests;
