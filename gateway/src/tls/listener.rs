//! A listener's certificate, swappable while connections run, and its rustls acceptor.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use arc_swap::ArcSwap;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;
use tokio_rustls::TlsAcceptor;

use super::pem::{load_certificates, load_private_key};
use super::{provider, PemRole, TlsError, PROTOCOL_VERSIONS};

/// ALPN protocol id of HTTP/2.
pub const ALPN_H2: &[u8] = b"h2";
/// ALPN protocol id of HTTP/1.1.
pub const ALPN_HTTP11: &[u8] = b"http/1.1";

/// What identifies one version of a file: modification time, size and inode. A rename over
/// the file changes the inode even within the same mtime tick.
type FileStamp = (Option<SystemTime>, u64, u64);

/// The certificate chain and key of one listener, reloadable from their files.
pub struct ReloadableCert {
    name: &'static str,
    cert_path: PathBuf,
    key_path: PathBuf,
    current: ArcSwap<CertifiedKey>,
    /// Stamps of both files at the last load attempt, successful or not, so a bad file is
    /// reported once rather than every second.
    stamp: Mutex<[Option<FileStamp>; 2]>,
}

/// The result of [`ReloadableCert::reload`].
#[derive(Debug)]
pub enum ReloadOutcome {
    /// Neither file changed since the last attempt.
    Unchanged,
    /// The new certificate is in service.
    Reloaded,
    /// The new files were refused; the previous certificate stays in service.
    Refused(TlsError),
}

// === impl ReloadableCert ===

impl ReloadableCert {
    /// Loads the pair; `name` is the configuration table (`server.tls`) used in logs.
    pub fn load(name: &'static str, cert_path: &Path, key_path: &Path) -> Result<Self, TlsError> {
        let stamp = [stamp(cert_path), stamp(key_path)];
        let key = load_pair(cert_path, key_path)?;
        Ok(Self {
            name,
            cert_path: cert_path.to_owned(),
            key_path: key_path.to_owned(),
            current: ArcSwap::from_pointee(key),
            stamp: Mutex::new(stamp),
        })
    }

    /// The configuration table this certificate belongs to.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The certificate chain file.
    pub fn cert_path(&self) -> &Path {
        &self.cert_path
    }

    /// The private key file.
    pub fn key_path(&self) -> &Path {
        &self.key_path
    }

    /// The certificate new handshakes get.
    pub fn current(&self) -> Arc<CertifiedKey> {
        self.current.load_full()
    }

    /// Loads the files again when either changed since the last attempt, or always when
    /// `force` (SIGHUP). A pair that fails to load leaves the current certificate in service.
    pub fn reload(&self, force: bool) -> ReloadOutcome {
        let now = [stamp(&self.cert_path), stamp(&self.key_path)];
        {
            let Ok(mut last) = self.stamp.lock() else {
                return ReloadOutcome::Unchanged;
            };
            if !force && *last == now {
                return ReloadOutcome::Unchanged;
            }
            *last = now;
        }
        match load_pair(&self.cert_path, &self.key_path) {
            Ok(key) => {
                self.current.store(Arc::new(key));
                ReloadOutcome::Reloaded
            }
            Err(err) => ReloadOutcome::Refused(err),
        }
    }
}

impl ResolvesServerCert for ReloadableCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

impl std::fmt::Debug for ReloadableCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReloadableCert")
            .field("name", &self.name)
            .field("cert", &self.cert_path)
            .field("key", &self.key_path)
            .finish_non_exhaustive()
    }
}

/// The acceptor of a TLS listener: TLS 1.2/1.3, ALPN `h2` then `http/1.1`, certificate
/// from `cert` at each handshake.
pub fn acceptor(cert: Arc<ReloadableCert>) -> Result<TlsAcceptor, rustls::Error> {
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(PROTOCOL_VERSIONS)?
        .with_no_client_auth()
        .with_cert_resolver(cert);
    config.alpn_protocols = vec![ALPN_H2.to_vec(), ALPN_HTTP11.to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

fn load_pair(cert_path: &Path, key_path: &Path) -> Result<CertifiedKey, TlsError> {
    let chain = load_certificates(cert_path, PemRole::Certificate)?;
    let key = load_private_key(key_path)?;
    CertifiedKey::from_der(chain, key, &provider()).map_err(|source| {
        // A key rustls cannot use, or one that does not belong to the certificate, is the
        // key file's fault; anything else (an unparsable leaf) the certificate's.
        let (path, role) = match source {
            rustls::Error::InconsistentKeys(_) | rustls::Error::General(_) => {
                (key_path, PemRole::Key)
            }
            _ => (cert_path, PemRole::Certificate),
        };
        TlsError::Rejected {
            path: path.to_owned(),
            role,
            source,
        }
    })
}

fn stamp(path: &Path) -> Option<FileStamp> {
    let meta = std::fs::metadata(path).ok()?;
    #[cfg(unix)]
    let inode = std::os::unix::fs::MetadataExt::ino(&meta);
    #[cfg(not(unix))]
    let inode = 0;
    Some((meta.modified().ok(), meta.len(), inode))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_pair(dir: &Path, tag: &str) -> (PathBuf, PathBuf, Vec<u8>) {
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let cert_path = dir.join(format!("{tag}.crt"));
        let key_path = dir.join(format!("{tag}.key"));
        std::fs::write(&cert_path, cert.cert.pem()).unwrap();
        std::fs::write(&key_path, cert.key_pair.serialize_pem()).unwrap();
        (cert_path, key_path, cert.cert.der().to_vec())
    }

    #[test]
    fn reload_swaps_good_pairs_and_keeps_the_old_one_on_bad_files() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key, der_a) = write_pair(dir.path(), "a");
        let reloadable = ReloadableCert::load("server.tls", &cert, &key).unwrap();
        assert_eq!(reloadable.current().cert[0].as_ref(), der_a.as_slice());
        assert!(matches!(reloadable.reload(false), ReloadOutcome::Unchanged));

        let (cert_b, key_b, der_b) = write_pair(dir.path(), "b");
        std::fs::rename(&cert_b, &cert).unwrap();
        std::fs::rename(&key_b, &key).unwrap();
        assert!(matches!(reloadable.reload(false), ReloadOutcome::Reloaded));
        assert_eq!(reloadable.current().cert[0].as_ref(), der_b.as_slice());

        // A key from another pair: refused, attributed to the key, B stays.
        let (_, key_c, _) = write_pair(dir.path(), "c");
        std::fs::rename(&key_c, &key).unwrap();
        match reloadable.reload(true) {
            ReloadOutcome::Refused(err) => assert_eq!(err.role(), PemRole::Key, "{err}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
        std::fs::write(&cert, "not pem").unwrap();
        assert!(matches!(
            reloadable.reload(false),
            ReloadOutcome::Refused(_)
        ));
        // Reported once: the same bad files are not retried every poll.
        assert!(matches!(reloadable.reload(false), ReloadOutcome::Unchanged));
        assert_eq!(reloadable.current().cert[0].as_ref(), der_b.as_slice());
    }

    #[test]
    fn acceptor_offers_h2_and_http11() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key, _) = write_pair(dir.path(), "a");
        let reloadable = Arc::new(ReloadableCert::load("server.tls", &cert, &key).unwrap());
        let acceptor = acceptor(reloadable).unwrap();
        assert_eq!(
            acceptor.config().alpn_protocols,
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        );
    }
}
