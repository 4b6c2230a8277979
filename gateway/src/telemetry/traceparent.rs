//! W3C Trace Context (`traceparent`, `tracestate`): parsing what a trusted caller sent and
//! formatting what the gateway forwards. Pure functions over bytes.
//!
//! `traceparent` is `00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>`, lower-case hex,
//! neither id all zeros. A header that does not parse is ignored (a new trace starts), as the
//! recommendation says ("the vendor MUST … start a new trace"); it is never an error to the
//! client. A version above `00` is read by its `00` prefix, as the spec asks.

use http::HeaderValue;

/// The `traceparent` header name.
pub(crate) static TRACEPARENT: http::HeaderName = http::HeaderName::from_static("traceparent");
/// The `tracestate` header name.
pub(crate) static TRACESTATE: http::HeaderName = http::HeaderName::from_static("tracestate");

/// Longest `tracestate` forwarded: the spec's 32 members of at most 256 characters bound it
/// near 8 KiB; 512 bytes is what it asks vendors to be able to propagate at least.
const MAX_TRACESTATE_LEN: usize = 512;

/// A parsed `traceparent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TraceParent {
    /// Trace id, never zero.
    pub trace_id: u128,
    /// The caller's span id, never zero.
    pub parent_id: u64,
    /// Trace flags (bit 0: sampled).
    pub flags: u8,
}

impl TraceParent {
    /// Parses a `traceparent` value; `None` for anything malformed.
    pub(crate) fn parse(value: &[u8]) -> Option<Self> {
        let version = hex_u128(value.get(0..2)?)?;
        // Version ff is forbidden; 00 is exactly 55 bytes; a later version may append
        // fields after a dash, which are ignored.
        let exact = value.len() == 55;
        let extended = version > 0 && value.get(55) == Some(&b'-');
        if version == 0xff || !(exact || extended) {
            return None;
        }
        if value.get(2) != Some(&b'-')
            || value.get(35) != Some(&b'-')
            || value.get(52) != Some(&b'-')
        {
            return None;
        }
        let trace_id = hex_u128(value.get(3..35)?)?;
        let parent_id = u64::try_from(hex_u128(value.get(36..52)?)?).ok()?;
        let flags = u8::try_from(hex_u128(value.get(53..55)?)?).ok()?;
        (trace_id != 0 && parent_id != 0).then_some(Self {
            trace_id,
            parent_id,
            flags,
        })
    }
}

/// `00-{trace_id}-{span_id}-{flags}`, written into a stack buffer: the header value is the
/// only allocation.
pub(crate) fn format(trace_id: u128, span_id: u64, flags: u8) -> HeaderValue {
    let mut text = *b"00-00000000000000000000000000000000-0000000000000000-00";
    put_hex(&mut text[3..35], &trace_id.to_be_bytes());
    put_hex(&mut text[36..52], &span_id.to_be_bytes());
    put_hex(&mut text[53..55], &[flags]);
    HeaderValue::from_bytes(&text).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// `bytes` as lower-case hex into `slot` (two digits per byte; a shorter `slot` takes the
/// leading bytes). Trace and span ids are written this way here and in the access log.
pub(crate) fn put_hex(slot: &mut [u8], bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (pair, byte) in slot.chunks_exact_mut(2).zip(bytes) {
        pair[0] = DIGITS[usize::from(byte >> 4)];
        pair[1] = DIGITS[usize::from(byte & 0xf)];
    }
}

/// A `tracestate` worth forwarding: visible ASCII, bounded; anything else is dropped (the
/// spec lets a vendor discard a `tracestate` it cannot propagate whole).
pub(crate) fn acceptable_tracestate(value: &HeaderValue) -> bool {
    let bytes = value.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= MAX_TRACESTATE_LEN
        && bytes.iter().all(|b| (0x20..0x7f).contains(b))
}

/// Lower-case hex only (the spec forbids upper case), at most 32 digits.
fn hex_u128(digits: &[u8]) -> Option<u128> {
    if digits.is_empty() || digits.len() > 32 {
        return None;
    }
    digits.iter().try_fold(0u128, |acc, &b| {
        let nibble = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            _ => return None,
        };
        Some((acc << 4) | u128::from(nibble))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn parses_the_spec_example_and_round_trips() {
        let parsed = TraceParent::parse(GOOD.as_bytes()).unwrap();
        assert_eq!(parsed.trace_id, 0x4bf92f3577b34da6a3ce929d0e0e4736);
        assert_eq!(parsed.parent_id, 0x00f067aa0ba902b7);
        assert_eq!(parsed.flags, 0x01, "sampled");
        assert_eq!(
            format(parsed.trace_id, parsed.parent_id, parsed.flags),
            GOOD
        );
    }

    #[test]
    fn malformed_values_are_ignored() {
        for bad in [
            "",
            "00",
            "garbage",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", // upper case
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01", // zero trace id
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", // zero parent id
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", // forbidden version
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x", // 00 has no tail
            "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01", // dash misplaced
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
        ] {
            assert_eq!(TraceParent::parse(bad.as_bytes()), None, "{bad:?}");
        }
    }

    #[test]
    fn later_versions_are_read_by_their_prefix() {
        let v1 = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-future";
        let parsed = TraceParent::parse(v1.as_bytes()).unwrap();
        assert_eq!(parsed.flags, 0);
    }

    #[test]
    fn tracestate_is_bounded_and_visible() {
        assert!(acceptable_tracestate(&HeaderValue::from_static(
            "congo=t61rcWkgMzE"
        )));
        let long = "a=".to_owned() + &"b".repeat(MAX_TRACESTATE_LEN);
        assert!(!acceptable_tracestate(
            &HeaderValue::from_str(&long).unwrap()
        ));
        assert!(!acceptable_tracestate(&HeaderValue::from_static("")));
    }
}
