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
//!
//! With a [`ClientView`] ([`simulate_with`]), [`CLIENT_REPORTED`] runs weighted-move on
//! the load as clients would report it per key range (gRFC A119), beside the run on the
//! exact per-key load.

pub mod clients;
pub mod figures;
pub mod report;
pub mod scenario;
pub mod simulate;
pub mod summary;
pub mod workload;

pub use clients::ClientView;
pub use scenario::{Event, Scenario, Topology};
pub use simulate::{simulate, simulate_with, Run, SimulateError, Trace, CLIENT_REPORTED, UNCONSTRAINED};
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
    run_all_with(scenarios, assigners, None, sweep)
}

/// As [`run_all`], with [`CLIENT_REPORTED`] beside `weighted-move` when `clients` is
/// given ([`simulate_with`]).
///
/// # Errors
///
/// The first [`SimulateError`].
pub fn run_all_with(
    scenarios: &[Scenario],
    assigners: &[&str],
    clients: Option<ClientView>,
    sweep: &Sweep,
) -> Result<Vec<Run>, SimulateError> {
    sweep.map("sharding scenarios", scenarios, |s| simulate_with(s, assigners, clients))
}
