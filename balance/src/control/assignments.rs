//! Following the assignment source: newer generations replace, older or equal ones
//! are ignored, invalid ones are rejected, and the last good one outlives the source.
//! A source that panics is polled again after a backoff, not dropped.

use std::fmt;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::time::Duration;

use futures_util::{FutureExt, Stream, StreamExt};
use steady_slice::Assignment;
use steady_subset::prng::SplitMix64;
use tokio::time::Instant;

use crate::error::BoxError;
use crate::route::pick::fresh_rng;
use crate::route::table::Counters;
use steady_core::Backoff;

/// A stream of assignments (or of the errors reading them), newest last.
pub(crate) type AssignmentSource = Pin<Box<dyn Stream<Item = Result<Assignment, BoxError>> + Send>>;

/// The source followed, and the assignment in force.
pub(super) struct Assignments {
    source: Option<AssignmentSource>,
    current: Option<Assignment>,
    /// Every task the assignment in force names, sorted.
    replica_tasks: Vec<u32>,
    /// Panics of the source since it last yielded an item.
    panics_in_a_row: u32,
    /// The wait before polling a source again after it panicked (the balancer's
    /// reconnection backoff), counted in panics in a row: a source that panics on every
    /// poll (as a panicked `async` block does) is polled about once per `backoff.max`,
    /// and never spins.
    restart: Backoff,
    /// When the source that panicked is polled again (`None`: at once).
    resume_at: Option<Instant>,
    /// The restart delays' jitter.
    rng: SplitMix64,
}

/// What [`Assignments::next`] yields when the source panicked: [`Assignments::accept`]
/// counts it as a restart, not as a rejected assignment.
#[derive(Debug)]
struct SourcePanicked {
    message: String,
    /// The wait before the source is polled again.
    restart_in: Duration,
}

impl fmt::Display for SourcePanicked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the assignment source panicked ({}): polled again in {:?}", self.message, self.restart_in)
    }
}

impl std::error::Error for SourcePanicked {}

impl Assignments {
    pub(super) fn new(restart: Backoff) -> Self {
        Self {
            restart,
            source: None,
            current: None,
            replica_tasks: Vec::new(),
            panics_in_a_row: 0,
            resume_at: None,
            // Seeded per process, as the slots' backoff is: frontends do not restart in step.
            rng: fresh_rng(),
        }
    }

    /// The assignment in force; `None` before the first.
    pub(super) fn current(&self) -> Option<&Assignment> {
        self.current.as_ref()
    }

    /// Every task the assignment in force names, sorted, without repeats.
    pub(super) fn replica_tasks(&self) -> &[u32] {
        &self.replica_tasks
    }

    /// Follows `source` instead of the one followed until now (the assignment in force
    /// stays until the new source sends a newer one).
    pub(super) fn follow(&mut self, source: AssignmentSource) {
        self.source = Some(source);
        self.panics_in_a_row = 0;
        self.resume_at = None;
    }

    /// Whether a source is followed.
    pub(super) fn is_following(&self) -> bool {
        self.source.is_some()
    }

    /// The next item of the source (pending forever when there is none).
    ///
    /// A source that panics is kept: the panic comes out as an error item that
    /// [`Assignments::accept`] counts as a restart, and the source is polled again after
    /// a backoff that grows with its panics in a row (the balancer's backoff). The
    /// assignment in force stays meanwhile. Cancel-safe: dropped during that wait, the
    /// next call waits for the rest of it.
    pub(super) async fn next(&mut self) -> Option<Result<Assignment, BoxError>> {
        let Some(source) = &mut self.source else { return std::future::pending().await };
        if let Some(at) = self.resume_at {
            tokio::time::sleep_until(at).await;
            self.resume_at = None;
        }
        match AssertUnwindSafe(source.next()).catch_unwind().await {
            Ok(item) => {
                self.panics_in_a_row = 0;
                item
            }
            Err(panic) => {
                let message = super::panic_message(&*panic);
                self.panics_in_a_row = self.panics_in_a_row.saturating_add(1);
                let restart_in = self.restart.delay(self.panics_in_a_row, &mut self.rng);
                self.resume_at = Some(Instant::now() + restart_in);
                Some(Err(Box::new(SourcePanicked { message, restart_in })))
            }
        }
    }

    /// Takes the source's next item (`None`: it ended); returns whether the assignment
    /// in force changed.
    pub(super) fn accept(&mut self, item: Option<Result<Assignment, BoxError>>, counters: &Counters) -> bool {
        let current = self.current.as_ref().map(Assignment::generation);
        match item {
            None => {
                tracing::info!(generation = ?current, "assignment source ended: the last good assignment stays");
                self.source = None;
                false
            }
            Some(Err(error)) if error.is::<SourcePanicked>() => {
                Counters::add(&counters.assignment_source_restarts, 1);
                tracing::error!(%error, panics_in_a_row = self.panics_in_a_row, generation = ?current, "assignment source restarted: the assignment in force stays");
                false
            }
            Some(Err(error)) => {
                Counters::add(&counters.assignments_rejected, 1);
                tracing::warn!(%error, generation = ?current, "invalid assignment rejected: the last good one stays");
                false
            }
            Some(Ok(assignment)) if current.is_some_and(|g| assignment.generation() <= g) => {
                Counters::add(&counters.assignments_stale, 1);
                tracing::debug!(generation = assignment.generation(), current = ?current, "stale assignment ignored");
                false
            }
            Some(Ok(assignment)) => {
                Counters::add(&counters.assignments_accepted, 1);
                if let Ok(mut at) = counters.assignment_accepted_at.lock() {
                    *at = Some(std::time::Instant::now());
                }
                tracing::info!(
                    generation = assignment.generation(),
                    slices = assignment.slices().len(),
                    "assignment in force"
                );
                let mut tasks: Vec<u32> =
                    assignment.slices().iter().flat_map(|s| s.replicas().iter().copied()).collect();
                tasks.sort_unstable();
                tasks.dedup();
                self.replica_tasks = tasks;
                self.current = Some(assignment);
                true
            }
        }
    }
}
