//! Outlier ejection: which members fail markedly more calls than the rest, how long
//! they stay out, and the panic threshold's cap (see [`crate::OutlierDetection`]).
//!
//! The detectors read the counters requests already keep on each connection
//! (`requests`, `failures`, the run of consecutive failures): nothing is added to the
//! request path but the run counter. Rates are taken over snapshots the control task
//! takes once per interval.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::time::Instant;

use crate::config::OutlierDetection;
use crate::route::endpoint::Endpoint;

/// A failure-rate outlier must also fail at least this many times the others' share.
const OUTLIER_RATIO: f64 = 2.0;

/// A run of consecutive failures ejects when a member failing like the others would
/// show one in its calls with at most this expected count.
const RUN_EVIDENCE: f64 = 0.01;

/// The others' share of failed calls is taken at its plausible upper end,
/// `(failures + RUN_PRIOR) / (calls + RUN_PRIOR)`, so that a few good calls of theirs
/// prove little: with no failure in 10 calls it reads 23%, in 100 calls 3%. A run judged
/// too early is reported again at the next multiple of the limit.
const RUN_PRIOR: f64 = 3.0;

/// Why a member was ejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Cause {
    /// A run of failed calls (the consecutive-failure detector).
    Consecutive,
    /// A high share of failed calls over an interval (the failure-rate detector).
    FailureRate,
}

/// Counts of one connection at a moment.
#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    requests: u64,
    failures: u64,
}

impl Counts {
    /// The calls of `endpoint` that have completed (sent, and no longer in flight; a
    /// request counts as sent before it completes, so counting those in flight would
    /// understate the share that fails), and those that failed.
    fn of<S>(endpoint: &Endpoint<S>) -> Self {
        let in_flight = endpoint.calls.in_flight.load(Ordering::Relaxed) as u64;
        Self {
            requests: endpoint.calls.requests.load(Ordering::Relaxed).saturating_sub(in_flight),
            failures: endpoint.calls.failures.load(Ordering::Relaxed),
        }
    }

    /// The counts since `earlier` (zero if the counters are from another connection).
    fn since(self, earlier: Counts) -> Counts {
        Counts {
            requests: self.requests.saturating_sub(earlier.requests),
            failures: self.failures.saturating_sub(earlier.failures),
        }
    }

    fn add(self, other: Counts) -> Counts {
        Counts { requests: self.requests + other.requests, failures: self.failures + other.failures }
    }

    fn share(self) -> f64 {
        if self.requests == 0 {
            0.0
        } else {
            (self.failures as f64 / self.requests as f64).min(1.0)
        }
    }
}

/// What one tick changed.
#[derive(Debug, Default)]
pub(super) struct Tick {
    /// Tasks the failure-rate detector ejected.
    pub(super) ejected: Vec<usize>,
    /// Tasks whose ejection ended.
    pub(super) returned: Vec<usize>,
}

/// One task's ejection history and the snapshots of its connection.
#[derive(Debug)]
struct Record {
    /// Ejections not yet forgiven (each makes the next ejection longer).
    ejections: u32,
    /// Out of rotation until then.
    ejected_until: Option<Instant>,
    /// When `ejections` last rose or fell.
    changed: Instant,
    /// The connection the snapshots are of.
    id: u64,
    /// Its counts at the last tick, and at the tick before.
    last: Counts,
    before: Counts,
}

/// The outlier detectors' state, for every task with a connection or a recent ejection.
pub(super) struct Outliers {
    config: OutlierDetection,
    records: HashMap<usize, Record>,
    next_tick: Instant,
}

/// A connection the detectors look at, and its task.
pub(super) struct Candidate<'a, S> {
    pub(super) task: usize,
    pub(super) endpoint: &'a Arc<Endpoint<S>>,
}

impl Outliers {
    pub(super) fn new(config: OutlierDetection, now: Instant) -> Self {
        Self { config, records: HashMap::new(), next_tick: now + config.interval }
    }

    /// Whether `task` is ejected now.
    pub(super) fn is_ejected(&self, task: usize, now: Instant) -> bool {
        self.records.get(&task).and_then(|r| r.ejected_until).is_some_and(|until| until > now)
    }

    /// The tasks ejected now, ascending.
    pub(super) fn ejected(&self, now: Instant) -> Vec<usize> {
        let mut tasks: Vec<usize> = self
            .records
            .iter()
            .filter(|(_, r)| r.ejected_until.is_some_and(|u| u > now))
            .map(|(t, _)| *t)
            .collect();
        tasks.sort_unstable();
        tasks
    }

    /// When the control task must next call [`Outliers::tick`]: the next interval, or an
    /// ejection's end if sooner. `None` with both detectors off.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        if !self.config.enabled() {
            return None;
        }
        let ends = self.records.values().filter_map(|r| r.ejected_until).min();
        Some(ends.map_or(self.next_tick, |e| e.min(self.next_tick)))
    }

    /// A member reported a run of failed calls: ejects it if the run stands out against
    /// the others' failure share and `may_eject` allows one more ejection. Returns
    /// whether it was ejected.
    pub(super) fn on_run<S>(
        &mut self,
        failing: Candidate<'_, S>,
        others: &[Candidate<'_, S>],
        may_eject: bool,
        now: Instant,
    ) -> bool {
        let Some(limit) = self.config.consecutive_failures else { return false };
        if !may_eject || self.is_ejected(failing.task, now) {
            return false;
        }
        // The run ended if the member succeeded since.
        if failing.endpoint.calls.consecutive_failures() < limit {
            return false;
        }
        // The others' share over the last one to two intervals.
        let rest = others.iter().map(|c| self.recent(c)).fold(Counts::default(), Counts::add);
        // With no other member there is nothing to compare: the run stands out.
        let rest = if others.is_empty() {
            0.0
        } else {
            ((rest.failures as f64 + RUN_PRIOR) / (rest.requests as f64 + RUN_PRIOR)).min(1.0)
        };
        let calls = self.recent(&failing).requests.max(u64::from(limit)) as f64;
        let expected_runs = calls * rest.powi(limit.min(i32::MAX as u32) as i32);
        if expected_runs >= RUN_EVIDENCE {
            tracing::debug!(task = failing.task, rest, "a run of failures, but the others fail alike: kept");
            return false;
        }
        self.eject(failing.task, failing.endpoint.id, now);
        failing.endpoint.calls.reset_run();
        true
    }

    /// Once per interval: ends the ejections that are due, forgives old ones, runs the
    /// failure-rate detector over `candidates` (every connection, ejected or not: the
    /// ejected ones are only snapshotted) and takes new snapshots. `budget` is how many more members may be ejected (the panic
    /// threshold's cap).
    pub(super) fn tick<S>(
        &mut self,
        candidates: &[Candidate<'_, S>],
        connected: impl Fn(usize) -> bool,
        mut budget: usize,
        now: Instant,
    ) -> Tick {
        let mut returned = Vec::new();
        let base = self.config.base_ejection;
        for (task, record) in &mut self.records {
            if record.ejected_until.is_some_and(|until| until <= now) {
                record.ejected_until = None;
                record.changed = now;
                returned.push(*task);
            }
            if record.ejected_until.is_none()
                && record.ejections > 0
                && now.duration_since(record.changed) >= base
            {
                record.ejections -= 1;
                record.changed = now;
            }
        }
        let mut ejected = Vec::new();
        if now >= self.next_tick {
            self.next_tick = now + self.config.interval;
            if let Some(rate) = self.config.failure_rate {
                let counts: Vec<Counts> = candidates.iter().map(|c| self.since_tick(c)).collect();
                let total = counts.iter().copied().fold(Counts::default(), Counts::add);
                let mut outliers: Vec<(f64, usize)> = counts
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| c.requests >= rate.min_requests)
                    .filter_map(|(i, c)| {
                        let share = c.share();
                        let rest = Counts {
                            requests: total.requests - c.requests,
                            failures: total.failures - c.failures,
                        }
                        .share();
                        (share >= rate.threshold && share >= OUTLIER_RATIO * rest).then_some((share, i))
                    })
                    .collect();
                // The worst first, while the cap allows.
                outliers.sort_by(|a, b| b.0.total_cmp(&a.0));
                for (_, i) in outliers {
                    if budget == 0 {
                        break;
                    }
                    let c = &candidates[i];
                    if !self.is_ejected(c.task, now) {
                        self.eject(c.task, c.endpoint.id, now);
                        c.endpoint.calls.reset_run();
                        ejected.push(c.task);
                        budget -= 1;
                    }
                }
            }
            for c in candidates {
                let counts = Counts::of(c.endpoint);
                let record = self.record(c.task, c.endpoint.id, now);
                record.before = record.last;
                record.last = counts;
            }
        }
        // Bounded memory: keep what a connection or an ejection still needs.
        self.records.retain(|task, r| connected(*task) || r.ejected_until.is_some() || r.ejections > 0);
        Tick { ejected, returned }
    }

    /// Takes `task` out of rotation, for longer with each ejection not yet forgiven.
    fn eject(&mut self, task: usize, id: u64, now: Instant) {
        let (base, max) = (self.config.base_ejection, self.config.max_ejection);
        let record = self.record(task, id, now);
        record.ejections = record.ejections.saturating_add(1);
        let length = base.saturating_mul(record.ejections).min(max);
        record.ejected_until = Some(now + length);
        record.changed = now;
        tracing::warn!(task, ejections = record.ejections, out_for = ?length, "member ejected as an outlier");
    }

    /// The record of `task`, its snapshots reset if they are of another connection.
    fn record(&mut self, task: usize, id: u64, now: Instant) -> &mut Record {
        let record = self.records.entry(task).or_insert_with(|| Record {
            ejections: 0,
            ejected_until: None,
            changed: now,
            id,
            last: Counts::default(),
            before: Counts::default(),
        });
        if record.id != id {
            record.id = id;
            record.last = Counts::default();
            record.before = Counts::default();
        }
        record
    }

    /// A connection's counts since the last tick.
    fn since_tick<S>(&self, c: &Candidate<'_, S>) -> Counts {
        let now = Counts::of(c.endpoint);
        match self.records.get(&c.task).filter(|r| r.id == c.endpoint.id) {
            Some(r) => now.since(r.last),
            None => now,
        }
    }

    /// A connection's counts since the tick before the last (one to two intervals).
    fn recent<S>(&self, c: &Candidate<'_, S>) -> Counts {
        let now = Counts::of(c.endpoint);
        match self.records.get(&c.task).filter(|r| r.id == c.endpoint.id) {
            Some(r) => now.since(r.before),
            None => now,
        }
    }
}
