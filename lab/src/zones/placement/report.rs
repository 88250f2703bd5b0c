//! The placement experiment's tables (stdout) and its figure (one SVG over the three
//! phases).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use steady_lab::figures::{legend, tick, DrawResult, CAPTION, FONT};

use super::source::{Lost, Source};
use super::{describe, Row, Setup, CADENCE, PHASES};
use crate::zones::fleet::{BACKENDS_PER_ZONE, ZONES};
use crate::zones::Settings;
use crate::LabResult;

/// The figure's file.
pub(crate) const FIGURE: &str = "zones-placement.svg";

fn colour(source: Source) -> RGBColor {
    match source {
        Source::Unconstrained => RGBColor(214, 39, 40),
        Source::SpreadZones => RGBColor(31, 119, 180),
        Source::ReplicaPerZone => RGBColor(44, 160, 44),
    }
}

fn percent(x: f64) -> String {
    if x.is_nan() {
        "-".to_owned()
    } else {
        format!("{:.1}", x * 100.0)
    }
}

fn lost(l: Lost) -> String {
    format!("{} ({:.1} %)", l.slices, l.key_share * 100.0)
}

/// One table per phase, then the runs that changed an assignment (and how many more
/// changed nothing while missing a constraint).
pub(super) fn print(out: &mut impl Write, s: &Settings, setup: Setup, rows: &[Row]) -> LabResult {
    let slices = rows.first().map_or(0, |r| r.slices);
    writeln!(
        out,
        "# steady-lab zones --placement: zones {}, {} backends each ({} µs per request), zone-aware keyed frontends {} for each assignment source, {} req/s per frontend (open loop, uniformly random keys); weighted-move under three placements ({} slices at the start); detection {} s, a run every {} s; {} s per phase, the first left out of the shares{}",
        ZONES.join("/"),
        BACKENDS_PER_ZONE,
        s.work.as_micros(),
        setup.frontends.map(|f| f.to_string()).join("/"),
        s.rate,
        slices,
        setup.detection.as_secs_f64(),
        CADENCE.as_secs_f64(),
        s.phase.as_secs(),
        if s.probation { "" } else { "; probation off" }
    )?;
    for (n, phase) in PHASES.into_iter().enumerate() {
        writeln!(out)?;
        writeln!(out, "## {}. {}", n + 1, describe(phase))?;
        writeln!(
            out,
            "| assignment | requests | failed | failed after 1 s | cross-zone % | 2nd half | lowest % | by frontend zone a / b / c, % | busiest / mean | slices without a live replica: at the change | at the end | runs (changed) | key churn (forced) |"
        )?;
        writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")?;
        for r in rows.iter().filter(|r| r.phase == phase) {
            let changed = r.runs.iter().filter(|run| !run.unchanged).count();
            let churn: f64 = r.runs.iter().map(|run| run.key_churn).sum();
            let forced: f64 = r.runs.iter().map(|run| run.forced_churn).sum();
            writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {:.2} | {} | {} | {} ({}) | {:.3} ({:.3}) |",
                r.source.name(),
                r.requests,
                r.failed,
                r.failed_after_first_second,
                percent(r.cross_zone),
                percent(r.cross_zone_second_half),
                r.lowest.map_or("-".to_owned(), percent),
                r.cross_zone_by_zone.map(percent).join(" / "),
                r.busiest_over_mean,
                lost(r.without_live_replica_at_change),
                lost(r.without_live_replica_at_end),
                r.runs.len(),
                changed,
                churn,
                forced,
            )?;
        }
    }
    writeln!(out)?;
    writeln!(out, "## The Assigners' runs that changed an assignment")?;
    writeln!(
        out,
        "| phase | assignment | at (ms) | why | generation | key churn | forced | imbalance | slices | violations | infeasible | slices without a live replica | run (µs) |"
    )?;
    writeln!(out, "|---|---|---:|---|---:|---:|---:|---:|---:|---|---|---:|---:|")?;
    let mut still_missing = Vec::new();
    for r in rows {
        let missing = r.runs.iter().filter(|run| run.unchanged && !run.violations.is_empty()).count();
        if missing > 0 {
            still_missing.push(format!(
                "# {}, {}: {missing} more runs changed nothing, each still missing what the last one did",
                serde_json::to_value(r.phase)?.as_str().unwrap_or_default(),
                r.source.name()
            ));
        }
        for run in r.runs.iter().filter(|run| !run.unchanged) {
            let violations: Vec<String> =
                run.violations.iter().map(|v| format!("{} {}", v.constraint, v.slices)).collect();
            writeln!(
                out,
                "| {} | {} | {} | {} | {} | {:.3} | {:.3} | {:.3} | {} | {} | {} | {} | {} |",
                serde_json::to_value(r.phase)?.as_str().unwrap_or_default(),
                r.source.name(),
                run.at_ms,
                serde_json::to_value(run.trigger)?.as_str().unwrap_or_default(),
                run.generation,
                run.key_churn,
                run.forced_churn,
                run.imbalance_after,
                run.slices,
                if violations.is_empty() { "-".to_owned() } else { violations.join(", ") },
                run.infeasible.as_deref().unwrap_or("-"),
                lost(run.without_live_replica),
                run.elapsed_us,
            )?;
        }
    }
    for line in still_missing {
        writeln!(out, "{line}")?;
    }
    Ok(())
}

/// Draws the figure into `dir` (created if needed): the keyed cross-zone share and the
/// failed keyed requests of each source, second by second over the three phases, with
/// the moment zone a's outage is detected (`detection` into the second phase).
pub(super) fn draw(dir: &Path, rows: &[Row], detection: Duration) -> DrawResult<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(FIGURE);
    let root = SVGBackend::new(&path, (1400, 900)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, body) = root.split_vertically(36);
    top.titled(
        "Keyed requests through zone a's outage (dashed: a phase begins; dotted: zone a's tasks leave the registry, the Assigners run)",
        CAPTION,
    )?;
    let (upper, lower) = body.split_vertically(430);
    let seconds = PHASES
        .iter()
        .map(|&p| rows.iter().filter(|r| r.phase == p).map(|r| r.failed_per_second.len()).max().unwrap_or(0))
        .collect::<Vec<_>>();
    let starts: Vec<usize> = seconds.iter().scan(0, |at, &n| Some(std::mem::replace(at, *at + n))).collect();
    let total = seconds.iter().sum::<usize>().max(1) as f64;
    // Each source's series over the whole run: second `t` of phase `p` at x = start + t + 0.5.
    let series = |source: Source, value: &dyn Fn(&Row, usize) -> Option<f64>| -> Vec<(f64, f64)> {
        let mut points = Vec::new();
        for (p, &phase) in PHASES.iter().enumerate() {
            if let Some(r) = rows.iter().find(|r| r.phase == phase && r.source == source) {
                for t in 0..seconds[p] {
                    if let Some(v) = value(r, t) {
                        points.push(((starts[p] + t) as f64 + 0.5, v));
                    }
                }
            }
        }
        points
    };
    let detected = starts.get(1).map(|&start| start as f64 + detection.as_secs_f64());

    let mut chart = ChartBuilder::on(&upper)
        .caption("Cross-zone share of keyed requests in each second, %", FONT)
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..total, 0.0..100.0)?;
    chart
        .configure_mesh()
        .x_desc("second of the run")
        .y_desc("cross-zone requests, %")
        .label_style(FONT)
        .x_label_formatter(&tick)
        .y_label_formatter(&tick)
        .draw()?;
    marks(&mut chart, &starts, detected, 100.0)?;
    let names = ["1. steady", "2. zone a down", "3. zone a back"];
    for (&start, name) in starts.iter().zip(names) {
        chart.draw_series(std::iter::once(Text::new(name, (start as f64 + 0.2, 97.0), FONT)))?;
    }
    for source in Source::ALL {
        let c = colour(source);
        let points = series(source, &|r, t| {
            r.cross_zone_per_second.get(t).copied().filter(|v| v.is_finite()).map(|v| v * 100.0)
        });
        chart
            .draw_series(LineSeries::new(points, c.stroke_width(3)))?
            .label(source.name())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(3)));
    }
    legend(&mut chart, SeriesLabelPosition::UpperRight)?;

    let most = rows.iter().flat_map(|r| r.failed_per_second.iter()).copied().max().unwrap_or(0);
    let y_max = (most as f64 * 1.1).max(10.0);
    let mut chart = ChartBuilder::on(&lower)
        .caption("Failed keyed requests in each second", FONT)
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..total, 0.0..y_max)?;
    chart
        .configure_mesh()
        .x_desc("second of the run")
        .y_desc("failed requests")
        .label_style(FONT)
        .x_label_formatter(&tick)
        .y_label_formatter(&tick)
        .draw()?;
    marks(&mut chart, &starts, detected, y_max)?;
    for source in Source::ALL {
        let c = colour(source);
        let points = series(source, &|r, t| r.failed_per_second.get(t).map(|&n| n as f64));
        chart.draw_series(LineSeries::new(points.clone(), c.stroke_width(3)))?;
        chart.draw_series(points.into_iter().map(|p| Circle::new(p, 3, c.filled())))?;
    }
    root.present()?;
    Ok(path.clone())
}

/// The phases' boundaries (`starts` but the first, dashed) and the detection of zone a's
/// outage (dotted) on `chart`, up to `y_max`.
fn marks<DB: DrawingBackend>(
    chart: &mut ChartContext<'_, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    starts: &[usize],
    detected: Option<f64>,
    y_max: f64,
) -> DrawResult<()>
where
    DB::ErrorType: 'static,
{
    for &x in starts.iter().skip(1) {
        let x = x as f64;
        chart.draw_series(DashedLineSeries::new([(x, 0.0), (x, y_max)], 8, 5, BLACK.stroke_width(2)))?;
    }
    if let Some(x) = detected {
        chart.draw_series(DashedLineSeries::new(
            [(x, 0.0), (x, y_max)],
            2,
            4,
            BLACK.mix(0.6).stroke_width(2),
        ))?;
    }
    Ok(())
}
