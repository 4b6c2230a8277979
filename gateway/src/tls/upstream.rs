//! TLS toward upstreams: client configurations, trust roots, and what a failure means.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use rustls::{AlertDescription, ClientConfig, RootCertStore};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use super::listener::{ALPN_H2, ALPN_HTTP11};
use super::{provider, PROTOCOL_VERSIONS};

/// A client certificate chain and its key, presented to upstreams that ask (mTLS).
#[derive(Debug)]
pub struct ClientIdentity {
    /// Leaf first.
    pub chain: Vec<CertificateDer<'static>>,
    /// The leaf's private key.
    pub key: PrivateKeyDer<'static>,
}

/// How establishing TLS to an upstream failed (inside the connector, before any request
/// byte was written).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsConnectError {
    /// The handshake did not finish within `tls_handshake_timeout`.
    #[error("TLS handshake with the upstream did not finish within {0:?}")]
    HandshakeTimeout(Duration),
    /// The handshake failed: a certificate verdict ([`certificate_failure`]) or a transport
    /// or protocol error.
    #[error("TLS handshake with the upstream failed")]
    Handshake(#[source] std::io::Error),
    /// The endpoint host is not a valid TLS server name.
    #[error("{0:?} is not a valid TLS server name")]
    ServerName(String),
}

/// The system's trust roots, loaded once per process (the OS store: on Debian
/// `/etc/ssl/certs`, overridable with `SSL_CERT_FILE`/`SSL_CERT_DIR`).
///
/// An error when none could be loaded, so an `https://` upstream without `tls.ca` is
/// refused at start-up rather than failing every request with `UnknownIssuer`.
pub fn system_roots() -> Result<Arc<RootCertStore>, String> {
    static ROOTS: OnceLock<Result<Arc<RootCertStore>, String>> = OnceLock::new();
    ROOTS
        .get_or_init(|| {
            let loaded = rustls_native_certs::load_native_certs();
            let mut store = RootCertStore::empty();
            let (added, _ignored) = store.add_parsable_certificates(loaded.certs);
            if added == 0 {
                let errors: Vec<String> = loaded.errors.iter().map(|e| e.to_string()).collect();
                return Err(format!(
                    "no system root certificate could be loaded ({}); install ca-certificates or set tls.ca",
                    if errors.is_empty() { "none found".to_owned() } else { errors.join("; ") }
                ));
            }
            Ok(Arc::new(store))
        })
        .clone()
}

/// The rustls client configuration of one upstream.
///
/// ALPN offers only `h2` when the upstream declares HTTP/2 (the client then speaks HTTP/2
/// and nothing else to it), otherwise only `http/1.1`. Session resumption uses rustls'
/// default in-memory cache, so reconnects after an idle close skip the full handshake.
pub fn upstream_client_config(
    roots: Arc<RootCertStore>,
    identity: Option<ClientIdentity>,
    http2: bool,
) -> Result<Arc<ClientConfig>, rustls::Error> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(PROTOCOL_VERSIONS)?
        .with_root_certificates(roots);
    let mut config = match identity {
        Some(id) => builder.with_client_auth_cert(id.chain, id.key)?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![if http2 { ALPN_H2 } else { ALPN_HTTP11 }.to_vec()];
    Ok(Arc::new(config))
}

/// The certificate verdict in an error's cause chain, if any: our rejection of the
/// upstream's certificate (`UnknownIssuer`, `NotValidForName`, `Expired`…) or the upstream's
/// rejection of ours (a certificate alert; with TLS 1.3 it arrives only after the client
/// finished its half of the handshake, so it can surface on the first read).
pub fn certificate_failure(err: &(dyn std::error::Error + 'static)) -> Option<String> {
    use portcullis_problem::caused_by;
    if let Some(reason) = caused_by::<rustls::Error>(err).and_then(verdict) {
        return Some(reason);
    }
    // `io::Error::source` skips the error it wraps (tokio-rustls wraps rustls' error in
    // one), so look inside it explicitly.
    caused_by::<std::io::Error>(err)
        .and_then(|io| io.get_ref())
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .and_then(verdict)
}

fn verdict(err: &rustls::Error) -> Option<String> {
    match err {
        rustls::Error::InvalidCertificate(reason) => Some(reason.to_string()),
        rustls::Error::NoCertificatesPresented => Some("NoCertificatesPresented".to_owned()),
        rustls::Error::AlertReceived(alert) if is_certificate_alert(*alert) => Some(format!(
            "the upstream refused the gateway's client certificate (alert {alert:?})"
        )),
        _ => None,
    }
}

fn is_certificate_alert(alert: AlertDescription) -> bool {
    matches!(
        alert,
        AlertDescription::BadCertificate
            | AlertDescription::UnsupportedCertificate
            | AlertDescription::CertificateRevoked
            | AlertDescription::CertificateExpired
            | AlertDescription::CertificateUnknown
            | AlertDescription::UnknownCA
            | AlertDescription::CertificateRequired
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_certificate_verdicts_inside_io_errors() {
        let rustls_err = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, rustls_err);
        let wrapped = TlsConnectError::Handshake(io);
        assert_eq!(
            certificate_failure(&wrapped).as_deref(),
            Some("UnknownIssuer")
        );

        let alert = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::AlertReceived(AlertDescription::CertificateRequired),
        );
        assert!(certificate_failure(&alert)
            .unwrap()
            .contains("CertificateRequired"));

        let other = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::AlertReceived(AlertDescription::HandshakeFailure),
        );
        assert_eq!(certificate_failure(&other), None);
        let timeout = TlsConnectError::HandshakeTimeout(Duration::from_secs(3));
        assert_eq!(certificate_failure(&timeout), None);
    }

    #[test]
    fn alpn_follows_the_http2_declaration() {
        let roots = Arc::new(RootCertStore::empty());
        let h2 = upstream_client_config(roots.clone(), None, true).unwrap();
        assert_eq!(h2.alpn_protocols, vec![b"h2".to_vec()]);
        let h1 = upstream_client_config(roots, None, false).unwrap();
        assert_eq!(h1.alpn_protocols, vec![b"http/1.1".to_vec()]);
    }
}
