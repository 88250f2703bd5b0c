//! Following the assignment source: newer generations replace, older or equal ones
//! are ignored, invalid ones are rejected, and the last good one outlives the source.

use std::pin::Pin;

use std::panic::AssertUnwindSafe;

use futures_util::{FutureExt, Stream, StreamExt};
use steady_slice::Assignment;

use crate::error::BoxError;
use crate::route::table::Counters;

/// A stream of assignments (or of the errors reading them), newest last.
pub(crate) type AssignmentSource = Pin<Box<dyn Stream<Item = Result<Assignment, BoxError>> + Send>>;

/// The source followed, and the assignment in force.
pub(super) struct Assignments {
    source: Option<AssignmentSource>,
    current: Option<Assignment>,
    /// Every task the assignment in force names, sorted.
    replica_tasks: Vec<u32>,
}

impl Assignments {
    pub(super) fn new() -> Self {
        Self { source: None, current: None, replica_tasks: Vec::new() }
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
    }

    /// Whether a source is followed.
    pub(super) fn is_following(&self) -> bool {
        self.source.is_some()
    }

    /// The next item of the source (pending forever when there is none). A source that
    /// panics counts as ended (`None`): it is dropped, since a stream that panicked may
    /// panic on every poll, and the assignment in force stays.
    pub(super) async fn next(&mut self) -> Option<Result<Assignment, BoxError>> {
        let Some(source) = &mut self.source else { return std::future::pending().await };
        match AssertUnwindSafe(source.next()).catch_unwind().await {
            Ok(item) => item,
            Err(_) => {
                tracing::error!("the assignment source panicked: following it no more");
                self.source = None;
                None
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
                tracing::info!(
                    generation = assignment.generation(),
                    slices = assignment.slices().len(),
                    "assignment in force"
                );
                let mut tasks: Vec<u32> =
                    assignment.slices().iter().flat_map(|s| s.replicas.iter().copied()).collect();
                tasks.sort_unstable();
                tasks.dedup();
                self.replica_tasks = tasks;
                self.current = Some(assignment);
                true
            }
        }
    }
}
