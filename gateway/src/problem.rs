//! RFC 9457 problem details: every error the gateway itself generates leaves through the one
//! [`Problem`] type that all Portcullis crates share (`portcullis-problem`).

pub use portcullis_problem::{retry_after_secs, Problem, CONTENT_TYPE, TYPE_BASE};
