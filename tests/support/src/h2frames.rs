//! Raw HTTP/2 frames (RFC 9113 §4, §6) for tests that must see or send what an HTTP/2
//! library hides: the server's SETTINGS, a client opening more streams than allowed, a
//! request with two `content-length` fields. Header blocks are encoded as HPACK literals
//! without indexing (RFC 7541 §6.2.2), which every decoder must accept.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};

/// The client connection preface.
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Frame types used here.
pub mod kind {
    /// DATA.
    pub const DATA: u8 = 0x0;
    /// HEADERS.
    pub const HEADERS: u8 = 0x1;
    /// RST_STREAM.
    pub const RST_STREAM: u8 = 0x3;
    /// SETTINGS.
    pub const SETTINGS: u8 = 0x4;
    /// GOAWAY.
    pub const GOAWAY: u8 = 0x7;
    /// WINDOW_UPDATE.
    pub const WINDOW_UPDATE: u8 = 0x8;
}

/// SETTINGS parameter ids.
pub mod setting {
    /// SETTINGS_INITIAL_WINDOW_SIZE.
    pub const INITIAL_WINDOW_SIZE: u16 = 0x4;
    /// SETTINGS_MAX_CONCURRENT_STREAMS.
    pub const MAX_CONCURRENT_STREAMS: u16 = 0x3;
    /// SETTINGS_MAX_HEADER_LIST_SIZE.
    pub const MAX_HEADER_LIST_SIZE: u16 = 0x6;
}

/// Flags.
pub const END_STREAM: u8 = 0x1;
/// HEADERS: the block is complete. SETTINGS: this is an acknowledgement (same bit).
pub const END_HEADERS: u8 = 0x4;
/// SETTINGS acknowledgement.
pub const ACK: u8 = 0x1;

/// One frame as received.
#[derive(Debug, Clone)]
pub struct Frame {
    /// Frame type.
    pub kind: u8,
    /// Flags.
    pub flags: u8,
    /// Stream id.
    pub stream: u32,
    /// Payload.
    pub payload: Vec<u8>,
}

// === impl Frame ===

impl Frame {
    /// The (id, value) pairs of a SETTINGS frame.
    pub fn settings(&self) -> Vec<(u16, u32)> {
        self.payload
            .chunks_exact(6)
            .map(|c| {
                (
                    u16::from_be_bytes([c[0], c[1]]),
                    u32::from_be_bytes([c[2], c[3], c[4], c[5]]),
                )
            })
            .collect()
    }

    /// The error code of a RST_STREAM (or the last-stream-id–skipping code of a GOAWAY).
    pub fn error_code(&self) -> Option<u32> {
        let at = match self.kind {
            kind::RST_STREAM => 0,
            kind::GOAWAY => 4,
            _ => return None,
        };
        let b = self.payload.get(at..at + 4)?;
        Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// The status of a response HEADERS frame when the encoder used the HPACK static table
    /// entry for it (200, 204, 206, 304, 400, 404, 500 — what h2 does).
    pub fn static_status(&self) -> Option<u16> {
        match self.payload.first()? {
            0x88 => Some(200),
            0x89 => Some(204),
            0x8a => Some(206),
            0x8b => Some(304),
            0x8c => Some(400),
            0x8d => Some(404),
            0x8e => Some(500),
            _ => None,
        }
    }
}

/// Encodes one frame.
pub fn encode(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).expect("frame length");
    let mut out = Vec::with_capacity(9 + payload.len());
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// A SETTINGS frame with `params`.
pub fn settings(params: &[(u16, u32)]) -> Vec<u8> {
    let payload: Vec<u8> = params
        .iter()
        .flat_map(|(id, value)| id.to_be_bytes().into_iter().chain(value.to_be_bytes()))
        .collect();
    encode(kind::SETTINGS, 0, 0, &payload)
}

/// A SETTINGS acknowledgement.
pub fn settings_ack() -> Vec<u8> {
    encode(kind::SETTINGS, ACK, 0, &[])
}

/// A complete HEADERS frame with `fields` (pseudo-headers first, as the caller lists them).
pub fn headers(stream: u32, fields: &[(&str, &str)], end_stream: bool) -> Vec<u8> {
    let mut block = Vec::new();
    for (name, value) in fields {
        block.push(0x00); // literal without indexing, new name
        hpack_string(&mut block, name.as_bytes());
        hpack_string(&mut block, value.as_bytes());
    }
    let flags = END_HEADERS | if end_stream { END_STREAM } else { 0 };
    encode(kind::HEADERS, flags, stream, &block)
}

/// A DATA frame.
pub fn data(stream: u32, bytes: &[u8], end_stream: bool) -> Vec<u8> {
    encode(
        kind::DATA,
        if end_stream { END_STREAM } else { 0 },
        stream,
        bytes,
    )
}

/// HPACK string literal, no Huffman: 7-bit-prefix length, then the bytes.
fn hpack_string(out: &mut Vec<u8>, bytes: &[u8]) {
    let mut len = bytes.len();
    if len < 127 {
        out.push(len as u8);
    } else {
        out.push(127);
        len -= 127;
        while len >= 128 {
            out.push((len % 128) as u8 | 0x80);
            len /= 128;
        }
        out.push(len as u8);
    }
    out.extend_from_slice(bytes);
}

/// Reads whole frames from a stream.
#[derive(Debug)]
pub struct FrameReader<S> {
    stream: S,
}

// === impl FrameReader ===

impl<S: AsyncRead + Unpin> FrameReader<S> {
    /// Reads from `stream`.
    pub fn new(stream: S) -> Self {
        Self { stream }
    }

    /// The next frame; `None` on close, error, or after `timeout` without one.
    pub async fn next(&mut self, timeout: Duration) -> Option<Frame> {
        tokio::time::timeout(timeout, async {
            let mut head = [0u8; 9];
            self.stream.read_exact(&mut head).await.ok()?;
            let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
            let mut payload = vec![0u8; len];
            self.stream.read_exact(&mut payload).await.ok()?;
            Some(Frame {
                kind: head[3],
                flags: head[4],
                stream: u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff,
                payload,
            })
        })
        .await
        .ok()
        .flatten()
    }

    /// The underlying stream (to write on it).
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.stream
    }

    /// The underlying stream, to keep it open after reading.
    pub fn into_inner(self) -> S {
        self.stream
    }
}
