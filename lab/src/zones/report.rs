//! The experiment's tables (stdout) and figures (SVG, one per phase).

use std::io::Write;
use std::path::{Path, PathBuf};

use plotters::prelude::*;
use steady_lab::figures::{legend, tick, DrawResult, CAPTION, FONT};

use super::fleet::{Strategy, Traffic, BACKENDS_PER_ZONE, SUBSET_SIZE, ZONES};
use super::{Outcome, Phase, Settings};
use crate::LabResult;

/// A stable colour per strategy; keyed traffic is drawn lighter.
fn colour(strategy: Strategy, traffic: Traffic) -> RGBColor {
    let RGBColor(r, g, b) = match strategy {
        Strategy::ZoneUnaware => RGBColor(214, 39, 40),
        Strategy::PerZone => RGBColor(31, 119, 180),
        Strategy::ZoneAware => RGBColor(44, 160, 44),
    };
    match traffic {
        Traffic::Unkeyed => RGBColor(r, g, b),
        // Halfway to white.
        Traffic::Keyed => {
            RGBColor(((r as u16 + 255) / 2) as u8, ((g as u16 + 255) / 2) as u8, ((b as u16 + 255) / 2) as u8)
        }
    }
}

fn percent(x: f64) -> String {
    if x.is_nan() {
        "-".to_owned()
    } else {
        format!("{:.1}", x * 100.0)
    }
}

fn label(o: &Outcome) -> String {
    format!("{}, {}", o.strategy.name(), o.traffic.name())
}

/// One table per phase.
pub(super) fn print(out: &mut impl Write, s: &Settings, outcomes: &[Outcome]) -> LabResult {
    writeln!(
        out,
        "# steady-lab zones: zones {}, {} backends each ({} µs per request), frontends 6/3/3, {} req/s per frontend (open loop), k = {}; {} s per phase, the first left out of the shares{}",
        ZONES.join("/"),
        BACKENDS_PER_ZONE,
        s.work.as_micros(),
        s.rate,
        SUBSET_SIZE,
        s.phase.as_secs(),
        if s.probation { "" } else { "; probation off" }
    )?;
    for (n, phase) in Phase::ALL.into_iter().enumerate() {
        let rows: Vec<&Outcome> = outcomes.iter().filter(|o| o.phase == phase).collect();
        let Some(first) = rows.first() else { continue };
        writeln!(out)?;
        let keyed = rows.iter().find(|o| o.traffic == Traffic::Keyed).and_then(|o| o.lowest);
        writeln!(
            out,
            "## {}. {}; lowest possible cross-zone share {} % (keyed, by the slices' replicas: {} %)",
            n + 1,
            phase.describe(),
            first.lowest.map_or("-".to_owned(), percent),
            keyed.map_or("-".to_owned(), percent)
        )?;
        writeln!(
            out,
            "| strategy | traffic | requests | cross-zone % | 2nd half | lowest % | busiest / mean | failed | failed after 1 s | connections / frontend | cross-zone connections / frontend (most) | opened (by new frontends) |"
        )?;
        writeln!(out, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")?;
        for o in rows {
            writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {:.2} | {} | {} | {:.1} | {:.1} ({}) | {} ({}) |",
                o.strategy.name(),
                o.traffic.name(),
                o.requests,
                percent(o.cross_zone),
                percent(o.cross_zone_second_half),
                o.lowest.map_or("-".to_owned(), percent),
                o.busiest_over_mean,
                o.failed,
                o.failed_after_first_second,
                o.connections,
                o.cross_zone_connections,
                o.most_cross_zone_connections,
                o.opened,
                o.opened_by_new
            )?;
        }
        let held: Vec<String> = outcomes
            .iter()
            .filter(|o| o.phase == phase && o.on_probation > 0)
            .map(|o| format!("{} {}", label(o), o.on_probation))
            .collect();
        if !held.is_empty() {
            writeln!(out, "# members on probation at the phase's end: {}", held.join(", "))?;
        }
    }
    Ok(())
}

/// Draws one figure per phase into `dir` (created if needed); returns the files.
pub(super) fn draw(dir: &Path, outcomes: &[Outcome]) -> DrawResult<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut files = Vec::new();
    for (n, phase) in Phase::ALL.into_iter().enumerate() {
        let rows: Vec<&Outcome> = outcomes.iter().filter(|o| o.phase == phase).collect();
        if !rows.is_empty() {
            files.push(phase_figure(dir, n + 1, phase, &rows)?);
        }
    }
    Ok(files)
}

/// Top left: each row's cross-zone share against the lowest possible (the dashed
/// line); top right: the same second by second; below: each backend's requests over the
/// mean of the serving backends.
fn phase_figure(dir: &Path, n: usize, phase: Phase, rows: &[&Outcome]) -> DrawResult<PathBuf> {
    let path = dir.join(phase.figure());
    let root = SVGBackend::new(&path, (1400, 1000)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, body) = root.split_vertically(36);
    top.titled(&format!("{n}. {}", phase.describe()), CAPTION)?;
    let (upper, right) = body.split_vertically(500);
    let (left, middle) = upper.split_horizontally(600);

    // Cross-zone share, one bar per row.
    let bars = rows.len() as f64;
    let mut chart = ChartBuilder::on(&left)
        .caption("Cross-zone share of requests, % (dashed: lowest possible)", FONT)
        .margin(12)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(-0.5..bars - 0.5, 0.0..100.0)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_desc("cross-zone requests, %")
        .label_style(FONT)
        .y_label_formatter(&tick)
        .draw()?;
    for (i, o) in rows.iter().enumerate() {
        let c = colour(o.strategy, o.traffic);
        let share = if o.cross_zone.is_nan() { 0.0 } else { o.cross_zone * 100.0 };
        let x = i as f64;
        chart
            .draw_series(std::iter::once(Rectangle::new([(x - 0.38, 0.0), (x + 0.38, share)], c.filled())))?
            .label(label(o))
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], c.filled()));
    }
    // Each bar against its own row's lowest share (keyed: by the slices' replicas).
    for (i, o) in rows.iter().enumerate() {
        if let Some(lowest) = o.lowest {
            let (x, y) = (i as f64, lowest * 100.0);
            chart.draw_series(DashedLineSeries::new(
                [(x - 0.5, y), (x + 0.5, y)],
                6,
                4,
                BLACK.stroke_width(2),
            ))?;
        }
    }
    legend(&mut chart, SeriesLabelPosition::UpperRight)?;

    // Second by second.
    let seconds = rows.iter().map(|o| o.cross_zone_per_second.len()).max().unwrap_or(1).max(2) as f64;
    let mut chart = ChartBuilder::on(&middle)
        .caption("Cross-zone share in each second of the phase, % (dashed: lowest possible)", FONT)
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(1.0..seconds, 0.0..100.0)?;
    chart
        .configure_mesh()
        .x_desc("second of the phase")
        .y_desc("cross-zone requests, %")
        .label_style(FONT)
        .x_label_formatter(&tick)
        .y_label_formatter(&tick)
        .draw()?;
    let mut lows: Vec<f64> = rows.iter().filter_map(|o| o.lowest).collect();
    lows.dedup_by(|a, b| (*a - *b).abs() < 1e-9);
    for lowest in lows {
        let y = lowest * 100.0;
        chart.draw_series(DashedLineSeries::new([(1.0, y), (seconds, y)], 8, 5, BLACK.stroke_width(2)))?;
    }
    for o in rows {
        let c = colour(o.strategy, o.traffic);
        let points = o
            .cross_zone_per_second
            .iter()
            .enumerate()
            .filter(|(_, s)| s.is_finite())
            .map(|(t, s)| ((t + 1) as f64, s * 100.0));
        chart.draw_series(LineSeries::new(points, c.stroke_width(3)))?;
    }

    // Requests per backend over the mean of the serving ones.
    let backends = rows[0].per_backend.len();
    let relative = |o: &Outcome| -> Vec<(f64, f64)> {
        let live: Vec<u64> =
            o.per_backend.iter().zip(&o.serving).filter(|(_, &s)| s).map(|(&r, _)| r).collect();
        let mean = live.iter().sum::<u64>() as f64 / live.len().max(1) as f64;
        o.per_backend
            .iter()
            .enumerate()
            .filter(|&(b, _)| o.serving[b])
            .map(|(b, &r)| (b as f64, if mean > 0.0 { r as f64 / mean } else { 0.0 }))
            .collect()
    };
    let y_max = rows.iter().flat_map(|o| relative(o)).map(|p| p.1).fold(1.6, f64::max) * 1.1;
    let mut chart = ChartBuilder::on(&right)
        .caption("Requests per backend / mean of the serving backends (zones a | b | c)", FONT)
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(-0.5..backends as f64 - 0.5, 0.0..y_max)?;
    chart
        .configure_mesh()
        .x_labels(backends)
        .x_desc("backend (job-wide index)")
        .y_desc("requests / mean")
        .label_style(FONT)
        .x_label_formatter(&tick)
        .y_label_formatter(&tick)
        .draw()?;
    for z in 1..ZONES.len() {
        let x = (z * BACKENDS_PER_ZONE) as f64 - 0.5;
        chart.draw_series(LineSeries::new([(x, 0.0), (x, y_max)], BLACK.mix(0.4).stroke_width(1)))?;
    }
    for o in rows {
        let c = colour(o.strategy, o.traffic);
        let points = relative(o);
        // A zone's backends are joined; the zones apart.
        for zone in 0..ZONES.len() {
            let mine: Vec<(f64, f64)> =
                points.iter().copied().filter(|(b, _)| *b as usize / BACKENDS_PER_ZONE == zone).collect();
            chart.draw_series(LineSeries::new(mine.clone(), c.stroke_width(2)))?;
            chart.draw_series(mine.into_iter().map(|p| Circle::new(p, 4, c.filled())))?;
        }
    }
    root.present()?;
    Ok(path.clone())
}
