//! Inbound signature verification (`verify = { … }` on a route; docs/async-delivery.md,
//! "Signatures"): the raw body is read whole (bounded by `server.max_body_bytes` and
//! `server.body_read_timeout`, which the edge's limits enforce on the body) and its HMAC-SHA256
//! compared in constant time with the one the sender put in the request. A missing, forged,
//! malformed or stale signature is a 401 problem; the request goes no further (no rate-limit
//! token spent, nothing forwarded or queued). Routes without `verify` pass straight through,
//! unbuffered. A file tenant with its own secret for the route (`tenants[].signature_secrets`)
//! is checked with that secret instead of the route's.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use base64::Engine;
use futures_util::future::{BoxFuture, Either};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::BodyExt;
use portcullis_problem::clock::WallClock;
use portcullis_problem::Problem;
use ring::hmac;
use subtle::ConstantTimeEq;
use tower::{Layer, Service};

use crate::config::{SignatureScheme, SigningKey, VerifySettings};
use crate::pipeline::rescue::request_body_problem;
use crate::plumbing::context::{Caller, RequestContext};

/// Standard Webhooks' message id header.
const WEBHOOK_ID: &str = "webhook-id";
/// Standard Webhooks' timestamp header.
const WEBHOOK_TIMESTAMP: &str = "webhook-timestamp";

/// Why a request's signature was refused (the problem's `detail`; never the secret, never
/// the signature itself).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SignatureError {
    /// A header the scheme needs is absent (or given twice).
    #[error("the {0} header is missing or given more than once")]
    Missing(String),
    /// The header does not have the scheme's form.
    #[error("the {0} header is malformed")]
    Malformed(String),
    /// The signed timestamp is farther from the gateway's clock than the tolerance.
    #[error("the signed timestamp is outside the tolerance of {0} s")]
    Stale(u64),
    /// No signature given matches the body.
    #[error("no signature matches the request")]
    Mismatch,
}

/// Checks signatures on routes with `verify`, against the wall clock for timestamps.
#[derive(Clone)]
pub(crate) struct SignatureLayer {
    clock: Arc<dyn WallClock>,
}

impl SignatureLayer {
    /// Signed timestamps are compared with `clock`.
    pub(crate) fn new(clock: Arc<dyn WallClock>) -> Self {
        Self { clock }
    }
}

/// The service of [`SignatureLayer`].
#[derive(Clone)]
pub(crate) struct Signature<S> {
    inner: S,
    clock: Arc<dyn WallClock>,
}

impl<S> Layer<S> for SignatureLayer {
    type Service = Signature<S>;
    fn layer(&self, inner: S) -> Signature<S> {
        Signature {
            inner,
            clock: self.clock.clone(),
        }
    }
}

impl<S> Service<Request<Body>> for Signature<S>
where
    S: Service<Request<Body>, Response = Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = Either<S::Future, BoxFuture<'static, Result<Response<Body>, S::Error>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let Some(settings) = RequestContext::of(request.extensions())
            .and_then(|context| context.route.settings.verify.clone())
        else {
            return Either::Left(self.inner.call(request));
        };
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let clock = self.clock.clone();
        Either::Right(Box::pin(async move {
            let (parts, body) = request.into_parts();
            let body = match body.collect().await {
                Ok(collected) => collected.to_bytes(),
                Err(err) => return Ok(request_body_problem(&err).closing().into_response()),
            };
            // A file tenant with its own secret for this route is checked with it alone.
            let tenant =
                RequestContext::of(&parts.extensions).and_then(|context| match &context.caller {
                    Caller::Tenant(tenant) => Some(tenant.id.clone()),
                    Caller::Anonymous => None,
                });
            let key = settings.key_for(tenant.as_deref());
            let now = unix_seconds(clock.now());
            if let Err(err) = check_with(&settings, key, &parts.headers, &body, now) {
                let route = RequestContext::of(&parts.extensions)
                    .map_or("", |context| context.route.metrics.label());
                tracing::info!(
                    route,
                    scheme = settings.scheme.as_str(),
                    reason = %err,
                    "request signature refused"
                );
                return Ok(refused(&err));
            }
            inner
                .call(Request::from_parts(parts, Body::from(body)))
                .await
        }))
    }
}

/// The 401 for a refused signature.
fn refused(err: &SignatureError) -> Response<Body> {
    Problem::new(
        StatusCode::UNAUTHORIZED,
        "signature-invalid",
        "Request signature not valid",
        err.to_string(),
    )
    .into_response()
}

/// Seconds since the Unix epoch at `now`.
fn unix_seconds(now: SystemTime) -> i64 {
    now.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// Checks `body` and `headers` against the route's scheme and key at `now` (Unix seconds).
#[cfg(test)]
pub(crate) fn check(
    settings: &VerifySettings,
    headers: &HeaderMap,
    body: &[u8],
    now: i64,
) -> Result<(), SignatureError> {
    check_with(settings, &settings.key, headers, body, now)
}

/// [`check`] with `key`: the route's, or the caller's own (`VerifySettings::key_for`).
pub(crate) fn check_with(
    settings: &VerifySettings,
    key: &SigningKey,
    headers: &HeaderMap,
    body: &[u8],
    now: i64,
) -> Result<(), SignatureError> {
    let key = hmac::Key::new(hmac::HMAC_SHA256, key.expose());
    let header = settings.header.as_str();
    let value = one(headers, header)?;
    match settings.scheme {
        SignatureScheme::HmacSha256 => {
            let hex_sig = value
                .strip_prefix("sha256=")
                .ok_or_else(|| SignatureError::Malformed(header.to_owned()))?;
            let given =
                hex::decode(hex_sig).map_err(|_| SignatureError::Malformed(header.to_owned()))?;
            matches(&hmac::sign(&key, body), [given])
        }
        SignatureScheme::Stripe => {
            let mut t = None;
            let mut given = Vec::new();
            for item in value.split(',') {
                match item.trim().split_once('=') {
                    Some(("t", v)) => t = Some(v),
                    Some(("v1", v)) => given.push(
                        hex::decode(v).map_err(|_| SignatureError::Malformed(header.to_owned()))?,
                    ),
                    _ => {}
                }
            }
            let t = t.ok_or_else(|| SignatureError::Malformed(header.to_owned()))?;
            fresh(t, settings.tolerance, now, header)?;
            if given.is_empty() {
                return Err(SignatureError::Malformed(header.to_owned()));
            }
            let mut ctx = hmac::Context::with_key(&key);
            ctx.update(t.as_bytes());
            ctx.update(b".");
            ctx.update(body);
            matches(&ctx.sign(), given)
        }
        SignatureScheme::StandardWebhooks => {
            let id = one(headers, WEBHOOK_ID)?;
            let ts = one(headers, WEBHOOK_TIMESTAMP)?;
            fresh(ts, settings.tolerance, now, WEBHOOK_TIMESTAMP)?;
            let given: Vec<Vec<u8>> = value
                .split_ascii_whitespace()
                .filter_map(|sig| sig.strip_prefix("v1,"))
                .filter_map(|b64| base64::engine::general_purpose::STANDARD.decode(b64).ok())
                .collect();
            if given.is_empty() {
                return Err(SignatureError::Malformed(header.to_owned()));
            }
            let mut ctx = hmac::Context::with_key(&key);
            ctx.update(id.as_bytes());
            ctx.update(b".");
            ctx.update(ts.as_bytes());
            ctx.update(b".");
            ctx.update(body);
            matches(&ctx.sign(), given)
        }
    }
}

/// The single value of `name`, as text.
fn one<'a>(headers: &'a HeaderMap, name: &str) -> Result<&'a str, SignatureError> {
    let mut values = headers.get_all(name).iter();
    match (values.next(), values.next()) {
        (Some(value), None) => value
            .to_str()
            .map_err(|_| SignatureError::Malformed(name.to_owned())),
        _ => Err(SignatureError::Missing(name.to_owned())),
    }
}

/// The signed Unix timestamp `t` is within `tolerance` of `now`.
fn fresh(t: &str, tolerance: Duration, now: i64, header: &str) -> Result<(), SignatureError> {
    let t: i64 = t
        .trim()
        .parse()
        .map_err(|_| SignatureError::Malformed(header.to_owned()))?;
    let tolerance = tolerance.as_secs();
    if now.abs_diff(t) > tolerance {
        return Err(SignatureError::Stale(tolerance));
    }
    Ok(())
}

/// Some signature in `given` equals `expected`, each compared in constant time (every
/// candidate is compared, so the time does not tell which one matched).
fn matches(
    expected: &hmac::Tag,
    given: impl IntoIterator<Item = Vec<u8>>,
) -> Result<(), SignatureError> {
    let expected = expected.as_ref();
    let mut found = subtle::Choice::from(0);
    for candidate in given {
        found |= expected.ct_eq(&candidate);
    }
    if bool::from(found) {
        Ok(())
    } else {
        Err(SignatureError::Mismatch)
    }
}

/// Test helpers: signatures as senders compute them.
#[cfg(test)]
mod sign {
    use super::*;

    /// `t=<t>,v1=<hex>` over `"{t}.{body}"`.
    pub(super) fn stripe(secret: &[u8], t: i64, body: &[u8]) -> String {
        let key = hmac::Key::new(hmac::HMAC_SHA256, secret);
        let mut message = format!("{t}.").into_bytes();
        message.extend_from_slice(body);
        format!("t={t},v1={}", hex::encode(hmac::sign(&key, &message)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use std::collections::HashMap;

    const NOW: i64 = 1_700_000_000;

    fn settings(verify: &str, secret: &str) -> std::sync::Arc<VerifySettings> {
        let text = format!(
            "[[upstreams]]\nname = \"u\"\nendpoints = [\"http://127.0.0.1:9\"]\n\
             [[routes]]\nprefix = \"/\"\nupstream = \"u\"\nverify = {{ {verify}, secret_env = \"S\" }}\n"
        );
        let env = HashMap::from([("S".to_owned(), secret.to_owned())]);
        let config = Config::parse(&text, &env).unwrap();
        config.routes[0].verify.clone().unwrap()
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        map
    }

    /// GitHub's documented example: secret "It's a Secret to Everybody", body
    /// "Hello, World!".
    #[test]
    fn hub_signature_matches_the_published_example() {
        let s = settings("scheme = \"hmac-sha256\"", "It's a Secret to Everybody");
        let sig = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
        let h = headers(&[("x-hub-signature-256", sig)]);
        assert_eq!(check(&s, &h, b"Hello, World!", NOW), Ok(()));
        assert_eq!(
            check(&s, &h, b"Hello, World?", NOW),
            Err(SignatureError::Mismatch)
        );
        assert!(matches!(
            check(&s, &HeaderMap::new(), b"Hello, World!", NOW),
            Err(SignatureError::Missing(_))
        ));
        let twice = headers(&[("x-hub-signature-256", sig), ("x-hub-signature-256", sig)]);
        assert!(check(&s, &twice, b"Hello, World!", NOW).is_err());
        let h = headers(&[("x-hub-signature-256", "sha1=00")]);
        assert!(matches!(
            check(&s, &h, b"x", NOW),
            Err(SignatureError::Malformed(_))
        ));
    }

    #[test]
    fn stripe_checks_any_v1_and_the_timestamp() {
        let s = settings("scheme = \"stripe\"", "whsec_test");
        let body = br#"{"id":"evt_1"}"#;
        let good = sign::stripe(b"whsec_test", NOW, body);
        let h = headers(&[("stripe-signature", &good)]);
        assert_eq!(check(&s, &h, body, NOW + 299), Ok(()));
        assert_eq!(
            check(&s, &h, body, NOW + 301),
            Err(SignatureError::Stale(300))
        );
        // A rolled secret: one of several v1 values matches.
        let v1 = good.split_once(",v1=").unwrap().1;
        let both = format!("t={NOW},v1={},v1={v1}", "ab".repeat(32));
        let h = headers(&[("stripe-signature", &both)]);
        assert_eq!(check(&s, &h, body, NOW), Ok(()));
        let forged = sign::stripe(b"other", NOW, body);
        let h = headers(&[("stripe-signature", &forged)]);
        assert_eq!(check(&s, &h, body, NOW), Err(SignatureError::Mismatch));
    }

    /// The Standard Webhooks specification's example.
    #[test]
    fn standard_webhooks_matches_the_specification_example() {
        let s = settings(
            "scheme = \"standard-webhooks\"",
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        );
        let body = br#"{"test": 2432232314}"#;
        let ts = 1_614_265_330;
        let h = headers(&[
            ("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek"),
            ("webhook-timestamp", "1614265330"),
            (
                "webhook-signature",
                "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
            ),
        ]);
        assert_eq!(check(&s, &h, body, ts), Ok(()));
        assert_eq!(
            check(&s, &h, body, ts + 600),
            Err(SignatureError::Stale(300))
        );
        assert_eq!(check(&s, &h, b"{}", ts), Err(SignatureError::Mismatch));
    }
}
