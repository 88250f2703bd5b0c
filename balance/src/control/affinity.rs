//! Affinity connections: on-demand connections to replicas outside the subset that
//! keyed requests need, bounded in number (least recently active out first) and
//! closed when idle.

use std::sync::atomic::Ordering;

use futures_util::Stream;
use tokio::time::Instant;

use super::{Control, SlotState};
use crate::connector::{Address, Connector};
use crate::job::JobView;

/// When an affinity connection was last seen busy.
pub(super) struct AffinityUse {
    /// The endpoint's request count at the last sweep.
    pub(super) requests: u64,
    /// When it was last requested or seen serving.
    pub(super) active: Instant,
}

impl<T, C, S, J> Control<T, C, S, J>
where
    T: Address,
    C: Connector<T, S>,
    S: Send + Sync + 'static,
    J: Stream<Item = JobView<T>> + Send + Unpin + 'static,
{
    /// The affinity tasks still worth a connection: serving, and not in the subset.
    pub(super) fn affinity_wanted(&self, subset: &[usize]) -> Vec<usize> {
        let now = Instant::now();
        let mut tasks: Vec<usize> = self
            .affinity
            .keys()
            .copied()
            .filter(|t| {
                !subset.contains(t)
                    && self.view.serving_task(*t).is_some_and(|address| {
                        // A failed task keeps its slot (and its retries) if it has one,
                        // but is not reopened before its backoff ends.
                        self.slots.contains_key(t) || !self.is_failed(*t, address, now)
                    })
            })
            .collect();
        tasks.sort_unstable();
        tasks
    }

    /// A keyed request needs `tasks`: keep affinity connections to the ones outside
    /// the subset, within the bound.
    pub(super) fn on_affinity(&mut self, tasks: Vec<u32>) {
        let now = Instant::now();
        self.refresh_affinity_activity(now);
        let subset = self.shared.table.load().wanted.clone();
        let requested: Vec<usize> = tasks
            .into_iter()
            .map(|t| t as usize)
            .filter(|t| !subset.contains(t) && self.view.serving_task(*t).is_some())
            .collect();
        for &task in &requested {
            self.affinity.entry(task).or_insert(AffinityUse { requests: 0, active: now }).active = now;
        }
        // Over the bound: close the least recently active, sparing the ones
        // just requested while others remain.
        while self.affinity.len() > self.config.max_affinity {
            let victim = self
                .affinity
                .iter()
                .filter(|(t, _)| !requested.contains(t))
                .min_by_key(|(_, u)| u.active)
                .or_else(|| self.affinity.iter().min_by_key(|(_, u)| u.active))
                .map(|(t, _)| *t);
            match victim {
                Some(task) => self.affinity.remove(&task),
                None => break,
            };
        }
        if !self.affinity.is_empty() && self.next_sweep.is_none() {
            self.next_sweep = now.checked_add(self.sweep_period());
        }
    }

    pub(super) fn sweep_period(&self) -> std::time::Duration {
        (self.config.affinity_idle / 2)
            .clamp(std::time::Duration::from_millis(10), std::time::Duration::from_secs(3600))
    }

    /// Marks affinity connections that served requests since the last look as active now.
    pub(super) fn refresh_affinity_activity(&mut self, now: Instant) {
        for (task, used) in &mut self.affinity {
            if let Some(SlotState::Ready(endpoint)) = self.slots.get(task).map(|s| &s.state) {
                let requests = endpoint.requests.load(Ordering::Relaxed);
                if requests != used.requests || endpoint.in_flight.load(Ordering::Relaxed) > 0 {
                    used.requests = requests;
                    used.active = now;
                }
            }
        }
    }

    /// Closes affinity connections that have been idle for the configured time.
    pub(super) async fn sweep_affinity(&mut self) {
        let now = Instant::now();
        if self.next_sweep.is_none_or(|at| at > now) {
            return;
        }
        let idle = self.config.affinity_idle;
        let mut closed = Vec::new();
        for (task, used) in &mut self.affinity {
            let busy = match self.slots.get(task).map(|s| &s.state) {
                Some(SlotState::Ready(endpoint)) => {
                    let requests = endpoint.requests.load(Ordering::Relaxed);
                    let busy = requests != used.requests || endpoint.in_flight.load(Ordering::Relaxed) > 0;
                    used.requests = requests;
                    busy
                }
                _ => false,
            };
            if busy {
                used.active = now;
            } else if now.duration_since(used.active) >= idle {
                closed.push(*task);
            }
        }
        for task in &closed {
            self.affinity.remove(task);
            tracing::debug!(task, "affinity connection idle: closing");
        }
        self.next_sweep = if self.affinity.is_empty() { None } else { now.checked_add(self.sweep_period()) };
        if !closed.is_empty() {
            self.reconcile().await;
        }
    }
}
