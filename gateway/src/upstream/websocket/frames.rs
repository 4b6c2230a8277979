//! Where WebSocket frames end (RFC 6455 §5.2), so that a tunnel closing on its own
//! (idle, lifetime, drain) sends its close frame between two frames, never inside one.
//! Payloads are not read, only counted: a frame costs its header's few bytes of work.

/// Follows one direction of a WebSocket connection frame by frame.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Frames {
    /// The header of the frame now starting, as far as it has arrived.
    head: [u8; 14],
    have: u8,
    /// Payload bytes of the current frame still to come.
    payload_left: u64,
}

// === impl Frames ===

impl Frames {
    /// Between two frames?
    pub(crate) fn at_boundary(&self) -> bool {
        self.have == 0 && self.payload_left == 0
    }

    /// Consumes `bytes` up to the end of the frame in progress (the next frame, at a
    /// boundary), or all of them if it does not end within; returns how many it consumed.
    pub(crate) fn advance(&mut self, bytes: &[u8]) -> usize {
        let mut at = 0;
        while self.payload_left == 0 {
            let Some(&byte) = bytes.get(at) else {
                return at;
            };
            self.head[usize::from(self.have)] = byte;
            self.have += 1;
            at += 1;
            if let Some((header_len, payload)) = header(&self.head[..usize::from(self.have)]) {
                if usize::from(self.have) == header_len {
                    self.have = 0;
                    self.payload_left = payload;
                    if payload == 0 {
                        return at;
                    }
                }
            }
        }
        let take = self.payload_left.min((bytes.len() - at) as u64);
        self.payload_left -= take;
        at + take as usize
    }

    /// Consumes all of `bytes`.
    pub(crate) fn advance_all(&mut self, bytes: &[u8]) {
        let mut at = 0;
        while at < bytes.len() {
            at += self.advance(&bytes[at..]);
        }
    }
}

/// The header's length and the payload's, once enough of the header has arrived to say.
fn header(head: &[u8]) -> Option<(usize, u64)> {
    let second = *head.get(1)?;
    let masked = second & 0x80 != 0;
    let (extended, short) = match second & 0x7f {
        126 => (2, None),
        127 => (8, None),
        n => (0, Some(u64::from(n))),
    };
    let len = 2 + extended + if masked { 4 } else { 0 };
    let payload = match short {
        Some(n) => n,
        None => {
            let bytes = head.get(2..2 + extended)?;
            bytes.iter().fold(0u64, |n, b| (n << 8) | u64::from(*b))
        }
    };
    Some((len, payload))
}

/// A close frame with `code` and `reason` (at most 123 bytes), masked with `mask` when it
/// goes to a server (RFC 6455 §5.3: a client masks every frame).
pub(crate) fn close_frame(code: u16, reason: &str, mask: Option<[u8; 4]>) -> Vec<u8> {
    let reason = &reason.as_bytes()[..reason.len().min(123)];
    let mut payload = code.to_be_bytes().to_vec();
    payload.extend_from_slice(reason);
    let mut frame = vec![0x88];
    // At most 125 bytes: the short length form.
    let len = payload.len() as u8;
    match mask {
        None => {
            frame.push(len);
            frame.extend_from_slice(&payload);
        }
        Some(key) => {
            frame.push(0x80 | len);
            frame.extend_from_slice(&key);
            frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
        }
    }
    frame
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(payload_len: usize, masked: bool) -> Vec<u8> {
        let mut f = vec![0x82];
        let m = if masked { 0x80 } else { 0 };
        match payload_len {
            0..=125 => f.push(m | payload_len as u8),
            126..=65535 => {
                f.push(m | 126);
                f.extend_from_slice(&(payload_len as u16).to_be_bytes());
            }
            _ => {
                f.push(m | 127);
                f.extend_from_slice(&(payload_len as u64).to_be_bytes());
            }
        }
        if masked {
            f.extend_from_slice(&[1, 2, 3, 4]);
        }
        f.extend(std::iter::repeat_n(0xaa, payload_len));
        f
    }

    #[test]
    fn boundaries_are_found_however_the_bytes_are_split() {
        let frames: Vec<Vec<u8>> = [0, 1, 125, 126, 300, 65535, 65536, 70000]
            .iter()
            .flat_map(|&n| [frame(n, false), frame(n, true)])
            .collect();
        let stream = frames.concat();
        let mut ends = Vec::new();
        let mut total = 0;
        for f in &frames {
            total += f.len();
            ends.push(total);
        }
        for split in [1, 2, 3, 7, 14, 1000, stream.len()] {
            let mut tracker = Frames::default();
            let mut seen = Vec::new();
            let mut offset = 0;
            for piece in stream.chunks(split) {
                let mut at = 0;
                while at < piece.len() {
                    at += tracker.advance(&piece[at..]);
                    if tracker.at_boundary() {
                        seen.push(offset + at);
                    }
                }
                offset += piece.len();
            }
            assert_eq!(seen, ends, "split {split}");
        }
    }

    #[test]
    fn close_frames_carry_code_and_reason_masked_or_not() {
        let plain = close_frame(1001, "going away", None);
        assert_eq!(&plain[..4], &[0x88, 12, 0x03, 0xe9]);
        assert_eq!(&plain[4..], b"going away");
        let masked = close_frame(1001, "going away", Some([9, 8, 7, 6]));
        assert_eq!(masked[1], 0x80 | 12);
        let unmasked: Vec<u8> = masked[6..]
            .iter()
            .enumerate()
            .map(|(i, b)| b ^ [9, 8, 7, 6][i % 4])
            .collect();
        assert_eq!(unmasked, plain[2..]);
        let mut tracker = Frames::default();
        tracker.advance_all(&masked);
        assert!(tracker.at_boundary());
    }
}
