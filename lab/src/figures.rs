//! The figures: SVG plots drawn with plotters from [`LabResults`].
//!
//! Text is left to the SVG viewer (plotters' font-less mode), so no system fonts or
//! font libraries are needed to draw them.

use std::collections::HashSet;
use std::error::Error;
use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;
use steady_subset::Algorithm;

use crate::experiments::{ChurnPoint, LabResults};

/// A boxed drawing error.
pub type DrawResult<T> = Result<T, Box<dyn Error>>;

/// One figure written to disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Figure {
    /// The file name, relative to the output directory.
    pub file: String,
    /// A one-line title.
    pub title: &'static str,
}

/// A stable colour per algorithm, so every figure reads the same way.
pub fn colour(algorithm: &Algorithm) -> RGBColor {
    match algorithm.to_string().as_str() {
        "round-robin" => RGBColor(127, 127, 127),
        "deterministic" => RGBColor(214, 39, 40),
        "deterministic-balanced" => RGBColor(255, 127, 14),
        "random" => RGBColor(148, 103, 189),
        "consistent" => RGBColor(140, 86, 75),
        "ringsteady" => RGBColor(31, 119, 180),
        "ringsteady-unscaled" => RGBColor(23, 190, 207),
        "rocksteadier" => RGBColor(44, 160, 44),
        "rocksteadier-decimal" => RGBColor(227, 119, 194),
        _ => RGBColor(0, 0, 0),
    }
}

/// The stroke width of algorithm `i` of `n`: earlier algorithms are drawn wider and
/// first, so lines that coincide show as nested stripes instead of hiding each other.
fn stroke(i: usize, n: usize) -> u32 {
    (2 + n.saturating_sub(i + 1)) as u32
}

/// Tick labels without float noise: `20`, `0.1`, `0.25`.
pub fn tick(v: &f64) -> String {
    let rounded = (v * 1e6).round() / 1e6;
    if rounded.fract() == 0.0 {
        format!("{rounded:.0}")
    } else {
        format!("{rounded:.3}").trim_end_matches('0').to_owned()
    }
}

/// The labels' font.
pub const FONT: (&str, u32) = ("sans-serif", 15);
/// The captions' font.
pub const CAPTION: (&str, u32) = ("sans-serif", 17);

/// Draws every figure into `dir` (created if needed) and lists them.
///
/// # Errors
///
/// I/O or drawing errors.
pub fn draw_all(results: &LabResults, dir: &Path) -> DrawResult<Vec<Figure>> {
    std::fs::create_dir_all(dir)?;
    let figures = vec![
        utilisation_grid(results, dir)?,
        backend_churn(results, dir)?,
        size_and_frontend_churn(results, dir)?,
        spread(results, dir)?,
        diversity(results, dir)?,
    ];
    Ok(figures)
}

/// Figure 1: utilisation against M/N on the article's grid, one panel per algorithm.
fn utilisation_grid(results: &LabResults, dir: &Path) -> DrawResult<Figure> {
    let file = "utilisation-grid.svg";
    let columns = 4;
    let rows = results.algorithms.len().div_ceil(columns);
    let target = dir.join(file);
    let root = SVGBackend::new(&target, (1400, 380 * rows as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, body) = root.split_vertically(40);
    top.titled(
        &format!(
            "Normalised utilisation against M/N, k = 20, 1 <= M <= 256, 20 <= N <= 256, M*k > N ({} scenarios)",
            results.grid.first().map_or(0, Vec::len)
        ),
        CAPTION,
    )?;
    let panels = body.split_evenly((rows, columns));
    for ((panel, algorithm), points) in panels.iter().zip(&results.algorithms).zip(&results.grid) {
        let mean = points.iter().map(|p| p.utilisation).sum::<f64>() / points.len().max(1) as f64;
        let mut chart = ChartBuilder::on(panel)
            .caption(format!("{algorithm} (mean {mean:.3})"), FONT)
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(45)
            .build_cartesian_2d((0.003f64..14.0f64).log_scale(), 0.0f64..1.02f64)?;
        chart.configure_mesh().x_desc("M/N (log scale)").y_desc("utilisation").label_style(FONT).draw()?;
        // Many scenarios share a pixel: draw each occupied pixel once.
        let mut pixels = HashSet::new();
        let dots: Vec<(f64, f64)> = points
            .iter()
            .map(|p| (p.scenario.frontends as f64 / p.scenario.backends as f64, p.utilisation))
            .filter(|&(x, y)| pixels.insert(((x.ln() * 60.0).round() as i64, (y * 300.0).round() as i64)))
            .collect();
        let c = colour(algorithm);
        chart.draw_series(dots.into_iter().map(|xy| Circle::new(xy, 1, c.mix(0.6).filled())))?;
    }
    root.present()?;
    Ok(Figure { file: file.to_owned(), title: "Utilisation against the frontend/backend ratio" })
}

/// One panel of churn lines: what to plot and how to label it.
struct ChurnPanel<'a> {
    series: &'a [Vec<ChurnPoint>],
    caption: String,
    x_desc: &'a str,
    y_desc: &'a str,
    log_y: bool,
    value: fn(&ChurnPoint) -> f64,
}

/// A figure of two churn panels side by side.
fn two_churn_panels(
    results: &LabResults,
    dir: &Path,
    file: &str,
    title: &'static str,
    panels: [ChurnPanel<'_>; 2],
) -> DrawResult<Figure> {
    let target = dir.join(file);
    let root = SVGBackend::new(&target, (1400, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(700);
    for (area, panel) in [left, right].iter().zip(&panels) {
        churn_panel(area, results, panel)?;
    }
    root.present()?;
    Ok(Figure { file: file.to_owned(), title })
}

/// Draws one line per algorithm into `area`, the y axis linear or logarithmic.
fn churn_panel(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    results: &LabResults,
    panel: &ChurnPanel<'_>,
) -> DrawResult<()> {
    let ChurnPanel { series, ref caption, x_desc, y_desc, log_y, value } = *panel;
    let xs = series.iter().flatten().map(|p| p.x as f64);
    let (x_min, x_max) = xs.fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(x), hi.max(x)));
    let x_range = x_min..x_max.max(x_min + 1.0);
    let y_max = series.iter().flatten().map(value).fold(0.0, f64::max).max(1.0) * 1.08;
    let mut builder = ChartBuilder::on(area);
    builder.caption(caption, CAPTION).margin(12).x_label_area_size(40).y_label_area_size(60);
    if log_y {
        // Zero is drawn on the bottom edge of a log axis.
        let mut chart = builder.build_cartesian_2d(x_range, (0.8..y_max * 1.5).log_scale())?;
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc(y_desc)
            .label_style(FONT)
            .x_label_formatter(&tick)
            .y_label_formatter(&tick)
            .draw()?;
        draw_lines(&mut chart, results, series, |p| (p.x as f64, value(p).max(0.8)))?;
        legend(&mut chart, SeriesLabelPosition::UpperRight)
    } else {
        let mut chart = builder.build_cartesian_2d(x_range, -0.02 * y_max..y_max)?;
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc(y_desc)
            .label_style(FONT)
            .x_label_formatter(&tick)
            .y_label_formatter(&tick)
            .draw()?;
        draw_lines(&mut chart, results, series, |p| (p.x as f64, value(p)))?;
        legend(&mut chart, SeriesLabelPosition::UpperRight)
    }
}

/// One line per algorithm, widest first (see [`stroke`]).
fn draw_lines<'a, P, X, Y>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>,
    results: &LabResults,
    series: &[Vec<P>],
    point: impl Fn(&P) -> (f64, f64),
) -> DrawResult<()>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    let n = results.algorithms.len();
    for (i, (algorithm, points)) in results.algorithms.iter().zip(series).enumerate() {
        let c = colour(algorithm);
        let width = stroke(i, n);
        chart
            .draw_series(LineSeries::new(points.iter().map(&point), c.stroke_width(width)))?
            .label(algorithm.to_string())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(width)));
    }
    Ok(())
}

/// The legend box.
///
/// # Errors
///
/// Drawing errors.
pub fn legend<'a, X, Y>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>,
    position: SeriesLabelPosition,
) -> DrawResult<()>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(FONT)
        .draw()?;
    Ok(())
}

/// Figure 2: backend churn as N grows one task at a time.
fn backend_churn(results: &LabResults, dir: &Path) -> DrawResult<Figure> {
    let (m, k, _) = results.config.resize;
    two_churn_panels(
        results,
        dir,
        "backend-churn.svg",
        "Backend churn as the backend job grows",
        [
            ChurnPanel {
                series: &results.resize,
                caption: format!("Most connections one frontend opens, N -> N+1 (M = {m}, k = {k})"),
                x_desc: "N before the step",
                y_desc: "connections opened (max over frontends)",
                log_y: false,
                value: |p| p.churn.max as f64,
            },
            ChurnPanel {
                series: &results.resize,
                caption: format!("All connections opened, N -> N+1 (M = {m}, k = {k})"),
                x_desc: "N before the step",
                y_desc: "connections opened (total, log scale)",
                log_y: true,
                value: |p| p.churn.total as f64,
            },
        ],
    )
}

/// Figure 3: subset-size churn and frontend churn.
fn size_and_frontend_churn(results: &LabResults, dir: &Path) -> DrawResult<Figure> {
    let (m, n, _) = results.config.size_churn;
    let (fn_n, fn_k, _) = results.config.frontend_churn;
    two_churn_panels(
        results,
        dir,
        "size-and-frontend-churn.svg",
        "Subset-size churn and frontend churn",
        [
            ChurnPanel {
                series: &results.size_churn,
                caption: format!("Subset-size churn, k -> k+1 (M = {m}, N = {n})"),
                x_desc: "k before the step",
                y_desc: "connections opened (max over frontends)",
                log_y: false,
                value: |p| p.churn.max as f64,
            },
            ChurnPanel {
                series: &results.frontend_churn,
                caption: format!("Frontend churn, M -> M+1 (N = {fn_n}, k = {fn_k})"),
                x_desc: "M before the step",
                y_desc: "connections opened by existing frontends",
                log_y: false,
                value: |p| p.churn.total as f64,
            },
        ],
    )
}

/// Figure 4: the worst fraction of a subset one rolling-restart window takes down.
fn spread(results: &LabResults, dir: &Path) -> DrawResult<Figure> {
    let file = "spread.svg";
    let (m, n, k, _) = results.config.spread;
    let target = dir.join(file);
    let root = SVGBackend::new(&target, (1000, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let w_max = results.spread.iter().flatten().map(|p| p.window).max().unwrap_or(1) as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("Worst fraction of one subset inside w consecutive backends (M = {m}, N = {n}, k = {k})"),
            CAPTION,
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(1.0..w_max.max(2.0), -0.01..1.05)?;
    chart
        .configure_mesh()
        .x_desc("w: backends restarting at once")
        .y_desc("fraction of the subset down (worst frontend)")
        .label_style(FONT)
        .x_label_formatter(&tick)
        .y_label_formatter(&tick)
        .draw()?;
    draw_lines(&mut chart, results, &results.spread, |p| (p.window as f64, p.worst))?;
    legend(&mut chart, SeriesLabelPosition::LowerRight)?;
    root.present()?;
    Ok(Figure { file: file.to_owned(), title: "Spread: what a rolling restart takes from one subset" })
}

/// Figure 5: diversity against M.
fn diversity(results: &LabResults, dir: &Path) -> DrawResult<Figure> {
    let file = "diversity.svg";
    let (n, k, max_m, _) = results.config.diversity;
    let target = dir.join(file);
    let root = SVGBackend::new(&target, (1000, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("Diversity: distinct subsets / min(M, C(N, k)) (N = {n}, k = {k})"), CAPTION)
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((1.0..max_m as f64).log_scale(), -0.01..1.05)?;
    chart
        .configure_mesh()
        .x_desc("M (log scale)")
        .y_desc("diversity")
        .label_style(FONT)
        .x_label_formatter(&tick)
        .y_label_formatter(&tick)
        .draw()?;
    draw_lines(&mut chart, results, &results.diversity, |&(m, d)| (m as f64, d))?;
    legend(&mut chart, SeriesLabelPosition::LowerLeft)?;
    root.present()?;
    Ok(Figure { file: file.to_owned(), title: "Diversity against the frontend job's size" })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_have_no_float_noise() {
        assert_eq!(tick(&20.0), "20");
        assert_eq!(tick(&0.9999999999999999), "1");
        assert_eq!(tick(&0.30000000000000004), "0.3");
        assert_eq!(tick(&0.25), "0.25");
    }
}
