//! Producing Slicer-style assignments from observed load.
//!
//! A run of an [`Assigner`] takes the previous [`Assignment`] (or none), the job's
//! [`Tasks`] with their states, the observed [`Load`] and the [`ReplicaLimits`], and
//! returns the next assignment with a [`Report`] of what it did. The assigners:
//!
//! * [`WeightedMove`]: Slicer's weighted-move algorithm: forced moves off leaving tasks,
//!   replica counts within limits, merges of cold slices, weighted moves within a churn
//!   budget, splits of hot slices. Without a previous assignment it starts from a
//!   fine-grained one ([`initial`]).
//! * [`Rotation`]: Rudolph's: `c * n` fixed bins, owners shifted by a rotation chosen to
//!   minimise the peak with a penalty for moving.
//! * [`Lpt`]: `c * n` fixed bins, heaviest first, each to the least loaded task.
//! * Baselines: [`StaticRanges`] (equal ranges; Slicer's static model of 100 slices per
//!   task) and [`ConsistentHashing`] (virtual nodes, and its load-aware variant).
//!
//! Every assigner takes a [`Placement`] too (constraints over the tasks' zones and racks:
//! replicas spread over them, a replica in every zone) and balances load over each task's
//! capacity ([`TaskProfile`]); [`JobSpec`] is the declarative form of both, with the goals
//! and task rules. See [`placement`] and `docs/placement.md`.
//!
//! # Contracts
//!
//! * Every assignment a run returns is valid by `steady-slice`'s rules (it is built by
//!   [`Assignment::new`]); no slice names a task that is not serving; every slice has
//!   between `min` and `max` replicas (both capped at the number of serving tasks, `min`
//!   raised to the zones a replica per zone needs, `max` capped at the spread domains).
//! * Weighted-move and LPT meet the [`Placement`] wherever the serving tasks can; where
//!   they cannot, the run still returns the best assignment it can, and its [`Report`]
//!   names the [`Infeasible`] constraint and the [`Violation`]s.
//! * Generations increase by one per change; a run that changes nothing returns the
//!   previous assignment itself with [`Report::unchanged`] set, so nothing is published.
//! * Bad input is a typed [`AssignError`], never a panic: no serving tasks, duplicate or
//!   out-of-range task indices, negative or non-finite load, bad limits or configuration.
//! * Runs are deterministic: the same input gives the same output (no randomness, no
//!   clock except for [`Report::elapsed`]).
//!
//! # Dependencies
//!
//! std and `steady-slice` only (and, with the feature `serde`, serde, to read a
//! [`JobSpec`]). The service around the assigner (load reports, the
//! store, the Watch server) lives in `steady-slicer`; this crate must never depend on an
//! async runtime, tonic or an etcd client, so that simulators, benchmarks and the lab
//! can run it as a plain function.
//!
//! # Example
//!
//! ```
//! use steady_assigner::{Assigner, Load, Placement, ReplicaLimits, RunInput, SliceKey, Tasks, WeightedMove};
//!
//! let tasks = Tasks::serving(0..4)?;
//! let load = Load::from_points([(SliceKey(42), 100.0), (SliceKey(1 << 63), 10.0)])?;
//! let input = RunInput {
//!     previous: None,
//!     tasks: &tasks,
//!     load: &load,
//!     replicas: ReplicaLimits::new(1, 2)?,
//!     placement: Placement::none(),
//! };
//! let first = WeightedMove::default().assign(&input)?;
//! assert_eq!(first.assignment.generation(), 1);
//! let next = WeightedMove::default().assign(&RunInput { previous: Some(&first.assignment), ..input })?;
//! assert!(next.assignment.generation() >= 1);
//! # Ok::<(), steady_assigner::AssignError>(())
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub, rust_2018_idioms)]

mod baselines;
mod error;
pub mod handover;
pub mod initial;
mod load;
mod lpt;
mod pieces;
pub mod placement;
mod report;
mod rotation;
mod spec;
mod tasks;
mod weighted_move;

pub use baselines::consistent::ConsistentHashing;
pub use baselines::static_ranges::StaticRanges;
pub use error::AssignError;
pub use handover::warming_step;
pub use load::{Load, ReplicaLimits};
pub use lpt::Lpt;
pub use pieces::{imbalance, imbalance_over};
pub use placement::{Constraint, Infeasible, Placement, PlacementCheck, Spread, TaskProfile, Violation};
pub use report::{Moves, Outcome, Report, SlicesPerTask};
pub use rotation::Rotation;
pub use spec::{profile_tasks, Goals, JobSpec, SpecError, TaskRule, MAX_TASK_RULES};
pub use steady_slice::{Assignment, SliceKey};
pub use tasks::{TaskState, Tasks};
pub use weighted_move::{WeightedMove, WeightedMoveConfig};

/// One run's input.
#[derive(Debug, Clone, Copy)]
pub struct RunInput<'a> {
    /// The assignment in force, if any. Slices on tasks that are not serving are moved.
    pub previous: Option<&'a Assignment>,
    /// The job's tasks and their states.
    pub tasks: &'a Tasks,
    /// The observed load.
    pub load: &'a Load,
    /// How many replicas each slice has.
    pub replicas: ReplicaLimits,
    /// The placement constraints ([`Placement::none`]: none).
    pub placement: &'a Placement,
}

/// An algorithm that produces the next assignment from the previous one and the load.
///
/// Implementations hold only configuration: everything a run needs is in its
/// [`RunInput`], so one value serves any number of jobs and threads.
pub trait Assigner: std::fmt::Debug {
    /// The name [`by_name`] knows it by.
    fn name(&self) -> &'static str;

    /// One run.
    ///
    /// # Errors
    ///
    /// [`AssignError::NoServingTasks`] when no task serves,
    /// [`AssignError::GenerationExhausted`] when the previous generation is `u64::MAX`,
    /// [`AssignError::BadConfig`] for an invalid configuration of the assigner.
    fn assign(&self, input: &RunInput<'_>) -> Result<Outcome, AssignError>;
}

/// The names [`by_name`] knows, as the lab's `assign` command takes them.
pub const NAMES: [&str; 8] = [
    "weighted-move",
    "rotation",
    "lpt",
    "static",
    "static-100",
    "consistent",
    "consistent-1000",
    "consistent-load-aware",
];

/// An assigner with its default configuration by name: `weighted-move`, `rotation`,
/// `lpt`, `static` (one range per task), `static-100` (Slicer's static model),
/// `consistent` (100 virtual nodes per task), `consistent-1000`, `consistent-load-aware`
/// (100 virtual nodes per task, scaled by load).
pub fn by_name(name: &str) -> Option<Box<dyn Assigner + Send + Sync>> {
    Some(match name {
        "weighted-move" => Box::new(WeightedMove::default()),
        "rotation" => Box::new(Rotation::default()),
        "lpt" => Box::new(Lpt::default()),
        "static" => Box::new(StaticRanges::one_per_task()),
        "static-100" => Box::new(StaticRanges::slicer_model()),
        "consistent" => Box::new(ConsistentHashing::new(100)),
        "consistent-1000" => Box::new(ConsistentHashing::new(1000)),
        "consistent-load-aware" => Box::new(ConsistentHashing::load_aware(100)),
        _ => return None,
    })
}

/// The serving tasks, ascending, or [`AssignError::NoServingTasks`].
fn serving_of(tasks: &Tasks) -> Result<Vec<u32>, AssignError> {
    let serving = tasks.serving_ids();
    if serving.is_empty() {
        return Err(AssignError::NoServingTasks);
    }
    Ok(serving)
}
