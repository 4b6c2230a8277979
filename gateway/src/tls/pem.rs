//! Reading PEM files: certificate chains, CA bundles and private keys.

use std::path::Path;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use super::{PemRole, TlsError};

/// Every `CERTIFICATE` block of a PEM file, in order (leaf first for a chain).
pub fn load_certificates(
    path: &Path,
    role: PemRole,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = read(path, role)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| invalid(path, role, format!("not a PEM certificate file ({err})")))?;
    if certs.is_empty() {
        return Err(invalid(path, role, "contains no PEM CERTIFICATE block"));
    }
    Ok(certs)
}

/// The first private key of a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn load_private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = read(path, PemRole::Key)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|err| {
        let reason = match err {
            rustls_pki_types::pem::Error::NoItemsFound => {
                "contains no PEM PRIVATE KEY block".to_owned()
            }
            other => format!("not a PEM private key file ({other})"),
        };
        invalid(path, PemRole::Key, reason)
    })
}

fn read(path: &Path, role: PemRole) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        role,
        source,
    })
}

fn invalid(path: &Path, role: PemRole, reason: impl Into<String>) -> TlsError {
    TlsError::Invalid {
        path: path.to_owned(),
        role,
        reason: reason.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_file_and_the_problem() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let err = load_certificates(&missing, PemRole::Certificate).unwrap_err();
        assert!(matches!(err, TlsError::Read { .. }), "{err}");
        assert!(err.to_string().contains("missing.pem"), "{err}");

        let garbage = dir.path().join("garbage.pem");
        std::fs::write(&garbage, "hello").unwrap();
        let err = load_certificates(&garbage, PemRole::Certificate).unwrap_err();
        assert!(err.to_string().contains("no PEM CERTIFICATE"), "{err}");
        let err = load_private_key(&garbage).unwrap_err();
        assert_eq!(err.role(), PemRole::Key);
        assert!(err.to_string().contains("no PEM PRIVATE KEY"), "{err}");
    }

    #[test]
    fn reads_a_generated_pair() {
        let dir = tempfile::tempdir().unwrap();
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let (cert_path, key_path) = (dir.path().join("c.pem"), dir.path().join("k.pem"));
        std::fs::write(&cert_path, cert.cert.pem()).unwrap();
        std::fs::write(&key_path, cert.key_pair.serialize_pem()).unwrap();
        assert_eq!(
            load_certificates(&cert_path, PemRole::Certificate)
                .unwrap()
                .len(),
            1
        );
        load_private_key(&key_path).unwrap();
    }
}
