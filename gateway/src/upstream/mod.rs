//! The upstream side: which endpoint gets an attempt, with health and discovery
//! ([`balance`]), the pooled client that sends one attempt ([`proxy`], with its
//! connector, DNS resolver and error classification), the headers the gateway sends about
//! the client ([`forwarded`]), and the built-in demo upstream ([`demo`]).
//! [`fleet`] shares the adaptive upstreams' learned limits across replicas.

pub(crate) mod balance;
pub mod demo;
pub(crate) mod fleet;
pub mod proxy;
pub(crate) mod websocket;
