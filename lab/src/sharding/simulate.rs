//! The simulation loop: one scenario, every assigner in lock-step on the same traffic.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use steady_assigner::{
    by_name, imbalance, imbalance_over, AssignError, Assigner, Assignment, Load, Placement, ReplicaLimits,
    RunInput, SliceKey, SlicesPerTask, Spread, TaskState, Tasks,
};
use steady_proto::autosharding::ranges::ReportError;

use super::clients::ClientView;
use super::scenario::{Event, Scenario, Topology};
use super::workload::{sample_counts, Popularity};

/// The name of the reference a placement scenario adds beside `weighted-move`: the same
/// assigner on the same traffic and task events, with the same replica limits, but with
/// no constraint and every task capacity 1 (weighted-move before placement existed), so
/// its run time and churn are what the constraints are measured against.
pub const UNCONSTRAINED: &str = "weighted-move-unconstrained";

/// The name of the run [`simulate_with`] adds beside `weighted-move` when given a
/// [`ClientView`]: the same assigner on the same traffic and events, seeing the window's
/// load as its clients would report it (per key range, under the quantum) instead of
/// exactly, key by key.
pub const CLIENT_REPORTED: &str = "weighted-move-clients";

/// What one assigner did over a scenario, step by step.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    /// The assigner's name.
    pub assigner: &'static str,
    /// Per step: the busiest serving task's load / the mean serving task's load, under
    /// the requests actually served in that step; in a scenario with a [`Topology`],
    /// load over capacity: the busiest serving task's load over its capacity against the
    /// total load over the total capacity.
    pub imbalance: Vec<f64>,
    /// Per step: the busiest serving task's load, requests per second.
    pub busiest: Vec<f64>,
    /// Per step: the key-space share whose owners changed in that step's run.
    pub churn: Vec<f64>,
    /// Per step: the part of `churn` forced by a task leaving or by replica limits.
    pub forced: Vec<f64>,
    /// Per step: how long the run took.
    pub elapsed: Vec<Duration>,
    /// Runs that published a new generation.
    pub published: usize,
    /// Per step: slices per serving task after the run.
    pub slices_per_task: Vec<SlicesPerTask>,
    /// Per step: the run's own imbalance ([`steady_assigner::Report::imbalance_after`]):
    /// on the load it saw, the busiest task's load over its capacity against the total
    /// load over the total capacity.
    pub planned: Vec<f64>,
    /// Per step, in a scenario with a [`Topology`]: the slices of the assignment in force
    /// that miss a constraint of its placement (`Placement::check`, summed over the
    /// constraints); empty for the other scenarios.
    pub violations: Vec<usize>,
}

/// A scenario's traces, with what bounds every assigner.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// The scenario.
    pub scenario: Scenario,
    /// Per step: the achievable floor of imbalance: the hottest key's load over as many
    /// replicas as allowed, against the mean task load (at least 1). In a scenario with a
    /// [`Topology`], over capacity: the replicas on the tasks of the largest capacities,
    /// as many as the limits and the spread allow, against the total load over the total
    /// capacity.
    pub floor: Vec<f64>,
    /// One trace per assigner, in the order asked for (in a scenario with a [`Topology`],
    /// [`UNCONSTRAINED`] last, when `weighted-move` ran).
    pub traces: Vec<Trace>,
    /// Per step: whether the serving tasks can meet the scenario's placement at all
    /// (always, without a [`Topology`]).
    pub feasible: Vec<bool>,
    /// Per step: the floor of [`Trace::planned`]: as `floor`, over capacity, for the load
    /// the run saw.
    pub seen_floor: Vec<f64>,
}

impl Run {
    /// The trace of `assigner`, if it ran.
    pub fn trace(&self, assigner: &str) -> Option<&Trace> {
        self.traces.iter().find(|t| t.assigner == assigner)
    }
}

/// An error of a simulation: an unknown assigner name or a failed run.
#[derive(Debug)]
pub enum SimulateError {
    /// No assigner has this name.
    UnknownAssigner(String),
    /// A client's report the server would refuse (a bug in the simulator or the
    /// aggregation).
    ClientReport {
        /// The step.
        step: usize,
        /// What the server said.
        error: ReportError,
    },
    /// A run refused its input (a bug in the simulator or the assigner).
    Run {
        /// The assigner.
        assigner: &'static str,
        /// The step.
        step: usize,
        /// What it said.
        error: AssignError,
    },
}

impl std::fmt::Display for SimulateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::UnknownAssigner(name) => write!(f, "unknown assigner {name:?}"),
            Self::Run { assigner, step, error } => write!(f, "{assigner} failed at step {step}: {error}"),
            Self::ClientReport { step, error } => {
                write!(f, "a client's report refused at step {step}: {error}")
            }
        }
    }
}

impl std::error::Error for SimulateError {}

/// One assigner's state during a simulation.
struct Contender {
    assigner: Box<dyn Assigner + Send + Sync>,
    assignment: Option<Assignment>,
    trace: Trace,
    /// Runs without the scenario's constraints and profiles ([`UNCONSTRAINED`]).
    plain: bool,
    /// Sees the load as clients report it ([`CLIENT_REPORTED`]).
    reported: bool,
}

impl Contender {
    fn new(assigner: Box<dyn Assigner + Send + Sync>, name: &'static str, plain: bool) -> Self {
        let trace = Trace {
            assigner: name,
            imbalance: Vec::new(),
            busiest: Vec::new(),
            churn: Vec::new(),
            forced: Vec::new(),
            elapsed: Vec::new(),
            published: 0,
            slices_per_task: Vec::new(),
            planned: Vec::new(),
            violations: Vec::new(),
        };
        Self { assigner, assignment: None, trace, plain, reported: false }
    }
}

/// Simulates `scenario` for each of `assigners` (names as `steady_assigner::by_name`
/// takes them): every step, apply the task events, run each assigner on the load of its
/// window, then serve the step's sampled requests under each assignment in force. In a
/// scenario with a [`Topology`], every run gets the tasks' profiles and the placement, and
/// [`UNCONSTRAINED`] runs beside `weighted-move`.
///
/// # Errors
///
/// [`SimulateError`] for an unknown name or a run that fails.
pub fn simulate(scenario: &Scenario, assigners: &[&str]) -> Result<Run, SimulateError> {
    simulate_with(scenario, assigners, None)
}

/// As [`simulate`]; with `clients`, [`CLIENT_REPORTED`] runs beside `weighted-move` (when
/// it is among `assigners`; last, after [`UNCONSTRAINED`]), on the window's load as
/// `clients` report it.
///
/// # Errors
///
/// As [`simulate`], and [`SimulateError::ClientReport`].
pub fn simulate_with(
    scenario: &Scenario,
    assigners: &[&str],
    clients: Option<ClientView>,
) -> Result<Run, SimulateError> {
    let mut contenders = assigners
        .iter()
        .map(|&name| {
            let assigner = by_name(name).ok_or_else(|| SimulateError::UnknownAssigner(name.to_owned()))?;
            let name = assigner.name();
            Ok(Contender::new(assigner, name, false))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let topology = scenario.topology.as_ref();
    if topology.is_some() && assigners.contains(&"weighted-move") {
        let reference = by_name("weighted-move").expect("weighted-move is an assigner");
        contenders.push(Contender::new(reference, UNCONSTRAINED, true));
    }
    if clients.is_some() && assigners.contains(&"weighted-move") {
        let reported = by_name("weighted-move").expect("weighted-move is an assigner");
        contenders.push(Contender { reported: true, ..Contender::new(reported, CLIENT_REPORTED, false) });
    }
    let placement = topology.map_or(Placement::none(), |t| &t.placement);
    let popularity =
        Popularity::new(scenario.keys, scenario.exponent, scenario.rate, scenario.shift, scenario.seed);
    let keys = KeySpace::new(popularity.slice_keys());
    let min_replicas = topology.map_or(1, |t| t.min_replicas.max(1));
    let limits = ReplicaLimits::new(min_replicas, scenario.max_replicas.max(min_replicas))
        .expect("1 <= min replicas <= max replicas");
    let mut states: BTreeMap<u32, TaskState> = (0..scenario.tasks).map(|t| (t, TaskState::Serving)).collect();
    let mut next_task = scenario.tasks;
    // Per-second rates of the last `window + delay` steps, in slice-key order.
    let mut history: VecDeque<Vec<f64>> = VecDeque::new();
    let mut floor = Vec::with_capacity(scenario.steps);
    let mut feasible = Vec::with_capacity(scenario.steps);
    let mut seen_floor = Vec::with_capacity(scenario.steps);

    for step in 0..scenario.steps {
        for event in &scenario.events {
            match *event {
                Event::Fail { at, task } if at == step => {
                    states.insert(task, TaskState::Gone);
                }
                Event::Add { at } if at == step => {
                    states.insert(next_task, TaskState::Serving);
                    next_task += 1;
                }
                Event::Return { at, task } if at == step => {
                    states.insert(task, TaskState::Serving);
                }
                _ => {}
            }
        }
        let plain =
            Tasks::new(states.iter().map(|(&t, &s)| (t, s))).expect("the simulator's tasks are valid");
        let tasks = match topology {
            Some(t) => profiled(plain.clone(), t),
            None => plain.clone(),
        };
        let serving = tasks.serving_ids();
        feasible.push(placement.feasibility(&tasks, limits).is_ok());
        // The run sees the `window` steps that end `delay` steps before it (newest first).
        let (view, means) = keys.observed(history.iter().skip(scenario.delay).take(scenario.window));
        let seen_hottest = means.iter().copied().fold(0.0, f64::max);
        let seen_total: f64 = means.iter().sum();
        let reported = match clients {
            Some(c) if !means.is_empty() => {
                let seen = history.len().saturating_sub(scenario.delay).min(scenario.window);
                let seconds = seen as f64 * scenario.step_seconds;
                let seed = scenario.seed ^ (step as u64).wrapping_mul(0x2545_F491_4F6C_DD1D);
                Some(
                    c.load(&keys.sorted, &means, seconds, seed, serving.len())
                        .map_err(|error| SimulateError::ClientReport { step, error })?,
                )
            }
            _ => None,
        };
        let capacity: Vec<f64> = serving.iter().map(|&t| tasks.profile(t).capacity).collect();
        let most_replicas = match topology {
            Some(t) => placement_replicas(scenario, t, &tasks, &serving),
            None => scenario.max_replicas.min(serving.len()).max(1),
        };
        seen_floor.push(floor_over_capacity(seen_hottest, seen_total, &capacity, most_replicas));
        for c in &mut contenders {
            let input = RunInput {
                previous: c.assignment.as_ref(),
                tasks: if c.plain { &plain } else { &tasks },
                load: if c.reported { reported.as_ref().unwrap_or(&view) } else { &view },
                replicas: limits,
                placement: if c.plain { Placement::none() } else { placement },
            };
            let outcome = c.assigner.assign(&input).map_err(|error| SimulateError::Run {
                assigner: c.trace.assigner,
                step,
                error,
            })?;
            let report = &outcome.report;
            c.trace.churn.push(if step == 0 { 0.0 } else { report.key_churn });
            c.trace.forced.push(if step == 0 { 0.0 } else { report.forced_churn });
            c.trace.elapsed.push(report.elapsed);
            c.trace.published += usize::from(!report.unchanged);
            c.trace.slices_per_task.push(report.slices_per_task);
            c.trace.planned.push(report.imbalance_after);
            if topology.is_some() {
                // Checked against the scenario's placement and profiles, whatever the run
                // was given (the unconstrained reference is held to them too).
                let check = placement.check(&tasks, limits, &outcome.assignment);
                c.trace.violations.push(check.violations.iter().map(|v| v.slices).sum());
            }
            c.assignment = Some(outcome.assignment);
        }

        let rates = keys.in_key_order(
            &sample_counts(&popularity.rates(step), scenario.step_seconds, scenario.seed, step)
                .into_iter()
                .map(|c| c / scenario.step_seconds)
                .collect::<Vec<_>>(),
        );
        let total: f64 = rates.iter().sum();
        let hottest = rates.iter().copied().fold(0.0, f64::max);
        match topology {
            None => {
                let replicas = scenario.max_replicas.min(serving.len()).max(1) as f64;
                let mean = total / serving.len() as f64;
                floor.push(if mean > 0.0 { (hottest / replicas / mean).max(1.0) } else { 1.0 });
            }
            Some(_) => floor.push(floor_over_capacity(hottest, total, &capacity, most_replicas)),
        }
        for c in &mut contenders {
            let loads = keys.task_loads(c.assignment.as_ref().expect("assigned above"), &rates, &serving);
            c.trace.imbalance.push(match topology {
                None => imbalance(&loads),
                Some(_) => imbalance_over(&loads, &capacity),
            });
            c.trace.busiest.push(loads.iter().copied().fold(0.0, f64::max));
        }
        history.push_front(rates);
        history.truncate(scenario.window + scenario.delay);
    }
    Ok(Run {
        scenario: scenario.clone(),
        floor,
        traces: contenders.into_iter().map(|c| c.trace).collect(),
        feasible,
        seen_floor,
    })
}

/// `tasks` with the profiles `topology` gives them.
fn profiled(mut tasks: Tasks, topology: &Topology) -> Tasks {
    let listed: Vec<u32> = tasks.iter().map(|(t, _)| t).collect();
    for t in listed {
        tasks = tasks.with_profile(t, topology.profile(t)).expect("the scenario's profiles are valid");
    }
    tasks
}

/// The most replicas a slice can have under the scenario's limits and placement: spread
/// over zones caps them at the zones with serving tasks.
fn placement_replicas(scenario: &Scenario, topology: &Topology, tasks: &Tasks, serving: &[u32]) -> usize {
    let mut most = scenario.max_replicas.min(serving.len());
    if topology.placement.spread == Spread::Zones {
        let mut zones: Vec<Option<String>> = serving.iter().map(|&t| tasks.profile(t).zone.clone()).collect();
        zones.sort_unstable();
        zones.dedup();
        most = most.min(zones.len());
    }
    most.max(1)
}

/// The achievable floor of imbalance over capacity: the hottest key on `replicas`
/// replicas on the tasks of the largest capacities, each replica carrying an equal share,
/// against the total load over the total capacity (at least 1). A lower bound: it ignores
/// which tasks the constraints let the replicas share.
fn floor_over_capacity(hottest: f64, total: f64, capacity: &[f64], replicas: usize) -> f64 {
    let room: f64 = capacity.iter().sum();
    if total <= 0.0 || room <= 0.0 {
        return 1.0;
    }
    let mut largest = capacity.to_vec();
    largest.sort_by(|a, b| b.total_cmp(a));
    let smallest_chosen = largest[replicas.min(largest.len()) - 1];
    (hottest / replicas as f64 / smallest_chosen / (total / room)).max(1.0)
}

/// The keys in slice-key order, and the maps between that order and key indices.
struct KeySpace {
    /// Slice keys, ascending.
    sorted: Vec<u64>,
    /// `order[j]`: the key index of the `j`-th key in slice-key order.
    order: Vec<usize>,
}

impl KeySpace {
    fn new(slice_keys: &[SliceKey]) -> Self {
        let mut order: Vec<usize> = (0..slice_keys.len()).collect();
        order.sort_by_key(|&i| slice_keys[i].get());
        Self { sorted: order.iter().map(|&i| slice_keys[i].get()).collect(), order }
    }

    /// Per-key values by key index, rearranged into slice-key order.
    fn in_key_order(&self, by_index: &[f64]) -> Vec<f64> {
        self.order.iter().map(|&i| by_index[i]).collect()
    }

    /// The load an assigner sees: the mean of the given steps' rates (none yet: no load),
    /// with those means in slice-key order (none yet: empty).
    fn observed<'a>(&self, steps: impl Iterator<Item = &'a Vec<f64>>) -> (Load, Vec<f64>) {
        let mut sum = vec![0.0; self.sorted.len()];
        let mut n = 0usize;
        for rates in steps {
            for (s, r) in sum.iter_mut().zip(rates) {
                *s += r;
            }
            n += 1;
        }
        if n == 0 {
            return (Load::none(), Vec::new());
        }
        let means: Vec<f64> = sum.into_iter().map(|s| s / n as f64).collect();
        let load = Load::from_points(self.sorted.iter().zip(&means).map(|(&k, &m)| (SliceKey(k), m)))
            .expect("sampled rates are finite and non-negative");
        (load, means)
    }

    /// Each serving task's load under `assignment` (a replica carries its slice's load
    /// divided by the slice's replicas), in the order of `serving`.
    fn task_loads(&self, assignment: &Assignment, rates: &[f64], serving: &[u32]) -> Vec<f64> {
        let mut loads = vec![0.0; serving.len()];
        let slices = assignment.slices();
        let mut key = 0;
        for (i, slice) in slices.iter().enumerate() {
            let end = slices.get(i + 1).map_or(u128::MAX, |next| u128::from(next.start.get()));
            let mut load = 0.0;
            while key < self.sorted.len() && u128::from(self.sorted[key]) < end {
                load += rates[key];
                key += 1;
            }
            let share = load / slice.replicas().len() as f64;
            for r in slice.replicas() {
                if let Ok(t) = serving.binary_search(r) {
                    loads[t] += share;
                }
            }
        }
        loads
    }
}
