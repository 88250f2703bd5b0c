//! `steady-lab`: the evaluation command line of steady.
//!
//! * `steady-lab subsets --algorithm NAME --frontends M --backends N --subset-size K` prints
//!   one line per frontend, `m: b1 b2 ... bk`, in preference order. **This format is a
//!   contract**: scripts diff it across versions.
//! * `steady-lab quality ...` prints the quality metrics of one scenario for each algorithm.
//! * `steady-lab grid ...` summarises utilisation and backend churn over the article's grid.

use std::io::{self, BufWriter, Write};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use steady_subset::Algorithm;

mod grid;
mod quality;

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
        /// consistent, ringsteady, ringsteady-unscaled, rocksteadier).
        #[arg(long, default_value = "rocksteadier")]
        algorithm: Algorithm,
        /// M, the number of frontend tasks.
        #[arg(long)]
        frontends: usize,
        /// N, the number of backend tasks.
        #[arg(long)]
        backends: usize,
        /// k, the subset size.
        #[arg(long)]
        subset_size: usize,
    },
    /// Print balance, diversity, churn and spread of one scenario, per algorithm.
    Quality(quality::QualityArgs),
    /// Summarise utilisation and backend churn over the article's grid
    /// (k = 20, 1 <= M <= 256, 20 <= N <= 256, M*k > N).
    Grid(grid::GridArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let result = match cli.command {
        Command::Subsets { algorithm, frontends, backends, subset_size } => {
            print_subsets(&mut out, &algorithm, frontends, backends, subset_size)
        }
        Command::Quality(args) => quality::run(&mut out, &args),
        Command::Grid(args) => grid::run(&mut out, &args),
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

/// The boxed error of a command.
type LabResult = Result<(), Box<dyn std::error::Error>>;

/// `m: b1 b2 ... bk`, one line per frontend (the contract format).
fn print_subsets(
    out: &mut impl Write,
    algorithm: &Algorithm,
    frontends: usize,
    backends: usize,
    size: usize,
) -> LabResult {
    use steady_subset::Subsetting;
    let mut subset = Vec::new();
    for m in 0..frontends {
        algorithm.subset_into(m, backends, size, &mut subset)?;
        write!(out, "{m}:")?;
        for b in &subset {
            write!(out, " {b}")?;
        }
        writeln!(out)?;
    }
    Ok(())
}
