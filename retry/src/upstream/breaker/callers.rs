//! Attribution of failed requests to callers, in bounded memory.
//!
//! Each window bucket keeps the callers its failed requests came from in a fixed table of
//! [`TRACKED_CALLERS`] entries, maintained with the Space-Saving algorithm (Metwally,
//! Agrawal, El Abbadi 2005): a known caller's count grows; a new caller takes a free
//! entry, or, when the table is full, replaces the entry with the smallest count and
//! inherits that count plus one. Counts therefore only over-estimate, by at most
//! `failures_in_bucket / TRACKED_CALLERS`, and every caller with more than that share of a
//! bucket's failures is guaranteed to be in its table. Memory: 32 × 16 bytes per bucket,
//! 5 KiB per upstream for the 10 buckets of a window, whatever the number of callers.
//!
//! The breaker sets aside the failures of the `min_callers - 1` callers with the most
//! failures before judging the failure rate ([`top_failures`]). Over-estimated counts make
//! it set aside more, never less: the error makes the breaker slower to open, never
//! openable by fewer callers.

/// Entries per bucket table.
pub(super) const TRACKED_CALLERS: usize = 32;

/// Failing callers of one window bucket.
#[derive(Debug, Clone, Copy)]
pub(super) struct FailingCallers {
    entries: [(u64, u32); TRACKED_CALLERS],
    len: usize,
}

// === impl FailingCallers ===

impl Default for FailingCallers {
    fn default() -> Self {
        Self {
            entries: [(0, 0); TRACKED_CALLERS],
            len: 0,
        }
    }
}

impl FailingCallers {
    /// Counts one failed request of `caller`.
    pub(super) fn add(&mut self, caller: u64) {
        let used = &mut self.entries[..self.len];
        if let Some(entry) = used.iter_mut().find(|e| e.0 == caller) {
            entry.1 = entry.1.saturating_add(1);
            return;
        }
        if self.len < TRACKED_CALLERS {
            self.entries[self.len] = (caller, 1);
            self.len += 1;
            return;
        }
        // Full: the new caller inherits the smallest count (Space-Saving), so no count
        // ever under-estimates a caller that is tracked.
        if let Some(smallest) = self.entries.iter_mut().min_by_key(|e| e.1) {
            *smallest = (caller, smallest.1.saturating_add(1));
        }
    }

    /// The tracked `(caller, failures)` entries.
    pub(super) fn entries(&self) -> &[(u64, u32)] {
        &self.entries[..self.len]
    }
}

/// Per-caller failure totals over several buckets, summed by caller, largest first.
pub(super) fn per_caller<'a>(tables: impl Iterator<Item = &'a FailingCallers>) -> Vec<u64> {
    let mut all: Vec<(u64, u32)> = tables.flat_map(|t| t.entries().iter().copied()).collect();
    all.sort_unstable_by_key(|e| e.0);
    let mut sums: Vec<u64> = Vec::with_capacity(all.len());
    let mut previous = None;
    for (caller, count) in all {
        match sums.last_mut() {
            Some(sum) if previous == Some(caller) => *sum += u64::from(count),
            _ => sums.push(u64::from(count)),
        }
        previous = Some(caller);
    }
    sums.sort_unstable_by(|a, b| b.cmp(a));
    sums
}

/// Failures of the `n` callers with the most failures (`sums` sorted largest first).
pub(super) fn top_failures(sums: &[u64], n: usize) -> u64 {
    sums.iter().take(n).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_exact_until_the_table_is_full() {
        let mut t = FailingCallers::default();
        for _ in 0..5 {
            t.add(7);
        }
        t.add(8);
        assert_eq!(t.entries(), &[(7, 5), (8, 1)]);
        let sums = per_caller([t, t].iter());
        assert_eq!(sums, vec![10, 2]);
        assert_eq!(top_failures(&sums, 1), 10);
        assert_eq!(top_failures(&sums, 0), 0);
        assert_eq!(top_failures(&sums, 5), 12);
    }

    #[test]
    fn a_heavy_caller_stays_tracked_among_many_and_is_never_under_counted() {
        let mut t = FailingCallers::default();
        // One caller's 200 failures interleaved with 1 000 callers' single failures.
        for i in 0..1_000u64 {
            t.add(1_000_000 + i);
            if i % 5 == 0 {
                t.add(42);
            }
        }
        let heavy = t
            .entries()
            .iter()
            .find(|e| e.0 == 42)
            .map(|e| e.1)
            .unwrap_or(0);
        assert!(
            heavy >= 200,
            "tracked with at least its true count: {heavy}"
        );
        assert_eq!(t.entries().len(), TRACKED_CALLERS);
        let total: u64 = t.entries().iter().map(|e| u64::from(e.1)).sum();
        assert_eq!(
            total, 1_200,
            "Space-Saving keeps the sum equal to the failures"
        );
    }
}
