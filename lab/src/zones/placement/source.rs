//! The assignment sources: the Assigner's weighted-move, run in process under three
//! placements, each publishing its assignments on a watch channel its frontends follow.

use serde::{Deserialize, Serialize};
use steady_assigner::{
    Assigner, Assignment, Load, Placement, ReplicaLimits, RunInput, Spread, TaskProfile, TaskState, Tasks,
    WeightedMove, WeightedMoveConfig,
};
use tokio::sync::watch;

use crate::zones::fleet::{zone_of_backend, BACKENDS_PER_ZONE, ZONES};
use crate::zones::lowest::lowest_cross_zone;

/// The job's backend tasks: zone `t / 4` for task `t`.
const TASKS: usize = BACKENDS_PER_ZONE * ZONES.len();

/// The key space's size, `2^64`, as a float.
const SPACE: f64 = 18_446_744_073_709_551_616.0;

/// Where a keyed frontend's assignments come from: weighted-move under one placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Source {
    /// Two replicas per slice, no constraint: the baseline.
    Unconstrained,
    /// Two replicas per slice in distinct zones (`Spread::Zones`).
    SpreadZones,
    /// A replica of every slice in each of zones a, b and c (`replica_per_zone`, three
    /// replicas).
    ReplicaPerZone,
}

impl Source {
    pub(crate) const ALL: [Source; 3] = [Source::Unconstrained, Source::SpreadZones, Source::ReplicaPerZone];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Source::Unconstrained => "2 replicas, no constraint",
            Source::SpreadZones => "2 replicas spread over zones",
            Source::ReplicaPerZone => "a replica per zone (3)",
        }
    }

    /// The placement it asks for, as a job spec writes it: `{}`,
    /// `{"spread": "zones"}`, `{"replica_per_zone": true, "zones": ["a", "b", "c"]}`.
    pub(crate) fn placement(self) -> Placement {
        match self {
            Source::Unconstrained => Placement::default(),
            Source::SpreadZones => Placement { spread: Spread::Zones, ..Placement::default() },
            Source::ReplicaPerZone => Placement {
                replica_per_zone: true,
                zones: ZONES.iter().map(|z| (*z).to_owned()).collect(),
                ..Placement::default()
            },
        }
    }

    /// Replicas per slice: `min = max`.
    pub(crate) fn replicas(self) -> usize {
        match self {
            Source::Unconstrained | Source::SpreadZones => 2,
            Source::ReplicaPerZone => ZONES.len(),
        }
    }
}

/// Slices of an assignment none of whose replicas is live.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Lost {
    /// How many.
    pub(crate) slices: usize,
    /// Their share of the key space.
    pub(crate) key_share: f64,
}

/// The slices of `assignment` with no replica `live` says runs.
pub(crate) fn without_live_replica(assignment: &Assignment, live: impl Fn(usize) -> bool) -> Lost {
    let mut lost = Lost::default();
    for (slice, share) in slices_with_shares(assignment) {
        if !slice.replicas().iter().any(|&r| live(r as usize)) {
            lost.slices += 1;
            lost.key_share += share;
        }
    }
    lost
}

/// The lowest cross-zone share of keyed requests `assignment` allows with `frontends` in
/// each zone, each slice's requests spread evenly over its live replicas (see
/// [`lowest_cross_zone`]), weighted by the slices' key shares; slices with no live
/// replica are left out. `None` when no slice has one.
pub(crate) fn keyed_lowest(
    assignment: &Assignment,
    frontends: [usize; 3],
    live: impl Fn(usize) -> bool,
) -> Option<f64> {
    let (mut sum, mut weight) = (0.0, 0.0);
    for (slice, share) in slices_with_shares(assignment) {
        let mut replicas = [0usize; 3];
        for &r in slice.replicas().iter().filter(|&&r| live(r as usize)) {
            replicas[zone_of_backend(r as usize)] += 1;
        }
        let zones: Vec<(usize, usize)> = (0..3).map(|z| (frontends[z], replicas[z])).collect();
        if let Some(lowest) = lowest_cross_zone(&zones) {
            sum += lowest * share;
            weight += share;
        }
    }
    (weight > 0.0).then(|| sum / weight)
}

/// Each slice of `assignment` with its share of the key space.
fn slices_with_shares(assignment: &Assignment) -> impl Iterator<Item = (&steady_slice::Slice, f64)> {
    let slices = assignment.slices();
    slices.iter().enumerate().map(move |(i, s)| {
        let end = slices.get(i + 1).map_or(1u128 << 64, |n| u128::from(n.start.get()));
        (s, (end - u128::from(s.start.get())) as f64 / SPACE)
    })
}

/// Why the Assigner ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Trigger {
    /// The first run, from no assignment, before the traffic starts.
    Initial,
    /// The task set changed (zone a's tasks gone, or back).
    Tasks,
    /// Its cadence.
    Cadence,
}

/// A constraint an assignment misses, as a run's report gives it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Missed {
    /// The constraint's name (`spread-zones`, `replica-per-zone`, ...).
    pub(crate) constraint: String,
    /// The slices that miss it.
    pub(crate) slices: usize,
}

/// One run of the Assigner, from its report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Run {
    /// Milliseconds into the phase (the initial run: 0, before the steady phase).
    pub(crate) at_ms: u64,
    pub(crate) trigger: Trigger,
    pub(crate) generation: u64,
    /// Nothing changed, so nothing was published.
    pub(crate) unchanged: bool,
    /// The key space whose owners changed, and the part of it forced (moves off tasks
    /// that left, repairs of constraints: no budget limits them).
    pub(crate) key_churn: f64,
    pub(crate) forced_churn: f64,
    pub(crate) imbalance_after: f64,
    /// The constraints the run's assignment misses, and why the task set cannot meet
    /// them, if it cannot.
    pub(crate) violations: Vec<Missed>,
    pub(crate) infeasible: Option<String>,
    pub(crate) slices: usize,
    /// How long the run took, in microseconds.
    pub(crate) elapsed_us: u64,
    /// The run's assignment against the servers running then.
    pub(crate) without_live_replica: Lost,
}

/// One source's Assigner: its task set (zone a's tasks serving or gone), the load, the
/// assignment in force and the channel it is published on.
pub(crate) struct SourceAssigner {
    source: Source,
    assigner: WeightedMove,
    placement: Placement,
    replicas: ReplicaLimits,
    load: Load,
    serving: [bool; TASKS],
    current: Assignment,
    sender: watch::Sender<Assignment>,
}

impl SourceAssigner {
    /// The source's first assignment (weighted-move from no assignment: its fine-grained
    /// initial one, `slices_per_task` slices per task; weighted-move's default is 100),
    /// published; with `load` (the keys the frontends send) in every run.
    pub(crate) fn start(
        source: Source,
        load: Load,
        slices_per_task: usize,
    ) -> Result<(Self, Run), Box<dyn std::error::Error>> {
        let replicas = ReplicaLimits::new(source.replicas(), source.replicas())?;
        let placement = source.placement();
        placement.validate()?;
        let serving = [true; TASKS];
        let assigner = WeightedMove::new(WeightedMoveConfig {
            initial_slices_per_task: slices_per_task,
            ..WeightedMoveConfig::default()
        })?;
        let tasks = task_set(&serving)?;
        let outcome = assigner.assign(&RunInput {
            previous: None,
            tasks: &tasks,
            load: &load,
            replicas,
            placement: &placement,
        })?;
        let run = run_row(&outcome, Trigger::Initial, 0, |t| serving[t]);
        let (sender, _) = watch::channel(outcome.assignment.clone());
        let me = Self {
            source,
            assigner,
            placement,
            replicas,
            load,
            serving,
            current: outcome.assignment,
            sender,
        };
        Ok((me, run))
    }

    pub(crate) fn source(&self) -> Source {
        self.source
    }

    /// The assignments it publishes, from the one in force.
    pub(crate) fn subscribe(&self) -> watch::Receiver<Assignment> {
        self.sender.subscribe()
    }

    /// The assignment in force.
    pub(crate) fn current(&self) -> &Assignment {
        &self.current
    }

    /// Marks every task of `zone` serving, or gone (as the registry's task set shows
    /// tasks whose leases expired).
    pub(crate) fn set_zone_serving(&mut self, zone: usize, serving: bool) {
        for i in 0..BACKENDS_PER_ZONE {
            self.serving[zone * BACKENDS_PER_ZONE + i] = serving;
        }
    }

    /// One run from the assignment in force, published unless nothing changed; its
    /// report, with its assignment's slices without a `live` replica. `at_ms`: when, in
    /// the phase.
    pub(crate) fn run(
        &mut self,
        trigger: Trigger,
        at_ms: u64,
        live: impl Fn(usize) -> bool,
    ) -> Result<Run, Box<dyn std::error::Error>> {
        let tasks = task_set(&self.serving)?;
        let input = RunInput {
            previous: Some(&self.current),
            tasks: &tasks,
            load: &self.load,
            replicas: self.replicas,
            placement: &self.placement,
        };
        let outcome = self.assigner.assign(&input)?;
        let run = run_row(&outcome, trigger, at_ms, live);
        if !outcome.report.unchanged {
            self.current = outcome.assignment;
            self.sender.send_replace(self.current.clone());
        }
        Ok(run)
    }
}

/// The job's twelve tasks, each in its zone, zone a's serving or gone as `serving` says.
fn task_set(serving: &[bool; TASKS]) -> Result<Tasks, steady_assigner::AssignError> {
    let states = serving
        .iter()
        .enumerate()
        .map(|(t, &s)| (t as u32, if s { TaskState::Serving } else { TaskState::Gone }));
    let mut tasks = Tasks::new(states)?;
    for t in 0..TASKS {
        tasks.set_profile(t as u32, TaskProfile::in_zone(ZONES[zone_of_backend(t)]))?;
    }
    Ok(tasks)
}

fn run_row(
    outcome: &steady_assigner::Outcome,
    trigger: Trigger,
    at_ms: u64,
    live: impl Fn(usize) -> bool,
) -> Run {
    let r = &outcome.report;
    Run {
        at_ms,
        trigger,
        generation: r.generation,
        unchanged: r.unchanged,
        key_churn: r.key_churn,
        forced_churn: r.forced_churn,
        imbalance_after: r.imbalance_after,
        violations: r
            .violations
            .iter()
            .map(|v| Missed { constraint: v.constraint.name().to_owned(), slices: v.slices })
            .collect(),
        infeasible: r.infeasible.as_ref().map(ToString::to_string),
        slices: r.slices,
        elapsed_us: r.elapsed.as_micros() as u64,
        without_live_replica: without_live_replica(&outcome.assignment, live),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use steady_slice::SliceKey;

    fn uniform() -> Load {
        Load::none().with_uniform(600.0).unwrap()
    }

    fn zone_a_down(t: usize) -> bool {
        zone_of_backend(t) != 0
    }

    #[test]
    fn only_the_unconstrained_assignment_loses_slices_with_zone_a() {
        let mut lost = Vec::new();
        for source in Source::ALL {
            let (a, run) = SourceAssigner::start(source, uniform(), 100).unwrap();
            assert!(run.violations.is_empty() && run.infeasible.is_none(), "{source:?}: {run:?}");
            assert_eq!(a.current().slices().len(), 1200, "about 100 slices per task");
            assert!(a.current().slices().iter().all(|s| s.replicas().len() == source.replicas()));
            lost.push(without_live_replica(a.current(), zone_a_down).slices);
        }
        // Weighted-move's initial assignment puts slice k on tasks k and k + 1 (mod 12):
        // with tasks numbered zone by zone, pairs (0, 1), (1, 2), (2, 3) are both in zone
        // a, a quarter of the slices.
        assert_eq!(lost, [300, 0, 0]);
    }

    #[test]
    fn runs_move_off_a_zone_that_left_and_name_what_a_replica_per_zone_then_misses() {
        for source in Source::ALL {
            let (mut a, _) = SourceAssigner::start(source, uniform(), 100).unwrap();
            let mut watch = a.subscribe();
            a.set_zone_serving(0, false);
            let run = a.run(Trigger::Tasks, 1000, zone_a_down).unwrap();
            assert_eq!(run.without_live_replica, Lost::default(), "{source:?}");
            assert!(!run.unchanged && watch.has_changed().unwrap(), "published");
            assert_eq!(watch.borrow_and_update().generation(), 2);
            match source {
                Source::ReplicaPerZone => {
                    assert_eq!(
                        run.infeasible.as_deref(),
                        Some("constraint replica-per-zone cannot be met: zone a has no serving task")
                    );
                    assert_eq!(run.violations[0].constraint, "replica-per-zone");
                }
                _ => assert!(run.violations.is_empty() && run.infeasible.is_none(), "{source:?}: {run:?}"),
            }
            // Back: a replica per zone is repaired at once (forced), the others hold.
            a.set_zone_serving(0, true);
            let run = a.run(Trigger::Tasks, 0, |_| true).unwrap();
            assert!(run.violations.is_empty() && run.infeasible.is_none(), "{source:?}: {run:?}");
            if source == Source::ReplicaPerZone {
                assert!(run.forced_churn > 0.3, "{run:?}");
            }
        }
    }

    #[test]
    fn the_lowest_keyed_share_follows_the_slices_live_replicas() {
        let one = |replicas: Vec<u32>| {
            Assignment::new(1, vec![steady_slice::Slice::new(SliceKey(0), replicas)]).unwrap()
        };
        // A replica in each zone, frontends 6/3/3: zone a's excess, a sixth, crosses.
        let lowest = keyed_lowest(&one(vec![0, 4, 8]), [6, 3, 3], |_| true).unwrap();
        assert!((lowest - 1.0 / 6.0).abs() < 1e-9);
        // Frontends 4/4/4: nothing needs to.
        assert!(keyed_lowest(&one(vec![0, 4, 8]), [4, 4, 4], |_| true).unwrap().abs() < 1e-9);
        // Both replicas in zone a, a dead: none live, nothing to route.
        assert_eq!(keyed_lowest(&one(vec![0, 1]), [6, 3, 3], zone_a_down), None);
        assert_eq!(without_live_replica(&one(vec![0, 1]), zone_a_down), Lost { slices: 1, key_share: 1.0 });
    }
}
