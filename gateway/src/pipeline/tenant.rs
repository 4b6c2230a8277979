//! Tenant resolution: who is calling?
//!
//! - `X-API-Key: …`, or else `Authorization: Bearer …`, names a tenant through the SHA-256 of
//!   the key. A known, active key → [`Caller::Tenant`]; the credential is removed before the
//!   request goes upstream (backends get `X-Portcullis-Tenant` instead, never the key).
//! - A key that is unknown, revoked or belongs to a disabled tenant → 401 problem+json. It is
//!   never treated as anonymous, so a bad key cannot spend someone else's quota.
//! - No key → [`Caller::Anonymous`], limited per client IP ([`ClientIp`]), which honours
//!   `X-Forwarded-For` only from `server.trusted_proxies`.
//!
//! When both headers are present `X-API-Key` wins and `Authorization` is passed through
//! untouched, so backends can keep their own bearer tokens.
//!
//! Tenants come from the control plane's [`Directory`] snapshot (`portcullis-control`); this
//! layer only reads it.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use axum::body::Body;
use http::{header, HeaderName, HeaderValue, Request, Response, StatusCode};
use portcullis_control::{Directory, Tenant};
use portcullis_ratelimit::Rejection;
use sha2::{Digest, Sha256};

use crate::pipeline::step::Step;
use crate::upstream::forwarded::{ClientIp, PeerAddr, TrustedProxies};
use portcullis_problem::Problem;

/// Header carrying an API key.
pub static X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");
/// Header telling backends which tenant called (set by the gateway only).
pub static X_PORTCULLIS_TENANT: HeaderName = HeaderName::from_static("x-portcullis-tenant");

/// The resolved caller, in request extensions from here on.
#[derive(Debug, Clone)]
pub enum Caller {
    /// An authenticated tenant.
    Tenant(Arc<Tenant>),
    /// No API key: limited by client IP.
    Anonymous,
}

/// Resolves [`Caller`] and [`ClientIp`] (a [`Step`]).
#[derive(Debug, Clone)]
pub(crate) struct ResolveTenant {
    directory: Arc<Directory>,
    trusted: Arc<TrustedProxies>,
}

impl ResolveTenant {
    /// Resolves against `directory`.
    pub(crate) fn new(directory: Arc<Directory>, trusted: Arc<TrustedProxies>) -> Self {
        Self { directory, trusted }
    }
}

impl Step for ResolveTenant {
    type Finish = ();

    fn step(&self, request: &mut Request<Body>) -> Result<(), Response<Body>> {
        let peer = request
            .extensions()
            .get::<PeerAddr>()
            .map(|p| p.0.ip())
            .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
        let client_ip = self.trusted.client_ip(peer, request.headers());
        request.extensions_mut().insert(ClientIp(client_ip));
        // Only the gateway says who the tenant is.
        request.headers_mut().remove(&X_PORTCULLIS_TENANT);

        let caller = match presented_key(request.headers()) {
            None => Caller::Anonymous,
            Some((source, key)) => {
                let hash: [u8; 32] = Sha256::digest(key.as_bytes()).into();
                let snapshot = self.directory.snapshot();
                match snapshot.by_key_hash(&hash) {
                    Some(tenant) if !tenant.disabled => {
                        let headers = request.headers_mut();
                        headers.remove(source);
                        if let Ok(value) = HeaderValue::from_str(&tenant.id) {
                            headers.insert(X_PORTCULLIS_TENANT.clone(), value);
                        }
                        Caller::Tenant(tenant.clone())
                    }
                    _ => {
                        metrics::counter!("tenant_auth_failures_total").increment(1);
                        return Err(unauthorized());
                    }
                }
            }
        };
        request.extensions_mut().insert(caller);
        Ok(())
    }
}

/// The rate-limit layer's observer (`RateLimitLayer::with_observer`): counts a 429 the layer
/// answered itself against the resolved tenant, for the admin usage view. Nothing else is a
/// rate-limit rejection — an upstream's own 429 passes through uncounted — and anonymous
/// callers have no per-tenant count.
pub fn count_rate_limited(extensions: &http::Extensions, rejection: &Rejection) {
    if let (Rejection::RateLimited { .. }, Some(Caller::Tenant(tenant))) =
        (rejection, extensions.get::<Caller>())
    {
        tenant.record_rate_limited();
    }
}

/// The circuit breaker's caller key of a request (see `RetryLayer::new`): its tenant, else
/// its client address. An IPv6 client counts by its /64, the block one subscriber usually
/// holds, so one host cannot pose as many callers by rotating addresses; an IPv4-mapped
/// address counts as the IPv4 address.
pub fn caller_key(extensions: &http::Extensions) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    match (extensions.get::<Caller>(), extensions.get::<ClientIp>()) {
        (Some(Caller::Tenant(tenant)), _) => ("tenant", &tenant.id).hash(&mut hasher),
        (_, Some(ClientIp(ip))) => match ip.to_canonical() {
            IpAddr::V4(v4) => ("ip4", v4).hash(&mut hasher),
            IpAddr::V6(v6) => ("ip6/64", &v6.octets()[..8]).hash(&mut hasher),
        },
        // Not resolved (never in the gateway's stack): one shared key.
        _ => "unknown".hash(&mut hasher),
    }
    hasher.finish()
}

/// The API key and the header it came in: `X-API-Key` first, then `Authorization: Bearer`.
fn presented_key(headers: &http::HeaderMap) -> Option<(HeaderName, String)> {
    if let Some(value) = headers.get(&X_API_KEY) {
        return Some((
            X_API_KEY.clone(),
            value.to_str().unwrap_or("\u{0}").trim().to_owned(),
        ));
    }
    let auth = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = auth.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| (header::AUTHORIZATION, token.trim().to_owned()))
}

fn unauthorized() -> Response<Body> {
    let mut response = Problem::new(
        StatusCode::UNAUTHORIZED,
        "invalid-api-key",
        "Invalid API key",
        "the API key is unknown, revoked or disabled; send a valid key in X-API-Key or Authorization: Bearer, or none for anonymous access",
    )
    .into_response();
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"portcullis\""),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_sources_in_order() {
        let mut headers = http::HeaderMap::new();
        assert!(presented_key(&headers).is_none());
        headers.insert(header::AUTHORIZATION, "Bearer abc".parse().unwrap());
        assert_eq!(presented_key(&headers).unwrap().1, "abc");
        headers.insert(&X_API_KEY, "xyz".parse().unwrap());
        let (source, key) = presented_key(&headers).unwrap();
        assert_eq!((source, key.as_str()), (X_API_KEY.clone(), "xyz"));
        let mut basic = http::HeaderMap::new();
        basic.insert(header::AUTHORIZATION, "Basic Zm9v".parse().unwrap());
        assert!(
            presented_key(&basic).is_none(),
            "non-bearer Authorization is the backend's business"
        );
    }

    #[test]
    fn caller_keys_tell_tenants_and_addresses_apart() {
        let ip = |s: &str| {
            let mut ext = http::Extensions::new();
            ext.insert(Caller::Anonymous);
            ext.insert(ClientIp(s.parse().unwrap()));
            caller_key(&ext)
        };
        assert_eq!(ip("192.0.2.1"), ip("192.0.2.1"));
        assert_ne!(ip("192.0.2.1"), ip("192.0.2.2"));
        assert_eq!(ip("192.0.2.1"), ip("::ffff:192.0.2.1"), "mapped IPv4");
        assert_eq!(
            ip("2001:db8:1:2::1"),
            ip("2001:db8:1:2:ffff::9"),
            "same /64"
        );
        assert_ne!(ip("2001:db8:1:2::1"), ip("2001:db8:1:3::1"));
        assert_ne!(ip("0.0.0.0"), caller_key(&http::Extensions::new()));
    }

    /// Only the rate-limit layer's own 429s count against a tenant: an upstream answering 429
    /// (its own limit, passed through) is not a gateway rejection. Before the count moved to
    /// the layer's observer, resolution counted every 429 status, this one included.
    #[tokio::test]
    async fn upstream_429s_are_not_counted_as_rate_limit_rejections() {
        use std::convert::Infallible;
        use std::time::Duration;

        use crate::pipeline::step::StepLayer;
        use portcullis_control::{Database, TenantSeed};
        use portcullis_ratelimit::{LimitKey, LimitRequest, LocalLimiter, RateLimitLayer};
        use tower::{ServiceBuilder, ServiceExt};

        let dir = tempfile::tempdir().unwrap();
        let db = Database::sqlite(&dir.path().join("t.db")).await.unwrap();
        let seed = TenantSeed {
            id: "acme",
            api_keys: vec!["acme-secret-key"],
            rate: 1,
            per: Duration::from_secs(3600),
            burst: 1,
            daily_quota: None,
            monthly_quota: None,
        };
        db.upsert_tenants(&[seed]).await.unwrap();
        let directory = Arc::new(Directory::open(&db).await.unwrap());
        let tenant_policy = |parts: &http::request::Parts| {
            let Some(Caller::Tenant(tenant)) = parts.extensions.get::<Caller>() else {
                return None;
            };
            let mut request = LimitRequest::new();
            request.push(LimitKey::tenant(&tenant.id), tenant.policy.clone()?, 1);
            Some(request)
        };
        let upstream_429 = tower::service_fn(|_: Request<Body>| async {
            let mut response = Response::new(Body::from("slow down (upstream)"));
            *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            Ok::<_, Infallible>(response)
        });
        let service = ServiceBuilder::new()
            .layer(StepLayer::new(ResolveTenant::new(
                directory.clone(),
                Arc::new(TrustedProxies::new(Vec::new())),
            )))
            .layer(
                RateLimitLayer::new(Arc::new(LocalLimiter::new()), tenant_policy)
                    .with_observer(count_rate_limited),
            )
            .service(upstream_429);
        let keyed = || {
            Request::builder()
                .uri("/")
                .header(&X_API_KEY, "acme-secret-key")
                .body(Body::empty())
                .unwrap()
        };
        let counted = || {
            let snapshot = directory.snapshot();
            snapshot.by_id("acme").unwrap().rate_limited_total()
        };

        // Admitted by the limiter (burst 1); the upstream itself answers 429.
        let first = service.clone().oneshot(keyed()).await.unwrap();
        assert_eq!(first.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(!first.headers().contains_key(header::RETRY_AFTER));
        assert_eq!(
            counted(),
            0,
            "an upstream 429 is not a rate-limit rejection"
        );

        // The bucket is empty now: the layer answers 429 itself, and that one counts.
        let second = service.clone().oneshot(keyed()).await.unwrap();
        assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(second.headers().contains_key(header::RETRY_AFTER));
        assert_eq!(counted(), 1);
    }

    proptest::proptest! {
        #[test]
        fn key_extraction_never_panics(auth in proptest::collection::vec(proptest::num::u8::ANY, 0..80),
                                       api in proptest::collection::vec(proptest::num::u8::ANY, 0..80)) {
            let mut headers = http::HeaderMap::new();
            if let Ok(v) = HeaderValue::from_bytes(&auth) { headers.insert(header::AUTHORIZATION, v); }
            let _ = presented_key(&headers);
            if let Ok(v) = HeaderValue::from_bytes(&api) { headers.insert(&X_API_KEY, v); }
            let _ = presented_key(&headers);
        }
    }
}
