//! Reading one HTTP/1.x request head the way hyper will read it, to learn where its body
//! ends — or why the head must be refused before hyper sees it.
//!
//! The rules mirror hyper 1.x's server parser (same `httparse` configuration, same
//! Content-Length and Transfer-Encoding reading) so that a head accepted here is framed
//! exactly as hyper frames it. Where hyper would quietly repair an ambiguous head (both
//! framing headers: it drops Content-Length) or answer a bare 400, this refuses, so the
//! client gets a problem+json answer instead.

use std::mem::MaybeUninit;

mod refusal;

pub use self::refusal::Refusal;

/// hyper's default limit on header lines; a head with more is refused with 431.
const MAX_HEADERS: usize = 100;

/// How the body after a head is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFraming {
    /// No body: the next byte starts the next request.
    Empty,
    /// Exactly this many bytes.
    Length(u64),
    /// Chunked transfer coding.
    Chunked,
}

/// What one request head says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadVerdict {
    /// More bytes are needed.
    Incomplete,
    /// The head is `len` bytes long and its body is framed as `body`; `upgrade`: hyper
    /// will offer the request a protocol switch (CONNECT, or HTTP/1.1 with `Upgrade`).
    Complete {
        len: usize,
        body: BodyFraming,
        upgrade: bool,
    },
    /// The head must not be served.
    Refused(Refusal),
}

/// Reads the request head at the start of `bytes` (leading empty lines are skipped, as
/// hyper does).
pub fn inspect(bytes: &[u8]) -> HeadVerdict {
    let mut slots = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut []);
    let len = match httparse::ParserConfig::default().parse_request_with_uninit_headers(
        &mut request,
        bytes,
        &mut slots,
    ) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return HeadVerdict::Incomplete,
        Err(httparse::Error::TooManyHeaders) => {
            return HeadVerdict::Refused(Refusal::TooManyHeaders)
        }
        Err(httparse::Error::Version) => return HeadVerdict::Refused(Refusal::UnsupportedVersion),
        Err(_) => return HeadVerdict::Refused(Refusal::MalformedHead),
    };
    match framing(&request) {
        Ok(body) => HeadVerdict::Complete {
            len,
            body,
            upgrade: asks_to_switch(&request),
        },
        Err(refusal) => HeadVerdict::Refused(refusal),
    }
}

/// Whether hyper's server parser marks this request as one that may switch protocols
/// (its `wants_upgrade`), exactly as it decides: an `Upgrade` field, whatever its value,
/// makes it HTTP/1.1 or not; without one, the method CONNECT.
fn asks_to_switch(request: &httparse::Request<'_, '_>) -> bool {
    let has_upgrade = request
        .headers
        .iter()
        .any(|h| h.name.eq_ignore_ascii_case("upgrade"));
    if has_upgrade {
        request.version == Some(1)
    } else {
        request.method == Some("CONNECT")
    }
}

/// The body framing a parsed head declares, by RFC 9112 §6 — refusing every ambiguity
/// instead of resolving it.
fn framing(request: &httparse::Request<'_, '_>) -> Result<BodyFraming, Refusal> {
    let http11 = request.version == Some(1);
    let mut length: Option<u64> = None;
    let mut lengths_conflict = false;
    let mut length_invalid = false;
    let mut transfer_encoding = false;
    // Codings across every Transfer-Encoding line, in order (RFC 9110 §5.3: lines combine).
    let mut chunked_count = 0usize;
    let mut other_coding = false;
    for header in request.headers.iter() {
        if header.name.eq_ignore_ascii_case("transfer-encoding") {
            if !http11 {
                return Err(Refusal::TransferEncodingInHttp10);
            }
            transfer_encoding = true;
            for coding in codings(header.value) {
                match coding {
                    Some(c) if c.eq_ignore_ascii_case(b"chunked") => chunked_count += 1,
                    // Any other coding; also an empty element (`chunked,`), which hyper
                    // refuses with a bare 400 — refused here so the answer is problem+json.
                    _ => other_coding = true,
                }
            }
        } else if header.name.eq_ignore_ascii_case("content-length") {
            // hyper's server takes one number per line, so a list ("5, 5") is refused even
            // when its elements agree; a list that disagrees is named as the conflict it is.
            let mut elements = header.value.split(|b| *b == b',').peekable();
            let mut is_list = false;
            while let Some(element) = elements.next() {
                is_list |= elements.peek().is_some();
                match decimal(element.trim_ascii()) {
                    None => length_invalid = true,
                    Some(n) if length.is_some_and(|seen| seen != n) => lengths_conflict = true,
                    Some(n) => length = Some(n),
                }
            }
            length_invalid |= is_list;
        }
    }
    let has_length = length.is_some() || length_invalid;
    if transfer_encoding && has_length {
        return Err(Refusal::LengthWithTransferEncoding);
    }
    if lengths_conflict {
        return Err(Refusal::ConflictingLengths);
    }
    if length_invalid {
        return Err(Refusal::InvalidLength);
    }
    if chunked_count > 1 {
        return Err(Refusal::RepeatedChunked);
    }
    // Exactly `chunked`, as nginx requires (it answers 501 for anything else): the gateway
    // implements no other coding, and forwarding `gzip, chunked` as a plain body would
    // hand the backend bytes it cannot read.
    if transfer_encoding && (other_coding || chunked_count == 0) {
        return Err(Refusal::UnsupportedTransferEncoding);
    }
    let chunked = chunked_count == 1;
    // CONNECT and `Upgrade` heads are framed like any other; the guard then waits for
    // their answer before reading on (`FramingGuard`).
    Ok(if chunked {
        BodyFraming::Chunked
    } else {
        match length {
            Some(0) | None => BodyFraming::Empty,
            Some(n) => BodyFraming::Length(n),
        }
    })
}

/// The codings of one Transfer-Encoding line, trimmed; `None` for the whole line when it is
/// not visible ASCII (hyper would not read it as `chunked` either).
fn codings(value: &[u8]) -> impl Iterator<Item = Option<&[u8]>> {
    let visible = value
        .iter()
        .all(|&b| b == b'\t' || (0x20..0x7f).contains(&b));
    let mut parts = value.split(|b| *b == b',').map(|c| Some(c.trim_ascii()));
    let mut invalid = (!visible).then_some(None);
    std::iter::from_fn(move || match invalid.take() {
        Some(none) => Some(none),
        None if visible => parts.next(),
        None => None,
    })
}

/// Digits only (no sign, no spaces inside), at most hyper's largest body length.
fn decimal(digits: &[u8]) -> Option<u64> {
    const MAX_BODY_LENGTH: u64 = u64::MAX - 2;
    if digits.is_empty() {
        return None;
    }
    digits
        .iter()
        .try_fold(0u64, |n, b| {
            if b.is_ascii_digit() {
                n.checked_mul(10)?.checked_add(u64::from(b - b'0'))
            } else {
                None
            }
        })
        .filter(|n| *n <= MAX_BODY_LENGTH)
}

#[cfg(test)]
mod tests {
    use http::StatusCode;

    use super::*;

    fn verdict(head: &str) -> HeadVerdict {
        inspect(head.as_bytes())
    }

    fn body(head: &str) -> BodyFraming {
        match verdict(head) {
            HeadVerdict::Complete { len, body, .. } => {
                assert_eq!(len, head.len());
                body
            }
            other => panic!("{head:?}: {other:?}"),
        }
    }

    #[test]
    fn ordinary_heads_are_framed_like_hyper_frames_them() {
        assert_eq!(
            body("GET / HTTP/1.1\r\nHost: a\r\n\r\n"),
            BodyFraming::Empty
        );
        assert_eq!(
            body("POST / HTTP/1.1\r\nContent-Length: 12\r\n\r\n"),
            BodyFraming::Length(12)
        );
        assert_eq!(
            body("POST / HTTP/1.1\r\ncontent-length: 5\r\nContent-Length: 5\r\n\r\n"),
            BodyFraming::Length(5)
        );
        assert_eq!(
            body("POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n"),
            BodyFraming::Empty
        );
        assert_eq!(
            body("POST / HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n"),
            BodyFraming::Chunked
        );
        assert_eq!(
            body("CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n"),
            BodyFraming::Empty
        );
        assert_eq!(
            body("GET / HTTP/1.1\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n"),
            BodyFraming::Empty
        );
        // Bare LF line endings and leading empty lines, as httparse (and so hyper) allows.
        assert_eq!(
            body("\r\nPOST / HTTP/1.0\nContent-Length: 3\n\n"),
            BodyFraming::Length(3)
        );
    }

    #[test]
    fn partial_heads_wait_for_more() {
        assert_eq!(verdict(""), HeadVerdict::Incomplete);
        assert_eq!(
            verdict("POST / HTTP/1.1\r\nContent-Le"),
            HeadVerdict::Incomplete
        );
        assert_eq!(
            verdict("POST / HTTP/1.1\r\nContent-Length: 5\r\n"),
            HeadVerdict::Incomplete
        );
    }

    #[test]
    fn every_framing_ambiguity_is_refused_by_name() {
        let refused = |head: &str| match verdict(head) {
            HeadVerdict::Refused(refusal) => refusal,
            other => panic!("{head:?}: {other:?}"),
        };
        for head in [
            "POST / HTTP/1.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: x\r\n\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length:\r\n\r\n",
        ] {
            assert_eq!(
                refused(head),
                Refusal::LengthWithTransferEncoding,
                "{head:?}"
            );
        }
        assert_eq!(
            refused("POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n"),
            Refusal::ConflictingLengths
        );
        assert_eq!(
            refused("POST / HTTP/1.1\r\nContent-Length: 5, 6\r\n\r\n"),
            Refusal::ConflictingLengths
        );
        for length in [
            "+5",
            "5 5",
            "0x5",
            "",
            "5,",
            "5, 5",
            "99999999999999999999",
            "18446744073709551614",
        ] {
            let head = format!("POST / HTTP/1.1\r\nContent-Length: {length}\r\n\r\n");
            assert_eq!(refused(&head), Refusal::InvalidLength, "{head:?}");
        }
        for te in [
            "chunked, gzip",
            "gzip, chunked",
            "identity",
            "gzip",
            "chunked;q=1",
            "",
        ] {
            let head = format!("POST / HTTP/1.1\r\nTransfer-Encoding: {te}\r\n\r\n");
            assert_eq!(
                refused(&head),
                Refusal::UnsupportedTransferEncoding,
                "{head:?}"
            );
            assert_eq!(
                Refusal::UnsupportedTransferEncoding.status(),
                StatusCode::NOT_IMPLEMENTED
            );
        }
        for te in [
            "chunked, chunked",
            "chunked,chunked",
            "chunked\r\nTransfer-Encoding: chunked",
        ] {
            let head = format!("POST / HTTP/1.1\r\nTransfer-Encoding: {te}\r\n\r\n");
            assert_eq!(refused(&head), Refusal::RepeatedChunked, "{head:?}");
        }
        for line in [
            "PRI * HTTP/2.0",
            "GET / HTTP/2.0",
            "GET / HTTP/1.2",
            "GET / HTTP/3",
        ] {
            let head = format!("{line}\r\nHost: a\r\n\r\n");
            assert_eq!(refused(&head), Refusal::UnsupportedVersion, "{head:?}");
        }
        assert_eq!(
            inspect(b"POST / HTTP/1.1\r\nTransfer-Encoding: \xe9, chunked\r\n\r\n"),
            HeadVerdict::Refused(Refusal::UnsupportedTransferEncoding)
        );
        // The last line decides, as in hyper.
        assert_eq!(
            refused(
                "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n"
            ),
            Refusal::UnsupportedTransferEncoding
        );
        assert_eq!(
            refused("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"),
            Refusal::TransferEncodingInHttp10
        );
        assert_eq!(refused("GARBAGE\r\n\r\n"), Refusal::MalformedHead);
        assert_eq!(
            refused("GET / HTTP/1.1\r\nTransfer-Encoding : chunked\r\n\r\n"),
            Refusal::MalformedHead
        );
        let many = format!("GET / HTTP/1.1\r\n{}\r\n", "X-A: b\r\n".repeat(101));
        assert_eq!(refused(&many), Refusal::TooManyHeaders);
    }
}
