//! The request layers that know the route: health routes, resolution of the route and the
//! caller into the one request context (`resolve`, `router`, `tenant`, `jwt`), protection
//! (`shed`, `fair_share`, `concurrency`, `auth_failures`, `buffer`), the rate-limit and
//! idempotency wiring of the concern crates, and `rescue`, which turns upstream-side errors
//! into problem+json. Their order is assembled, with a comment per layer, in
//! [`crate::stack`].

pub(crate) mod auth_failures;
pub(crate) mod buffer;
pub(crate) mod concurrency;
pub(crate) mod cors;
pub(crate) mod deliveries;
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
pub(crate) mod signature;
pub mod tenant;
pub(crate) mod websocket;
