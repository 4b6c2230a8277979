//! TLS on both legs, with rustls and the `ring` provider only.
//!
//! # Listener side
//!
//! [`ReloadableCert`] holds the certificate chain and key of a listener behind an `ArcSwap`
//! and is the rustls certificate *resolver* of that listener's [`ServerConfig`]. Every new
//! handshake asks it for the current key, so swapping the key changes what new handshakes
//! see while established connections keep the session they negotiated: nothing is dropped.
//! [`watch`] swaps it on SIGHUP and when either file's modification time or size changes
//! (polled every second — one `stat` per file, no extra crate). A file that does not parse,
//! or a key that does not match the certificate, is refused with an error log line and the
//! old certificate stays in service; the next change (or SIGHUP) tries again.
//!
//! Listeners speak TLS 1.2 and 1.3 only and offer ALPN `h2` and `http/1.1`.
//!
//! # Upstream side
//!
//! [`upstream_client_config`] builds the rustls client configuration of one upstream:
//! verified against the system roots or a configured CA bundle, an optional client
//! certificate (mTLS), ALPN `h2` when the upstream declares HTTP/2. The connector in
//! `proxy::connector` does the handshake under its own timeout; [`certificate_failure`]
//! finds a certificate verdict anywhere in an error's cause chain, so the proxy can classify
//! it as never retryable (docs/retry-policy.md: a certificate error may be an attack).
//!
//! [`ServerConfig`]: rustls::ServerConfig

mod listener;
mod pem;
mod reload;
mod upstream;

use std::path::PathBuf;
use std::sync::Arc;

pub use listener::{acceptor, ReloadableCert, ALPN_H2, ALPN_HTTP11};
pub use pem::{load_certificates, load_private_key};
pub use reload::watch;
pub use upstream::{
    certificate_failure, system_roots, upstream_client_config, ClientIdentity, TlsConnectError,
};

/// The crypto provider of every TLS configuration in the gateway.
///
/// Explicit rather than process-default, so no dependency enabling another provider can make
/// rustls panic on an ambiguous default.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The protocol versions the gateway speaks: TLS 1.3 and 1.2, nothing older.
pub const PROTOCOL_VERSIONS: &[&rustls::SupportedProtocolVersion] =
    &[&rustls::version::TLS13, &rustls::version::TLS12];

/// Which of a certificate/key pair a [`TlsError`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PemRole {
    /// The certificate chain (or a CA bundle).
    Certificate,
    /// The private key.
    Key,
}

/// A TLS file or configuration could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// The file could not be read.
    #[error("{path}: cannot read: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Which file of the pair.
        role: PemRole,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file was read but holds no usable PEM item of the expected kind.
    #[error("{path}: {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Which file of the pair.
        role: PemRole,
        /// What is wrong.
        reason: String,
    },
    /// rustls refused the material (unsupported key type, key not matching the certificate…).
    #[error("{path}: {source}")]
    Rejected {
        /// The file the error is attributed to.
        path: PathBuf,
        /// Which file of the pair.
        role: PemRole,
        /// rustls' reason.
        source: rustls::Error,
    },
}

// === impl TlsError ===

impl TlsError {
    /// Which file of the pair the error is about (for the configuration field path).
    pub fn role(&self) -> PemRole {
        match self {
            Self::Read { role, .. } | Self::Invalid { role, .. } | Self::Rejected { role, .. } => {
                *role
            }
        }
    }
}
