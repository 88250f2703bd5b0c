//! `steady-lab assign`: one assigner run from files, for other tools to call.
//!
//! ```text
//! steady-lab assign --algorithm NAME --tasks T --load FILE [--previous FILE] [--max-replicas R]
//! steady-lab assign --algorithm NAME --tasks T --load FILE [--previous FILE] --spec FILE
//! ```
//!
//! **This interface is a contract** (scripts and other tools call it):
//! * `--load FILE`: observed load as JSON, `{"keys": [[K, L], ...]}`: `K` a slice key (an
//!   unsigned 64-bit integer), `L` its load (a finite, non-negative number). Keys not listed
//!   carry no load; a key listed twice carries the sum.
//! * `--previous FILE`: the assignment in force, in `steady-slice`'s JSON form
//!   (`{"generation": G, "slices": [{"start": K, "replicas": [t, ...]}, ...]}`), validated;
//!   without it the run makes an initial assignment (generation 1).
//! * The run is for tasks `0..T`, all serving (tasks the previous assignment names at or
//!   above `T` are gone and their slices move), with 1 to `R` replicas per slice
//!   (default 1).
//! * stdout: the next assignment, in the same JSON form, on one line. It is the previous
//!   assignment itself (same generation) when the run changes nothing.
//! * stderr: the run's report, one line of `name=value` pairs (informative, not frozen).
//! * Bad input (unknown algorithm, malformed JSON, negative or non-finite load, an invalid
//!   previous assignment, `T = 0`, bad `R`) exits non-zero with one line on stderr.
//!
//! With `--spec FILE`, a job spec (`steady_assigner::JobSpec`'s JSON document: replicas,
//! constraints, goals and task profiles; `docs/slicer.md` has the format) says the rest:
//! * the replicas per slice come from the spec (`--max-replicas` with `--spec` is refused);
//!   the constraints (spread over zones or racks, a replica per zone) are the run's
//!   placement; the tasks `0..T` get their zones, racks and capacities from the spec's task
//!   rules; the goals configure `weighted-move` (its imbalance threshold and churn budget;
//!   the other assigners have no such settings and ignore them).
//! * stdout: one line of JSON,
//!   `{"assignment": A, "violations": [V, ...], "infeasible": null | "TEXT", "imbalance": F}`:
//!   `A` the next assignment as above; one `V` per constraint some slices miss,
//!   `{"constraint": "spread-zones", "slices": N, "key_share": F, "first": K}` (the
//!   constraint's name: `min-replicas`, `spread-zones`, `spread-racks`,
//!   `replica-per-zone`; how many slices miss it, their share of the key space, the start
//!   of the first of them), an empty list when the assignment meets every constraint;
//!   `infeasible` why no assignment of these tasks can meet the spec (naming the
//!   constraint, e.g. `constraint replica-per-zone cannot be met: zone c has no serving
//!   task`), the assignment then being the best the run could make; `imbalance` the
//!   busiest task's load over its capacity against the total load over the total capacity.
//! * A bad spec (malformed JSON, an unknown field, a value out of range) exits non-zero
//!   with one line on stderr naming the field (`job spec: tasks[0].capacity must be finite
//!   and above zero`).
//!
//! Without `--spec`, stdout is the assignment alone, exactly as before specs existed.
//!
//! `NAME`: `weighted-move`, `rotation`, `lpt`, `static`, `consistent` (100 virtual nodes
//! per task), `consistent-load-aware`; also `static-100` and `consistent-1000`.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::Args;
use serde::{Deserialize, Serialize};
use steady_assigner::{
    by_name, JobSpec, Load, Placement, ReplicaLimits, Report, RunInput, SliceKey, Tasks, WeightedMove,
    WeightedMoveConfig, NAMES,
};
use steady_slice::Assignment;

use crate::LabResult;

/// Arguments of `steady-lab assign`.
#[derive(Debug, Args)]
pub struct AssignArgs {
    /// The assigner: weighted-move, rotation, lpt, static, consistent, consistent-load-aware
    /// (also static-100, consistent-1000).
    #[arg(long)]
    algorithm: String,
    /// T: assign to tasks 0..T, all serving.
    #[arg(long)]
    tasks: u32,
    /// Observed load: JSON {"keys": [[K, L], ...]}.
    #[arg(long)]
    load: PathBuf,
    /// The previous assignment (steady-slice JSON); none: the initial assignment.
    #[arg(long)]
    previous: Option<PathBuf>,
    /// The most replicas a slice may have (not with --spec, which gives the replicas).
    #[arg(long, default_value_t = 1, conflicts_with = "spec")]
    max_replicas: usize,
    /// A job spec (JSON): replicas, constraints, goals, task profiles. stdout is then
    /// {"assignment", "violations", "infeasible", "imbalance"}.
    #[arg(long)]
    spec: Option<PathBuf>,
}

/// The load file's shape.
#[derive(Debug, Deserialize)]
struct LoadFile {
    keys: Vec<(u64, f64)>,
}

/// stdout with `--spec`.
#[derive(Debug, Serialize)]
struct SpecOutput<'a> {
    assignment: &'a Assignment,
    violations: Vec<ViolationOutput>,
    infeasible: Option<String>,
    imbalance: f64,
}

/// One violated constraint, as `SpecOutput` lists it.
#[derive(Debug, Serialize)]
struct ViolationOutput {
    constraint: &'static str,
    slices: usize,
    key_share: f64,
    first: u64,
}

impl<'a> SpecOutput<'a> {
    fn new(assignment: &'a Assignment, report: &Report) -> Self {
        Self {
            assignment,
            violations: report
                .violations
                .iter()
                .map(|v| ViolationOutput {
                    constraint: v.constraint.name(),
                    slices: v.slices,
                    key_share: v.key_share,
                    first: v.first.get(),
                })
                .collect(),
            infeasible: report.infeasible.as_ref().map(ToString::to_string),
            imbalance: report.imbalance_after,
        }
    }
}

/// Runs one assigner run and prints the assignment (stdout) and report (stderr).
pub fn run(out: &mut impl Write, args: &AssignArgs) -> LabResult {
    let mut assigner = by_name(&args.algorithm).ok_or_else(|| {
        format!("unknown algorithm {:?}: expected one of {}", args.algorithm, NAMES.join(", "))
    })?;
    if args.tasks == 0 {
        return Err("--tasks must be at least 1".into());
    }
    let mut tasks = Tasks::serving(0..args.tasks).map_err(|e| format!("--tasks {}: {e}", args.tasks))?;
    let spec = args.spec.as_deref().map(read_spec).transpose()?;
    let replicas = match &spec {
        Some(spec) => spec.replicas,
        None => ReplicaLimits::new(1, args.max_replicas).map_err(|e| format!("--max-replicas: {e}"))?,
    };
    if let Some(spec) = &spec {
        tasks = spec.profile(tasks).map_err(|e| format!("--spec: {e}"))?;
        if assigner.name() == "weighted-move" {
            let config = spec.weighted_move(WeightedMoveConfig::default());
            assigner = Box::new(WeightedMove::new(config).map_err(|e| format!("--spec: {e}"))?);
        }
    }
    let file: LoadFile = read_json(&args.load)?;
    let load = Load::from_points(file.keys.into_iter().map(|(k, l)| (SliceKey(k), l)))
        .map_err(|e| format!("{}: {e}", args.load.display()))?;
    let previous: Option<Assignment> = args.previous.as_deref().map(read_json).transpose()?;
    let outcome = assigner.assign(&RunInput {
        previous: previous.as_ref(),
        tasks: &tasks,
        load: &load,
        replicas,
        placement: spec.as_ref().map_or(Placement::none(), |s| &s.placement),
    })?;
    match spec {
        Some(_) => writeln!(
            out,
            "{}",
            serde_json::to_string(&SpecOutput::new(&outcome.assignment, &outcome.report))?
        )?,
        None => writeln!(out, "{}", serde_json::to_string(&outcome.assignment)?)?,
    }
    eprintln!("{}", outcome.report);
    Ok(())
}

/// A job spec, validated: a bad one is one line naming its file and the field.
fn read_spec(path: &Path) -> Result<JobSpec, String> {
    // Through a JSON value, so the error is the spec's (naming the field), not the
    // parser's position in the file.
    let value: serde_json::Value = read_json(path)?;
    serde_json::from_value(value).map_err(|e| format!("{}: {e}", path.display()))
}

/// A JSON file, with its path in the error.
fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}
