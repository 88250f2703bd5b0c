//! The sharding tables, in markdown (the CLI prints them; `steady-lab report` puts them
//! in `docs/report.md`), and the targets of the evaluation checked against them.

use std::fmt::Write as _;

use super::simulate::Run;
use super::summary::{self, floor_mean, summarise, Summary, SETTLED, STATIC_MODEL};
use super::workload::Shift;
use crate::figures::Figure;

/// The assigner the targets are about.
pub const SUBJECT: &str = "weighted-move";

fn percent(x: f64) -> String {
    format!("{:.2}%", x * 100.0)
}

fn seconds(x: Option<f64>) -> String {
    match x {
        Some(s) if s.is_finite() => format!("{s:.0} s"),
        Some(_) => "never".into(),
        None => "-".into(),
    }
}

/// One scenario's table: a row per assigner.
pub fn scenario_table(out: &mut String, run: &Run) {
    let _ = writeln!(
        out,
        "**{}**  \nachievable floor of imbalance (mean): {:.3}\n",
        run.scenario,
        floor_mean(run)
    );
    out.push_str(
        "| assigner | imbalance mean | p90 | max | churn/run | worst run | median hour | worst hour | \
         reaction (median) | busiest vs static-100 | slices/task min/mean/max | run ms mean/max | published |\n",
    );
    out.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for s in summarise(run) {
        let (lo, mean, hi) = s.slices_per_task;
        let _ = writeln!(
            out,
            "| {} | {:.3} | {:.3} | {:.3} | {} | {} | {} | {} | {} | {} | {lo}/{mean:.0}/{hi} | {:.2}/{:.2} | {} |",
            s.assigner,
            s.imbalance_mean,
            s.imbalance_p90,
            s.imbalance_max,
            percent(s.churn_per_run),
            percent(s.churn_run_max),
            s.churn_hour_median.map_or("-".into(), percent),
            s.churn_hour_max.map_or("-".into(), percent),
            seconds(s.reaction_median()),
            s.busiest_reduction.map_or("-".into(), |r| format!("{:.1}% lower", r * 100.0)),
            s.run_ms_mean,
            s.run_ms_max,
            s.published,
        );
    }
    out.push('\n');
}

/// How the subject fared against one target.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// The target, in words.
    pub target: String,
    /// What we measured.
    pub measured: String,
    /// Whether the target is met.
    pub met: bool,
}

fn find<'a>(all: &'a [Summary], name: &str) -> Option<&'a Summary> {
    all.iter().find(|s| s.assigner == name)
}

/// Weighted-move's targets (`docs/report.md` lists them), checked over `runs`. Targets
/// whose baseline did not run are left out.
pub fn verdicts(runs: &[Run]) -> Vec<Verdict> {
    let summaries: Vec<(&Run, Vec<Summary>)> = runs.iter().map(|r| (r, summarise(r))).collect();
    let subject = |all: &'_ [Summary]| find(all, SUBJECT).cloned();
    let mut out = Vec::new();

    // Lower imbalance than static and consistent hashing on every skewed scenario.
    let mut wins = 0;
    let mut total = 0;
    let mut losses = Vec::new();
    for (run, all) in &summaries {
        let Some(wm) = subject(all) else { continue };
        for baseline in ["static", STATIC_MODEL, "consistent", "consistent-1000"] {
            if let Some(b) = find(all, baseline) {
                total += 1;
                if wm.imbalance_mean < b.imbalance_mean {
                    wins += 1;
                } else {
                    losses.push(format!("{} vs {baseline}", run.scenario.name));
                }
            }
        }
    }
    if total > 0 {
        let measured = if losses.is_empty() {
            format!("lower mean imbalance in {wins} of {total} comparisons")
        } else {
            format!("lower in {wins} of {total}; not in {}", losses.join(", "))
        };
        out.push(Verdict {
            target: "imbalance below static and consistent hashing on every scenario".into(),
            measured,
            met: wins == total,
        });
    }

    // Churn at least 10x below load-aware consistent hashing.
    let ratios: Vec<(String, f64)> = summaries
        .iter()
        .filter_map(|(run, all)| {
            let (wm, ch) = (subject(all)?, find(all, "consistent-load-aware")?);
            Some((run.scenario.name.clone(), ch.churn_per_run / wm.churn_per_run.max(1e-12)))
        })
        .collect();
    if let Some((name, worst)) = ratios.iter().min_by(|a, b| a.1.total_cmp(&b.1)) {
        let mut all: Vec<f64> = ratios.iter().map(|r| r.1).collect();
        out.push(Verdict {
            target: "key churn per run at least 10x below load-aware consistent hashing".into(),
            measured: format!(
                "{:.0}x lower at the median scenario, {worst:.1}x at the worst ({name})",
                summary::median(&mut all).unwrap_or(0.0)
            ),
            met: *worst >= 10.0,
        });
    }

    // Per run under 10% of the key space, excluding forced moves.
    let worst_run = summaries
        .iter()
        .filter_map(|(r, all)| Some((r, subject(all)?.churn_run_max)))
        .max_by(|a, b| a.1.total_cmp(&b.1));
    if let Some((run, worst)) = worst_run {
        out.push(Verdict {
            target: "under 10% of the key space per run, forced moves excluded".into(),
            measured: format!("worst run {} ({})", percent(worst), run.scenario.name),
            met: worst < 0.10,
        });
    }

    // The median hour under 20% (Slicer fig. 7 is production traffic: the days here,
    // not the experiments that reshuffle the hot keys on purpose).
    let worst_hour = summaries
        .iter()
        .filter(|(r, _)| matches!(r.scenario.shift, Shift::Diurnal { .. }))
        .filter_map(|(r, all)| Some((r, subject(all)?.churn_hour_median?)))
        .max_by(|a, b| a.1.total_cmp(&b.1));
    if let Some((run, worst)) = worst_hour {
        out.push(Verdict {
            target: "the median hour under 20% of the key space (the days)".into(),
            measured: format!("highest median hour {} ({})", percent(worst), run.scenario.name),
            met: worst < 0.20,
        });
    }

    // Slices per task within 50-150.
    let outside: Vec<String> = summaries
        .iter()
        .filter_map(|(r, all)| {
            let (_, mean, _) = subject(all)?.slices_per_task;
            (!(50.0..=150.0).contains(&mean)).then(|| format!("{} ({mean:.0})", r.scenario.name))
        })
        .collect();
    if summaries.iter().any(|(_, all)| subject(all).is_some()) {
        out.push(Verdict {
            target: "slices per task settling within 50-150 (mean after the last run)".into(),
            measured: if outside.is_empty() {
                "all scenarios within".into()
            } else {
                format!("outside: {}", outside.join(", "))
            },
            met: outside.is_empty(),
        });
    }

    // Reaction time on the periodic-shift scenarios (the stress case shifts every step
    // and has no time to settle).
    for (run, all) in &summaries {
        let periodic = matches!(run.scenario.shift, Shift::Every { steps } if steps > 1);
        if let (true, Some(wm)) = (periodic, subject(all)) {
            let median = wm.reaction_median();
            out.push(Verdict {
                target: format!(
                    "{}: imbalance under {SETTLED} within 480 s of a shift (median)",
                    run.scenario.name
                ),
                measured: format!(
                    "median {} over {} shifts (floor {:.2})",
                    seconds(median),
                    wm.reactions.len(),
                    floor_mean(run)
                ),
                met: median.is_some_and(|m| m <= 480.0),
            });
        }
    }

    // The busiest task against the static model (Slicer fig. 9: 63% median).
    let mut reductions: Vec<f64> =
        summaries.iter().filter_map(|(_, all)| subject(all)?.busiest_reduction).collect();
    if let Some(median) = summary::median(&mut reductions.clone()) {
        reductions.sort_by(f64::total_cmp);
        out.push(Verdict {
            target: "busiest task's load vs the static model (Slicer: 63% lower, median)".into(),
            measured: format!(
                "{:.0}% lower at the median scenario ({:.0}% to {:.0}%)",
                median * 100.0,
                reductions[0] * 100.0,
                reductions[reductions.len() - 1] * 100.0
            ),
            met: median >= 0.63,
        });
    }
    out
}

/// The targets as a markdown table.
pub fn verdict_table(out: &mut String, verdicts: &[Verdict]) {
    out.push_str("| target | measured | met |\n|---|---|---|\n");
    for v in verdicts {
        let _ = writeln!(out, "| {} | {} | {} |", v.target, v.measured, if v.met { "yes" } else { "**no**" });
    }
    out.push('\n');
}

/// Every table: the targets first, then one table per scenario.
pub fn tables(runs: &[Run]) -> String {
    let mut out = String::new();
    verdict_table(&mut out, &verdicts(runs));
    for run in runs {
        scenario_table(&mut out, run);
    }
    out
}

/// The `docs/report.md` section: how the simulation works, the figures, the tables.
pub fn section(runs: &[Run], figures: &[Figure], figures_dir: &str) -> String {
    let mut out = String::from(
        "## Sharding: the assigners against each other (`steady-lab sharding`)\n\n\
         A deterministic simulation (`lab/src/sharding/`): named keys hashed to slice keys, Zipf \
         popularity, requests drawn per step (Poisson around the expected rates), and every \
         assigner of `steady-assigner` run once per step on the mean load of a trailing window \
         seen with a delay (Slicer's 5 minutes, 1 minute late). Imbalance is the busiest serving \
         task's load over the mean, under the requests actually served in the step; key churn is \
         the share of the key space whose owner set changed (`Assignment::diff`). Metrics skip the \
         warm-up (window + delay). The floor is what no assigner can beat: the hottest key spread \
         over the most replicas allowed, against the mean task load.\n\n",
    );
    for f in figures {
        let _ = writeln!(out, "![{}]({figures_dir}/{})\n", f.title, f.file);
    }
    out.push_str("### Targets (weighted-move)\n\n");
    out.push_str(&tables(runs));
    out
}
