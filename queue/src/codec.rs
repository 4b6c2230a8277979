//! Header lists as one byte string: for each header, the name's length (u32, big endian),
//! the name, the value's length, the value. Names and values are raw bytes (obs-text
//! included), so nothing is lost or re-encoded on the way through the queue.

use crate::error::QueueError;
use crate::message::Headers;

/// Encodes `headers`.
pub(crate) fn encode_headers(headers: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let len = headers.iter().map(|(n, v)| 8 + n.len() + v.len()).sum();
    let mut out = Vec::with_capacity(len);
    for (name, value) in headers {
        for part in [name, value] {
            let n = u32::try_from(part.len()).unwrap_or(u32::MAX);
            out.extend_from_slice(&n.to_be_bytes());
            out.extend_from_slice(part.get(..n as usize).unwrap_or(part));
        }
    }
    out
}

/// Decodes [`encode_headers`]; a truncated or overlong field is [`QueueError::Corrupt`].
pub(crate) fn decode_headers(mut bytes: &[u8]) -> Result<Headers, QueueError> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let name = take(&mut bytes)?;
        let value = take(&mut bytes)?;
        out.push((name, value));
    }
    Ok(out)
}

fn take(bytes: &mut &[u8]) -> Result<Vec<u8>, QueueError> {
    let corrupt = || QueueError::Corrupt("truncated header list".into());
    let (len, rest) = bytes.split_first_chunk::<4>().ok_or_else(corrupt)?;
    let len = u32::from_be_bytes(*len) as usize;
    let part = rest.get(..len).ok_or_else(corrupt)?;
    *bytes = rest.get(len..).ok_or_else(corrupt)?;
    Ok(part.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_keeps_order_repeats_and_raw_bytes() {
        let h = vec![
            (b"set-cookie".to_vec(), b"a=1".to_vec()),
            (b"set-cookie".to_vec(), b"b=2".to_vec()),
            (b"x-obs".to_vec(), b"caf\xe9".to_vec()),
            (b"x-empty".to_vec(), Vec::new()),
        ];
        assert_eq!(decode_headers(&encode_headers(&h)).unwrap(), h);
        assert!(decode_headers(&[0, 0, 0, 9, b'a']).is_err());
        assert!(decode_headers(&[0, 0]).is_err());
    }
}
