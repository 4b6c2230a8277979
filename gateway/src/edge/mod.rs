//! The edge: everything between a client's socket and the first request layer that knows a
//! route. Nothing a client sends reaches the pipeline before passing through here.
//!
//! - [`listener`]: accepts connections (at most `server.max_connections`), serves exactly the
//!   protocol TLS negotiated (or h2c prior knowledge), and bounds every silent phase with a
//!   per-connection watchdog (handshake, first request, partial heads, keep-alive idleness,
//!   clients that stop reading);
//! - [`framing`]: the framing guard that reads every HTTP/1.x head before hyper and refuses
//!   ambiguous framing (request smuggling), plus lingering close for early answers;
//! - request layers that need no route: `grpc` (the gateway's own answers to a gRPC call
//!   as `grpc-status`), `hop_by_hop` (the client's hop-by-hop fields), `request_id`,
//!   `limits` (413/431, body deadline via `body_timeout`) and `target` (path
//!   normalisation, Host rules), and `upgrade` (which requests are WebSocket handshakes).
//!   Their place in the request path: `crate::stack`.

pub(crate) mod body_timeout;
pub mod framing;
pub(crate) mod grpc;
pub(crate) mod hop_by_hop;
pub(crate) mod limits;
pub mod listener;
pub(crate) mod request_id;
pub(crate) mod target;
pub(crate) mod upgrade;
