//! `steady-lab quality`: every metric of one scenario, one row per algorithm.

use std::io::Write;

use clap::Args;
use steady_subset::quality::Report;
use steady_subset::Algorithm;

use crate::{chosen, LabResult, ScenarioArgs};

/// Arguments of `steady-lab quality`.
#[derive(Debug, Args)]
pub struct QualityArgs {
    /// Only this algorithm (default: all of them).
    #[arg(long)]
    algorithm: Option<Algorithm>,
    #[command(flatten)]
    scenario: ScenarioArgs,
    /// The rolling-restart window for the spread metric (default: k).
    #[arg(long)]
    window: Option<usize>,
}

/// Prints the table.
pub fn run(out: &mut impl Write, args: &QualityArgs) -> LabResult {
    let scenario = args.scenario.scenario();
    let window = args.window.unwrap_or(scenario.size);
    let algorithms = chosen(&args.algorithm);
    writeln!(
        out,
        "# M={} N={} k={} spread window={window}",
        scenario.frontends, scenario.backends, scenario.size
    )?;
    writeln!(
        out,
        "{:<24} {:>6} {:>9} {:>9} {:>11} {:>11} {:>9} {:>9} {:>7}",
        "algorithm",
        "util",
        "max/ideal",
        "diversity",
        "N+1 max/avg",
        "N-1 max/avg",
        "M+1 max",
        "k+1 max",
        "spread"
    )?;
    for algorithm in &algorithms {
        let r = Report::measure(algorithm, scenario, window)?;
        writeln!(
            out,
            "{:<24} {:>6.3} {:>9} {:>9.3} {:>11} {:>11} {:>9} {:>9} {:>7.3}",
            algorithm.to_string(),
            r.utilisation,
            format!("{}/{}", r.max_connections, r.ideal_max_connections),
            r.diversity,
            format!("{}/{:.2}", r.backend_growth_churn.max, r.backend_growth_churn.mean),
            format!("{}/{:.2}", r.backend_shrink_churn.max, r.backend_shrink_churn.mean),
            r.frontend_churn.max,
            r.size_churn.max,
            r.spread,
        )?;
    }
    Ok(())
}
