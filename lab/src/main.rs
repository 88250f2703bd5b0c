//! `steady-lab`: the evaluation command line of steady.
//!
//! * `steady-lab subsets --algorithm NAME --frontends M --backends N --subset-size K` prints
//!   one line per frontend, `m: b1 b2 ... bk`, in preference order. **This format is a
//!   contract**: scripts diff it across versions. Without `--algorithm` it is the library's
//!   default, `rocksteadier-decimal`; `--algorithm rocksteadier` gives Rocksteadier's.
//! * `steady-lab quality ...` prints the quality metrics of one scenario for each algorithm.
//! * `steady-lab grid ...` summarises utilisation and backend churn over the article's grid.
//! * `steady-lab resize [--algorithm NAME]` resizes a job of real tonic servers under load
//!   (the article's figure 5 on real connections): the default algorithm, or NAME, against
//!   Deterministic.
//! * `steady-lab slicer [--store memory|etcd --endpoints ...]` runs the keyed Slicer loop
//!   end to end on real tonic servers (load reports, Assigner, faults).
//! * `steady-lab cache [--quick]` measures what keyed routing buys on real tonic servers
//!   (cache hits, database reads, tail latency) for every routing strategy, and through a
//!   rolling restart; prints the tables and writes the figures.
//! * `steady-lab zones [--quick]` routes across three zones on real tonic servers (a
//!   zone killed and back, frontends doubled, backends halved) with zone-unaware
//!   Rocksteadier, one channel per zone and steady's zone-aware mode side by side;
//!   prints a table per phase and writes a figure per phase.
//! * `steady-lab consistent [--seconds S]` measures exclusive ownership's availability on
//!   real tonic servers and a real etcd: with the bridge, without it, and eventual mode.
//! * `steady-lab chaos [--minutes N | --seconds S]` soaks the whole system on real
//!   processes (a three-member etcd, two `steady-slicer` instances, backend processes,
//!   frontends under load) while a schedule of faults runs, checks invariants throughout
//!   and exits non-zero when one is violated.
//! * `steady-lab assign --algorithm NAME --tasks T --load FILE [--previous FILE]
//!   [--max-replicas R | --spec FILE]` runs one assigner run: the next assignment as one
//!   line of JSON on stdout (with a job spec: the assignment with every constraint it
//!   misses), the report on stderr. **Also a contract**: see `assign.rs`.
//! * `steady-lab sharding [--scenario PREFIX] [--assigner NAME] [--quick] [--figures DIR]`
//!   simulates the assigners over the sharding scenarios and prints their tables.
//! * `steady-lab figures --out DIR` draws the evaluation figures (SVG).
//! * `steady-lab report --out FILE.md` measures every scenario family, draws the figures
//!   next to the report and writes the markdown tables (`docs/` is made this way).
//!
//! Arguments clap refuses (an unknown flag, a value that does not parse, a missing
//! argument) are one line on stderr, naming the argument and pointing at the command's
//! `--help`, and exit code 2; a command's own refusals are one line and exit code 1.

use std::io::{self, BufWriter, Write};
use std::process::ExitCode;

use std::path::PathBuf;

use clap::error::ErrorKind;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use steady_lab::experiments::{self, LabConfig, LabResults};
use steady_lab::sharding::{self, Scenario as ShardingScenario};
use steady_lab::sweep::Sweep;
use steady_lab::{figures, report};
use steady_subset::quality::Scenario;
use steady_subset::Algorithm;

mod assign;
mod cache;
mod chaos;
mod consistent;
mod exclusive;
mod grid;
mod output;
mod quality;
mod resize;
mod sharding_command;
mod slicer_demo;
mod zones;

/// Evaluate steady's subsetting algorithms.
#[derive(Debug, Parser)]
#[command(name = "steady-lab", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print each frontend's subset, one line per frontend: `m: b1 b2 ... bk`.
    Subsets {
        /// The algorithm (round-robin, deterministic, deterministic-balanced, random,
        /// consistent, ringsteady, ringsteady-unscaled, rocksteadier, rocksteadier-decimal).
        /// The default is the library's, rocksteadier-decimal; `--algorithm rocksteadier`
        /// pins Rocksteadier.
        #[arg(long, default_value_t = Algorithm::default())]
        algorithm: Algorithm,
        #[command(flatten)]
        scenario: ScenarioArgs,
    },
    /// Print balance, diversity, churn and spread of one scenario, per algorithm.
    Quality(quality::QualityArgs),
    /// Summarise utilisation and backend churn over the article's grid
    /// (k = 20, 1 <= M <= 256, 20 <= N <= 256, M*k > N).
    Grid(grid::GridArgs),
    /// Resize a backend job of real tonic servers under load, the default algorithm
    /// (decimal Rocksteadier, or --algorithm) and Deterministic side by side: connections,
    /// failures and latency per step, and an SVG.
    Resize(resize::ResizeArgs),
    /// The keyed Slicer loop end to end on real tonic servers: Slicelets report load, an
    /// Assigner rebalances, frontends follow; with the Assigner killed and a backend
    /// drained on the way. Prints a row per step and writes an SVG.
    Slicer(slicer_demo::SlicerArgs),
    /// What keyed routing buys, on real tonic servers: backends with bounded caches over a
    /// database, and every routing strategy (p2c, static and consistent hashing, Rudolph
    /// in process, the Slicer loop with one replica and with up to three) side by side on
    /// the same keys; a rolling restart. Prints the tables, writes the figures.
    Cache(cache::CacheArgs),
    /// Routing across three zones on real tonic servers: zone-unaware Rocksteadier, one
    /// channel per zone and steady's zone-aware mode, unkeyed and keyed, through a zone
    /// killed and back, a zone's frontends doubled and a zone's backends halved. Prints
    /// the cross-zone share against the lowest possible, balance, failures and
    /// connections per phase; writes a figure per phase.
    Zones(zones::ZonesArgs),
    /// Exclusive ownership's safety under real faults: backend tasks in processes of their
    /// own hold etcd leases while Assigners move slices every few hundred milliseconds
    /// and a schedule pauses a task past its lease, kills the Assigner mid-change,
    /// restarts etcd and cuts a task's link; then checks that no two tasks ever believed
    /// they owned one key at once. `--broken` runs a deliberately unsafe task, to show
    /// the checker catching it.
    Checker(exclusive::checker::CheckerArgs),
    /// (The checker's backend task.)
    #[command(hide = true)]
    ExclusiveNode(exclusive::node::NodeArgs),
    /// (The checker's scripted Assigner.)
    #[command(hide = true)]
    ExclusiveMover(exclusive::mover::MoverArgs),
    /// Exclusive ownership's availability on real tonic servers and a real etcd: the same
    /// skewed keyed workload with the lease protocol's bridge, without it, and in eventual
    /// mode; prints a row per mode (requests satisfied, refused, rerouted, p50/p99, recalls).
    Consistent(consistent::ConsistentArgs),
    /// A soak on real processes: a three-member etcd, two steady-slicer instances (one
    /// leading), backend processes and frontends under keyed and unkeyed load, while a
    /// schedule kills, drains and stalls backends, kills the leading instance and etcd
    /// members; invariants (requests lost per fault, slices without a serving replica,
    /// memory growth, control tasks alive, frontends on the newest generation) are
    /// checked throughout and printed with their bounds; a violated one exits non-zero.
    Chaos(chaos::ChaosArgs),
    /// (The chaos soak's backend task.)
    #[command(hide = true)]
    ChaosBackend(chaos::backend::BackendArgs),
    /// Run one assigner run: the next assignment as one line of JSON on stdout (with
    /// --spec, with the constraints it misses), the run's report on stderr.
    Assign(assign::AssignArgs),
    /// Simulate the assigners (weighted-move, rotation, LPT and the baselines) over the
    /// standard sharding scenarios and print their tables.
    Sharding(sharding_command::ShardingArgs),
    /// Draw the evaluation figures (SVG) into a directory.
    Figures {
        /// The directory to write the figures to (created if needed).
        #[arg(long)]
        out: PathBuf,
        #[command(flatten)]
        run: RunArgs,
    },
    /// Measure every scenario family (subsets, then the sharding simulation) and write the
    /// markdown report, with its figures in a `figures/` directory beside it.
    Report {
        /// The report file, e.g. docs/report.md.
        #[arg(long)]
        out: PathBuf,
        #[command(flatten)]
        run: RunArgs,
    },
}

/// One scenario: M frontends, N backends, subsets of k.
#[derive(Debug, Args)]
pub struct ScenarioArgs {
    /// M, the number of frontend tasks.
    #[arg(long)]
    frontends: usize,
    /// N, the number of backend tasks.
    #[arg(long)]
    backends: usize,
    /// k, the subset size.
    #[arg(long)]
    subset_size: usize,
}

impl ScenarioArgs {
    fn scenario(&self) -> Scenario {
        Scenario { frontends: self.frontends, backends: self.backends, size: self.subset_size }
    }
}

/// Options shared by the long-running commands.
#[derive(Debug, Args)]
struct RunArgs {
    /// Worker threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Sample the article's grid every STEP values of M and N (default 1: all of it).
    #[arg(long, default_value_t = 1)]
    grid_step: usize,
}

impl RunArgs {
    fn measure(&self) -> Result<LabResults, Box<dyn std::error::Error>> {
        let config = LabConfig { grid_step: self.grid_step.max(1), ..LabConfig::full() };
        Ok(experiments::run(&config, &Algorithm::all(), &Sweep::new(self.threads))?)
    }
}

/// `arg` accepts a negative number as its value, when it takes one (clap refuses the
/// setting on flags such as `--quick`).
fn negative_values(arg: clap::Arg) -> clap::Arg {
    if arg.get_action().takes_values() {
        arg.allow_negative_numbers(true)
    } else {
        arg
    }
}

/// The command line, or the process ends: help and the version print as usual (so does
/// the help clap prints when no command is given), and anything clap refuses is one line on
/// stderr and exit code 2.
fn parse_args() -> Cli {
    // A negative number is a value (`--tasks -1` is a bad `--tasks`, not an unknown flag).
    let command =
        Cli::command().mut_args(negative_values).mut_subcommands(|sub| sub.mut_args(negative_values));
    // The `--help` to point at: the subcommand's, when one was named.
    let path = match std::env::args_os().nth(1) {
        Some(sub) if command.find_subcommand(&sub).is_some() => {
            format!("steady-lab {}", sub.to_string_lossy())
        }
        _ => "steady-lab".to_owned(),
    };
    let parsed = command.try_get_matches().and_then(|mut matches| Cli::from_arg_matches_mut(&mut matches));
    match parsed {
        Ok(cli) => cli,
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) =>
        {
            e.exit()
        }
        Err(e) => {
            eprintln!("steady-lab: {}", steady_slicer_server::cli::one_line(&e, &path));
            std::process::exit(e.exit_code());
        }
    }
}

fn main() -> ExitCode {
    let cli = parse_args();
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let result = match cli.command {
        Command::Subsets { algorithm, scenario } => print_subsets(&mut out, &algorithm, scenario.scenario()),
        Command::Quality(args) => quality::run(&mut out, &args),
        Command::Grid(args) => grid::run(&mut out, &args),
        Command::Resize(args) => resize::run(&mut out, &args),
        Command::Assign(args) => assign::run(&mut out, &args),
        Command::Sharding(args) => sharding_command::run(&mut out, &args),
        Command::Slicer(args) => slicer_demo::run(&mut out, &args),
        Command::Cache(args) => cache::run(&mut out, &args),
        Command::Zones(args) => zones::run(&mut out, &args),
        Command::Checker(args) => exclusive::checker::run(&mut out, &args),
        Command::ExclusiveNode(args) => exclusive::node::run(&args),
        Command::ExclusiveMover(args) => exclusive::mover::run(&args),
        Command::Consistent(args) => consistent::run(&mut out, &args),
        Command::Chaos(args) => chaos::run(&mut out, &args),
        Command::ChaosBackend(args) => chaos::backend::run(&args),
        Command::Figures { out: dir, run } => run.measure().and_then(|results| {
            for f in figures::draw_all(&results, &dir)? {
                writeln!(out, "{}", dir.join(&f.file).display())?;
            }
            Ok(())
        }),
        Command::Report { out: file, run } => run.measure().and_then(|results| {
            let dir = file.parent().map(|p| p.join("figures")).unwrap_or_else(|| PathBuf::from("figures"));
            let drawn = figures::draw_all(&results, &dir)?;
            let mut text = report::render(&results, &drawn, "figures");
            let runs = sharding::run_all(
                &ShardingScenario::standard(),
                &sharding::ASSIGNERS,
                &Sweep::new(run.threads),
            )?;
            let drawn = sharding::figures::draw_all(&runs, &dir)?;
            text.push('\n');
            text.push_str(&sharding::report::section(&runs, &drawn, "figures"));
            std::fs::write(&file, text)?;
            writeln!(out, "{}", file.display())?;
            Ok(())
        }),
    };
    match result.and_then(|()| out.flush().map_err(Into::into)) {
        Ok(()) => ExitCode::SUCCESS,
        // A closed pipe (`steady-lab subsets ... | head`) is not an error.
        Err(e) if e.downcast_ref::<io::Error>().is_some_and(|e| e.kind() == io::ErrorKind::BrokenPipe) => {
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("steady-lab: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The algorithm named on the command line, or all of them.
fn chosen(algorithm: &Option<Algorithm>) -> Vec<Algorithm> {
    match algorithm {
        Some(a) => vec![a.clone()],
        None => Algorithm::all(),
    }
}

/// The boxed error of a command.
type LabResult = Result<(), Box<dyn std::error::Error>>;

/// `m: b1 b2 ... bk`, one line per frontend (the contract format).
fn print_subsets(out: &mut impl Write, algorithm: &Algorithm, scenario: Scenario) -> LabResult {
    use steady_subset::Subsetting;
    let mut subset = Vec::new();
    for m in 0..scenario.frontends {
        algorithm.subset_into(m, scenario.backends, scenario.size, &mut subset)?;
        write!(out, "{m}:")?;
        for b in &subset {
            write!(out, " {b}")?;
        }
        writeln!(out)?;
    }
    Ok(())
}
