//! Request-smuggling defence: a request whose end is ambiguous — `Content-Length` with
//! `Transfer-Encoding`, differing `Content-Length` values, a length that is not a number,
//! `chunked` applied twice — is answered 400 problem+json and its connection closed, before
//! any layer reads its body or any byte of it goes upstream. A `Transfer-Encoding` other than
//! exactly `chunked` is answered 501, a request line naming another HTTP version 505.
//!
//! # Two halves
//!
//! hyper's HTTP/1.1 parser resolves such heads on its own terms before the pipeline sees
//! them: it frames a request carrying both headers by `Transfer-Encoding` and *removes*
//! `Content-Length` (RFC 9112 §6.3), and answers the other cases with a bare, empty 400.
//! Both are safe, but neither tells the client it was refused. So:
//!
//! - [`FramingGuard`] wraps each HTTP/1.x connection and reads every request head before
//!   hyper does (following bodies by their framing to find the next head). A head to refuse
//!   reaches hyper as a small refusal request carrying [`REFUSAL_HEADER`] and
//!   `connection: close`; nothing after it is read.
//! - [`Smuggling`], a step outermost in the pipeline, answers that request with the
//!   refusal's status (400; 431 for too many header lines, 501, 505) in problem+json with
//!   `Connection: close`, and refuses conflicting framing headers that reach it by any
//!   other route.
//!
//! The guard also turns heads hyper cannot parse at all into the same problem+json answer.
//!
//! HTTP/2 carries no framing headers: the h2 library resets a stream (PROTOCOL_ERROR) that
//! sends `transfer-encoding`, differing `content-length` fields, or a body whose length
//! differs from its `content-length` (RFC 9113 §8.1.1, §8.2.2), and the proxy re-frames
//! every body it forwards, so an HTTP/2 request cannot desynchronise an HTTP/1.1 upstream.

mod chunked;
mod guard;
mod head;
mod layer;

pub use guard::FramingGuard;
pub use head::Refusal;
pub use layer::{conflict, Smuggling};

/// Carries a refusal from the connection guard to the pipeline. Never forwarded: the
/// [`Smuggling`] step answers every request that has it.
pub const REFUSAL_HEADER: &str = "x-portcullis-refused";
