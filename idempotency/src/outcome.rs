//! The outcome table: what happens to the key once the upstream answered.
//!
//! | response | decision | why |
//! |---|---|---|
//! | carries [`NotForwarded`] | release | the gateway proves the upstream never saw it |
//! | 429, 408 | release | the upstream refused before processing |
//! | 503 **with** `Retry-After` | release | an explicit "not now" (overload, maintenance) |
//! | 500, 502, 504, other 5xx, 503 without `Retry-After` | store | ambiguous: the upstream may have acted; replaying the failure is safe, re-executing is not |
//! | … the same, upstream dedupes on the key | release | a re-execution is deduplicated downstream |
//! | 2xx, 3xx, other 4xx | store | definitive |
//!
//! A pure function of status, headers and the two flags, so it is tested exhaustively
//! without I/O.

use http::{header, HeaderMap, StatusCode};

use crate::extensions::NotForwarded;

/// What to do with the key after the response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Delete the in-flight record: the client may retry with the same key.
    Release,
    /// Complete the record with this response: duplicates get it replayed.
    Store,
}

/// Applies the outcome table.
pub fn classify(
    status: StatusCode,
    headers: &HeaderMap,
    extensions: &http::Extensions,
    upstream_dedupes_keys: bool,
) -> Outcome {
    if extensions.get::<NotForwarded>().is_some() {
        return Outcome::Release;
    }
    match status.as_u16() {
        429 | 408 => Outcome::Release,
        503 if headers.contains_key(header::RETRY_AFTER) => Outcome::Release,
        500..=599 if upstream_dedupes_keys => Outcome::Release,
        _ => Outcome::Store,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(status: u16, retry_after: bool, not_forwarded: bool, dedupes: bool) -> Outcome {
        let mut h = HeaderMap::new();
        if retry_after {
            h.insert(header::RETRY_AFTER, "3".parse().unwrap());
        }
        let mut ext = http::Extensions::new();
        if not_forwarded {
            ext.insert(NotForwarded);
        }
        classify(StatusCode::from_u16(status).unwrap(), &h, &ext, dedupes)
    }

    #[test]
    fn table() {
        use Outcome::*;
        for (status, ra, nf, dedupes, want) in [
            (201, false, false, false, Store),
            (302, false, false, false, Store),
            (400, false, false, false, Store),
            (404, false, false, true, Store),
            (409, false, false, false, Store),
            (422, false, false, false, Store),
            (429, false, false, false, Release),
            (429, true, false, false, Release),
            (408, false, false, false, Release),
            (503, true, false, false, Release),
            (503, false, false, false, Store),
            (503, false, false, true, Release),
            (500, false, false, false, Store),
            (500, true, false, false, Store),
            (500, false, false, true, Release),
            (502, false, false, false, Store),
            (504, false, false, false, Store),
            (504, false, false, true, Release),
            (507, false, false, false, Store),
            (200, false, true, false, Release),
            (502, false, true, false, Release),
            (503, false, true, false, Release),
        ] {
            assert_eq!(
                run(status, ra, nf, dedupes),
                want,
                "{status} ra={ra} nf={nf} d={dedupes}"
            );
        }
    }
}
