//! `steady-lab sharding`: the assigners simulated over the standard scenarios and the
//! placement scenarios, their tables on stdout and, with `--figures DIR`, the figures.

use std::io::Write;
use std::path::PathBuf;

use clap::{Args, ValueEnum};
use steady_lab::sharding::{self, figures, report, ClientView, Scenario, ASSIGNERS};
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
    /// Where the assigners' load comes from: `exact` (every key's load over the window),
    /// or `clients`: also runs `weighted-move-clients`, weighted-move on the load as
    /// clients would report it per key range (gRFC A119), beside weighted-move on the
    /// exact load.
    #[arg(long, value_enum, default_value_t = LoadFrom::Exact)]
    load_from: LoadFrom,
    /// With `--load-from clients`: the clients each key's requests are split over.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// With `--load-from clients`: the most a range may carry of a client's load unless
    /// it holds a single key [default: per task, as steady-slicer sends it:
    /// 1/(16 tasks) within [1/1024, 1/20]].
    #[arg(long)]
    quantum: Option<f64>,
}

/// Where the assigners' load comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LoadFrom {
    /// Every key's load over the window.
    Exact,
    /// Also as clients report it, per key range.
    Clients,
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
    if args.load_from == LoadFrom::Clients
        && !(args.clients >= 1 && args.quantum.is_none_or(|q| (0.0..=1.0).contains(&q)))
    {
        return Err("--clients must be at least 1 and --quantum within [0, 1]".into());
    }
    let clients = (args.load_from == LoadFrom::Clients)
        .then_some(ClientView { clients: args.clients, quantum: args.quantum });
    let runs = sharding::run_all_with(&chosen, &assigners, clients, &Sweep::new(args.threads))?;
    write!(out, "{}", report::tables(&runs))?;
    if let Some(dir) = &args.figures {
        for f in figures::draw_all(&runs, dir)? {
            writeln!(out, "{}", dir.join(&f.file).display())?;
        }
    }
    Ok(())
}
