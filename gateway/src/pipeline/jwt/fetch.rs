//! Where key sets come from: a JWKS URL (one HTTP/1.1 GET on a fresh connection, TLS with
//! the system roots for `https://`, the whole exchange bounded) or a local file.
//!
//! A JWKS fetch happens every few minutes at most, so it needs no pool: a plain hyper
//! client connection is enough and keeps the data plane's upstream pools out of it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{header, Request, Uri};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

/// Largest JWKS document read (real ones are a few KiB).
pub(crate) const MAX_JWKS_BYTES: usize = 1024 * 1024;

/// Fetching a JWKS document failed; the last good keys stay in use.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FetchError {
    /// TCP connect failed.
    #[error("cannot connect to the JWKS endpoint: {0}")]
    Connect(#[source] std::io::Error),
    /// TLS handshake failed.
    #[error("TLS handshake with the JWKS endpoint failed: {0}")]
    Tls(#[source] std::io::Error),
    /// HTTP exchange failed.
    #[error("JWKS request failed: {0}")]
    Http(#[from] hyper::Error),
    /// A status other than 2xx.
    #[error("the JWKS endpoint answered {0}")]
    Status(u16),
    /// Body over [`MAX_JWKS_BYTES`] or unreadable.
    #[error("the JWKS body is unreadable or larger than {MAX_JWKS_BYTES} bytes")]
    Body,
    /// Exchange not finished in time.
    #[error("the JWKS fetch did not finish within {0:?}")]
    Timeout(Duration),
    /// The file could not be read.
    #[error("cannot read the JWKS file: {0}")]
    File(#[source] std::io::Error),
    /// The document is not a usable key set.
    #[error(transparent)]
    Keys(#[from] super::jwk::JwksError),
}

/// A source of JWKS documents (object-safe, so tests can count fetches).
pub(crate) trait JwksSource: Send + Sync + 'static {
    /// The current document.
    fn fetch(&self) -> BoxFuture<'_, Result<Bytes, FetchError>>;
    /// A cheap check for a new document (file metadata); `false` when unknown.
    fn changed(&self) -> bool {
        false
    }
    /// How often the refresher calls [`JwksSource::changed`] (`None`: never).
    fn watch_every(&self) -> Option<Duration> {
        None
    }
}

/// A JWKS served over HTTP(S).
pub(crate) struct UrlSource {
    uri: Uri,
    tls: Option<tokio_rustls::TlsConnector>,
    timeout: Duration,
}

/// A JWKS file, re-read when its modification time or length changes.
#[derive(Debug)]
pub(crate) struct FileSource {
    path: PathBuf,
    seen: std::sync::Mutex<Option<(std::time::SystemTime, u64)>>,
}

/// How often a JWKS file's metadata is looked at.
const FILE_WATCH: Duration = Duration::from_secs(1);

// === impl UrlSource ===

impl UrlSource {
    pub(crate) fn new(uri: Uri, tls: Option<Arc<rustls::ClientConfig>>, timeout: Duration) -> Self {
        Self {
            uri,
            tls: tls.map(tokio_rustls::TlsConnector::from),
            timeout,
        }
    }

    async fn get(&self) -> Result<Bytes, FetchError> {
        let host = self.uri.host().unwrap_or_default();
        // An IPv6 literal comes bracketed; neither connect nor a server name wants that.
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let port = self
            .uri
            .port_u16()
            .unwrap_or(if self.tls.is_some() { 443 } else { 80 });
        let tcp = TcpStream::connect((host, port))
            .await
            .map_err(FetchError::Connect)?;
        match &self.tls {
            None => self.exchange(tcp).await,
            Some(tls) => {
                let name =
                    rustls_pki_types::ServerName::try_from(host.to_owned()).map_err(|e| {
                        FetchError::Tls(std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
                    })?;
                let stream = tls.connect(name, tcp).await.map_err(FetchError::Tls)?;
                self.exchange(stream).await
            }
        }
    }

    async fn exchange<T>(&self, io: T) -> Result<Bytes, FetchError>
    where
        T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
        let path = self
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned();
        let authority = self
            .uri
            .authority()
            .map(|a| a.as_str().to_owned())
            .unwrap_or_default();
        let request = async move {
            let request = Request::get(path)
                .header(header::HOST, authority)
                .header(header::ACCEPT, "application/jwk-set+json, application/json")
                .header(header::USER_AGENT, "portcullis")
                .body(Empty::<Bytes>::new())
                .map_err(|_| FetchError::Status(0))?;
            let response = sender.send_request(request).await?;
            if !response.status().is_success() {
                return Err(FetchError::Status(response.status().as_u16()));
            }
            Limited::new(response.into_body(), MAX_JWKS_BYTES)
                .collect()
                .await
                .map(|c| c.to_bytes())
                .map_err(|_| FetchError::Body)
        };
        // The connection is driven here rather than spawned, so nothing outlives the
        // timeout. If it ends first, what it delivered is already in the body.
        let mut conn = std::pin::pin!(conn);
        let mut request = std::pin::pin!(request);
        tokio::select! {
            result = &mut request => result,
            _ = &mut conn => request.await,
        }
    }
}

impl JwksSource for UrlSource {
    fn fetch(&self) -> BoxFuture<'_, Result<Bytes, FetchError>> {
        Box::pin(async move {
            tokio::time::timeout(self.timeout, self.get())
                .await
                .map_err(|_| FetchError::Timeout(self.timeout))?
        })
    }
}

// === impl FileSource ===

impl FileSource {
    pub(crate) fn new(path: PathBuf) -> Self {
        Self {
            path,
            seen: std::sync::Mutex::new(None),
        }
    }

    fn stamp(&self) -> Option<(std::time::SystemTime, u64)> {
        let meta = std::fs::metadata(&self.path).ok()?;
        Some((meta.modified().ok()?, meta.len()))
    }
}

impl JwksSource for FileSource {
    fn fetch(&self) -> BoxFuture<'_, Result<Bytes, FetchError>> {
        Box::pin(async move {
            let stamp = self.stamp();
            let bytes = tokio::fs::read(&self.path)
                .await
                .map_err(FetchError::File)?;
            if bytes.len() > MAX_JWKS_BYTES {
                return Err(FetchError::Body);
            }
            if let Ok(mut seen) = self.seen.lock() {
                *seen = stamp;
            }
            Ok(Bytes::from(bytes))
        })
    }

    fn changed(&self) -> bool {
        let now = self.stamp();
        now.is_some() && self.seen.lock().is_ok_and(|seen| *seen != now)
    }

    fn watch_every(&self) -> Option<Duration> {
        Some(FILE_WATCH)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_file_is_reread_when_it_changes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jwks.json");
        std::fs::write(&path, r#"{"keys": []}"#).unwrap();
        let source = FileSource::new(path.clone());
        assert!(source.changed(), "never read yet");
        assert_eq!(source.fetch().await.unwrap(), r#"{"keys": []}"#);
        assert!(!source.changed());
        // A different length is a change even within the file system's time granularity.
        std::fs::write(&path, r#"{"keys": [ ]}"#).unwrap();
        assert!(source.changed());
        source.fetch().await.unwrap();
        assert!(!source.changed());
        std::fs::remove_file(&path).unwrap();
        assert!(!source.changed(), "a vanished file keeps the last keys");
        assert!(matches!(source.fetch().await, Err(FetchError::File(_))));
    }

    #[tokio::test]
    async fn an_unreachable_url_is_an_error_not_a_hang() {
        // Port 9 (discard) on loopback: nothing listens in the test environment.
        let source = UrlSource::new(
            "http://127.0.0.1:9/jwks".parse().unwrap(),
            None,
            Duration::from_secs(2),
        );
        assert!(matches!(
            source.fetch().await,
            Err(FetchError::Connect(_) | FetchError::Timeout(_))
        ));
    }
}
