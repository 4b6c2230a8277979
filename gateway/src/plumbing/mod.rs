//! What the gateway's layers share, and nothing else: the step scaffold every small layer is
//! written in, bodies that hold a permit until their last byte, who the client is, the request
//! context and the route it carries, the header names only the gateway sets, which worker
//! a thread is, and SIGHUP for the reload tasks. A leaf: it imports none of `edge`, `telemetry`, `upstream` or `pipeline`, so
//! each of those can use it without running back up the layering (docs/architecture.md gives
//! the order; `tests/e2e/repository.rs` holds it).

pub mod client;
pub mod context;
pub(crate) mod hangup;
pub(crate) mod headers;
pub(crate) mod held;
pub mod route;
pub(crate) mod step;
pub(crate) mod worker;
