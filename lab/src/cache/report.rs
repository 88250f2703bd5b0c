//! The experiment's tables (stdout) and figures (SVG).

use std::io::Write;
use std::path::{Path, PathBuf};

use plotters::prelude::*;
use steady_lab::figures::{legend, tick, DrawResult, CAPTION, FONT};

use super::{Outcome, Phase, Settings};
use crate::LabResult;

/// A stable colour per strategy, in [`super::Strategy::ALL`]'s order of names.
fn colour(strategy: &str) -> RGBColor {
    match strategy {
        "p2c (unkeyed)" => RGBColor(127, 127, 127),
        "static hashing" => RGBColor(214, 39, 40),
        "consistent hashing" => RGBColor(140, 86, 75),
        "Rudolph (in process)" => RGBColor(31, 119, 180),
        "Slicer, 1 replica" => RGBColor(44, 160, 44),
        "Slicer, <=3 replicas" => RGBColor(148, 103, 189),
        _ => RGBColor(0, 0, 0),
    }
}

fn percent(x: f64) -> String {
    if x.is_nan() {
        "-".to_owned()
    } else {
        format!("{:.1}", x * 100.0)
    }
}

/// The tables: one per phase, and the restart's hit rate second by second.
pub(super) fn print(out: &mut impl Write, s: &Settings, outcomes: &[Outcome]) -> LabResult {
    let f = &s.fleet;
    writeln!(
        out,
        "# steady-lab cache: {} backends (LRU of {} entries, {} workers x {} µs per request), database {} µs per read x {} at once, {} frontends",
        f.backends,
        f.backend.cache_entries,
        f.backend.workers,
        f.backend.work.as_micros(),
        f.database.read_latency.as_micros(),
        f.database.concurrency,
        f.frontends
    )?;
    let bound = match f.keyed_bound {
        None => "off".to_owned(),
        Some(b) => format!("{} x mean in flight + {}, spilling to {:?}", b.factor, b.floor, b.spill),
    };
    writeln!(out, "# Slicer strategies' keyed load bound: {bound}")?;
    for phase in [Phase::Reshuffled, Phase::Steady, Phase::Closed, Phase::Restart] {
        let rows: Vec<&Outcome> = outcomes.iter().filter(|o| o.phase == phase).collect();
        if rows.is_empty() {
            continue;
        }
        writeln!(out)?;
        writeln!(
            out,
            "## {:?}: {}; {:.0} s measured after {} s of warm-up",
            phase,
            phase.describe(s),
            rows[0].seconds,
            s.warmup.as_secs()
        )?;
        writeln!(
            out,
            "| strategy | req/s | p50 ms | p90 ms | p99 ms | hit % | db reads/s | misrouted | spilled | failed | key affinity % | p95 per backend, ms |"
        )?;
        writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")?;
        for o in &rows {
            let p95: Vec<String> = o.backend_p95_ms.iter().map(|p| format!("{p:.1}")).collect();
            writeln!(
                out,
                "| {} | {:.0} | {:.2} | {:.2} | {:.2} | {} | {:.0} | {} | {} | {} | {} | {} |",
                o.strategy,
                o.requests_per_second,
                o.p50_ms,
                o.p90_ms,
                o.p99_ms,
                percent(o.hit_rate),
                o.db_reads_per_second,
                o.misrouted.map_or("-".to_owned(), |m| m.to_string()),
                o.spilled,
                o.failed,
                percent(o.key_affinity),
                p95.join(" ")
            )?;
        }
        if phase == Phase::Restart {
            writeln!(out)?;
            writeln!(out, "## Restart, second by second: hit % (misrouted / failed requests)")?;
            let header: Vec<&str> = rows.iter().map(|o| o.strategy.as_str()).collect();
            writeln!(out, "| s | {} |", header.join(" | "))?;
            writeln!(out, "|---:|{}", "---:|".repeat(rows.len()))?;
            let seconds = rows.iter().map(|o| o.hit_rate_per_second.len()).max().unwrap_or(0);
            for t in 0..seconds {
                let cells: Vec<String> = rows
                    .iter()
                    .map(|o| {
                        let hit = o.hit_rate_per_second.get(t).copied().unwrap_or(f64::NAN);
                        let failed = o.failed_per_second.get(t).copied().unwrap_or(0);
                        let misrouted = match o.misrouted {
                            Some(_) => o.misrouted_per_second.get(t).map_or("?".to_owned(), u64::to_string),
                            None => "-".to_owned(),
                        };
                        format!("{} ({misrouted} / {failed})", percent(hit))
                    })
                    .collect();
                writeln!(out, "| {} | {} |", t + 1, cells.join(" | "))?;
            }
            let lows: Vec<String> = rows
                .iter()
                .map(|o| {
                    format!(
                        "{} {}",
                        o.strategy,
                        percent(o.hit_rate_per_second.iter().copied().fold(f64::NAN, f64::min))
                    )
                })
                .collect();
            writeln!(out, "# lowest one-second hit %: {}", lows.join(", "))?;
            let warmed: Vec<String> = rows
                .iter()
                .filter(|o| o.warmed > 0)
                .map(|o| format!("{} {}", o.strategy, o.warmed))
                .collect();
            if !warmed.is_empty() {
                writeln!(out, "# cache entries warmed from the old owner: {}", warmed.join(", "))?;
            }
        }
    }
    Ok(())
}

/// Draws the figures into `dir` (created if needed); returns the files written.
pub(super) fn draw(dir: &Path, outcomes: &[Outcome]) -> DrawResult<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut files = Vec::new();
    let of = |phase: Phase| -> Vec<&Outcome> { outcomes.iter().filter(|o| o.phase == phase).collect() };
    if outcomes.iter().any(|o| matches!(o.phase, Phase::Reshuffled | Phase::Steady)) {
        files.push(hit_rate_against_p99(dir, outcomes)?);
    }
    let reshuffled = of(Phase::Reshuffled);
    if !reshuffled.is_empty() {
        files.push(backend_p95(dir, &reshuffled)?);
        files.push(over_time(
            dir,
            &reshuffled,
            "cache-hit-rate-over-time.svg",
            "Hit rate per second, keys reshuffled (open loop)",
        )?);
    }
    let restart = of(Phase::Restart);
    if !restart.is_empty() {
        files.push(over_time(
            dir,
            &restart,
            "cache-restart.svg",
            "Hit rate per second through a rolling restart of every backend",
        )?);
    }
    Ok(files)
}

/// One point per strategy and open-loop phase: p99 against hit rate (filled: reshuffled
/// keys; hollow: one ranking).
fn hit_rate_against_p99(dir: &Path, outcomes: &[Outcome]) -> DrawResult<PathBuf> {
    let path = dir.join("cache-hit-rate-vs-p99.svg");
    let root = SVGBackend::new(&path, (1000, 650)).into_drawing_area();
    root.fill(&WHITE)?;
    let points: Vec<&Outcome> =
        outcomes.iter().filter(|o| matches!(o.phase, Phase::Reshuffled | Phase::Steady)).collect();
    // Log scale: the p99s span three orders of magnitude.
    let x_max = points.iter().map(|o| o.p99_ms).fold(1.0, f64::max) * 1.5;
    let x_min = points.iter().map(|o| o.p99_ms).filter(|p| *p > 0.0).fold(x_max, f64::min) * 0.7;
    let y_min = points.iter().map(|o| o.hit_rate * 100.0).filter(|h| h.is_finite()).fold(100.0, f64::min);
    let mut chart = ChartBuilder::on(&root)
        .caption("Hit rate against p99 (filled: keys reshuffled; hollow: one ranking)", CAPTION)
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((x_min..x_max).log_scale(), (y_min - 5.0).max(0.0)..100.0)?;
    chart
        .configure_mesh()
        .x_desc("p99 latency, ms (log scale)")
        .y_desc("cache hit rate, %")
        .label_style(FONT)
        .x_label_formatter(&tick)
        .y_label_formatter(&tick)
        .draw()?;
    let mut names: Vec<&str> = Vec::new();
    for o in &points {
        if !names.contains(&o.strategy.as_str()) {
            names.push(&o.strategy);
        }
    }
    for name in names {
        let c = colour(name);
        let mine = points.iter().filter(|o| o.strategy == name);
        chart
            .draw_series(mine.map(|o| {
                let style = if o.phase == Phase::Reshuffled { c.filled() } else { c.stroke_width(2) };
                Circle::new((o.p99_ms, o.hit_rate * 100.0), 7, style)
            }))?
            .label(name)
            .legend(move |(x, y)| Circle::new((x + 8, y), 6, c.filled()));
    }
    legend(&mut chart, SeriesLabelPosition::LowerRight)?;
    root.present()?;
    Ok(path.clone())
}

/// Each backend's p95 per strategy (Rudolph's figure 7): a column of dots per strategy.
fn backend_p95(dir: &Path, rows: &[&Outcome]) -> DrawResult<PathBuf> {
    let path = dir.join("cache-backend-p95.svg");
    let root = SVGBackend::new(&path, (1000, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let y_max = rows.iter().flat_map(|o| o.backend_p95_ms.iter().copied()).fold(1.0, f64::max) * 1.5;
    let y_min =
        rows.iter().flat_map(|o| o.backend_p95_ms.iter().copied()).filter(|p| *p > 0.0).fold(y_max, f64::min)
            * 0.7;
    let n = rows.len() as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption("Each backend's p95 latency per strategy, keys reshuffled (open loop)", CAPTION)
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.5..n - 0.5, (y_min..y_max).log_scale())?;
    let names: Vec<&str> = rows.iter().map(|o| o.strategy.as_str()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(rows.len())
        .x_label_formatter(&|x| names.get(x.round() as usize).map_or(String::new(), |s| (*s).to_owned()))
        .y_desc("p95 latency, ms (log scale)")
        .label_style(FONT)
        .y_label_formatter(&tick)
        .draw()?;
    for (i, o) in rows.iter().enumerate() {
        let c = colour(&o.strategy);
        chart.draw_series(o.backend_p95_ms.iter().map(|&p| Circle::new((i as f64, p), 6, c.filled())))?;
    }
    root.present()?;
    Ok(path.clone())
}

/// One line per strategy: the hit rate in each second measured.
fn over_time(dir: &Path, rows: &[&Outcome], file: &str, title: &str) -> DrawResult<PathBuf> {
    let path = dir.join(file);
    let root = SVGBackend::new(&path, (1200, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let seconds = rows.iter().map(|o| o.hit_rate_per_second.len()).max().unwrap_or(1).max(2) as f64;
    let y_min = rows
        .iter()
        .flat_map(|o| o.hit_rate_per_second.iter().map(|h| h * 100.0))
        .filter(|h| h.is_finite())
        .fold(100.0, f64::min);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, CAPTION)
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(1.0..seconds, (y_min - 5.0).max(0.0)..100.0)?;
    chart
        .configure_mesh()
        .x_desc("second measured")
        .y_desc("cache hit rate, %")
        .label_style(FONT)
        .x_label_formatter(&tick)
        .y_label_formatter(&tick)
        .draw()?;
    for o in rows {
        let c = colour(&o.strategy);
        let points = o
            .hit_rate_per_second
            .iter()
            .enumerate()
            .filter(|(_, h)| h.is_finite())
            .map(|(t, h)| ((t + 1) as f64, h * 100.0));
        chart
            .draw_series(LineSeries::new(points, c.stroke_width(3)))?
            .label(o.strategy.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(3)));
    }
    legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    root.present()?;
    Ok(path.clone())
}
