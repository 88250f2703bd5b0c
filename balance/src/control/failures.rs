//! The control task's reactions to failing members: request feedback (a broken
//! connection, a run of failed calls, a probe served), the outlier detectors' interval
//! work, and the panic threshold's cap on ejections.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures_util::Stream;
use tokio::time::Instant;

use super::outliers::{Candidate, Cause};
use super::slots::SlotState;
use super::{Control, SubsetHealth};
use crate::connector::{Address, Connector};
use crate::route::endpoint::{Endpoint, Feedback};
use crate::route::table::Counters;
use steady_core::JobView;

impl<T, C, S, J> Control<T, C, S, J>
where
    T: Address,
    C: Connector<T, S>,
    S: Send + Sync + 'static,
    J: Stream<Item = JobView<T>> + Send + Unpin + 'static,
{
    pub(super) fn on_feedback(&mut self, feedback: Feedback) {
        match feedback {
            Feedback::Failed { task, id } => {
                let Some(slot) = self.slots.get(task) else { return };
                let endpoint = match slot.endpoint() {
                    Some(endpoint) if endpoint.id == id => endpoint.clone(),
                    // Already handled, or about an older connection.
                    _ => return,
                };
                let address = slot.address.clone();
                // A connection that served requests before failing starts the count
                // afresh; one that never did makes the backoff grow.
                let served = endpoint.calls.requests.load(Ordering::Relaxed)
                    > endpoint.calls.failures.load(Ordering::Relaxed);
                let (failures, until) = self.slots.record_failure(task, &address, served);
                self.slots.set_state(task, SlotState::Backoff { until });
                Counters::add(&self.shared().counters.ejections, 1);
                tracing::warn!(task, failures, retry_in = ?until - Instant::now(), "backend failed a call: out of rotation");
                self.retiring.push((endpoint, "failed"));
                self.reconcile();
            }
            Feedback::Consecutive { task, id } => {
                let Some(endpoint) = self.slots.endpoint(task).filter(|e| e.id == id).cloned() else {
                    return;
                };
                let now = Instant::now();
                let connected: Vec<(usize, Arc<Endpoint<S>>)> = self
                    .slots
                    .iter()
                    .filter(|(t, _)| *t != task)
                    .filter_map(|(t, s)| Some((t, s.endpoint()?.clone())))
                    .collect();
                let others: Vec<Candidate<'_, S>> =
                    connected.iter().map(|(task, endpoint)| Candidate { task: *task, endpoint }).collect();
                let may_eject = self.ejection_budget() > 0;
                if self.outliers.on_run(Candidate { task, endpoint: &endpoint }, &others, may_eject, now) {
                    self.count_ejection(task, Cause::Consecutive);
                    self.reconcile();
                }
            }
            Feedback::Probed { id } => {
                let probed =
                    self.slots.iter().find_map(|(_, s)| s.endpoint().filter(|e| e.id == id).cloned());
                if let Some(endpoint) = probed {
                    tracing::debug!(task = endpoint.task, "probe served: slow start");
                    if !self.slow_start.contains(id) {
                        self.slow_start.start(endpoint, Instant::now());
                    }
                }
            }
            Feedback::Drained { id } => self.draining.drained(id, self.publisher.shared()),
        }
    }

    /// Whether requests have been sent through this balancer (members that join then
    /// take up load gradually; the first ones open at once).
    pub(super) fn requests_flow(&self) -> bool {
        let shared = self.shared();
        shared.counters.closed_requests.load(Ordering::Relaxed) > 0
            || shared.table.load().members.iter().any(|e| e.calls.requests.load(Ordering::Relaxed) > 0)
    }

    /// Runs the outlier detectors' interval work; members whose ejection ended come
    /// back through slow start. Returns whether the rotation changed.
    pub(super) fn detect_outliers(&mut self, now: Instant) -> bool {
        let connected: Vec<(usize, Arc<Endpoint<S>>)> =
            self.slots.iter().filter_map(|(t, s)| Some((t, s.endpoint()?.clone()))).collect();
        let candidates: Vec<Candidate<'_, S>> =
            connected.iter().map(|(task, endpoint)| Candidate { task: *task, endpoint }).collect();
        let budget = self.ejection_budget();
        let slots = &self.slots;
        let tick = self.outliers.tick(&candidates, |t| slots.contains(t), budget, now);
        for &task in &tick.ejected {
            self.count_ejection(task, Cause::FailureRate);
        }
        for &task in &tick.returned {
            if let Some(endpoint) = self.slots.endpoint(task) {
                tracing::info!(task, "ejection over: back in rotation, slow start");
                self.slow_start.start(endpoint.clone(), now);
            }
        }
        !tick.ejected.is_empty() || !tick.returned.is_empty()
    }

    /// How many more members of the subset ejection may take out: the panic threshold's
    /// share of the subset (at least one), less those out already.
    fn ejection_budget(&self) -> usize {
        let SubsetHealth { primary, out, .. } = self.health;
        let cap = ((primary as f64 * self.config.outliers.max_ejected_share).floor() as usize).max(1);
        cap.saturating_sub(out)
    }

    fn count_ejection(&self, task: usize, cause: Cause) {
        let counters = &self.shared().counters;
        let counter = match cause {
            Cause::Consecutive => &counters.ejected_consecutive,
            Cause::FailureRate => &counters.ejected_failure_rate,
        };
        Counters::add(counter, 1);
        tracing::warn!(task, ?cause, "outlier ejected");
    }
}
