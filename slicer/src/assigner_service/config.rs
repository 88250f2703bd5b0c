//! [`AssignerConfig`]: how an Assigner service runs, and its validation.

use std::fmt;
use std::time::Duration;

use steady_assigner::{JobSpec, Placement, ReplicaLimits, TaskRule};
use steady_slice::guard::Consistency;

/// How an Assigner service runs ([`AssignerConfig::validate`] gives the ranges).
#[derive(Debug, Clone)]
pub struct AssignerConfig {
    /// Time between runs when nothing else happens (default 10 s; at least
    /// [`MIN_CADENCE`]).
    pub cadence: Duration,
    /// The least time between two publications (default 1 s), across terms.
    pub min_interval: Duration,
    /// Reports older than this are ignored (default 30 s; not zero).
    pub stale_after: Duration,
    /// Replicas per slice (default one).
    pub replicas: ReplicaLimits,
    /// The placement constraints (default none; see `steady_assigner::Placement`). A run
    /// that cannot meet them still publishes the best assignment it can and says which
    /// constraint it misses ([`super::AssignerStats::placement`]).
    pub placement: Placement,
    /// Task profiles by index (racks, capacities, zones for tasks their discovery source
    /// puts in none), applied to the task set before every run.
    pub task_rules: Vec<TaskRule>,
    /// The backoff after a store error, doubled up to 16 times this (default 100 ms; at
    /// least [`MIN_BACKOFF`]).
    pub backoff: Duration,
    /// Moves in two steps (default `None`: one step). With `Some(warm_up)`, a run that
    /// gives a key range a new owner first publishes a warming step (the range's current
    /// owners keep serving it, the new ones are named warming and get no client traffic;
    /// see `steady_assigner::handover`), then, `warm_up` later, the run's assignment
    /// itself. Runs wait while a handover is under way, so a switch is at most `warm_up`
    /// late. At most an hour. Not in exclusive mode (a handover has two tasks serve one
    /// range).
    pub handover: Option<Duration>,
    /// The job's consistency mode (default [`Consistency::Eventual`]). With
    /// [`Consistency::Exclusive`] (`docs/exclusive.md`) every write goes through
    /// `AssignmentStore::write_exclusive` (the generation replaced is recalled from the
    /// job's Slicelets before the new one is granted), a recall left pending is settled
    /// at the start of every term and before every run, `replicas` allows at most one per
    /// slice, there is no `handover`, and the store must have leases (`EtcdStore`).
    pub consistency: Consistency,
}

/// The shortest [`AssignerConfig::cadence`] [`AssignerConfig::validate`] accepts: runs
/// cost a full assigner pass, so the loop must not spin.
pub const MIN_CADENCE: Duration = Duration::from_millis(10);

/// The shortest [`AssignerConfig::backoff`] after a store error that
/// [`AssignerConfig::validate`] accepts.
pub const MIN_BACKOFF: Duration = Duration::from_millis(1);

/// Lost races in a row after which the service backs off before re-reading.
pub(super) const CONFLICTS_BEFORE_BACKOFF: u32 = 3;

impl Default for AssignerConfig {
    fn default() -> Self {
        Self {
            cadence: Duration::from_secs(10),
            min_interval: Duration::from_secs(1),
            stale_after: Duration::from_secs(30),
            replicas: ReplicaLimits::default(),
            placement: Placement::default(),
            task_rules: Vec::new(),
            backoff: Duration::from_millis(100),
            handover: None,
            consistency: Consistency::Eventual,
        }
    }
}

/// A configuration value out of range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AssignerConfigError {
    /// The field.
    pub field: &'static str,
    /// What it must be.
    pub expected: &'static str,
}

impl fmt::Display for AssignerConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "assigner config: {} must be {}", self.field, self.expected)
    }
}

impl std::error::Error for AssignerConfigError {}

impl AssignerConfig {
    /// With the replicas, constraints and task rules of `spec` (its goals configure the
    /// assigner itself: `JobSpec::weighted_move`).
    pub fn with_spec(mut self, spec: &JobSpec) -> Self {
        self.replicas = spec.replicas;
        self.placement = spec.placement.clone();
        self.task_rules = spec.tasks.clone();
        self
    }

    /// Checks every field's range.
    ///
    /// # Errors
    ///
    /// [`AssignerConfigError`] naming the first field out of range.
    pub fn validate(&self) -> Result<(), AssignerConfigError> {
        let bad = |field, expected| Err(AssignerConfigError { field, expected });
        if self.cadence < MIN_CADENCE {
            return bad("cadence", "at least 10 ms");
        }
        if self.backoff < MIN_BACKOFF {
            return bad("backoff", "at least 1 ms");
        }
        if self.stale_after.is_zero() {
            return bad("stale_after", "more than zero");
        }
        if self.handover.is_some_and(|w| w > Duration::from_secs(3600)) {
            return bad("handover", "at most an hour");
        }
        if self.consistency == Consistency::Exclusive {
            if self.replicas.max() > 1 {
                return bad("replicas", "at most 1 per slice in exclusive mode");
            }
            if self.handover.is_some() {
                return bad("handover", "none in exclusive mode (a handover has two tasks serve one range)");
            }
        }
        if self.placement.validate().is_err() {
            return bad("placement.zones", "distinct labels of 1 to 63 bytes of [A-Za-z0-9._-]");
        }
        if (JobSpec { tasks: self.task_rules.clone(), ..JobSpec::default() }).validate().is_err() {
            return bad(
                "task_rules",
                "ranges first <= last, valid zone and rack labels, capacities above zero",
            );
        }
        Ok(())
    }
}
