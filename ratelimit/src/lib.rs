//! Token-bucket (GCRA) rate limiting and calendar quotas as a tower [`Layer`](tower::Layer),
//! with an in-process backend and a Redis backend shared by gateway replicas.
//!
//! Every request the application's extractor describes is checked against all of its
//! policies (tenant or client IP, route, global, daily and monthly quotas…) in **one atomic,
//! all-or-nothing decision**: a rejected request consumes nothing anywhere. Rejections are answered at once with
//! **429** + `Retry-After` and an RFC 9457 problem+json body of the draft's `quota-exceeded`
//! type, whose `violated-policies` names every enforced policy that refused it; admitted
//! responses carry `X-RateLimit-*` and the IETF `RateLimit-Policy` / `RateLimit` fields
//! (draft-ietf-httpapi-ratelimit-headers-10). `RateLimit`'s `t` is the wait for *more*
//! quota (a bucket's next token; on a 429, exactly `Retry-After`), while `X-RateLimit-Reset`
//! is when the bucket is full again ([`headers`]). Nothing is queued.
//!
//! # Where to put this layer
//!
//! *After* tenant resolution, because the extractor needs to know who is calling (an
//! unknown API key must be refused with 401 before it can spend anyone's quota), and after
//! the load shedder, which protects the process itself and must stay the cheapest check.
//! *Before* idempotency, so a rate-limited retry is refused before it takes an idempotency
//! lock (429 is "provably not processed": the client may retry with the same key). The
//! gateway's own order is `gateway/src/stack/mod.rs`.
//!
//! # Example
//!
//! ```
//! use std::{net::IpAddr, sync::Arc, time::Duration};
//! use axum::{routing::get, Router};
//! use portcullis_ratelimit::{LimitKey, LimitRequest, LocalLimiter, Policy, RateLimitLayer};
//!
//! let per_ip = Arc::new(Policy::try_new("ip", 10, Duration::from_secs(1), 20)?);
//! let global = Arc::new(Policy::try_new("global", 50_000, Duration::from_secs(1), 100_000)?);
//! let layer = RateLimitLayer::new(Arc::new(LocalLimiter::new()), move |req: &http::request::Parts| {
//!     let ip = req.extensions.get::<IpAddr>()?; // inserted by an earlier layer; else pass
//!     Some(LimitRequest::new()
//!         .with(LimitKey::ip(*ip), per_ip.clone(), 1)
//!         .with(LimitKey::global(), global.clone(), 1))
//! });
//! let app: Router = Router::new().route("/", get(|| async { "hi" })).layer(layer);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Distributed, with a local fallback sized for 3 replicas while Redis is unreachable:
//!
//! ```
//! # use std::sync::Arc;
//! use portcullis_ratelimit::{FallbackConfig, FallbackLimiter, Limiter, RedisLimiter, RedisLimiterConfig};
//! let redis = RedisLimiter::open("redis://127.0.0.1:6379", RedisLimiterConfig::default())?;
//! let config = FallbackConfig { replicas: 3, ..FallbackConfig::default() };
//! let limiter: Arc<dyn Limiter> = Arc::new(FallbackLimiter::new(Arc::new(redis), config));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Calendar quotas
//!
//! Besides token buckets, a policy can be a daily or monthly request quota on UTC calendar
//! boundaries ([`Policy::calendar`], keyed by [`LimitKey::period`]), checked in the **same**
//! all-or-nothing decision as the buckets:
//!
//! ```
//! use std::{sync::Arc, time::Duration};
//! use portcullis_ratelimit::{LimitKey, LimitRequest, Period, Policy, Principal};
//!
//! let per_second = Arc::new(Policy::try_new("tenant", 100, Duration::from_secs(1), 200)?);
//! let daily = Arc::new(Policy::calendar("daily_quota", 100_000, Period::Day)?);
//! let monthly = Arc::new(Policy::calendar("monthly_quota", 2_000_000, Period::Month)?);
//! let acme = Principal::Tenant("acme");
//! let request = LimitRequest::new()
//!     .with(LimitKey::tenant("acme"), per_second, 1)
//!     .with(LimitKey::period(acme, Period::Day), daily, 1)
//!     .with(LimitKey::period(acme, Period::Month), monthly, 1);
//! # let _ = request;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! In short (the full essay is in [`policy`]):
//!
//! - **fixed windows, on purpose**: a quota is a billing-style allowance stated in calendar
//!   terms ("10 000 a day, resets at 00:00 UTC"), not traffic smoothing, which the buckets
//!   already do on the same request; the window's counter is exactly "used today";
//! - **all-or-nothing with the buckets**: a request refused by a bucket spends no quota, one
//!   refused by the quota spends no tokens, so `used` counts admitted requests only;
//! - **the limiter's clock decides the window** in every backend (Redis keeps buckets on
//!   server time but takes the window from the gateway): replicas disagree on the midnight
//!   instant by their clock skew, which only moves a boundary request into one day or the
//!   other; counters expire when their window ends;
//! - exhausted → 429 naming the quota, `Retry-After` = `t` = seconds to the window's end;
//!   [`Limiter::reset`] and [`Limiter::give_back`] let an operator undo use.
//!
//! # Modules
//!
//! - [`gcra`]: the arithmetic, pure, property-tested; [`decision`]: what it produces;
//! - [`period`]: UTC day/month windows and the fixed-window counter, pure, property-tested;
//! - [`policy`], [`key`]: what is limited and under which (hash-tagged) key;
//! - [`limiter`]: the [`Limiter`] trait, [`LocalLimiter`], [`RedisLimiter`],
//!   [`FallbackLimiter`], and the consumption semantics shared by all;
//! - [`headers`], [`rejection`]: what the client sees;
//! - [`clock`]: injected time; [`metrics`]: the metric names.
//!
//! # Shadow policies
//!
//! A policy built `.with_shadow(true)` is evaluated, counted
//! (`ratelimit_shadow_rejections_total`) and may be the policy reported in the headers, but
//! never rejects. It consumes tokens only when the request is admitted and it would itself
//! have admitted it, so its bucket shows what enforcing it would do to the traffic that
//! really passes; it never drains, nor is drained by, the enforced policies' verdicts.

#![forbid(unsafe_code)]

pub mod clock;
pub mod decision;
pub mod gcra;
pub mod headers;
pub mod key;
pub mod layer;
pub mod limiter;
pub mod metrics;
pub mod outcome;
pub mod period;
pub mod policy;
pub mod rejection;
pub mod service;

pub use crate::clock::{Clock, ManualClock, SystemClock};
pub use crate::decision::{ceil_secs, Decision, Verdict};
pub use crate::key::{LimitKey, Principal};
pub use crate::layer::{Extract, Observe, RateLimitLayer};
pub use crate::limiter::{
    BatchedConfig, BatchedLimiter, Check, FailMode, FallbackConfig, FallbackLimiter, LimitRequest,
    Limiter, LimiterError, LocalLimiter, LocalLimiterConfig, RedisLimiter, RedisLimiterConfig,
};
pub use crate::outcome::RateLimitOutcome;
pub use crate::period::{Period, Window};
pub use crate::policy::{Policy, PolicyError};
pub use crate::rejection::Rejection;
pub use crate::service::RateLimit;
