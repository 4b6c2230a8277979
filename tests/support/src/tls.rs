//! TLS for tests: a throwaway CA that issues server and client certificates (generated with
//! rcgen in each test run — no private key is ever committed), PEM files written atomically,
//! rustls configurations with the `ring` provider, a handshake probe that returns the
//! certificate a server presents, and a listener that never finishes a handshake.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::upstream::MAX_STALL;

/// The crypto provider of every test configuration (explicit: never the process default).
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A certificate and its key, as PEM and as the DER the peer sees.
#[derive(Debug, Clone)]
pub struct Issued {
    /// Certificate (PEM).
    pub cert_pem: String,
    /// Private key (PEM, PKCS#8).
    pub key_pem: String,
    /// Certificate (DER), to compare with what a handshake presents.
    pub der: Vec<u8>,
}

/// A test certificate authority.
pub struct TestCa {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa").finish_non_exhaustive()
    }
}

// === impl TestCa ===

impl TestCa {
    /// A new CA named `name`.
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("CA key");
        let cert = params.self_signed(&key).expect("self-sign CA");
        Self { cert, key }
    }

    /// The CA certificate (PEM), for a bundle.
    pub fn pem(&self) -> String {
        self.cert.pem()
    }

    /// A server certificate for `localhost` and `127.0.0.1`.
    pub fn server(&self) -> Issued {
        self.issue("localhost", ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A client certificate with common name `name`.
    pub fn client(&self, name: &str) -> Issued {
        self.issue(name, ExtendedKeyUsagePurpose::ClientAuth)
    }

    /// Writes the CA certificate to `dir/name`.
    pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
        write_atomic(&dir.join(name), &self.pem())
    }

    fn issue(&self, name: &str, usage: ExtendedKeyUsagePurpose) -> Issued {
        let mut params = CertificateParams::new(vec![name.to_owned()]).expect("leaf params");
        params
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![usage];
        let key = KeyPair::generate().expect("leaf key");
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .expect("sign leaf");
        Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().to_vec(),
        }
    }
}

// === impl Issued ===

impl Issued {
    /// A self-signed server certificate for `localhost` and `127.0.0.1` (no CA knows it).
    pub fn self_signed() -> Self {
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
        params
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        let key = KeyPair::generate().expect("key");
        let cert = params.self_signed(&key).expect("self-sign");
        Self {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().to_vec(),
        }
    }

    /// Writes `dir/{stem}.crt` and `dir/{stem}.key`, each by rename so a watcher never sees
    /// half a file. Returns (cert path, key path).
    pub fn write(&self, dir: &Path, stem: &str) -> (PathBuf, PathBuf) {
        (
            write_atomic(&dir.join(format!("{stem}.crt")), &self.cert_pem),
            write_atomic(&dir.join(format!("{stem}.key")), &self.key_pem),
        )
    }

    /// The certificate chain as rustls wants it.
    pub fn chain(&self) -> Vec<CertificateDer<'static>> {
        vec![CertificateDer::from(self.der.clone())]
    }

    /// The key as rustls wants it.
    pub fn key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes()).expect("key PEM")
    }
}

/// Writes `text` to `path` through a temporary file and a rename.
pub fn write_atomic(path: &Path, text: &str) -> PathBuf {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write temp PEM");
    std::fs::rename(&tmp, path).expect("rename PEM into place");
    path.to_owned()
}

/// Roots holding the CA certificates in `pems`.
pub fn roots(pems: &[&str]) -> RootCertStore {
    let mut store = RootCertStore::empty();
    for pem in pems {
        for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
            store.add(cert.expect("CA PEM")).expect("add root");
        }
    }
    store
}

/// A client configuration trusting `ca_pem`, offering `alpn`; TLS 1.3 only when `tls13_only`.
pub fn client_config(ca_pem: &str, alpn: &[&[u8]], tls13_only: bool) -> ClientConfig {
    let versions: &[&rustls::SupportedProtocolVersion] = if tls13_only {
        &[&rustls::version::TLS13]
    } else {
        &[&rustls::version::TLS13, &rustls::version::TLS12]
    };
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(versions)
        .expect("versions")
        .with_root_certificates(roots(&[ca_pem]))
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    config
}

/// A server configuration presenting `issued`, requiring a client certificate signed by
/// `client_ca` when given, offering ALPN `h2` and `http/1.1`.
pub fn server_config(issued: &Issued, client_ca: Option<&TestCa>) -> Arc<ServerConfig> {
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("versions");
    let builder = match client_ca {
        Some(ca) => {
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots(&[&ca.pem()])),
                provider(),
            )
            .build()
            .expect("client verifier");
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(issued.chain(), issued.key())
        .expect("server cert");
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Arc::new(config)
}

/// Connects to `addr`, completes a TLS handshake as `localhost` trusting `ca_pem`, and
/// returns the end-entity certificate (DER) the server presented. Bounded to 5 s.
pub async fn presented_certificate(addr: SocketAddr, ca_pem: &str) -> Result<Vec<u8>, String> {
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client_config(ca_pem, &[], false)));
    let handshake = async {
        let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        let name = ServerName::try_from("localhost").map_err(|e| e.to_string())?;
        let tls = connector
            .connect(name, tcp)
            .await
            .map_err(|e| e.to_string())?;
        let (_, session) = tls.get_ref();
        session
            .peer_certificates()
            .and_then(|certs| certs.first())
            .map(|cert| cert.to_vec())
            .ok_or_else(|| "no peer certificate".to_owned())
    };
    tokio::time::timeout(Duration::from_secs(5), handshake)
        .await
        .map_err(|_| "handshake timed out".to_owned())?
}

/// `GET path` over TLS (HTTP/1.1, trusting `ca_pem`) on a fresh connection; the status, if
/// any answer came within 5 s.
pub async fn tls_get_status(addr: SocketAddr, ca_pem: &str, path: &str) -> Option<u16> {
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    let answer = tls_raw_request(addr, ca_pem, request.as_bytes()).await?;
    crate::gateway::parse_status(&answer)
}

/// Sends `bytes` over a fresh TLS connection (ALPN `http/1.1`, trusting `ca_pem`) and
/// returns everything received until the server closes; `None` if that takes over 5 s.
pub async fn tls_raw_request(addr: SocketAddr, ca_pem: &str, bytes: &[u8]) -> Option<Vec<u8>> {
    tls_raw_request_offering(addr, ca_pem, &[b"http/1.1"], bytes).await
}

/// [`tls_raw_request`] offering the ALPN protocols `alpn` (none when empty); `None` also when
/// the handshake fails.
pub async fn tls_raw_request_offering(
    addr: SocketAddr,
    ca_pem: &str,
    alpn: &[&[u8]],
    bytes: &[u8],
) -> Option<Vec<u8>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let config = client_config(ca_pem, alpn, false);
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let exchange = async {
        let tcp = TcpStream::connect(addr).await.ok()?;
        let name = ServerName::try_from("localhost").ok()?;
        let mut tls = connector.connect(name, tcp).await.ok()?;
        tls.write_all(bytes).await.ok()?;
        let mut out = Vec::new();
        let _ = tls.read_to_end(&mut out).await;
        Some(out)
    };
    tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .ok()
        .flatten()
}

/// A listener that accepts TCP connections and never says a word: a TLS handshake with it
/// never completes. Counts connections; holds each at most [`MAX_STALL`]; stops when dropped.
#[derive(Debug)]
pub struct SilentListener {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

// === impl SilentListener ===

impl SilentListener {
    /// Starts on a free loopback port.
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let connections = Arc::new(AtomicUsize::new(0));
        let counter = connections.clone();
        let task = tokio::spawn(async move {
            let mut held = tokio::task::JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                held.spawn(async move {
                    tokio::time::sleep(MAX_STALL).await;
                    drop(stream);
                });
            }
        });
        Self {
            addr,
            connections,
            task,
        }
    }

    /// `https://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// TCP connections accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

impl Drop for SilentListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}
