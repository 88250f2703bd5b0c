//! The demo's output: the summary lines and the SVG.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use super::control::ControlPlane;
use super::{Row, SlicerArgs};
use crate::LabResult;

/// The summary lines: imbalance before and after rebalancing, misroutes per
/// reassignment, failures, failover.
pub(super) fn summarise(
    out: &mut impl Write,
    rows: &[Row],
    args: &SlicerArgs,
    failover: Option<Duration>,
    control: &ControlPlane,
) -> LabResult {
    let every = args.shift_every.max(1);
    let shifts: Vec<usize> = (1..args.steps).filter(|s| s % every == 0).collect();
    for &shift in &shifts {
        let at = |s: usize| rows.get(s).map_or(f64::NAN, |r| r.imbalance);
        let settled = (shift..rows.len().min(shift + every)).find(|&s| rows[s].imbalance < 1.2);
        writeln!(
            out,
            "# shift at step {shift}: imbalance {:.2} in the step before, {:.2} right after, under 1.2 after {}",
            at(shift - 1),
            at(shift),
            settled.map_or("never".into(), |s| format!("{} steps", s - shift + 1)),
        )?;
    }
    let requests: u64 = rows.iter().map(|r| r.requests).sum();
    let misrouted: u64 = rows.iter().map(|r| r.misrouted).sum();
    let generations = rows.windows(2).filter(|w| w[1].generation != w[0].generation).count();
    writeln!(
        out,
        "# requests {requests}, misrouted {misrouted} ({:.4}%), {:.1} per new generation; failed {}",
        100.0 * misrouted as f64 / requests.max(1) as f64,
        misrouted as f64 / generations.max(1) as f64,
        rows.iter().map(|r| r.failed).sum::<u64>(),
    )?;
    writeln!(out, "# load reports accepted {}, dropped {}", control.book.accepted(), control.book.dropped())?;
    if let Some(f) = failover {
        writeln!(
            out,
            "# failover: the standby led {:.2} s after the leader was killed (lease 2 s)",
            f.as_secs_f64()
        )?;
    }
    Ok(())
}

/// Imbalance, misroutes and failures per step.
pub(super) fn draw(path: &PathBuf, rows: &[Row]) -> LabResult {
    let root = SVGBackend::new(path, (1200, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(600);
    let at = |r: &Row, v: f64| (r.step as f64, v);
    let y_max = rows.iter().map(|r| r.imbalance).fold(2.0, f64::max) * 1.1;
    let mut chart = panel(&left, rows, "Imbalance per step (busiest backend / mean)", y_max)?;
    chart.draw_series(LineSeries::new(rows.iter().map(|r| at(r, r.imbalance)), GREEN.stroke_width(3)))?;
    let y_max = rows.iter().map(|r| (r.misrouted + r.failed) as f64).fold(10.0, f64::max) * 1.1;
    let mut chart = panel(&right, rows, "Misrouted (blue) and failed (red) requests per step", y_max)?;
    chart
        .draw_series(LineSeries::new(rows.iter().map(|r| at(r, r.misrouted as f64)), BLUE.stroke_width(3)))?;
    chart.draw_series(LineSeries::new(rows.iter().map(|r| at(r, r.failed as f64)), RED.stroke_width(3)))?;
    root.present()?;
    Ok(())
}

/// One panel over the steps, from 0 to `y_max`, with its mesh drawn.
fn panel<'a>(
    area: &DrawingArea<SVGBackend<'a>, plotters::coord::Shift>,
    rows: &[Row],
    caption: &str,
    y_max: f64,
) -> Result<
    ChartContext<'a, SVGBackend<'a>, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    Box<dyn std::error::Error>,
> {
    let steps = rows.len().max(2) as f64;
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 17))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d(0f64..steps - 1.0, 0f64..y_max)?;
    chart.configure_mesh().x_desc("step").label_style(("sans-serif", 14)).draw()?;
    Ok(chart)
}
