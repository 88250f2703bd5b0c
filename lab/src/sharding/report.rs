//! The sharding tables, in markdown (the CLI prints them; `steady-lab report` puts them
//! in `docs/report.md`), and the targets of the evaluation checked against them.

use std::fmt::Write as _;

use super::simulate::{Run, UNCONSTRAINED};
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

/// Weighted-move's targets (`docs/report.md` lists them), checked over the runs of `runs`
/// without a topology (the placement scenarios have targets of their own,
/// [`placement_verdicts`]). Targets whose baseline did not run are left out.
pub fn verdicts(runs: &[Run]) -> Vec<Verdict> {
    let summaries: Vec<(&Run, Vec<Summary>)> =
        runs.iter().filter(|r| r.scenario.topology.is_none()).map(|r| (r, summarise(r))).collect();
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

/// Every table: the targets first, then one table per scenario; then, when placement
/// scenarios ran, their targets and one table per placement scenario.
pub fn tables(runs: &[Run]) -> String {
    let mut out = String::new();
    let (placed, plain): (Vec<&Run>, Vec<&Run>) = runs.iter().partition(|r| r.scenario.topology.is_some());
    if !plain.is_empty() || placed.is_empty() {
        verdict_table(&mut out, &verdicts(runs));
        for run in &plain {
            scenario_table(&mut out, run);
        }
    }
    if !placed.is_empty() {
        out.push_str(PLACEMENT_HEADING);
        verdict_table(&mut out, &placement_verdicts(runs));
        for run in &placed {
            placement_table(&mut out, run);
        }
    }
    out
}

/// The heading of the placement tables.
const PLACEMENT_HEADING: &str = "**Placement under constraints** (imbalance is load over capacity; \
     violations: slices missing a constraint of the scenario's placement, summed over the \
     constraints; `weighted-move-unconstrained`: weighted-move on the same traffic without the \
     constraints and capacities)\n\n";

/// The imbalance the placement targets ask for where the floor allows it.
pub const PLACEMENT_IMBALANCE: f64 = 1.10;

/// The most run time weighted-move may take under constraints, against unconstrained
/// weighted-move on the same workload.
pub const PLACEMENT_TIME_RATIO: f64 = 2.0;

/// The churn budget of a run, forced moves excluded: weighted-move's default move and
/// merge budgets.
pub const CHURN_BUDGET: f64 = 0.10;

/// One placement scenario's table: a row per assigner.
pub fn placement_table(out: &mut String, run: &Run) {
    let infeasible = run.feasible.iter().filter(|&&f| !f).count();
    let _ = writeln!(
        out,
        "**{}**  \nachievable floor of imbalance (mean): {:.3}; runs whose task set cannot meet the \
         placement: {infeasible} of {}\n",
        run.scenario,
        floor_mean(run),
        run.feasible.len(),
    );
    out.push_str(
        "| assigner | violations (max, runs after the first) | where infeasible | imbalance mean | p90 | max | \
         run's own median/p90 | churn/run | worst run | forced/run | run ms mean/p90 | vs unconstrained mean/p90 |\n",
    );
    out.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for s in summarise(run) {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.3} | {:.3} | {:.3} | {:.3}/{:.3} | {} | {} | {} | {:.2}/{:.2} | {} |",
            s.assigner,
            s.violations_max.map_or("-".into(), |v| v.to_string()),
            s.violations_infeasible_max.map_or("-".into(), |v| v.to_string()),
            s.imbalance_mean,
            s.imbalance_p90,
            s.imbalance_max,
            s.planned_median,
            s.planned_p90,
            percent(s.churn_per_run),
            percent(s.churn_run_max),
            percent(s.forced_per_run),
            s.run_ms_mean,
            s.run_ms_p90,
            match (s.run_vs_unconstrained, s.run_p90_vs_unconstrained) {
                (Some(m), Some(p)) => format!("{m:.2}x/{p:.2}x"),
                _ => "-".into(),
            },
        );
    }
    out.push('\n');
}

/// Weighted-move's placement targets, checked over the runs of `runs` with a topology:
/// no violation after the first run wherever the task set can meet the placement; the
/// runs' own imbalance at most [`PLACEMENT_IMBALANCE`] where the floor allows it; churn
/// per run within [`CHURN_BUDGET`]; run time at most [`PLACEMENT_TIME_RATIO`] times
/// unconstrained weighted-move's.
pub fn placement_verdicts(runs: &[Run]) -> Vec<Verdict> {
    let summaries: Vec<(&Run, Summary, Option<Summary>)> = runs
        .iter()
        .filter(|r| r.scenario.topology.is_some())
        .filter_map(|r| {
            let all = summarise(r);
            let wm = find(&all, SUBJECT)?.clone();
            Some((r, wm, find(&all, UNCONSTRAINED).cloned()))
        })
        .collect();
    let mut out = Vec::new();
    if summaries.is_empty() {
        return out;
    }

    let missing: Vec<String> = summaries
        .iter()
        .filter(|(_, wm, _)| wm.violations_max.unwrap_or(0) > 0)
        .map(|(r, wm, _)| format!("{} in {}", wm.violations_max.unwrap_or(0), r.scenario.name))
        .collect();
    let unconstrained = summaries.iter().filter_map(|(_, _, u)| u.as_ref()?.violations_max).max();
    out.push(Verdict {
        target: "constraint violations 0 after the first run wherever the task set can meet the placement"
            .into(),
        measured: format!(
            "{}{}",
            if missing.is_empty() { "0 in every scenario".to_string() } else { missing.join(", ") },
            unconstrained
                .map_or(String::new(), |u| format!(" (unconstrained weighted-move: up to {u} slices)")),
        ),
        met: missing.is_empty(),
    });

    let floored: Vec<&(&Run, Summary, Option<Summary>)> =
        summaries.iter().filter(|(r, _, _)| seen_floor_median(r) <= PLACEMENT_IMBALANCE).collect();
    let worst = floored.iter().max_by(|a, b| a.1.planned_median.total_cmp(&b.1.planned_median));
    if let Some((run, wm, _)) = worst {
        let skipped: Vec<String> = summaries
            .iter()
            .filter(|(r, _, _)| seen_floor_median(r) > PLACEMENT_IMBALANCE)
            .map(|(r, wm, _)| {
                format!("{} {:.3} against {:.3}", r.scenario.name, wm.planned_median, seen_floor_median(r))
            })
            .collect();
        out.push(Verdict {
            target: format!(
                "the runs' own imbalance (load over capacity, median run) at most {PLACEMENT_IMBALANCE:.2} \
                 where the floor allows it"
            ),
            measured: format!(
                "worst {:.3} ({}){}",
                wm.planned_median,
                run.scenario.name,
                if skipped.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; where the floor is above {PLACEMENT_IMBALANCE:.2}, against the floor: {}",
                        skipped.join(", ")
                    )
                }
            ),
            met: wm.planned_median <= PLACEMENT_IMBALANCE,
        });
    }

    if let Some((run, wm, _)) =
        summaries.iter().max_by(|a, b| a.1.churn_run_max.total_cmp(&b.1.churn_run_max))
    {
        out.push(Verdict {
            target: format!(
                "churn per run within the budget ({}), forced moves and repairs excluded",
                percent(CHURN_BUDGET)
            ),
            measured: format!("worst run {} ({})", percent(wm.churn_run_max), run.scenario.name),
            met: wm.churn_run_max <= CHURN_BUDGET + 1e-9,
        });
    }

    let mut ratios: Vec<(f64, &str)> = summaries
        .iter()
        .filter_map(|(r, wm, _)| Some((wm.run_vs_unconstrained?, r.scenario.name.as_str())))
        .collect();
    ratios.sort_by(|a, b| a.0.total_cmp(&b.0));
    let worst_p90 = summaries
        .iter()
        .filter_map(|(r, wm, _)| Some((wm.run_p90_vs_unconstrained?, r.scenario.name.as_str())))
        .max_by(|a, b| a.0.total_cmp(&b.0));
    if let (Some(&(worst, name)), Some((p90, p90_name))) = (ratios.last(), worst_p90) {
        out.push(Verdict {
            target: format!(
                "run time at most {PLACEMENT_TIME_RATIO:.0}x unconstrained weighted-move's on the same workload \
                 (mean per run)"
            ),
            measured: format!(
                "{:.2}x at the median scenario, {worst:.2}x at the worst ({name}); 90th percentiles: \
                 {p90:.2}x at the worst ({p90_name})",
                ratios[(ratios.len() - 1) / 2].0
            ),
            met: worst <= PLACEMENT_TIME_RATIO,
        });
    }
    out
}

/// The median over the runs after the warm-up of the floor of the runs' own imbalance.
fn seen_floor_median(run: &Run) -> f64 {
    let from = run.scenario.warm_up().min(run.seen_floor.len());
    summary::median(&mut run.seen_floor[from..].to_vec()).unwrap_or(1.0)
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
