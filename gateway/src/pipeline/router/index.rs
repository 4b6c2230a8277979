//! The route index of one host group: a segment trie for `exact` and `pattern` paths, and a
//! hash map of `prefix`es probed at the request path's segment boundaries, longest first.
//!
//! Cost per request, whatever the number of routes: one hash lookup per path segment in the
//! trie (plus a parameter branch where one is configured), and at most two hash lookups per
//! segment boundary for prefixes; nothing is allocated. A linear scan of 1 000 prefixes
//! costs microseconds; this costs a few hundred nanoseconds (`benches/router.rs`).

use rustc_hash::FxHashMap as HashMap;

use crate::config::routes::pattern::{segment_name, PathRule, Segment};

/// Routes of one host group, by path.
#[derive(Debug, Default)]
pub(super) struct Group {
    trie: Node,
    prefixes: HashMap<Box<str>, Vec<u32>>,
    longest_prefix: usize,
    /// Bit `n` set: some prefix is `n` bytes long (for `n` < 256; longer ones are always
    /// probed). Most probes of a path are skipped without hashing.
    prefix_lengths: [u64; 4],
}

/// A trie node: the routes whose `exact` path or `pattern` ends here, those whose
/// `{*rest}` starts here, and the children by literal segment or parameter.
#[derive(Debug, Default)]
struct Node {
    literal: HashMap<Box<str>, Node>,
    param: Option<Box<Node>>,
    end: Vec<u32>,
    rest: Vec<u32>,
}

/// How specific a route's path is, among the routes of one host group (greater = more
/// specific): `exact` > `pattern` > `prefix`; for patterns more literal segments, then a
/// literal earlier rather than later (`/orders/{id}` before `/{kind}/7`), then a fixed
/// number of segments before a `{*rest}`; for prefixes, longer first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct PathRank {
    kind: u8,
    length: u32,
    literal_mask: u64,
    fixed: bool,
}

// === impl PathRank ===

impl PathRank {
    pub(super) fn of(path: &PathRule) -> Self {
        match path {
            PathRule::Exact(text) => Self {
                kind: 3,
                length: u32::try_from(text.len()).unwrap_or(u32::MAX),
                literal_mask: u64::MAX,
                fixed: true,
            },
            PathRule::Pattern(pattern) => {
                let segments = pattern.segments();
                let literals = segments
                    .iter()
                    .filter(|s| matches!(s, Segment::Literal(_)))
                    .count();
                // Bit 63 is the first segment: a literal earlier sorts higher.
                let literal_mask = segments
                    .iter()
                    .take(64)
                    .enumerate()
                    .filter(|(_, s)| matches!(s, Segment::Literal(_)))
                    .fold(0u64, |mask, (i, _)| mask | (1 << (63 - i)));
                Self {
                    kind: 2,
                    length: u32::try_from(literals).unwrap_or(u32::MAX),
                    literal_mask,
                    fixed: !pattern.has_rest(),
                }
            }
            PathRule::Prefix(text) => Self {
                kind: 1,
                length: u32::try_from(text.len()).unwrap_or(u32::MAX),
                literal_mask: 0,
                fixed: false,
            },
        }
    }
}

// === impl Group ===

impl Group {
    /// Adds route `index`. Candidates sharing a node or prefix are ordered later, by
    /// [`Group::sort`].
    pub(super) fn insert(&mut self, index: u32, path: &PathRule) {
        match path {
            PathRule::Prefix(prefix) => {
                self.longest_prefix = self.longest_prefix.max(prefix.len());
                if let Some(word) = self.prefix_lengths.get_mut(prefix.len() / 64) {
                    *word |= 1 << (prefix.len() % 64);
                }
                self.prefixes
                    .entry(prefix.as_str().into())
                    .or_default()
                    .push(index);
            }
            PathRule::Exact(text) => {
                let mut node = &mut self.trie;
                for piece in text[1..].split('/') {
                    node = node.literal.entry(piece.into()).or_default();
                }
                node.end.push(index);
            }
            PathRule::Pattern(pattern) => {
                let mut node = &mut self.trie;
                for segment in pattern.segments() {
                    node = match segment {
                        Segment::Literal(text) => node.literal.entry(text.clone()).or_default(),
                        Segment::Param => node.param.get_or_insert_with(Box::default),
                    };
                }
                if pattern.has_rest() {
                    node.rest.push(index);
                } else {
                    node.end.push(index);
                }
            }
        }
    }

    /// Orders every candidate list with `order` (the within-path tie-breakers).
    pub(super) fn sort(&mut self, order: &impl Fn(&u32, &u32) -> std::cmp::Ordering) {
        for list in self.prefixes.values_mut() {
            list.sort_by(order);
        }
        self.trie.sort(order);
    }

    /// Calls `visit` with the candidates of every `exact`/`pattern` node that matches
    /// `path`. Each node is visited at most once, so the work is bounded by the configured
    /// trie, not by the request.
    pub(super) fn visit_trie(&self, path: &str, visit: &mut impl FnMut(&[u32])) {
        let trie = &self.trie;
        if trie.literal.is_empty() && trie.param.is_none() {
            return;
        }
        if let Some(segments) = path.strip_prefix('/') {
            trie.walk(Some(segments), visit);
        }
    }

    /// Calls `visit` with the candidates of every matching prefix, longest first, until it
    /// returns `true`.
    pub(super) fn visit_prefixes(&self, path: &str, visit: &mut impl FnMut(&[u32]) -> bool) {
        if self.prefixes.is_empty() {
            return;
        }
        let mut probe = |candidate: &str| {
            let len = candidate.len();
            let configured = match self.prefix_lengths.get(len / 64) {
                Some(word) => word & (1 << (len % 64)) != 0,
                None => true,
            };
            len <= self.longest_prefix
                && configured
                && self.prefixes.get(candidate).is_some_and(|list| visit(list))
        };
        // A prefix matches when it is the whole path, ends with `/` inside it, or is
        // followed by `/` or `;` (see `pattern::prefix_matches`): exactly these candidates.
        if probe(path) {
            return;
        }
        let bytes = path.as_bytes();
        for i in (1..bytes.len()).rev() {
            let found = match bytes[i] {
                b'/' => probe(&path[..=i]) || probe(&path[..i]),
                b';' => probe(&path[..i]),
                _ => false,
            };
            if found {
                return;
            }
        }
        if bytes.len() > 1 && bytes[0] == b'/' {
            probe("/");
        }
    }
}

// === impl Node ===

impl Node {
    fn walk(&self, remaining: Option<&str>, visit: &mut impl FnMut(&[u32])) {
        let Some(remaining) = remaining else {
            if !self.end.is_empty() {
                visit(&self.end);
            }
            return;
        };
        // `{*rest}` takes one or more segments: not a lone trailing empty one.
        if !self.rest.is_empty() && !remaining.is_empty() {
            visit(&self.rest);
        }
        let (segment, tail) = match remaining.split_once('/') {
            Some((segment, tail)) => (segment, Some(tail)),
            None => (remaining, None),
        };
        let name = segment_name(segment);
        if let Some(child) = self.literal.get(name) {
            child.walk(tail, visit);
        }
        if let Some(child) = &self.param {
            if !name.is_empty() {
                child.walk(tail, visit);
            }
        }
    }

    fn sort(&mut self, order: &impl Fn(&u32, &u32) -> std::cmp::Ordering) {
        self.end.sort_by(order);
        self.rest.sort_by(order);
        for child in self.literal.values_mut() {
            child.sort(order);
        }
        if let Some(child) = &mut self.param {
            child.sort(order);
        }
    }
}
