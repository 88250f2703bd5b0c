//! `steady-lab sharding`: a deterministic simulator that holds the assigners of
//! `steady-assigner` against each other and against the papers' results.
//!
//! A [`Scenario`] is a job: named keys with Zipf popularity that moves over time (hot
//! keys reshuffled at a period, or a diurnal drift), tasks that fail and join, time in
//! steps (1 minute by default). Each step, every assigner runs once on the load of a
//! trailing window seen with a delay (Slicer: 5 minutes, 1 minute late), and then the
//! step's requests, Poisson draws around the expected rates, are served under each
//! assignment in force. All assigners see the same requests; nothing depends on threads
//! or clocks except the measured run times.
//!
//! The placement scenarios ([`Scenario::placement`]) give the tasks zones and capacities
//! and the job constraints (a [`Topology`]: replicas spread over zones, a replica per
//! zone), which every run is given; each assignment is checked against them, imbalance is
//! load over capacity, and [`UNCONSTRAINED`] weighted-move runs beside the constrained one
//! on the same traffic, the reference for run time and churn.
//!
//! [`summary`] turns the traces into the figures weighted-move's targets name: imbalance
//! (mean, p90, max) beside the achievable floor, key churn per run and per hour,
//! reaction time after a shift, the busiest task's load against the static model, slices
//! per task and run time; for the placement scenarios also constraint violations and the
//! run time against the unconstrained reference. [`figures`] draws them and [`report`]
//! writes the tables.

pub mod figures;
pub mod report;
pub mod scenario;
pub mod simulate;
pub mod summary;
pub mod workload;

pub use scenario::{Event, Scenario, Topology};
pub use simulate::{simulate, Run, SimulateError, Trace, UNCONSTRAINED};
pub use workload::Shift;

use crate::sweep::Sweep;

/// The assigners of the evaluation, as `steady_assigner::by_name` names them.
pub const ASSIGNERS: [&str; 8] = steady_assigner::NAMES;

/// Simulates every scenario (one per worker at a time) for every assigner.
///
/// # Errors
///
/// The first [`SimulateError`].
pub fn run_all(scenarios: &[Scenario], assigners: &[&str], sweep: &Sweep) -> Result<Vec<Run>, SimulateError> {
    sweep.map("sharding scenarios", scenarios, |s| simulate(s, assigners))
}
