//! [`AssignerStats`]: what an Assigner service has done.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use steady_assigner::{Infeasible, Moves, Violation};
use tokio::time::Instant;

use crate::store::Recall;

/// How many published runs [`AssignerStats::history`] keeps.
const RUN_HISTORY: usize = 64;

/// One run that published a new generation, as the status page and the metrics show it.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRecord {
    /// The generation it produced.
    pub generation: u64,
    /// When the run ended.
    pub at: SystemTime,
    /// The previous assignment's imbalance under the run's load (`None`: no previous).
    pub imbalance_before: Option<f64>,
    /// The new assignment's imbalance (busiest serving task's load / mean).
    pub imbalance_after: f64,
    /// The share of the key space whose owners changed.
    pub key_churn: f64,
    /// The changes made, by kind.
    pub moves: Moves,
    /// How long the assigner's computation took.
    pub elapsed: Duration,
}

/// What an Assigner service has done, for tests, logs and the demo.
#[derive(Debug, Default)]
pub struct AssignerStats {
    pub(super) terms: AtomicU64,
    pub(super) runs: AtomicU64,
    pub(super) published: AtomicU64,
    pub(super) conflicts: AtomicU64,
    pub(super) errors: AtomicU64,
    pub(super) generation: AtomicU64,
    pub(super) handovers: AtomicU64,
    pub(super) leading: AtomicBool,
    /// Total time spent in assigner runs, in nanoseconds.
    pub(super) run_nanos: AtomicU64,
    /// The latest published runs, oldest first (at most [`RUN_HISTORY`]).
    pub(super) history: Mutex<VecDeque<RunRecord>>,
    /// Every move so far, by kind (the sums of each published run's).
    pub(super) moves: Mutex<Moves>,
    /// The placement as the last run left it.
    pub(super) placement: Mutex<PlacementState>,
    /// Exclusive mode's recalls.
    pub(super) recalls: Mutex<Recalls>,
}

/// Exclusive mode's recalls, as this service saw them.
#[derive(Debug, Default)]
pub(super) struct Recalls {
    completed: u64,
    /// When the pending recall's publish transaction was answered (`Some(None)`: pending,
    /// begun by another term; `None`: none pending).
    pending: Option<Option<Instant>>,
    last: Option<Duration>,
    longest: Option<Duration>,
}

/// The placement constraints the assignment of the last run misses, and why, if the task
/// set cannot meet them: what the status page and the metrics show.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PlacementState {
    /// The constraints missed, with how many slices miss each.
    pub violations: Vec<Violation>,
    /// Why the task set cannot meet the constraints, if it cannot.
    pub infeasible: Option<Infeasible>,
}

impl AssignerStats {
    /// Times this service became the job's leader.
    pub fn terms(&self) -> u64 {
        self.terms.load(Ordering::Relaxed)
    }
    /// Assigner runs.
    pub fn runs(&self) -> u64 {
        self.runs.load(Ordering::Relaxed)
    }
    /// Generations written and handed to the Distributor.
    pub fn published(&self) -> u64 {
        self.published.load(Ordering::Relaxed)
    }
    /// Handovers begun: warming steps published (see `AssignerConfig::handover`).
    pub fn handovers(&self) -> u64 {
        self.handovers.load(Ordering::Relaxed)
    }
    /// Writes that lost a race (then re-read and retried).
    pub fn conflicts(&self) -> u64 {
        self.conflicts.load(Ordering::Relaxed)
    }
    /// Store errors, runs the assigner refused or panicked in, and failed campaigns
    /// (each retried after a backoff, or at the next cadence).
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }
    /// The last generation this service published (0: none).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }
    /// Whether this service leads its job now.
    pub fn is_leading(&self) -> bool {
        self.leading.load(Ordering::Relaxed)
    }
    /// Time spent in assigner runs so far.
    pub fn run_time(&self) -> Duration {
        Duration::from_nanos(self.run_nanos.load(Ordering::Relaxed))
    }
    /// The latest runs that published a generation, oldest first (at most 64).
    pub fn history(&self) -> Vec<RunRecord> {
        self.history.lock().unwrap_or_else(|p| p.into_inner()).iter().cloned().collect()
    }
    /// Every move of the published runs so far, by kind.
    pub fn moves(&self) -> Moves {
        *self.moves.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Recalls completed by this service in exclusive mode (the guard then granted the
    /// new generation), its own and those it settled for an earlier term.
    pub fn recalls(&self) -> u64 {
        self.recall_state().completed
    }

    /// Whether a recall this service leads is pending now (exclusive mode: a Slicelet
    /// still holds the generation being replaced, so the keys that move pause).
    pub fn recall_pending(&self) -> bool {
        self.recall_state().pending.is_some()
    }

    /// The last recall's time, from the transaction that published the generation to the
    /// grant (`None`: none timed yet; a recall begun in another term is counted, not
    /// timed).
    pub fn last_recall(&self) -> Option<Duration> {
        self.recall_state().last
    }

    /// The longest recall's time so far (as [`AssignerStats::last_recall`]).
    pub fn longest_recall(&self) -> Option<Duration> {
        self.recall_state().longest
    }

    fn recall_state(&self) -> std::sync::MutexGuard<'_, Recalls> {
        self.recalls.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records what a write in exclusive mode did with its recall.
    pub(super) fn recall_published(&self, published_at: Instant, recall: Recall) {
        let mut recalls = self.recall_state();
        match recall {
            Recall::Granted { at, .. } => recalls.complete(Some(published_at), at),
            Recall::Pending { .. } => recalls.pending = Some(Some(published_at)),
            Recall::Clear => recalls.pending = None,
        }
    }

    /// Records what a settle did: completed the pending recall, or found none.
    pub(super) fn recall_settled(&self, recall: Recall) {
        let mut recalls = self.recall_state();
        match recall {
            Recall::Granted { at, .. } => {
                let since = recalls.pending.flatten();
                recalls.complete(since, at);
            }
            Recall::Clear => recalls.pending = None,
            Recall::Pending { .. } => recalls.pending = Some(recalls.pending.flatten()),
        }
    }

    /// A settle failed on a recall pending (perhaps begun by an earlier term).
    pub(super) fn recall_stuck(&self) {
        let mut recalls = self.recall_state();
        recalls.pending = Some(recalls.pending.flatten());
    }

    /// The term ended: whatever is pending is the next leader's.
    pub(super) fn recall_handed_over(&self) {
        self.recall_state().pending = None;
    }

    /// The placement constraints the last run's assignment misses, and why (every run,
    /// published or not).
    pub fn placement(&self) -> PlacementState {
        self.placement.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Keeps the last run's placement; whether the infeasibility changed (for a log line).
    pub(super) fn set_placement(&self, state: PlacementState) -> bool {
        let mut current = self.placement.lock().unwrap_or_else(|p| p.into_inner());
        let changed = current.infeasible != state.infeasible;
        *current = state;
        changed
    }

    pub(super) fn record(&self, run: RunRecord) {
        {
            let mut total = self.moves.lock().unwrap_or_else(|p| p.into_inner());
            let m = &run.moves;
            total.forced += m.forced;
            total.merged += m.merged;
            total.moved += m.moved;
            total.replicas_added += m.replicas_added;
            total.replicas_removed += m.replicas_removed;
            total.swapped += m.swapped;
            total.split += m.split;
        }
        let mut history = self.history.lock().unwrap_or_else(|p| p.into_inner());
        if history.len() == RUN_HISTORY {
            history.pop_front();
        }
        history.push_back(run);
    }
}

impl Recalls {
    /// A recall completed at `at`, timed from `since` when known.
    fn complete(&mut self, since: Option<Instant>, at: Instant) {
        self.completed += 1;
        self.pending = None;
        if let Some(since) = since {
            let took = at.saturating_duration_since(since);
            self.last = Some(took);
            self.longest = Some(self.longest.map_or(took, |l| l.max(took)));
        }
    }
}
