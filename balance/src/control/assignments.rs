//! Following the assignment source: newer generations replace, older or equal ones
//! are ignored, invalid ones are rejected, and the last good one outlives the source.

use std::pin::Pin;

use futures_util::{Stream, StreamExt};

use super::Control;
use crate::assignment::{Assignment, AssignmentError};
use crate::connector::{Address, Connector};
use crate::job::JobView;
use crate::table::Counters;

/// A stream of assignments (or of the errors decoding them), newest last.
pub(crate) type AssignmentSource = Pin<Box<dyn Stream<Item = Result<Assignment, AssignmentError>> + Send>>;

impl<T, C, S, J> Control<T, C, S, J>
where
    T: Address,
    C: Connector<T, S>,
    S: Send + Sync + 'static,
    J: Stream<Item = JobView<T>> + Send + Unpin + 'static,
{
    pub(super) async fn on_assignment(&mut self, item: Option<Result<Assignment, AssignmentError>>) {
        let c = &self.shared.counters;
        let current = self.assignment.as_ref().map(Assignment::generation);
        match item {
            None => {
                tracing::info!(generation = ?current, "assignment source ended: the last good assignment stays");
                self.assignments = None;
            }
            Some(Err(error)) => {
                Counters::add(&c.assignments_rejected, 1);
                tracing::warn!(%error, generation = ?current, "invalid assignment rejected: the last good one stays");
            }
            Some(Ok(assignment)) if current.is_some_and(|g| assignment.generation() <= g) => {
                Counters::add(&c.assignments_stale, 1);
                tracing::debug!(generation = assignment.generation(), current = ?current, "stale assignment ignored");
            }
            Some(Ok(assignment)) => {
                Counters::add(&c.assignments_accepted, 1);
                tracing::info!(
                    generation = assignment.generation(),
                    slices = assignment.slices().len(),
                    "assignment in force"
                );
                self.assignment = Some(assignment);
                self.reconcile().await;
            }
        }
    }
}

/// The next item of the assignment source (pending forever once it is gone).
pub(super) async fn next_assignment(
    source: &mut Option<AssignmentSource>,
) -> Option<Result<Assignment, AssignmentError>> {
    match source {
        Some(source) => source.next().await,
        None => std::future::pending().await,
    }
}
