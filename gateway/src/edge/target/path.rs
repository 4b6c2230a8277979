//! Path normalisation (RFC 3986 §6.2.2): one spelling per resource, so that route matching,
//! rate limiting, the idempotency fingerprint and the upstream all see the same path.
//!
//! In order:
//! 1. percent-encodings of unreserved characters (`ALPHA DIGIT - . _ ~`, §2.3) are decoded, the
//!    others are kept with uppercase hex (§6.2.2.1–2);
//! 2. dot segments are removed (§5.2.4) — after step 1, so `%2e%2e` is `..` too;
//! 3. repeated slashes are merged (nginx's `merge_slashes on`, Envoy's `merge_slashes`).
//!
//! What cannot be normalised without guessing is refused instead ([`PathError`]): an encoded
//! `/` (it would either split a segment or be routed differently from how the upstream
//! reads it), a backslash, raw or encoded (a separator to Windows and IIS backends, so
//! `/a\..\secure` could reach `/secure` behind the gateway's back; nginx on Linux passes it
//! through, Envoy's normalisation turns it into `/`), an encoded control byte, malformed percent-encoding, and a `..` that climbs
//! above the root (nginx answers 400 to the last; RFC 3986 would silently drop it).
//!
//! Cost: an already normal path (the common case) is one scan of its bytes and is returned
//! borrowed, with no allocation; only a path that changes is rebuilt.

use std::borrow::Cow;

/// Why a path cannot be normalised safely.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PathError {
    /// The path does not start with `/` (not origin-form).
    #[error("the request target is not an absolute path")]
    NotAbsolute,
    /// `%2F`: an encoded slash.
    #[error("the path contains an encoded '/' (%2F), which cannot be routed unambiguously")]
    EncodedSlash,
    /// `%00`–`%1F` or `%7F`.
    #[error("the path contains an encoded control character (%00-%1F or %7F)")]
    EncodedControl,
    /// A `%` not followed by two hex digits.
    #[error("the path contains malformed percent-encoding (a '%' not followed by two hex digits)")]
    MalformedPercent,
    /// `..` above the root.
    #[error("the path climbs above the root with a '..' segment")]
    AboveRoot,
    /// A `.` or `..` segment with `;` parameters (`..;/`): Tomcat, Jetty and Spring strip
    /// the parameters and climb, so `/public/..;/secure` would reach `/secure` unseen.
    #[error("the path has a '.' or '..' segment with ';' parameters, which backends resolve differently")]
    DotSegmentParameters,
    /// `\\` or `%5C`: a separator on some backends (Windows, IIS, Node's `path.win32`), a
    /// plain byte to others.
    #[error("the path contains a backslash ('\\' or %5C), which backends read differently")]
    Backslash,
}

// === impl PathError ===

impl PathError {
    /// A stable, machine-readable reason (the problem's `reason` member and metric label).
    pub(crate) fn code(self) -> &'static str {
        match self {
            Self::NotAbsolute => "not-origin-form",
            Self::EncodedSlash => "encoded-slash",
            Self::EncodedControl => "encoded-control-character",
            Self::MalformedPercent => "malformed-percent-encoding",
            Self::AboveRoot => "dot-segment-above-root",
            Self::Backslash => "backslash",
            Self::DotSegmentParameters => "dot-segment-with-parameters",
        }
    }
}

/// The normal form of `path`; borrowed when `path` is already normal.
///
/// The result starts with `/`, has no empty segment except a trailing slash, no `.` or `..`
/// segment, and only uppercase percent-encodings of bytes that are not unreserved, `/` or
/// control bytes; normalising it again returns it unchanged (and borrowed).
pub(crate) fn normalize(path: &str) -> Result<Cow<'_, str>, PathError> {
    if !path.starts_with('/') {
        return Err(PathError::NotAbsolute);
    }
    if is_normal(path.as_bytes()) {
        return Ok(Cow::Borrowed(path));
    }
    if path.contains('\\') {
        return Err(PathError::Backslash);
    }
    let decoded = decode_unreserved(path)?;
    remove_dot_segments(&decoded).map(Cow::Owned)
}

/// Whether `path` (starting with `/`) is already in normal form: one pass, no allocation.
fn is_normal(path: &[u8]) -> bool {
    let mut segment_start = 1;
    let mut i = 1;
    while i <= path.len() {
        match path.get(i) {
            None | Some(b'/') => {
                let segment = &path[segment_start..i];
                // An empty segment is `//`, unless it is the one after a trailing slash.
                if (segment.is_empty() && i < path.len()) || is_dot_segment(segment) {
                    return false;
                }
                segment_start = i + 1;
            }
            Some(b'%') => {
                let canonical = match (path.get(i + 1), path.get(i + 2)) {
                    (Some(&high), Some(&low)) if is_upper_hex(high) && is_upper_hex(low) => {
                        let byte = hex_value(high).unwrap_or(0) << 4 | hex_value(low).unwrap_or(0);
                        !(is_unreserved(byte) || byte == b'/' || byte == b'\\' || is_control(byte))
                    }
                    _ => false,
                };
                if !canonical {
                    return false;
                }
                i += 2;
            }
            Some(b'\\') => return false,
            Some(_) => {}
        }
        i += 1;
    }
    true
}

/// Step 1: decodes unreserved characters, uppercases the hex of the other encodings, and
/// refuses encodings that cannot stay (`/`, control bytes) or are malformed.
fn decode_unreserved(path: &str) -> Result<String, PathError> {
    let mut out = String::with_capacity(path.len());
    let mut rest = path;
    // Splitting at ASCII '%' always lands on a char boundary, so slices stay valid UTF-8.
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let bytes = rest.as_bytes();
        let (Some(high), Some(low)) = (
            bytes.get(at + 1).and_then(|b| hex_value(*b)),
            bytes.get(at + 2).and_then(|b| hex_value(*b)),
        ) else {
            return Err(PathError::MalformedPercent);
        };
        let byte = high << 4 | low;
        if byte == b'/' {
            return Err(PathError::EncodedSlash);
        }
        if byte == b'\\' {
            return Err(PathError::Backslash);
        }
        if is_control(byte) {
            return Err(PathError::EncodedControl);
        }
        if is_unreserved(byte) {
            out.push(char::from(byte));
        } else {
            out.push('%');
            out.push(char::from(HEX_UPPER[usize::from(high)]));
            out.push(char::from(HEX_UPPER[usize::from(low)]));
        }
        rest = &rest[at + 3..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Steps 2 and 3 on a path starting with `/`: a stack of segments, where empty segments
/// (`//`) and `.` vanish and `..` pops; a path that ended on one of them keeps its trailing `/`
/// (RFC 3986 §5.2.4: `/a/b/..` → `/a/`).
fn remove_dot_segments(path: &str) -> Result<String, PathError> {
    let mut out = String::with_capacity(path.len());
    // Length of `out` before each segment still on the stack.
    let mut starts: Vec<usize> = Vec::new();
    let mut trailing_slash = false;
    for segment in path.get(1..).unwrap_or_default().split('/') {
        trailing_slash = true;
        if segment.contains(';') && is_dot_segment(segment.as_bytes()) {
            return Err(PathError::DotSegmentParameters);
        }
        match segment {
            "" | "." => {}
            ".." => {
                let start = starts.pop().ok_or(PathError::AboveRoot)?;
                out.truncate(start);
            }
            segment => {
                starts.push(out.len());
                out.push('/');
                out.push_str(segment);
                trailing_slash = false;
            }
        }
    }
    if out.is_empty() || trailing_slash {
        out.push('/');
    }
    Ok(out)
}

/// `.` or `..`, also with `;` parameters after it (which backends strip before resolving).
fn is_dot_segment(segment: &[u8]) -> bool {
    let name = segment.split(|b| *b == b';').next().unwrap_or_default();
    name == b"." || name == b".."
}

const HEX_UPPER: &[u8; 16] = b"0123456789ABCDEF";

fn hex_value(byte: u8) -> Option<u8> {
    match byte {
        b'0'..=b'9' => Some(byte - b'0'),
        b'a'..=b'f' => Some(byte - b'a' + 10),
        b'A'..=b'F' => Some(byte - b'A' + 10),
        _ => None,
    }
}

fn is_upper_hex(byte: u8) -> bool {
    byte.is_ascii_digit() || (b'A'..=b'F').contains(&byte)
}

/// RFC 3986 §2.3.
fn is_unreserved(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~')
}

fn is_control(byte: u8) -> bool {
    byte < 0x20 || byte == 0x7F
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn norm(path: &str) -> Result<String, PathError> {
        normalize(path).map(Cow::into_owned)
    }

    #[test]
    fn normal_paths_are_borrowed() {
        for path in [
            "/",
            "/a",
            "/a/",
            "/orders/7",
            "/a.b/..c/c..",
            "/%C3%A9t%C3%A9",
            "/a%3Bb%25",
            "/a;b=c",
            "/é",
        ] {
            assert!(
                matches!(normalize(path), Ok(Cow::Borrowed(p)) if p == path),
                "{path}"
            );
        }
    }

    #[test]
    fn dot_segments_and_slashes() {
        let cases = [
            ("/x/../secure/a", "/secure/a"),
            ("//secure/a", "/secure/a"),
            ("/./secure/a", "/secure/a"),
            ("/secure//a//", "/secure/a/"),
            ("/a/b/..", "/a/"),
            ("/a/b/.", "/a/b/"),
            ("/a/./b/../c", "/a/c"),
            ("/..a/b../.../c", "/..a/b../.../c"),
            ("//", "/"),
            ("/.", "/"),
            ("/a/..", "/"),
            ("///a///", "/a/"),
        ];
        for (input, expected) in cases {
            assert_eq!(norm(input).as_deref(), Ok(expected), "{input}");
        }
    }

    #[test]
    fn percent_encodings() {
        let cases = [
            ("/%73ecure/a", "/secure/a"),
            ("/%7e%2D%5f%2e", "/~-_."),
            ("/a%3bb", "/a%3Bb"),
            ("/%c3%a9", "/%C3%A9"),
            ("/a/%2E%2e/b", "/b"),
            ("/a/.%2e/b", "/b"),
            ("/%2e/secure", "/secure"),
            ("/%25", "/%25"),
            ("/%252F", "/%252F"),
        ];
        for (input, expected) in cases {
            assert_eq!(norm(input).as_deref(), Ok(expected), "{input}");
        }
    }

    #[test]
    fn what_cannot_be_normalised_is_refused() {
        let cases = [
            ("/a%2Fb", PathError::EncodedSlash),
            ("/a%2fb", PathError::EncodedSlash),
            ("/a%00", PathError::EncodedControl),
            ("/a%0a", PathError::EncodedControl),
            ("/a%7F", PathError::EncodedControl),
            ("/a%zz", PathError::MalformedPercent),
            ("/a%4", PathError::MalformedPercent),
            ("/a%", PathError::MalformedPercent),
            ("/%%41", PathError::MalformedPercent),
            ("/../a", PathError::AboveRoot),
            ("/a/../../b", PathError::AboveRoot),
            ("/..", PathError::AboveRoot),
            ("/scan\\..\\secure", PathError::Backslash),
            ("/a\\b", PathError::Backslash),
            ("/a%5Cb", PathError::Backslash),
            ("/public/..;/secure", PathError::DotSegmentParameters),
            ("/a/.;x=1/b", PathError::DotSegmentParameters),
            ("/a/%2e%2e;/b", PathError::DotSegmentParameters),
            ("/a%5c..%5csecure", PathError::Backslash),
            ("/%2e%2e/", PathError::AboveRoot),
            ("*", PathError::NotAbsolute),
            ("", PathError::NotAbsolute),
            ("a/b", PathError::NotAbsolute),
        ];
        for (input, expected) in cases {
            assert_eq!(norm(input), Err(expected), "{input}");
        }
    }

    /// Paths built from the characters that matter here, so the property tests reach dot
    /// segments and encodings often; plus arbitrary strings.
    fn path_like() -> impl Strategy<Value = String> {
        prop_oneof![
            "/[/.%a-fA-F0-9sx~_-]{0,40}",
            "(/|/\\.|/\\.\\.|/%2[eEfF]|/%[0-9a-fA-F]{0,2}|/[a-z]{1,3}|//)*",
            any::<String>(),
        ]
    }

    proptest! {
        #[test]
        fn normal_form_properties(path in path_like()) {
            // Never panics, whatever the input.
            let Ok(normal) = normalize(&path) else { return Ok(()); };
            prop_assert!(normal.starts_with('/'), "{normal}");
            prop_assert!(!normal.contains("//"), "{normal}");
            for segment in normal.split('/') {
                prop_assert!(segment != "." && segment != "..", "{normal}");
            }
            // Idempotent, and the second pass is the allocation-free one.
            let again = normalize(&normal);
            prop_assert!(matches!(again, Ok(Cow::Borrowed(p)) if p == normal.as_ref()), "{normal} -> {again:?}");
        }

        #[test]
        fn borrowed_means_unchanged(path in path_like()) {
            if let Ok(Cow::Borrowed(p)) = normalize(&path) {
                prop_assert_eq!(p, path.as_str());
                // The slow path agrees with the fast one.
                let slow = decode_unreserved(&path).and_then(|d| remove_dot_segments(&d));
                prop_assert_eq!(slow.as_deref(), Ok(path.as_str()));
            }
        }
    }
}
