//! Name resolution for upstream endpoints: hyper-util's system resolver (`getaddrinfo` on
//! the blocking pool, exactly what `HttpConnector::new` uses) with its failures typed as
//! [`DnsError`]. hyper-util reports every connect-phase failure as one private error type
//! told apart only by its message; with this type in the cause chain the classifier finds a
//! DNS failure by downcasting (`ProxyErrorKind::Dns`: nothing was sent, at most 2 attempts).

use std::io;
use std::task::{Context, Poll};

use futures_util::future::{MapErr, TryFutureExt};
use hyper_util::client::legacy::connect::dns::{GaiAddrs, GaiFuture, GaiResolver, Name};
use tower::Service;

/// The connector every upstream pool uses.
pub type HttpConnector = hyper_util::client::legacy::connect::HttpConnector<Resolver>;

/// Builds a connector that resolves with [`Resolver`].
pub(crate) fn http_connector() -> HttpConnector {
    HttpConnector::new_with_resolver(Resolver(GaiResolver::new()))
}

/// The system resolver, with typed failures.
#[derive(Debug, Clone)]
pub struct Resolver(GaiResolver);

/// Resolving an upstream's host name failed: no connection was attempted.
#[derive(Debug, thiserror::Error)]
#[error("dns error: {0}")]
pub struct DnsError(#[source] io::Error);

// === impl Resolver ===

impl Service<Name> for Resolver {
    type Response = GaiAddrs;
    type Error = DnsError;
    type Future = MapErr<GaiFuture, fn(io::Error) -> DnsError>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), DnsError>> {
        self.0.poll_ready(cx).map_err(DnsError)
    }

    fn call(&mut self, name: Name) -> Self::Future {
        self.0
            .call(name)
            .map_err(DnsError as fn(io::Error) -> DnsError)
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use axum::body::Body;
    use http::Uri;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;

    use super::*;
    use crate::upstream::proxy::{ProxyError, ProxyErrorKind};

    /// The error hyper-util's client returns for `uri` through `connector`.
    async fn failure<R>(
        connector: hyper_util::client::legacy::connect::HttpConnector<R>,
        uri: &'static str,
    ) -> ProxyErrorKind
    where
        R: Service<Name, Error = DnsError> + Clone + Send + Sync + 'static,
        R::Response: Iterator<Item = SocketAddr>,
        R::Future: Send,
    {
        let client = Client::builder(TokioExecutor::new()).build::<_, Body>(connector);
        let err = client
            .get(Uri::from_static(uri))
            .await
            .expect_err("no upstream there");
        ProxyError::from_client(err, 0).kind()
    }

    #[tokio::test]
    async fn a_resolver_failure_is_classified_as_dns_by_its_type() {
        // Stands in for getaddrinfo failing (no network needed): the same error type the
        // real resolver returns, through hyper-util's connector and client.
        let failing = tower::service_fn(|_: Name| async {
            Err::<std::vec::IntoIter<SocketAddr>, _>(DnsError(io::Error::other("no such host")))
        });
        let connector =
            hyper_util::client::legacy::connect::HttpConnector::new_with_resolver(failing);
        assert_eq!(
            failure(connector, "http://orders.test/").await,
            ProxyErrorKind::Dns
        );
    }

    #[tokio::test]
    async fn a_refused_connection_is_not_dns() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        drop(listener);
        let uri: &'static str = Box::leak(format!("http://{addr}/").into_boxed_str());
        assert_eq!(
            failure(http_connector(), uri).await,
            ProxyErrorKind::ConnectRefused
        );
    }
}
