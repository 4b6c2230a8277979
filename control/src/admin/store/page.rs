//! Listing pages: the page size bounds and the cursor of the next page.

use serde::Serialize;

/// Most items one list page returns.
pub(crate) const MAX_PAGE: u64 = 500;
/// Items per page when `limit` is not given.
pub(crate) const DEFAULT_PAGE: u64 = 50;

/// One page of a listing.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Page<T> {
    /// The items.
    pub(crate) items: Vec<T>,
    /// Pass as `cursor` to get the next page; `null` on the last page.
    pub(crate) next_cursor: Option<String>,
}

/// Rows to fetch for a page: one more than shown, to know whether another page follows.
pub(super) fn page_fetch(limit: u64) -> i64 {
    i64::try_from(limit.clamp(1, MAX_PAGE) + 1).unwrap_or(i64::MAX)
}

/// The page of `items` (fetched with [`page_fetch`]): at most `limit` of them, and the
/// cursor of the next page when there was one more.
pub(super) fn paginate<T>(
    mut items: Vec<T>,
    limit: u64,
    cursor_of: impl Fn(&T) -> String,
) -> Page<T> {
    let limit = usize::try_from(limit.clamp(1, MAX_PAGE)).unwrap_or(usize::MAX);
    let next_cursor = if items.len() > limit {
        items.truncate(limit);
        items.last().map(cursor_of)
    } else {
        None
    };
    Page { items, next_cursor }
}
