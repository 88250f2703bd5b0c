//! Failure history: which tasks failed, how often, and when to try them again.

use futures_util::Stream;
use tokio::time::Instant;

use super::{Control, SlotState};
use crate::connector::{Address, Connector};
use crate::job::JobView;

/// A task that failed (a connection attempt, or a call), kept whether or not it is
/// still wanted, so that a failing stand-in is not reopened at once when its slot goes.
pub(super) struct Health<T> {
    pub(super) address: T,
    /// Consecutive failures: connection attempts that failed, or connections that
    /// failed before serving any request. Drives the backoff.
    pub(super) failures: u32,
    /// No new attempt before this.
    pub(super) retry_at: Instant,
}

impl<T, C, S, J> Control<T, C, S, J>
where
    T: Address,
    C: Connector<T, S>,
    S: Send + Sync + 'static,
    J: Stream<Item = JobView<T>> + Send + Unpin + 'static,
{
    /// Whether `task` (at `address`) is unusable: it failed, and is waiting out its
    /// backoff or retrying, and has not connected since.
    pub(super) fn is_failed(&self, task: usize, address: &T, now: Instant) -> bool {
        let Some(health) = self.health.get(&task).filter(|h| h.address == *address) else { return false };
        match self.slots.get(&task).map(|s| &s.state) {
            Some(SlotState::Ready(_)) => false,
            Some(SlotState::Connecting { .. } | SlotState::Backoff { .. }) => true,
            None => now < health.retry_at,
        }
    }

    /// Records a failure of `task` and returns when to retry it. `served` says whether
    /// its connection served a request before failing, which restarts the count.
    pub(super) fn record_failure(&mut self, task: usize, address: &T, served: bool) -> (u32, Instant) {
        let now = Instant::now();
        let health = self.health.entry(task).or_insert_with(|| Health {
            address: address.clone(),
            failures: 0,
            retry_at: now,
        });
        if health.address != *address || served {
            health.address = address.clone();
            health.failures = 0;
        }
        health.failures += 1;
        health.retry_at = now + self.config.backoff.delay(health.failures, &mut self.rng);
        (health.failures, health.retry_at)
    }
}
