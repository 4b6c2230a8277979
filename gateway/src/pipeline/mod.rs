//! The request pipeline, in order: observe (metrics and access log), route match and tenant
//! resolution into the one request context ([`context`]), load shedding, rate limiting and
//! idempotency (the concern crates, wired to the gateway's configuration here), then rescue,
//! which turns every upstream-side error into problem+json before the retry layer and the
//! proxy.
//!
//! The order itself is assembled, with a comment per layer, in [`crate::stack`]. The
//! gateway's own small layers (here and in [`crate::edge`]) are `step::Step`s, made tower layers
//! by the one generic `step::StepLayer`.

pub(crate) mod auth_failures;
pub(crate) mod buffer;
pub(crate) mod concurrency;
pub(crate) mod fair_share;
pub(crate) mod health;
pub mod idempotency;
pub(crate) mod in_flight;
pub mod jwt;
pub mod ratelimit;
pub mod rescue;
pub(crate) mod resolve;
pub mod router;
pub mod shed;
pub mod tenant;
