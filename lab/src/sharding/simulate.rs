//! The simulation loop: one scenario, every assigner in lock-step on the same traffic.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use steady_assigner::{
    by_name, imbalance, AssignError, Assigner, Assignment, Load, ReplicaLimits, RunInput, SliceKey,
    SlicesPerTask, TaskState, Tasks,
};

use super::scenario::{Event, Scenario};
use super::workload::{sample_counts, Popularity};

/// What one assigner did over a scenario, step by step.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    /// The assigner's name.
    pub assigner: &'static str,
    /// Per step: the busiest serving task's load / the mean serving task's load, under
    /// the requests actually served in that step.
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
}

/// A scenario's traces, with what bounds every assigner.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// The scenario.
    pub scenario: Scenario,
    /// Per step: the achievable floor of imbalance: the hottest key's load over as many
    /// replicas as allowed, against the mean task load (at least 1).
    pub floor: Vec<f64>,
    /// One trace per assigner, in the order asked for.
    pub traces: Vec<Trace>,
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
        }
    }
}

impl std::error::Error for SimulateError {}

/// One assigner's state during a simulation.
struct Contender {
    assigner: Box<dyn Assigner + Send + Sync>,
    assignment: Option<Assignment>,
    trace: Trace,
}

/// Simulates `scenario` for each of `assigners` (names as `steady_assigner::by_name`
/// takes them): every step, apply the task events, run each assigner on the load of its
/// window, then serve the step's sampled requests under each assignment in force.
///
/// # Errors
///
/// [`SimulateError`] for an unknown name or a run that fails.
pub fn simulate(scenario: &Scenario, assigners: &[&str]) -> Result<Run, SimulateError> {
    let mut contenders = assigners
        .iter()
        .map(|&name| {
            let assigner = by_name(name).ok_or_else(|| SimulateError::UnknownAssigner(name.to_owned()))?;
            let trace = Trace {
                assigner: assigner.name(),
                imbalance: Vec::new(),
                busiest: Vec::new(),
                churn: Vec::new(),
                forced: Vec::new(),
                elapsed: Vec::new(),
                published: 0,
                slices_per_task: Vec::new(),
            };
            Ok(Contender { assigner, assignment: None, trace })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let popularity =
        Popularity::new(scenario.keys, scenario.exponent, scenario.rate, scenario.shift, scenario.seed);
    let keys = KeySpace::new(popularity.slice_keys());
    let limits = ReplicaLimits::new(1, scenario.max_replicas.max(1)).expect("1 <= max replicas");
    let mut states: BTreeMap<u32, TaskState> = (0..scenario.tasks).map(|t| (t, TaskState::Serving)).collect();
    let mut next_task = scenario.tasks;
    // Per-second rates of the last `window + delay` steps, in slice-key order.
    let mut history: VecDeque<Vec<f64>> = VecDeque::new();
    let mut floor = Vec::with_capacity(scenario.steps);

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
                _ => {}
            }
        }
        let tasks =
            Tasks::new(states.iter().map(|(&t, &s)| (t, s))).expect("the simulator's tasks are valid");
        let serving = tasks.serving_ids();
        // The run sees the `window` steps that end `delay` steps before it (newest first).
        let view = keys.observed(history.iter().skip(scenario.delay).take(scenario.window));
        for c in &mut contenders {
            let input = RunInput {
                previous: c.assignment.as_ref(),
                tasks: &tasks,
                load: &view,
                replicas: limits,
                placement: steady_assigner::Placement::none(),
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
        let replicas = scenario.max_replicas.min(serving.len()).max(1) as f64;
        let mean = total / serving.len() as f64;
        floor.push(if mean > 0.0 { (hottest / replicas / mean).max(1.0) } else { 1.0 });
        for c in &mut contenders {
            let loads = keys.task_loads(c.assignment.as_ref().expect("assigned above"), &rates, &serving);
            c.trace.imbalance.push(imbalance(&loads));
            c.trace.busiest.push(loads.iter().copied().fold(0.0, f64::max));
        }
        history.push_front(rates);
        history.truncate(scenario.window + scenario.delay);
    }
    Ok(Run { scenario: scenario.clone(), floor, traces: contenders.into_iter().map(|c| c.trace).collect() })
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

    /// The load an assigner sees: the mean of the given steps' rates (none yet: no load).
    fn observed<'a>(&self, steps: impl Iterator<Item = &'a Vec<f64>>) -> Load {
        let mut sum = vec![0.0; self.sorted.len()];
        let mut n = 0usize;
        for rates in steps {
            for (s, r) in sum.iter_mut().zip(rates) {
                *s += r;
            }
            n += 1;
        }
        if n == 0 {
            return Load::none();
        }
        Load::from_points(self.sorted.iter().zip(sum).map(|(&k, s)| (SliceKey(k), s / n as f64)))
            .expect("sampled rates are finite and non-negative")
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
            let share = load / slice.replicas.len() as f64;
            for r in &slice.replicas {
                if let Ok(t) = serving.binary_search(r) {
                    loads[t] += share;
                }
            }
        }
        loads
    }
}
