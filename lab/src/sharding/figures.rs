//! The sharding figures (SVG): imbalance over time per assigner, and churn against
//! imbalance over every scenario.

use std::path::Path;

use plotters::prelude::*;

use super::simulate::Run;
use super::summary::summarise;
use crate::figures::{legend, tick, DrawResult, Figure, CAPTION, FONT};

/// A stable colour per assigner.
pub fn colour(assigner: &str) -> RGBColor {
    match assigner {
        "weighted-move" => RGBColor(44, 160, 44),
        "rotation" => RGBColor(31, 119, 180),
        "lpt" => RGBColor(23, 190, 207),
        "static" => RGBColor(127, 127, 127),
        "static-100" => RGBColor(188, 189, 34),
        "consistent" => RGBColor(140, 86, 75),
        "consistent-1000" => RGBColor(148, 103, 189),
        "consistent-load-aware" => RGBColor(214, 39, 40),
        _ => RGBColor(0, 0, 0),
    }
}

/// Draws the sharding figures into `dir` (created if needed): the imbalance over time of
/// the reaction experiment and of one day (when they ran), and churn against imbalance.
///
/// # Errors
///
/// I/O or drawing errors.
pub fn draw_all(runs: &[Run], dir: &Path) -> DrawResult<Vec<Figure>> {
    std::fs::create_dir_all(dir)?;
    let mut figures = Vec::new();
    if let Some(run) = runs.iter().find(|r| r.scenario.name.starts_with("slicer")) {
        figures.push(over_time(
            run,
            dir,
            "sharding-reaction.svg",
            "Imbalance after hot-key shifts (Slicer 5.2.3)",
        )?);
    }
    let day = runs
        .iter()
        .find(|r| r.scenario.name == "day-t20-z1.2")
        .or_else(|| runs.iter().find(|r| r.scenario.name.starts_with("day")));
    if let Some(run) = day {
        figures.push(over_time(
            run,
            dir,
            "sharding-day.svg",
            "Imbalance over a day with a failure and a new task",
        )?);
    }
    // The placement scenarios measure imbalance over capacity: they have tables of their own.
    if runs.iter().any(|r| r.scenario.topology.is_none()) {
        figures.push(churn_against_imbalance(runs, dir)?);
    }
    Ok(figures)
}

/// One line per assigner: imbalance per step (log scale), with the floor in black.
fn over_time(run: &Run, dir: &Path, file: &str, title: &'static str) -> DrawResult<Figure> {
    let target = dir.join(file);
    let root = SVGBackend::new(&target, (1400, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let minutes = |step: usize| step as f64 * run.scenario.step_seconds / 60.0;
    let y_max = run.traces.iter().flat_map(|t| t.imbalance.iter().copied()).fold(2.0, f64::max) * 1.1;
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("{title}: {}", run.scenario), CAPTION)
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..minutes(run.scenario.steps), (0.95..y_max).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("minutes")
        .y_desc("imbalance: busiest task / mean (log scale)")
        .label_style(FONT)
        .x_label_formatter(&tick)
        .y_label_formatter(&tick)
        .draw()?;
    let n = run.traces.len();
    for (i, trace) in run.traces.iter().enumerate() {
        let c = colour(trace.assigner);
        let width = (1 + n.saturating_sub(i + 1) / 3) as u32;
        chart
            .draw_series(LineSeries::new(
                trace.imbalance.iter().enumerate().map(|(s, &y)| (minutes(s), y.max(0.95))),
                c.stroke_width(width),
            ))?
            .label(trace.assigner)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(width)));
    }
    chart
        .draw_series(LineSeries::new(
            run.floor.iter().enumerate().map(|(s, &y)| (minutes(s), y)),
            BLACK.stroke_width(1),
        ))?
        .label("floor (hottest key over max replicas)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLACK.stroke_width(1)));
    legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    root.present()?;
    Ok(Figure { file: file.to_owned(), title })
}

/// One point per assigner and scenario: mean key churn per run (log scale) against mean
/// imbalance (log scale).
fn churn_against_imbalance(runs: &[Run], dir: &Path) -> DrawResult<Figure> {
    let file = "sharding-churn.svg";
    let target = dir.join(file);
    let root = SVGBackend::new(&target, (1100, 700)).into_drawing_area();
    root.fill(&WHITE)?;
    // Churn 0 (the static assigners) is drawn on the left edge.
    const NO_CHURN: f64 = 1e-6;
    let points: Vec<(&'static str, f64, f64)> = runs
        .iter()
        .filter(|r| r.scenario.topology.is_none())
        .flat_map(summarise)
        .map(|s| (s.assigner, s.churn_per_run.max(NO_CHURN), s.imbalance_mean))
        .collect();
    let y_max = points.iter().map(|p| p.2).fold(2.0, f64::max) * 1.1;
    let mut chart = ChartBuilder::on(&root)
        .caption("Key churn per run against imbalance, every scenario (left edge: no churn)", CAPTION)
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((NO_CHURN * 0.8..1.0).log_scale(), (0.95..y_max).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("mean key churn per run, share of the key space (log scale)")
        .y_desc("mean imbalance (log scale)")
        .label_style(FONT)
        .x_label_formatter(&|x| format!("{x:.0e}"))
        .y_label_formatter(&tick)
        .draw()?;
    let mut names: Vec<&'static str> = points.iter().map(|p| p.0).collect();
    names.sort_unstable();
    names.dedup();
    for name in names {
        let c = colour(name);
        chart
            .draw_series(
                points.iter().filter(|p| p.0 == name).map(|&(_, x, y)| Circle::new((x, y), 5, c.filled())),
            )?
            .label(name)
            .legend(move |(x, y)| Circle::new((x + 8, y), 5, c.filled()));
    }
    legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    root.present()?;
    Ok(Figure { file: file.to_owned(), title: "Key churn against imbalance per assigner" })
}
