//! `steadyctl`, the operator's command line of a fleet of `steady-slicer` instances: what
//! the `steadyctl` binary runs, as a library so that it can be tested piece by piece.
//! `docs/steadyctl.md` is its manual.
//!
//! ```text
//! steadyctl --endpoints http://etcd-0:2379 jobs
//! steadyctl --endpoints http://etcd-0:2379 instances --json
//! steadyctl --endpoints http://etcd-0:2379 show users
//! steadyctl --endpoints http://etcd-0:2379 tasks users
//! steadyctl --endpoints http://etcd-0:2379 spec put users.json
//! steadyctl --endpoints http://etcd-0:2379 drain users 3 5
//! steadyctl --endpoints http://etcd-0:2379 run users
//! steadyctl --specs-dir /etc/steady/jobs undrain users 3
//! ```
//!
//! * [`args`]: the command line ([`args::Cli`]): where the fleet is (`--endpoints URLS`
//!   with the `--etcd-*` access flags of [`crate::etcd_flags`], or `--specs-dir DIR` for a
//!   memory-store fleet, where only the spec commands and drain/undrain work), `--json`,
//!   `--timeout-ms`, and the commands.
//! * [`stores`]: the fleet's stores as the command line names them.
//! * [`output`]: tables and summaries for people, JSON for scripts.
//! * [`pages`]: a job's page on its leader (`GET /jobs/<job>.json`), for the loads.
//! * [`run`]: one command, to a [`Report`] (what to print) or a [`CtlError`].
//!
//! # Contract
//!
//! Exit 0 with the output on stdout (and notes, `steadyctl: note: ...`, on stderr: a
//! stored spec that does not read, loads that could not be had); exit 1 with one line on
//! stderr, `steadyctl: ...`, when the command failed (an unknown job, a spec refused
//! naming its field, etcd unreachable); exit 2 with one line when the command line is
//! refused. The JSON output's field names are stable (`docs/steadyctl.md` lists them):
//! fields may be added, none renamed or removed.
//!
//! A job is known when it has a spec: the commands that name a job fail with
//! [`CtlError::UnknownJob`] for any other. `drain` and `undrain` read the spec, change its
//! `drained` set and write it back: two edits of one spec at once race, and the last
//! write wins.

use std::io::Write;
use std::process::ExitCode;

pub mod args;
mod assignment;
mod commands;
mod error;
pub mod output;
pub mod pages;
pub mod stores;

pub use assignment::{slice_rows, slice_table, task_rows, SliceRow, TaskRow};
pub use error::{one_line, CtlError};

use args::{Cli, Command, SpecCommand};
use stores::Stores;

/// What a command prints: its output (stdout) and notes (stderr, a line each).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// For stdout: a table, a summary, or JSON; ends in a newline.
    pub stdout: String,
    /// For stderr, each as `steadyctl: note: ...`: what the output lacks and why.
    pub notes: Vec<String>,
}

impl Report {
    /// Output alone.
    pub fn out(stdout: impl Into<String>) -> Self {
        Self { stdout: stdout.into(), notes: Vec::new() }
    }
}

/// Runs `cli`'s command against the fleet's stores.
///
/// # Errors
///
/// [`CtlError`]: the stores unreachable or refusing, an unknown job, a spec refused, a
/// command that needs `--endpoints` given `--specs-dir`.
pub async fn run(cli: &Cli) -> Result<Report, CtlError> {
    let command = &cli.command;
    // Refused before connecting: nothing to reach for it on a spec directory.
    if cli.specs_dir.is_some() && !command.specs_only() {
        return Err(CtlError::NeedsEndpoints(command.name()));
    }
    let stores = Stores::open(cli).await?;
    let json = cli.json;
    match command {
        Command::Jobs => commands::jobs(&stores, json).await,
        Command::Instances => commands::instances(&stores, json).await,
        Command::Show { job } => assignment::show(&stores, job, json).await,
        Command::Tasks { job } => assignment::tasks(&stores, job, json, cli.timeout()).await,
        Command::Spec(SpecCommand::Get { job }) => commands::spec_get(&stores, job).await,
        Command::Spec(SpecCommand::Put { file }) => commands::spec_put(&stores, file, json).await,
        Command::Spec(SpecCommand::Delete { job }) => commands::spec_delete(&stores, job, json).await,
        Command::Spec(SpecCommand::List) => commands::spec_list(&stores, json).await,
        Command::Drain { job, tasks } => commands::drain(&stores, job, tasks, true, json).await,
        Command::Undrain { job, tasks } => commands::drain(&stores, job, tasks, false, json).await,
        Command::Run { job } => commands::run(&stores, job, json).await,
    }
}

/// The `steadyctl` program: parses the command line (exit 2 on a refusal), runs the
/// command on a runtime of one thread, prints its report, and says how it ended (1 with
/// one line on stderr when it failed).
pub fn main() -> ExitCode {
    let cli = args::parse_args();
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("steadyctl: cannot start a runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(run(&cli));
    // Nothing of the command outlives it (etcd's client tasks end with the runtime).
    drop(runtime);
    match result {
        Ok(report) => {
            // A closed pipe (`steadyctl jobs | head -1`) is not an error of ours.
            let _ = std::io::stdout().lock().write_all(report.stdout.as_bytes());
            for note in &report.notes {
                eprintln!("steadyctl: note: {}", one_line(note));
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("steadyctl: {}", one_line(&e.to_string()));
            ExitCode::FAILURE
        }
    }
}
