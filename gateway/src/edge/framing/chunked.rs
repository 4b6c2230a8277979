//! Following a chunked body byte by byte — only to find where it ends, never to decode it.
//!
//! The grammar is hyper 1.x's chunked decoder's, state for state: a size line of hex digits,
//! optional whitespace and an extension, ended by CR LF; the data; CR LF; after the
//! zero-size chunk, trailer lines and a final CR LF. Anything hyper would reject makes the
//! tracker give up ([`Progress::Lost`]); hyper then rejects it too and closes the
//! connection, so giving up never lets a desynchronised request through.

/// Where inside a chunked body the next byte falls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkTracker {
    state: State,
    size: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// First hex digit of a size line.
    Start,
    /// More hex digits, or what ends them.
    Size,
    /// Whitespace after the digits.
    SizeWhitespace,
    /// A chunk extension, up to CR.
    Extension,
    /// LF ending a size line.
    SizeLf,
    /// Chunk data; `size` bytes left.
    Data,
    /// CR after chunk data.
    DataCr,
    /// LF after chunk data.
    DataLf,
    /// Inside a trailer line, up to CR.
    Trailer,
    /// LF ending a trailer line.
    TrailerLf,
    /// CR of the final empty line, or the first byte of another trailer line.
    EndCr,
    /// LF of the final empty line.
    EndLf,
}

/// The outcome of feeding bytes to the tracker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// All bytes belonged to the body; it continues.
    Continues,
    /// The body ended after this many of the bytes.
    Ended(usize),
    /// The bytes are not a chunked body hyper would accept.
    Lost,
}

impl Default for ChunkTracker {
    fn default() -> Self {
        Self::new()
    }
}

// === impl ChunkTracker ===

impl ChunkTracker {
    /// At the start of a chunked body.
    pub fn new() -> Self {
        Self {
            state: State::Start,
            size: 0,
        }
    }

    /// Feeds the next bytes of the stream.
    pub fn advance(&mut self, bytes: &[u8]) -> Progress {
        let mut at = 0;
        while at < bytes.len() {
            if self.state == State::Data {
                // Skip data in bulk: the only place large spans occur.
                let available = (bytes.len() - at) as u64;
                let take = self.size.min(available);
                at += take as usize;
                self.size -= take;
                if self.size == 0 {
                    self.state = State::DataCr;
                }
                continue;
            }
            let byte = bytes[at];
            at += 1;
            let Some(next) = self.step(byte) else {
                return Progress::Lost;
            };
            if next == Step::End {
                return Progress::Ended(at);
            }
        }
        Progress::Continues
    }

    fn step(&mut self, byte: u8) -> Option<Step> {
        use State::*;
        self.state = match (self.state, byte) {
            (Start, _) => {
                self.size = u64::from(hex(byte)?);
                Size
            }
            (Size, b'\t' | b' ') => SizeWhitespace,
            (Size | SizeWhitespace, b';') => Extension,
            (Size | SizeWhitespace | Extension, b'\r') => SizeLf,
            (Size, _) => {
                self.size = self
                    .size
                    .checked_mul(16)?
                    .checked_add(u64::from(hex(byte)?))?;
                Size
            }
            (SizeWhitespace, b'\t' | b' ') => SizeWhitespace,
            (SizeWhitespace, _) => return None,
            (Extension, b'\n') => return None,
            (Extension, _) => Extension,
            (SizeLf, b'\n') if self.size == 0 => EndCr,
            (SizeLf, b'\n') => Data,
            (SizeLf, _) => return None,
            (Data, _) => unreachable!("data is skipped in bulk"),
            (DataCr, b'\r') => DataLf,
            (DataLf, b'\n') => Start,
            (DataCr | DataLf, _) => return None,
            (Trailer, b'\r') => TrailerLf,
            (Trailer, _) => Trailer,
            (TrailerLf, b'\n') => EndCr,
            (TrailerLf, _) => return None,
            (EndCr, b'\r') => EndLf,
            (EndCr, _) => Trailer,
            (EndLf, b'\n') => return Some(Step::End),
            (EndLf, _) => return None,
        };
        Some(Step::More)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    More,
    End,
}

fn hex(byte: u8) -> Option<u8> {
    match byte {
        b'0'..=b'9' => Some(byte - b'0'),
        b'a'..=b'f' => Some(byte - b'a' + 10),
        b'A'..=b'F' => Some(byte - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole(body: &[u8]) -> Progress {
        ChunkTracker::new().advance(body)
    }

    #[test]
    fn finds_the_end_of_well_formed_bodies() {
        let body = b"5\r\nhello\r\n0\r\n\r\n";
        assert_eq!(whole(body), Progress::Ended(body.len()));
        let with_extras =
            b"A;name=value\r\n0123456789\r\n1 \t\r\n!\r\n0\r\nX-Trailer: t\r\n\r\nGET";
        assert_eq!(whole(with_extras), Progress::Ended(with_extras.len() - 3));
        assert_eq!(whole(b"0\r\n\r\n"), Progress::Ended(5));
    }

    #[test]
    fn any_split_gives_the_same_answer() {
        let body = b"1f\r\n0123456789012345678901234567890\r\n0\r\nA: b\r\n\r\nNEXT";
        for split in 0..body.len() {
            let mut tracker = ChunkTracker::new();
            let first = tracker.advance(&body[..split]);
            let end = match first {
                Progress::Ended(at) => at,
                Progress::Continues => match tracker.advance(&body[split..]) {
                    Progress::Ended(at) => split + at,
                    other => panic!("split {split}: {other:?}"),
                },
                Progress::Lost => panic!("split {split}: lost"),
            };
            assert_eq!(end, body.len() - 4, "split {split}");
        }
    }

    #[test]
    fn gives_up_where_hyper_would_reject() {
        for bad in [
            &b"\r\n"[..],
            b"x\r\n",
            b"5\nhello",
            b"5\r\nhelloX",
            b"5\r\nhello\rX",
            b"5 5\r\n",
            b"5;ext\nmore",
            b"11111111111111111\r\n",
            b"0\r\n\rX",
        ] {
            assert_eq!(whole(bad), Progress::Lost, "{bad:?}");
        }
    }
}
