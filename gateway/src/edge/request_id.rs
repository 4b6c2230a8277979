//! `X-Request-Id`: propagated when the client sent a sane one, generated (UUID v4) otherwise,
//! and echoed on the response so clients and logs can correlate.

use axum::body::Body;
use http::{HeaderValue, Request, Response};

use crate::plumbing::step::{Finish, Step};

/// The header name.
pub(crate) use portcullis_problem::headers::X_REQUEST_ID;

/// Longest client-supplied id we propagate; longer or odd ones are replaced.
const MAX_ID_LEN: usize = 128;

/// Ensures every request and its response carry `X-Request-Id` (a [`Step`]).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RequestId;

/// Echoes the request's id on its response.
pub(crate) struct EchoId(HeaderValue);

impl Step for RequestId {
    type Finish = EchoId;

    fn step(&self, request: &mut Request<Body>) -> Result<EchoId, Response<Body>> {
        let id = match request.headers().get(&X_REQUEST_ID) {
            Some(value) if acceptable(value) => value.clone(),
            _ => {
                let mut buf = uuid::Uuid::encode_buffer();
                let text = uuid::Uuid::new_v4().hyphenated().encode_lower(&mut buf);
                let generated = HeaderValue::from_str(text)
                    .unwrap_or_else(|_| HeaderValue::from_static("invalid"));
                request
                    .headers_mut()
                    .insert(X_REQUEST_ID.clone(), generated.clone());
                generated
            }
        };
        Ok(EchoId(id))
    }
}

impl Finish for EchoId {
    fn finish(self, mut response: Response<Body>) -> Response<Body> {
        response.headers_mut().insert(X_REQUEST_ID.clone(), self.0);
        response
    }
}

fn acceptable(value: &HeaderValue) -> bool {
    let bytes = value.as_bytes();
    !bytes.is_empty() && bytes.len() <= MAX_ID_LEN && bytes.iter().all(|b| b.is_ascii_graphic())
}
