//! How a route matches the path: a `prefix` (today's segment-boundary rule), an `exact` path,
//! or a segment `pattern` such as `/orders/{id}/items` or `/files/{*rest}`.
//!
//! Paths are compared in the normal form the edge gives every request (see
//! `edge::target`), segment by segment for `exact` and `pattern`. Matrix parameters
//! (`/orders;v=1/7`) end a segment's name, as Java backends read them: `/orders;v=1` is
//! `/orders` to the backend, so it must be `/orders` to the router too, or a stricter route's
//! policy could be skipped by adding `;x` to a segment.

use std::borrow::Cow;

/// How a route matches the (normalised) path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathRule {
    /// The path starts with this text on a segment boundary (`/orders` matches `/orders`,
    /// `/orders/7` and `/orders;v=1`, not `/ordersx`).
    Prefix(String),
    /// The path is exactly this one (matrix parameters aside).
    Exact(String),
    /// The path has these segments.
    Pattern(Pattern),
}

/// A parsed segment pattern: literals, `{name}` (one non-empty segment) and an optional
/// trailing `{*name}` (one or more further segments).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    text: String,
    segments: Vec<Segment>,
    rest: bool,
}

/// One segment of a [`Pattern`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Segment {
    /// Matches exactly this text (before any `;` parameters of the request's segment).
    Literal(Box<str>),
    /// `{name}`: any non-empty segment.
    Param,
}

/// Why a path text cannot be a route's `exact` path or `pattern`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PatternError {
    /// Not starting with `/`.
    #[error("must start with '/'")]
    NotAbsolute,
    /// A segment not in the normal form requests are matched in.
    #[error(
        "a segment is not in normal form (requests are matched after normalisation); write {0:?}"
    )]
    NotNormal(String),
    /// Refused by normalisation itself (encoded slash, backslash, …).
    #[error("{0}")]
    Invalid(String),
    /// `;` in a segment: matrix parameters are ignored when matching, so they cannot be
    /// part of a route's path.
    #[error("contains ';': matrix parameters are ignored when matching, leave them out")]
    MatrixParameter,
    /// `{` or `}` outside a whole-segment `{name}`, or an invalid name.
    #[error("segment {0:?}: a parameter is a whole segment `{{name}}` or a trailing `{{*name}}`, name of [A-Za-z0-9_]")]
    BadParameter(String),
    /// `{*name}` anywhere but last.
    #[error("`{{*{0}}}` must be the last segment")]
    RestNotLast(String),
    /// The same name twice.
    #[error("parameter name {0:?} is used twice")]
    DuplicateName(String),
    /// Parameters in an `exact` path.
    #[error("contains '{{' or '}}': use `pattern` for paths with parameters")]
    ParameterInExact,
}

// === impl PathRule ===

impl PathRule {
    /// The path text as configured: the route's default name.
    pub fn text(&self) -> &str {
        match self {
            Self::Prefix(text) | Self::Exact(text) => text,
            Self::Pattern(pattern) => &pattern.text,
        }
    }

    /// The field that configures it.
    pub fn field(&self) -> &'static str {
        match self {
            Self::Prefix(_) => "prefix",
            Self::Exact(_) => "exact",
            Self::Pattern(_) => "pattern",
        }
    }
}

// === impl Pattern ===

impl Pattern {
    /// Parses `/orders/{id}/items` or `/files/{*rest}`.
    pub fn parse(text: &str) -> Result<Self, PatternError> {
        let body = text.strip_prefix('/').ok_or(PatternError::NotAbsolute)?;
        let mut names: Vec<&str> = Vec::new();
        let mut segments = Vec::new();
        let mut rest = false;
        let pieces: Vec<&str> = body.split('/').collect();
        for (i, piece) in pieces.iter().enumerate() {
            if rest {
                return Err(PatternError::RestNotLast(
                    names.last().map_or_else(String::new, |n| (*n).to_owned()),
                ));
            }
            if let Some(inner) = piece.strip_prefix('{').and_then(|p| p.strip_suffix('}')) {
                let (name, is_rest) = match inner.strip_prefix('*') {
                    Some(name) => (name, true),
                    None => (inner, false),
                };
                if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                {
                    return Err(PatternError::BadParameter((*piece).to_owned()));
                }
                if names.contains(&name) {
                    return Err(PatternError::DuplicateName(name.to_owned()));
                }
                names.push(name);
                if is_rest {
                    rest = true;
                } else {
                    segments.push(Segment::Param);
                }
                continue;
            }
            if piece.contains(['{', '}']) {
                return Err(PatternError::BadParameter((*piece).to_owned()));
            }
            // Only a trailing slash leaves an empty segment in a normal path.
            if piece.is_empty() && i + 1 < pieces.len() {
                return Err(PatternError::Invalid(
                    "has an empty segment ('//'), which a normalised path never has".into(),
                ));
            }
            literal(piece)?;
            segments.push(Segment::Literal((*piece).into()));
        }
        Ok(Self {
            text: text.to_owned(),
            segments,
            rest,
        })
    }

    /// Checks an `exact` path: a pattern without parameters.
    pub fn check_exact(text: &str) -> Result<(), PatternError> {
        if text.contains(['{', '}']) {
            return Err(PatternError::ParameterInExact);
        }
        Self::parse(text).map(|_| ())
    }

    /// The configured text.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The fixed segments (the trailing `{*rest}` excluded).
    pub(crate) fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// Ends with `{*rest}`.
    pub(crate) fn has_rest(&self) -> bool {
        self.rest
    }
}

/// A literal segment must already be what a normalised request path holds.
fn literal(segment: &str) -> Result<(), PatternError> {
    if segment.contains(';') {
        return Err(PatternError::MatrixParameter);
    }
    if segment == "." || segment == ".." {
        return Err(PatternError::Invalid(
            "has a '.' or '..' segment, which normalisation removes from every path".into(),
        ));
    }
    let path = format!("/{segment}");
    match crate::edge::target::normalize_path(&path) {
        Ok(Cow::Borrowed(_)) => Ok(()),
        Ok(normal) => Err(PatternError::NotNormal(
            normal.trim_start_matches('/').to_owned(),
        )),
        Err(why) => Err(PatternError::Invalid(why.to_string())),
    }
}

/// The name of a request path segment for matching: what comes before its `;` parameters.
pub(crate) fn segment_name(segment: &str) -> &str {
    segment.split_once(';').map_or(segment, |(name, _)| name)
}

/// A prefix matches on a segment boundary: `/`, the end, or `;` — matrix parameters
/// (`/secure;jsessionid=1/pay`) that Java backends strip before routing, so the gateway's
/// route must be the one the backend serves.
#[cfg(test)]
pub(crate) fn prefix_matches(prefix: &str, path: &str) -> bool {
    match path.strip_prefix(prefix) {
        Some(rest) => {
            rest.is_empty()
                || prefix.ends_with('/')
                || rest.starts_with('/')
                || rest.starts_with(';')
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_parse_into_segments() {
        let p = Pattern::parse("/orders/{id}/items").unwrap();
        assert_eq!(
            p.segments(),
            [
                Segment::Literal("orders".into()),
                Segment::Param,
                Segment::Literal("items".into())
            ]
        );
        assert!(!p.has_rest());
        let p = Pattern::parse("/files/{*path}").unwrap();
        assert_eq!(p.segments(), [Segment::Literal("files".into())]);
        assert!(p.has_rest());
        assert_eq!(
            Pattern::parse("/").unwrap().segments(),
            [Segment::Literal("".into())]
        );
    }

    #[test]
    fn bad_patterns_are_refused_with_a_reason() {
        for (text, want) in [
            ("orders", PatternError::NotAbsolute),
            ("/a/{*rest}/b", PatternError::RestNotLast("rest".into())),
            ("/a/{id}/{id}", PatternError::DuplicateName("id".into())),
            ("/a/x{id}", PatternError::BadParameter("x{id}".into())),
            ("/a/{}", PatternError::BadParameter("{}".into())),
            ("/a/{i-d}", PatternError::BadParameter("{i-d}".into())),
            ("/a;v=1/{id}", PatternError::MatrixParameter),
            ("/a/%7euser", PatternError::NotNormal("~user".into())),
        ] {
            assert_eq!(Pattern::parse(text), Err(want), "{text}");
        }
        for text in ["/a%2Fb/{id}", "/a//{id}", "/a/../{id}", "/./{id}"] {
            assert!(
                matches!(Pattern::parse(text), Err(PatternError::Invalid(_))),
                "{text}"
            );
        }
        assert_eq!(
            Pattern::check_exact("/a/{id}"),
            Err(PatternError::ParameterInExact)
        );
        assert_eq!(Pattern::check_exact("/a/b/"), Ok(()));
    }

    #[test]
    fn segment_names_drop_matrix_parameters() {
        assert_eq!(segment_name("orders;v=1"), "orders");
        assert_eq!(segment_name(";v=1"), "");
        assert_eq!(segment_name("orders"), "orders");
    }

    #[test]
    fn segment_boundary_prefixes() {
        assert!(prefix_matches("/orders", "/orders"));
        assert!(prefix_matches("/orders", "/orders/7"));
        assert!(!prefix_matches("/orders", "/ordersx"));
        assert!(prefix_matches("/", "/anything"));
        assert!(prefix_matches("/api/", "/api/x"));
        assert!(!prefix_matches("/orders", "/"));
        // Matrix parameters end a segment, as Java backends read them.
        assert!(prefix_matches("/secure", "/secure;jsessionid=1/pay"));
        assert!(prefix_matches("/secure", "/secure;x"));
    }
}
