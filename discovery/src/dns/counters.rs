//! [`DnsCounters`]: what a DNS source did, for metrics and tests.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Counts kept by a running DNS source; a cheap handle, clones share the counts.
///
/// Give one to [`DnsConfig::counters`](super::DnsConfig::counters) and read it with
/// [`DnsCounters::snapshot`] while the source runs. Counts only grow.
#[derive(Debug, Clone, Default)]
pub struct DnsCounters(Arc<Counts>);

/// A snapshot of [`DnsCounters`].
///
/// Anomalies in an answer (`duplicate_ordinals`, `skipped_records`, `capped_answers`) are
/// counted each time a resolution sees them, so a lasting anomaly grows by one per period.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DnsCountsSnapshot {
    /// Resolutions attempted, the first included.
    pub resolutions: u64,
    /// Resolutions that failed (resolver error: timeout, refused, server failure); the
    /// last view was kept.
    pub failures: u64,
    /// Resolutions that succeeded with no usable task (no such name, no records); the
    /// last view was kept.
    pub empty_answers: u64,
    /// Views published after the first one (a resolution that changed nothing publishes
    /// nothing).
    pub changes: u64,
    /// Records whose target claimed an ordinal another target already had (the
    /// target whose name sorts first keeps it).
    pub duplicate_ordinals: u64,
    /// Records left out of a view: a target with no ordinal, an ordinal at or above the
    /// cap, or a target whose own address lookup found nothing.
    pub skipped_records: u64,
    /// Answers cut at the cap on records.
    pub capped_answers: u64,
}

#[derive(Debug, Default)]
struct Counts {
    resolutions: AtomicU64,
    failures: AtomicU64,
    empty_answers: AtomicU64,
    changes: AtomicU64,
    duplicate_ordinals: AtomicU64,
    skipped_records: AtomicU64,
    capped_answers: AtomicU64,
}

/// Which count to add to.
#[derive(Debug, Clone, Copy)]
pub(super) enum Count {
    Resolutions,
    Failures,
    EmptyAnswers,
    Changes,
    DuplicateOrdinals,
    SkippedRecords,
    CappedAnswers,
}

impl DnsCounters {
    /// The counts now (each read on its own: a snapshot taken during a resolution may
    /// see part of its counts).
    pub fn snapshot(&self) -> DnsCountsSnapshot {
        let c = &self.0;
        let read = |a: &AtomicU64| a.load(Ordering::Relaxed);
        DnsCountsSnapshot {
            resolutions: read(&c.resolutions),
            failures: read(&c.failures),
            empty_answers: read(&c.empty_answers),
            changes: read(&c.changes),
            duplicate_ordinals: read(&c.duplicate_ordinals),
            skipped_records: read(&c.skipped_records),
            capped_answers: read(&c.capped_answers),
        }
    }

    /// Adds `n` to `count`.
    pub(super) fn add(&self, count: Count, n: u64) {
        let c = &self.0;
        let counter = match count {
            Count::Resolutions => &c.resolutions,
            Count::Failures => &c.failures,
            Count::EmptyAnswers => &c.empty_answers,
            Count::Changes => &c.changes,
            Count::DuplicateOrdinals => &c.duplicate_ordinals,
            Count::SkippedRecords => &c.skipped_records,
            Count::CappedAnswers => &c.capped_answers,
        };
        counter.fetch_add(n, Ordering::Relaxed);
    }
}
