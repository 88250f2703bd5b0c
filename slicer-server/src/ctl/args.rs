//! `steadyctl`'s command line: where the fleet is, how to print, and the commands.

use std::path::PathBuf;
use std::time::Duration;

use clap::error::ErrorKind;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use steady_slice::MAX_TASK;

use crate::etcd_flags::EtcdFlags;

/// Inspect and steer a fleet of steady-slicer instances: its jobs, their leaders and
/// assignments, the instances; job specs, drains and runs.
#[derive(Debug, Parser)]
#[command(name = "steadyctl", version)]
pub struct Cli {
    /// The fleet's etcd (its assignment store), e.g. http://127.0.0.1:2379.
    #[arg(long, value_delimiter = ',', value_name = "URLS", global = true, conflicts_with = "specs_dir")]
    pub endpoints: Vec<String>,
    /// A memory-store fleet's spec directory (`<job>.json` files): spec commands and
    /// drain/undrain only.
    #[arg(long, value_name = "DIR", global = true)]
    pub specs_dir: Option<PathBuf>,
    /// Print JSON (stable field names, docs/steadyctl.md) instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
    /// The most one request may take, in milliseconds (an etcd request, the leader's
    /// page), 1 to 600,000.
    #[arg(long, value_name = "MS", default_value_t = 5000, global = true,
          value_parser = clap::value_parser!(u64).range(1..=600_000))]
    pub timeout_ms: u64,
    /// How to reach etcd (`--etcd-ca`, ...).
    #[command(flatten)]
    pub etcd: EtcdFlags,
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// `--timeout-ms`.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }
}

/// What to do.
#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// List the jobs: algorithm, tasks, consistency, leader, generation, drained tasks.
    Jobs,
    /// List the live instances and how many jobs each leads.
    Instances,
    /// A job's spec, leader and assignment (every slice).
    Show {
        /// The job.
        job: String,
    },
    /// A job's tasks: state, slices, share of the key space, load.
    Tasks {
        /// The job.
        job: String,
    },
    /// Read, write or remove job specs.
    #[command(subcommand)]
    Spec(SpecCommand),
    /// Drain tasks of a job: their slices move away, they get none, until undrained.
    Drain {
        /// The job.
        job: String,
        /// The tasks, by index.
        #[arg(required = true, value_parser = task_index())]
        tasks: Vec<u32>,
    },
    /// Undrain tasks of a job.
    Undrain {
        /// The job.
        job: String,
        /// The tasks, by index.
        #[arg(required = true, value_parser = task_index())]
        tasks: Vec<u32>,
    },
    /// Ask the job's leader for a run of its Assigner now.
    Run {
        /// The job.
        job: String,
    },
}

/// `steadyctl spec ...`.
#[derive(Debug, Clone, Subcommand)]
pub enum SpecCommand {
    /// Print a job's spec document.
    Get {
        /// The job.
        job: String,
    },
    /// Validate a spec document and store it (creating or replacing its job's).
    Put {
        /// The document (JSON; `-` reads standard input).
        file: PathBuf,
    },
    /// Remove a job's spec: the fleet stops serving the job.
    Delete {
        /// The job.
        job: String,
    },
    /// List the jobs that have a spec (and the stored specs that are refused).
    List,
}

impl Command {
    /// The command's name, as typed (`spec put`), for messages.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Jobs => "jobs",
            Self::Instances => "instances",
            Self::Show { .. } => "show",
            Self::Tasks { .. } => "tasks",
            Self::Spec(SpecCommand::Get { .. }) => "spec get",
            Self::Spec(SpecCommand::Put { .. }) => "spec put",
            Self::Spec(SpecCommand::Delete { .. }) => "spec delete",
            Self::Spec(SpecCommand::List) => "spec list",
            Self::Drain { .. } => "drain",
            Self::Undrain { .. } => "undrain",
            Self::Run { .. } => "run",
        }
    }

    /// Whether it works on a spec directory (it reads and writes specs only).
    pub fn specs_only(&self) -> bool {
        matches!(self, Self::Spec(_) | Self::Drain { .. } | Self::Undrain { .. })
    }
}

fn task_index() -> clap::builder::RangedI64ValueParser<u32> {
    clap::value_parser!(u32).range(0..=i64::from(MAX_TASK))
}

/// The command line, or the process ends: `--help` and `--version` print as usual, and
/// anything refused (an unknown flag or command, a value that does not parse, a missing
/// argument, neither or both of `--endpoints` and `--specs-dir`) is one line on stderr,
/// `steadyctl: ...`, and exit code 2.
pub fn parse_args() -> Cli {
    match try_parse(std::env::args_os()) {
        Ok(cli) => cli,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => e.exit(),
        Err(e) => {
            eprintln!("steadyctl: {}", crate::cli::one_line(&e, "steadyctl"));
            std::process::exit(2);
        }
    }
}

/// Parses `args` (the program's name first) as [`parse_args`] does, returning clap's
/// refusal instead of exiting.
///
/// # Errors
///
/// clap's error; also `MissingRequiredArgument` when neither `--endpoints` nor
/// `--specs-dir` is given.
pub fn try_parse<I, T>(args: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    // A negative number is a value (`drain users -1` is a bad task, not an unknown flag).
    let command = Cli::command().mut_subcommands(|sub| sub.allow_negative_numbers(true));
    let mut command = command.allow_negative_numbers(true);
    let mut matches = command.try_get_matches_from_mut(args)?;
    let cli = Cli::from_arg_matches_mut(&mut matches)?;
    if cli.endpoints.is_empty() && cli.specs_dir.is_none() {
        return Err(command.error(
            ErrorKind::MissingRequiredArgument,
            "where is the fleet? give --endpoints URLS (its etcd) or --specs-dir DIR (a memory-store fleet's specs)",
        ));
    }
    Ok(cli)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(args: &[&str]) -> String {
        let e = try_parse([&["steadyctl"], args].concat()).unwrap_err();
        crate::cli::one_line(&e, "steadyctl")
    }

    #[test]
    fn global_flags_come_before_or_after_the_command() {
        let before = try_parse(["steadyctl", "--json", "--endpoints", "http://a:2379,http://b:2379", "jobs"]);
        let after = try_parse(["steadyctl", "jobs", "--json", "--endpoints", "http://a:2379,http://b:2379"]);
        for cli in [before.unwrap(), after.unwrap()] {
            assert!(cli.json);
            assert_eq!(cli.endpoints, ["http://a:2379", "http://b:2379"]);
            assert!(matches!(cli.command, Command::Jobs));
        }
        let cli = try_parse(["steadyctl", "drain", "users", "3", "5", "--specs-dir", "/tmp"]).unwrap();
        assert!(matches!(cli.command, Command::Drain { ref tasks, .. } if tasks == &[3, 5]));
        assert!(cli.command.specs_only());
    }

    #[test]
    fn refusals_are_one_line() {
        for (args, expected) in [
            (&["jobs"][..], "where is the fleet?"),
            (&["--endpoints", "x", "--specs-dir", "d", "jobs"][..], "cannot be used with"),
            (&["--endpoints", "x", "drain", "users"][..], "required arguments were not provided"),
            (&["--endpoints", "x", "drain", "users", "-1"][..], "invalid value '-1'"),
            (&["--endpoints", "x", "drain", "users", "16777216"][..], "invalid value '16777216'"),
            (&["--endpoints", "x", "job"][..], "a similar command exists: 'jobs'"),
            (&["--endpoints", "x", "jobs", "--timeout-ms", "0"][..], "invalid value '0'"),
        ] {
            let line = refusal(args);
            assert!(line.contains(expected), "{args:?}: {line}");
            assert_eq!(line.lines().count(), 1, "{line}");
            assert!(line.ends_with("(see 'steadyctl --help')"), "{line}");
        }
    }
}
