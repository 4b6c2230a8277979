//! Why a request head is refused: the stable code, status and client text of each refusal.

use http::StatusCode;

/// Why a head was refused. Each has a stable code carried from the connection to the
/// request pipeline (see [`super::super::REFUSAL_HEADER`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `Content-Length` together with `Transfer-Encoding`.
    LengthWithTransferEncoding,
    /// Two `Content-Length` values that differ.
    ConflictingLengths,
    /// A `Content-Length` that is not a decimal number.
    InvalidLength,
    /// `Transfer-Encoding` other than exactly `chunked` (`gzip, chunked`, `identity`, …):
    /// the gateway decodes no other coding, so it cannot forward the body faithfully.
    UnsupportedTransferEncoding,
    /// `chunked` applied more than once (RFC 9112 §6.1 forbids it).
    RepeatedChunked,
    /// `Transfer-Encoding` on an HTTP/1.0 request, which cannot carry it.
    TransferEncodingInHttp10,
    /// More header lines than the gateway reads.
    TooManyHeaders,
    /// Not an HTTP/1.x request head at all.
    MalformedHead,
    /// A request line naming another HTTP version (`HTTP/2.0` as text, `HTTP/1.2`).
    UnsupportedVersion,
}

// === impl Refusal ===

impl Refusal {
    const ALL: [Refusal; 9] = [
        Refusal::LengthWithTransferEncoding,
        Refusal::ConflictingLengths,
        Refusal::InvalidLength,
        Refusal::UnsupportedTransferEncoding,
        Refusal::RepeatedChunked,
        Refusal::TransferEncodingInHttp10,
        Refusal::TooManyHeaders,
        Refusal::MalformedHead,
        Refusal::UnsupportedVersion,
    ];

    /// The stable code.
    pub fn code(self) -> &'static str {
        match self {
            Refusal::LengthWithTransferEncoding => "content-length-with-transfer-encoding",
            Refusal::ConflictingLengths => "conflicting-content-length",
            Refusal::InvalidLength => "invalid-content-length",
            Refusal::UnsupportedTransferEncoding => "unsupported-transfer-encoding",
            Refusal::RepeatedChunked => "repeated-chunked",
            Refusal::TransferEncodingInHttp10 => "transfer-encoding-in-http-1.0",
            Refusal::TooManyHeaders => "too-many-headers",
            Refusal::MalformedHead => "malformed-request-head",
            Refusal::UnsupportedVersion => "unsupported-http-version",
        }
    }

    /// The refusal a code names.
    pub fn from_code(code: &[u8]) -> Option<Refusal> {
        Self::ALL.into_iter().find(|r| r.code().as_bytes() == code)
    }

    /// 431 for too many header lines, 501 for a transfer coding the gateway does not
    /// implement, 505 for another HTTP version, 400 for everything else (as nginx answers).
    pub fn status(self) -> StatusCode {
        match self {
            Refusal::TooManyHeaders => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Refusal::UnsupportedTransferEncoding => StatusCode::NOT_IMPLEMENTED,
            Refusal::UnsupportedVersion => StatusCode::HTTP_VERSION_NOT_SUPPORTED,
            _ => StatusCode::BAD_REQUEST,
        }
    }

    /// Does this refusal concern message framing (a smuggling vector)?
    pub fn is_framing(self) -> bool {
        !matches!(
            self,
            Refusal::TooManyHeaders | Refusal::MalformedHead | Refusal::UnsupportedVersion
        )
    }

    /// What the client is told.
    pub fn detail(self) -> &'static str {
        match self {
            Refusal::LengthWithTransferEncoding => {
                "the request carried both Content-Length and Transfer-Encoding, so its end is ambiguous"
            }
            Refusal::ConflictingLengths => {
                "the request carried Content-Length values that differ, so its end is ambiguous"
            }
            Refusal::InvalidLength => "the request's Content-Length is not a decimal number",
            Refusal::UnsupportedTransferEncoding => {
                "the gateway accepts no Transfer-Encoding other than exactly chunked"
            }
            Refusal::RepeatedChunked => {
                "the request's Transfer-Encoding applies chunked more than once, so its end is ambiguous"
            }
            Refusal::TransferEncodingInHttp10 => {
                "an HTTP/1.0 request cannot use Transfer-Encoding"
            }
            Refusal::TooManyHeaders => "the request has more than 100 header lines",
            Refusal::MalformedHead => "the request head is not valid HTTP/1.1",
            Refusal::UnsupportedVersion => {
                "the request line names an HTTP version other than HTTP/1.0 or HTTP/1.1; HTTP/2 needs TLS with ALPN h2, or prior knowledge where h2c is enabled"
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        for refusal in Refusal::ALL {
            assert_eq!(Refusal::from_code(refusal.code().as_bytes()), Some(refusal));
        }
        assert_eq!(Refusal::from_code(b"nonsense"), None);
    }
}
