//! The metrics of a trace: imbalance, churn, reaction time, slices per task, run time.

use super::simulate::{Run, Trace, UNCONSTRAINED};

/// The imbalance a reaction must fall under (Slicer, OSDI 2016, section 5.2.3).
pub const SETTLED: f64 = 1.2;

/// The baseline the busiest task's load is compared with (Slicer fig. 9): the static
/// model of 100 equal slices per task.
pub const STATIC_MODEL: &str = "static-100";

/// One assigner's figures over one scenario, measured after the warm-up.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// The assigner.
    pub assigner: &'static str,
    /// Mean imbalance.
    pub imbalance_mean: f64,
    /// 90th percentile of imbalance (nearest rank).
    pub imbalance_p90: f64,
    /// Worst imbalance.
    pub imbalance_max: f64,
    /// Mean key churn per run, forced moves excluded.
    pub churn_per_run: f64,
    /// Worst key churn of one run, forced moves excluded.
    pub churn_run_max: f64,
    /// Median over whole hours (after the warm-up) of the key churn summed over the
    /// hour's runs, forced moves included; `None` when no whole hour was measured.
    pub churn_hour_median: Option<f64>,
    /// The worst such hour.
    pub churn_hour_max: Option<f64>,
    /// Per hot-key shift: seconds until a step's imbalance fell under [`SETTLED`]
    /// (`None`: not before the next shift).
    pub reactions: Vec<Option<f64>>,
    /// Median over steps of `1 - busiest / busiest under the static model`.
    pub busiest_reduction: Option<f64>,
    /// Slices per serving task after the last run: fewest, mean, most.
    pub slices_per_task: (usize, f64, usize),
    /// Mean run time, milliseconds.
    pub run_ms_mean: f64,
    /// Slowest run, milliseconds.
    pub run_ms_max: f64,
    /// Runs that published a new generation.
    pub published: usize,
    /// Mean key churn per run forced by tasks leaving, replica limits or repairs of
    /// constraints (which no budget limits).
    pub forced_per_run: f64,
    /// The runs' own imbalance ([`Trace::planned`]: on the load each saw, over
    /// capacity), median over the runs after the warm-up.
    pub planned_median: f64,
    /// Its 90th percentile (nearest rank).
    pub planned_p90: f64,
    /// 90th percentile of run time (nearest rank), milliseconds.
    pub run_ms_p90: f64,
    /// In a scenario with a topology: the most slices missing a constraint in one
    /// assignment, over the runs after the first whose task set can meet the placement
    /// (`None` without a topology).
    pub violations_max: Option<usize>,
    /// The same over the runs whose task set cannot meet it (`None`: there were none).
    pub violations_infeasible_max: Option<usize>,
    /// For `weighted-move` in a scenario with a topology: its mean run time over the mean
    /// run time of [`UNCONSTRAINED`] on the same traffic.
    pub run_vs_unconstrained: Option<f64>,
    /// The same for the 90th percentiles of run time.
    pub run_p90_vs_unconstrained: Option<f64>,
}

impl Summary {
    /// The median reaction time in seconds, shifts that never settled counting as
    /// infinitely slow; `None` without shifts.
    pub fn reaction_median(&self) -> Option<f64> {
        let mut times: Vec<f64> = self.reactions.iter().map(|r| r.unwrap_or(f64::INFINITY)).collect();
        median(&mut times)
    }
}

/// Summaries of every trace of `run`, in its order.
pub fn summarise(run: &Run) -> Vec<Summary> {
    let reference = run.trace(STATIC_MODEL);
    run.traces.iter().map(|t| summary(run, t, reference)).collect()
}

/// The run times of `trace`, milliseconds.
fn millis(trace: &Trace) -> Vec<f64> {
    trace.elapsed.iter().map(|d| d.as_secs_f64() * 1e3).collect()
}

/// The mean achievable floor of imbalance after the warm-up.
pub fn floor_mean(run: &Run) -> f64 {
    mean(&run.floor[run.scenario.warm_up().min(run.floor.len())..])
}

fn summary(run: &Run, trace: &Trace, reference: Option<&Trace>) -> Summary {
    let scenario = &run.scenario;
    let from = scenario.warm_up().min(trace.imbalance.len());
    let measured = &trace.imbalance[from..];
    let unforced: Vec<f64> =
        trace.churn[from..].iter().zip(&trace.forced[from..]).map(|(c, f)| (c - f).max(0.0)).collect();
    let mut hours: Vec<f64> =
        trace.churn[from..].chunks_exact(scenario.steps_per_hour()).map(|h| h.iter().sum()).collect();
    let reactions = scenario
        .shifts()
        .into_iter()
        .map(|shift| {
            let next = shift + scenario.shifts_period().unwrap_or(usize::MAX - shift);
            (shift..next.min(trace.imbalance.len()))
                .find(|&t| trace.imbalance[t] < SETTLED)
                .map(|t| (t - shift + 1) as f64 * scenario.step_seconds)
        })
        .collect();
    let busiest_reduction = reference.filter(|r| r.assigner != trace.assigner).and_then(|r| {
        let mut reductions: Vec<f64> = trace.busiest[from..]
            .iter()
            .zip(&r.busiest[from..])
            .filter(|(_, &s)| s > 0.0)
            .map(|(&b, &s)| 1.0 - b / s)
            .collect();
        median(&mut reductions)
    });
    let last = trace.slices_per_task.last().copied().unwrap_or_default();
    let run_ms = millis(trace);
    let topology = scenario.topology.is_some();
    // Violations after the first run, apart by whether the task set could meet the placement.
    let violations = |feasible: bool| {
        trace
            .violations
            .iter()
            .zip(&run.feasible)
            .skip(1)
            .filter(|&(_, &f)| f == feasible)
            .map(|(&v, _)| v)
            .max()
    };
    let unconstrained = run.trace(UNCONSTRAINED).filter(|_| topology && trace.assigner == "weighted-move");
    Summary {
        assigner: trace.assigner,
        imbalance_mean: mean(measured),
        imbalance_p90: percentile(measured, 0.9),
        imbalance_max: measured.iter().copied().fold(0.0, f64::max),
        churn_per_run: mean(&unforced),
        churn_run_max: unforced.iter().copied().fold(0.0, f64::max),
        churn_hour_max: hours.iter().copied().reduce(f64::max),
        churn_hour_median: median(&mut hours),
        reactions,
        busiest_reduction,
        slices_per_task: (last.min, last.mean, last.max),
        run_ms_mean: mean(&run_ms),
        run_ms_max: run_ms.iter().copied().fold(0.0, f64::max),
        published: trace.published,
        forced_per_run: mean(&trace.forced[from..]),
        planned_median: median(&mut trace.planned[from..].to_vec()).unwrap_or(1.0),
        planned_p90: percentile(&trace.planned[from..], 0.9),
        run_ms_p90: percentile(&run_ms, 0.9),
        violations_max: topology.then(|| violations(true).unwrap_or(0)),
        violations_infeasible_max: if topology { violations(false) } else { None },
        run_vs_unconstrained: unconstrained.map(|u| mean(&run_ms) / mean(&millis(u)).max(1e-9)),
        run_p90_vs_unconstrained: unconstrained
            .map(|u| percentile(&run_ms, 0.9) / percentile(&millis(u), 0.9).max(1e-9)),
    }
}

/// The arithmetic mean (0 for none).
pub fn mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        0.0
    } else {
        values.iter().sum::<f64>() / values.len() as f64
    }
}

/// The median (the lower middle value for an even count); `None` for none.
pub fn median(values: &mut [f64]) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    values.get(values.len().saturating_sub(1) / 2).copied()
}

/// The nearest-rank percentile `q` in (0, 1] (0 for none).
pub fn percentile(values: &[f64], q: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len().max(1)) - 1;
    sorted.get(rank).copied().unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_percentiles_by_nearest_rank() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), Some(2.0));
        assert_eq!(median(&mut []), None);
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.9), 9.0);
        assert_eq!(percentile(&v, 1.0), 10.0);
        assert_eq!(percentile(&[], 0.9), 0.0);
        assert_eq!(mean(&v), 5.5);
    }
}
