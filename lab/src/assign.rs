//! `steady-lab assign`: one assigner run from files, for other tools to call.
//!
//! ```text
//! steady-lab assign --algorithm NAME --tasks T --load FILE [--previous FILE] [--max-replicas R]
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
//! `NAME`: `weighted-move`, `rotation`, `lpt`, `static`, `consistent` (100 virtual nodes
//! per task), `consistent-load-aware`; also `static-100` and `consistent-1000`.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::Args;
use serde::Deserialize;
use steady_assigner::{by_name, Load, ReplicaLimits, RunInput, SliceKey, Tasks, NAMES};
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
    /// The most replicas a slice may have.
    #[arg(long, default_value_t = 1)]
    max_replicas: usize,
}

/// The load file's shape.
#[derive(Debug, Deserialize)]
struct LoadFile {
    keys: Vec<(u64, f64)>,
}

/// Runs one assigner run and prints the assignment (stdout) and report (stderr).
pub fn run(out: &mut impl Write, args: &AssignArgs) -> LabResult {
    let assigner = by_name(&args.algorithm).ok_or_else(|| {
        format!("unknown algorithm {:?}: expected one of {}", args.algorithm, NAMES.join(", "))
    })?;
    if args.tasks == 0 {
        return Err("--tasks must be at least 1".into());
    }
    let tasks = Tasks::serving(0..args.tasks).map_err(|e| format!("--tasks {}: {e}", args.tasks))?;
    let replicas = ReplicaLimits::new(1, args.max_replicas).map_err(|e| format!("--max-replicas: {e}"))?;
    let file: LoadFile = read_json(&args.load)?;
    let load = Load::from_points(file.keys.into_iter().map(|(k, l)| (SliceKey(k), l)))
        .map_err(|e| format!("{}: {e}", args.load.display()))?;
    let previous: Option<Assignment> = args.previous.as_deref().map(read_json).transpose()?;
    let outcome = assigner.assign(&RunInput {
        previous: previous.as_ref(),
        tasks: &tasks,
        load: &load,
        replicas,
        placement: steady_assigner::Placement::none(),
    })?;
    writeln!(out, "{}", serde_json::to_string(&outcome.assignment)?)?;
    eprintln!("{}", outcome.report);
    Ok(())
}

/// A JSON file, with its path in the error.
fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}
