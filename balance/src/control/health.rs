//! The health of the members, as the control task keeps it: outlier ejection, slow
//! start, how much of the subset is out (the panic threshold), and the aging of latency
//! estimates.
//!
//! Membership reads it to plan (an ejected task is out, and a stand-in may replace it),
//! and tells it how much of the subset the plan found out; the table publishes the
//! ejections it says are in force.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::outliers::{Candidate, Cause, Outliers};
use super::slow_start::SlowStarts;
use crate::config::{BalanceConfig, Load};
use crate::route::endpoint::Endpoint;
use crate::route::gate::GateState;
use crate::route::table::Counters;

/// How often, and after how long without a timed response, a member's latency
/// estimate is aged.
const LATENCY_AGING: Duration = Duration::from_secs(1);

/// How many of the subset's first `k` members are out of rotation (ejected, or failed
/// and backing off), as of the last reconcile.
#[derive(Debug, Clone, Copy, Default)]
struct SubsetHealth {
    /// The subset's size without stand-ins (at most `k`).
    primary: usize,
    /// Of those, how many are out of rotation.
    out: usize,
    /// More than the configured share is out: ejected members serve again.
    panic: bool,
}

/// The members' health: its pieces, each with its own timers.
pub(super) struct Health<S> {
    outliers: Outliers,
    slow_starts: SlowStarts<S>,
    /// The subset's health at the last reconcile, for the panic threshold.
    subset: SubsetHealth,
    /// The panic threshold (`OutlierDetection::max_ejected_share`).
    max_ejected_share: f64,
    /// With Peak EWMA: when the latency estimates of members with no timed response
    /// lately are next aged (see `Endpoint::age_latency`).
    next_aging: Option<Instant>,
}

impl<S> Health<S> {
    pub(super) fn new(config: &BalanceConfig) -> Self {
        Self {
            outliers: Outliers::new(config.outliers, Instant::now()),
            slow_starts: SlowStarts::new(config.slow_start),
            subset: SubsetHealth::default(),
            max_ejected_share: config.outliers.max_ejected_share,
            next_aging: matches!(config.load, Load::PeakEwma { .. }).then(|| Instant::now() + LATENCY_AGING),
        }
    }

    /// When [`Health::on_timer`] is next due: the outlier detectors' next interval or
    /// an ejection's end, the next slow-start step, the next aging; `None` when none
    /// is pending.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        [self.outliers.next_deadline(), self.slow_starts.next_deadline(), self.next_aging]
            .into_iter()
            .flatten()
            .min()
    }

    /// Whether `task` is ejected now (whether or not the subset is in panic).
    pub(super) fn is_ejected(&self, task: usize, now: Instant) -> bool {
        self.outliers.is_ejected(task, now)
    }

    /// The tasks ejected now, ascending (in rotation anyway during a panic).
    pub(super) fn ejected(&self, now: Instant) -> Vec<usize> {
        self.outliers.ejected(now)
    }

    /// The tasks the table must leave out now, ascending: the ejected ones, unless the
    /// subset is in panic.
    pub(super) fn kept_out(&self, now: Instant) -> Vec<usize> {
        if self.subset.panic {
            Vec::new()
        } else {
            self.outliers.ejected(now)
        }
    }

    /// Whether the subset is in panic: more than the configured share of it is out,
    /// and ejected members serve again.
    pub(super) fn panic(&self) -> bool {
        self.subset.panic
    }

    /// Membership planned a subset of `primary` members (stand-ins left out), `out` of
    /// them out of rotation: records it, entering or leaving panic.
    pub(super) fn observe_subset(&mut self, primary: usize, out: usize, counters: &Counters) {
        debug_assert!(out <= primary, "{out} out of a subset of {primary}");
        let panic = out as f64 > self.max_ejected_share * primary as f64;
        if panic != self.subset.panic {
            if panic {
                Counters::add(&counters.panics, 1);
                tracing::warn!(
                    out,
                    subset = primary,
                    "panic: most of the subset is out; ejected members serve again"
                );
            } else {
                tracing::info!(out, subset = primary, "panic over");
            }
        }
        self.subset = SubsetHealth { primary, out, panic };
    }

    /// The gate a new connection opens with: probation when `returning` from a broken
    /// connection, slow start when `joining` while requests flow, else open (see
    /// [`SlowStarts::initial_gate`]).
    pub(super) fn opening_gate(&self, returning: bool, joining: bool) -> GateState {
        self.slow_starts.initial_gate(returning, joining)
    }

    /// The gate a probation member opens to once its probe succeeded.
    pub(super) fn after_probe(&self) -> GateState {
        self.slow_starts.after_probe()
    }

    /// Starts the slow start of `endpoint`, now.
    pub(super) fn start_slow_start(&mut self, endpoint: Arc<Endpoint<S>>, now: Instant) {
        self.slow_starts.start(endpoint, now);
    }

    /// `endpoint`, on probation, served its probe: its slow start begins (unless it
    /// began already).
    pub(super) fn probe_served(&mut self, endpoint: Arc<Endpoint<S>>, now: Instant) {
        tracing::debug!(task = endpoint.task, "probe served: slow start");
        if !self.slow_starts.contains(endpoint.id) {
            self.slow_starts.start(endpoint, now);
        }
    }

    /// Connection `endpoint` of `task` reported a run of failed calls: ejects it if the
    /// run stands out against the `others` (every other connection in rotation, by
    /// task) and the panic threshold allows one more ejection. Returns whether it was
    /// ejected.
    pub(super) fn on_run(
        &mut self,
        task: usize,
        endpoint: &Arc<Endpoint<S>>,
        others: &[(usize, Arc<Endpoint<S>>)],
        counters: &Counters,
        now: Instant,
    ) -> bool {
        let others: Vec<Candidate<'_, S>> =
            others.iter().map(|(task, endpoint)| Candidate { task: *task, endpoint }).collect();
        let may_eject = self.ejection_budget() > 0;
        let ejected = self.outliers.on_run(Candidate { task, endpoint }, &others, may_eject, now);
        if ejected {
            count_ejection(counters, task, Cause::Consecutive);
        }
        ejected
    }

    /// The health's timer work, over the members connected now (`connected`, by
    /// ascending task): the outlier detectors' interval (members whose ejection ended
    /// come back through slow start), the slow starts' next step, and the aging of
    /// latency estimates when due. `has_slot` says whether a task still has a slot
    /// (connected or not), for the detectors' memory. Returns whether the rotation
    /// changed (an ejection began or ended).
    pub(super) fn on_timer(
        &mut self,
        now: Instant,
        connected: &[(usize, Arc<Endpoint<S>>)],
        has_slot: impl Fn(usize) -> bool,
        counters: &Counters,
    ) -> bool {
        let changed = self.detect_outliers(now, connected, has_slot, counters);
        self.slow_starts.advance(now, |id| connected.iter().any(|(_, e)| e.id == id));
        if self.next_aging.is_some_and(|t| t <= now) {
            self.next_aging = Some(now + LATENCY_AGING);
            for (_, endpoint) in connected {
                endpoint.age_latency(now, LATENCY_AGING);
            }
        }
        changed
    }

    /// Runs the outlier detectors' interval work; members whose ejection ended come
    /// back through slow start. Returns whether the rotation changed.
    fn detect_outliers(
        &mut self,
        now: Instant,
        connected: &[(usize, Arc<Endpoint<S>>)],
        has_slot: impl Fn(usize) -> bool,
        counters: &Counters,
    ) -> bool {
        let candidates: Vec<Candidate<'_, S>> =
            connected.iter().map(|(task, endpoint)| Candidate { task: *task, endpoint }).collect();
        let budget = self.ejection_budget();
        let tick = self.outliers.tick(&candidates, has_slot, budget, now);
        for &task in &tick.ejected {
            count_ejection(counters, task, Cause::FailureRate);
        }
        for &task in &tick.returned {
            if let Some((_, endpoint)) = connected.iter().find(|(t, _)| *t == task) {
                tracing::info!(task, "ejection over: back in rotation, slow start");
                self.slow_starts.start(endpoint.clone(), now);
            }
        }
        !tick.ejected.is_empty() || !tick.returned.is_empty()
    }

    /// How many more members of the subset ejection may take out: the panic threshold's
    /// share of the subset (at least one), less those out already.
    fn ejection_budget(&self) -> usize {
        let SubsetHealth { primary, out, .. } = self.subset;
        let cap = ((primary as f64 * self.max_ejected_share).floor() as usize).max(1);
        cap.saturating_sub(out)
    }
}

fn count_ejection(counters: &Counters, task: usize, cause: Cause) {
    let counter = match cause {
        Cause::Consecutive => &counters.ejected_consecutive,
        Cause::FailureRate => &counters.ejected_failure_rate,
    };
    Counters::add(counter, 1);
    tracing::warn!(task, ?cause, "outlier ejected");
}
