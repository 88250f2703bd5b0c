//! `steady-lab grid`: utilisation and backend churn over the article's figure-2 grid.

use std::io::Write;

use clap::Args;
use steady_lab::stats::{Better, Summary};
use steady_lab::sweep::Sweep;
use steady_subset::quality::{
    article_grid, churn, connection_counts, normalised_utilisation, subsets, Scenario,
};
use steady_subset::{Algorithm, SubsetError};

use crate::{chosen, LabResult};

/// Arguments of `steady-lab grid`.
#[derive(Debug, Args)]
pub struct GridArgs {
    /// Sample every STEP values of M and N (1 = the full grid, 59,148 scenarios).
    #[arg(long, default_value_t = 16)]
    step: usize,
    /// Only this algorithm (default: all of them).
    #[arg(long)]
    algorithm: Option<Algorithm>,
    /// Worker threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
}

/// What one scenario contributes to the summary.
#[derive(Debug, Clone, Copy)]
struct Point {
    utilisation: f64,
    growth_churn_max: usize,
    shrink_churn_max: usize,
}

fn measure(algorithm: &Algorithm, s: Scenario) -> Result<Point, SubsetError> {
    let base = subsets(algorithm, s.frontends, s.backends, s.size)?;
    let grown = subsets(algorithm, s.frontends, s.backends + 1, s.size)?;
    let shrunk = subsets(algorithm, s.frontends, s.backends - 1, s.size)?;
    Ok(Point {
        utilisation: normalised_utilisation(&connection_counts(&base, s.backends)),
        growth_churn_max: churn(&base, &grown).max,
        shrink_churn_max: churn(&base, &shrunk).max,
    })
}

/// Prints one summary row per algorithm.
pub fn run(out: &mut impl Write, args: &GridArgs) -> LabResult {
    let grid = article_grid(args.step);
    if grid.is_empty() {
        return Err(format!("step {} leaves no scenario in the grid", args.step).into());
    }
    let sweep = Sweep::new(args.threads);
    writeln!(
        out,
        "# article grid: k=20, 1<=M<=256, 20<=N<=256, M*k>N, step {}: {} scenarios",
        args.step,
        grid.len()
    )?;
    writeln!(
        out,
        "{:<24} {:>9} {:>9} {:>9} {:>14} {:>14}",
        "algorithm", "util mean", "util p10", "util min", "N+1 churn max", "N-1 churn max"
    )?;
    for algorithm in chosen(&args.algorithm) {
        let points = sweep.map(&algorithm.to_string(), &grid, |&s| measure(&algorithm, s))?;
        let utils: Vec<f64> = points.iter().map(|p| p.utilisation).collect();
        let u = Summary::of(&utils, Better::Higher).expect("the grid is not empty");
        writeln!(
            out,
            "{:<24} {:>9.4} {:>9.4} {:>9.4} {:>14} {:>14}",
            algorithm.to_string(),
            u.mean,
            u.tail,
            u.worst,
            points.iter().map(|p| p.growth_churn_max).max().unwrap_or(0),
            points.iter().map(|p| p.shrink_churn_max).max().unwrap_or(0),
        )?;
    }
    Ok(())
}
