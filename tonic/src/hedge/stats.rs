//! [`HedgeStats`]: what a hedge did, from counters its clones and requests share.

use std::sync::atomic::{AtomicU64, Ordering};

/// The counters behind [`HedgeStats`].
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) hedged: AtomicU64,
    pub(crate) unbuffered: AtomicU64,
    pub(crate) extra_attempts: AtomicU64,
    pub(crate) refused_by_budget: AtomicU64,
    pub(crate) no_other_member: AtomicU64,
    pub(crate) hedges_won: AtomicU64,
}

impl Counters {
    pub(crate) fn add(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// What a [`Hedge`](super::Hedge) did so far (counters since it was built, shared by its clones).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HedgeStats {
    /// Requests of hedged methods that could be hedged (their bodies were kept): each
    /// deposited in the budget.
    pub hedged_requests: u64,
    /// Requests of hedged methods sent once because their body could not be kept (a
    /// client stream, or past [`crate::MAX_REPLAY_BYTES`]).
    pub sent_once: u64,
    /// Attempts sent after the first (each withdrew from the budget).
    pub extra_attempts: u64,
    /// Extra attempts the budget refused (at most one per request: hedging stops there).
    pub refused_by_budget: u64,
    /// Extra attempts not sent because no ready member was left that the request's
    /// earlier attempts had not gone to (for a keyed request: no other ready replica).
    pub no_other_member: u64,
    /// Requests answered by an attempt after the first.
    pub hedges_won: u64,
}

/// A snapshot of `c`.
pub(crate) fn stats_of(c: &Counters) -> HedgeStats {
    let read = |n: &AtomicU64| n.load(Ordering::Relaxed);
    HedgeStats {
        hedged_requests: read(&c.hedged),
        sent_once: read(&c.unbuffered),
        extra_attempts: read(&c.extra_attempts),
        refused_by_budget: read(&c.refused_by_budget),
        no_other_member: read(&c.no_other_member),
        hedges_won: read(&c.hedges_won),
    }
}
