//! `steady-lab sharding`: the assigners simulated over the standard scenarios and the
//! placement scenarios, their tables on stdout and, with `--figures DIR`, the figures.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use steady_lab::sharding::{self, figures, report, Scenario, ASSIGNERS};
use steady_lab::sweep::Sweep;

use crate::LabResult;

/// Arguments of `steady-lab sharding`.
#[derive(Debug, Args)]
pub struct ShardingArgs {
    /// Only the scenarios whose names start with this (repeatable; e.g. `slicer`,
    /// `day-t20`, `stress`, `placement`). Default: all of them.
    #[arg(long)]
    scenario: Vec<String>,
    /// Only these assigners (repeatable). Default: all of them.
    #[arg(long)]
    assigner: Vec<String>,
    /// Shorter runs (at most 240 steps and 10,000 keys per scenario) for a quick look.
    #[arg(long)]
    quick: bool,
    /// Also draw the figures (SVG) into this directory.
    #[arg(long)]
    figures: Option<PathBuf>,
    /// Worker threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
}

/// The scenarios `args` choose.
fn scenarios(args: &ShardingArgs) -> Vec<Scenario> {
    Scenario::all()
        .into_iter()
        .filter(|s| args.scenario.is_empty() || args.scenario.iter().any(|p| s.name.starts_with(p.as_str())))
        .map(|s| if args.quick { s.shortened(240, 10_000) } else { s })
        .collect()
}

pub fn run(out: &mut impl Write, args: &ShardingArgs) -> LabResult {
    let chosen = scenarios(args);
    if chosen.is_empty() {
        return Err(format!("no scenario matches {:?}", args.scenario).into());
    }
    let assigners: Vec<&str> = if args.assigner.is_empty() {
        ASSIGNERS.to_vec()
    } else {
        args.assigner.iter().map(String::as_str).collect()
    };
    let runs = sharding::run_all(&chosen, &assigners, &Sweep::new(args.threads))?;
    write!(out, "{}", report::tables(&runs))?;
    if let Some(dir) = &args.figures {
        for f in figures::draw_all(&runs, dir)? {
            writeln!(out, "{}", dir.join(&f.file).display())?;
        }
    }
    Ok(())
}
