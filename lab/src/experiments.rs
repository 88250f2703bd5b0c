//! The measurements behind the figures and the report, for every algorithm.
//!
//! Everything here is computed from `steady_subset::quality`; nothing is typed in.
//! [`LabConfig::full`] is what `docs/` is generated from; [`LabConfig::tiny`] runs
//! in well under a second for tests.

use std::collections::HashSet;
use std::ops::RangeInclusive;

use steady_subset::quality::{
    article_grid, churn, connection_counts, diversity, max_distinct_subsets, normalised_utilisation, spread,
    subsets, worst_spread, Churn, Report, Scenario,
};
use steady_subset::{Algorithm, SubsetError};

use crate::sweep::Sweep;

/// Which scenarios to measure.
#[derive(Debug, Clone)]
pub struct LabConfig {
    /// Sample the article's grid every `grid_step` values of M and N (1: all 59,148).
    pub grid_step: usize,
    /// Backend churn as N grows one task at a time: `(M, k, N range)`.
    pub resize: (usize, usize, RangeInclusive<usize>),
    /// Subset-size churn `k -> k + 1`: `(M, N, k range)`.
    pub size_churn: (usize, usize, RangeInclusive<usize>),
    /// Frontend churn `M -> M + 1`: `(N, k, M values)`.
    pub frontend_churn: (usize, usize, Vec<usize>),
    /// Spread against the restart window: `(M, N, k, window range)`.
    pub spread: (usize, usize, usize, RangeInclusive<usize>),
    /// Diversity against M: `(N, k, largest M, sample every)`.
    pub diversity: (usize, usize, usize, usize),
    /// The production-like family.
    pub production: Vec<Scenario>,
    /// The rolling-restart family: scenario and restart window.
    pub rolling: Vec<(Scenario, usize)>,
}

impl LabConfig {
    /// The configuration `docs/` is generated from.
    pub fn full() -> Self {
        let sizes = [10, 50, 100, 500, 1000, 5000];
        let mut production = Vec::new();
        for &frontends in &sizes {
            for &backends in &sizes {
                for size in [10, 20, 50, 100] {
                    production.push(Scenario { frontends, backends, size });
                }
            }
        }
        let mut rolling = Vec::new();
        for frontends in [100, 1000] {
            for backends in [100, 1000] {
                for size in [10, 20, 50] {
                    for window in [5, 10, 25, 50] {
                        rolling.push((Scenario { frontends, backends, size }, window));
                    }
                }
            }
        }
        Self {
            grid_step: 1,
            resize: (500, 20, 20..=300),
            size_churn: (500, 300, 1..=60),
            frontend_churn: (300, 20, (1..=500).step_by(5).collect()),
            spread: (500, 300, 20, 1..=60),
            diversity: (100, 10, 5000, 25),
            production,
            rolling,
        }
    }

    /// A configuration small enough for unit tests.
    pub fn tiny() -> Self {
        Self {
            grid_step: 64,
            resize: (30, 5, 10..=14),
            size_churn: (30, 20, 1..=4),
            frontend_churn: (20, 5, vec![1, 2, 10]),
            spread: (30, 40, 5, 1..=6),
            diversity: (12, 3, 60, 20),
            production: vec![
                Scenario { frontends: 10, backends: 10, size: 3 },
                Scenario { frontends: 50, backends: 20, size: 5 },
            ],
            rolling: vec![(Scenario { frontends: 10, backends: 30, size: 5 }, 5)],
        }
    }
}

/// One scenario of the article's grid.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GridPoint {
    /// The scenario.
    pub scenario: Scenario,
    /// Normalised utilisation.
    pub utilisation: f64,
    /// Diversity.
    pub diversity: f64,
    /// Churn when N grows by one.
    pub growth: Churn,
    /// Churn when N shrinks by one.
    pub shrink: Churn,
    /// Worst spread with a restart window of k.
    pub spread: f64,
}

/// The churn of one step of a sweep, at `x` (the N, k or M before the step).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ChurnPoint {
    /// The swept value before the step.
    pub x: usize,
    /// Connections opened by the step.
    pub churn: Churn,
}

/// Spread for one restart window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpreadPoint {
    /// Consecutive tasks restarting at once.
    pub window: usize,
    /// The largest fraction of any frontend's subset inside one window.
    pub worst: f64,
    /// The mean over frontends of that fraction.
    pub mean: f64,
}

/// Everything measured, per algorithm (outer index: `algorithms`).
#[derive(Debug, Clone)]
pub struct LabResults {
    /// The configuration measured.
    pub config: LabConfig,
    /// The algorithms, in the order of every outer vector below.
    pub algorithms: Vec<Algorithm>,
    /// The article's grid.
    pub grid: Vec<Vec<GridPoint>>,
    /// Backend churn, N -> N + 1.
    pub resize: Vec<Vec<ChurnPoint>>,
    /// Subset-size churn, k -> k + 1.
    pub size_churn: Vec<Vec<ChurnPoint>>,
    /// Frontend churn, M -> M + 1.
    pub frontend_churn: Vec<Vec<ChurnPoint>>,
    /// Spread against the window.
    pub spread: Vec<Vec<SpreadPoint>>,
    /// Diversity against M: `(M, diversity)`.
    pub diversity: Vec<Vec<(usize, f64)>>,
    /// The production-like family.
    pub production: Vec<Vec<(Scenario, Report)>>,
    /// The rolling-restart family: scenario, window and spread.
    pub rolling: Vec<Vec<(Scenario, SpreadPoint)>>,
}

/// `f` for every (algorithm, x), run on the sweep's workers, grouped by algorithm.
fn per_algorithm<X: Sync, R: Send>(
    sweep: &Sweep,
    label: &str,
    algorithms: &[Algorithm],
    xs: &[X],
    f: impl Fn(&Algorithm, &X) -> Result<R, SubsetError> + Sync,
) -> Result<Vec<Vec<R>>, SubsetError> {
    let pairs: Vec<(usize, usize)> =
        (0..algorithms.len()).flat_map(|a| (0..xs.len()).map(move |x| (a, x))).collect();
    let mut flat = sweep.map(label, &pairs, |&(a, x)| f(&algorithms[a], &xs[x]))?.into_iter();
    Ok(algorithms.iter().map(|_| flat.by_ref().take(xs.len()).collect()).collect())
}

/// Measures every algorithm of `algorithms` on every scenario of `config`.
///
/// # Errors
///
/// A [`SubsetError`] if a configured scenario is out of range.
pub fn run(config: &LabConfig, algorithms: &[Algorithm], sweep: &Sweep) -> Result<LabResults, SubsetError> {
    let grid = per_algorithm(sweep, "article grid", algorithms, &article_grid(config.grid_step), |a, &s| {
        let base = subsets(a, s.frontends, s.backends, s.size)?;
        Ok(GridPoint {
            scenario: s,
            utilisation: normalised_utilisation(&connection_counts(&base, s.backends)),
            diversity: diversity(&base, s.backends),
            growth: churn(&base, &subsets(a, s.frontends, s.backends + 1, s.size)?),
            shrink: churn(&base, &subsets(a, s.frontends, s.backends - 1, s.size)?),
            spread: worst_spread(&base, s.size),
        })
    })?;

    let (m, k, ref ns) = config.resize;
    let ns: Vec<usize> = ns.clone().collect();
    let resize = per_algorithm(sweep, "backend churn", algorithms, &ns, |a, &n| {
        Ok(ChurnPoint { x: n, churn: churn(&subsets(a, m, n, k)?, &subsets(a, m, n + 1, k)?) })
    })?;

    let (m, n, ref ks) = config.size_churn;
    let ks: Vec<usize> = ks.clone().collect();
    let size_churn = per_algorithm(sweep, "subset-size churn", algorithms, &ks, |a, &k| {
        Ok(ChurnPoint { x: k, churn: churn(&subsets(a, m, n, k)?, &subsets(a, m, n, k + 1)?) })
    })?;

    let (n, k, ref ms) = config.frontend_churn;
    let frontend_churn = per_algorithm(sweep, "frontend churn", algorithms, ms, |a, &m| {
        Ok(ChurnPoint { x: m, churn: churn(&subsets(a, m, n, k)?, &subsets(a, m + 1, n, k)?) })
    })?;

    let (m, n, k, ref ws) = config.spread;
    let ws: Vec<usize> = ws.clone().collect();
    let spread =
        per_algorithm(sweep, "spread", algorithms, &ws, |a, &w| Ok(spread_point(&subsets(a, m, n, k)?, w)))?;

    let (n, k, max_m, every) = config.diversity;
    let diversity = per_algorithm(sweep, "diversity", algorithms, &[()], |a, ()| {
        Ok(diversity_curve(&subsets(a, max_m, n, k)?, n, every))
    })?
    .into_iter()
    .map(|mut one| one.pop().unwrap_or_default())
    .collect();

    let production = per_algorithm(sweep, "production-like", algorithms, &config.production, |a, &s| {
        Ok((s, Report::measure(a, s, s.size)?))
    })?;

    let rolling = per_algorithm(sweep, "rolling restart", algorithms, &config.rolling, |a, &(s, w)| {
        Ok((s, spread_point(&subsets(a, s.frontends, s.backends, s.size)?, w)))
    })?;

    Ok(LabResults {
        config: config.clone(),
        algorithms: algorithms.to_vec(),
        grid,
        resize,
        size_churn,
        frontend_churn,
        spread,
        diversity,
        production,
        rolling,
    })
}

/// Worst and mean spread of a fleet's subsets for one window.
fn spread_point(all: &[Vec<usize>], window: usize) -> SpreadPoint {
    let fractions: Vec<f64> = all.iter().map(|s| spread(s, window)).collect();
    SpreadPoint {
        window,
        worst: fractions.iter().copied().fold(0.0, f64::max),
        mean: fractions.iter().sum::<f64>() / fractions.len().max(1) as f64,
    }
}

/// Diversity of the first `M` subsets for every `M <= 100` and then every `every`-th,
/// counting distinct subsets incrementally.
fn diversity_curve(all: &[Vec<usize>], backends: usize, every: usize) -> Vec<(usize, f64)> {
    let mut seen: HashSet<Vec<usize>> = HashSet::new();
    let mut curve = Vec::new();
    for (i, subset) in all.iter().enumerate() {
        let mut key = subset.clone();
        key.sort_unstable();
        seen.insert(key);
        let m = i + 1;
        if m <= 100 || m % every.max(1) == 0 || m == all.len() {
            // The same normalisation as quality::diversity, on the first m subsets.
            let d = seen.len() as f64 / max_distinct_subsets(m, backends, subset.len()) as f64;
            curve.push((m, d));
        }
    }
    curve
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_diversity_curve_ends_where_quality_diversity_does() {
        let a = Algorithm::from_name("ringsteady").unwrap();
        let all = subsets(&a, 300, 40, 4).unwrap();
        let curve = diversity_curve(&all, 40, 50);
        assert_eq!(curve.len(), 100 + 4);
        assert_eq!(curve[..100].iter().map(|p| p.0).collect::<Vec<_>>(), (1..=100).collect::<Vec<_>>());
        let (m, d) = *curve.last().unwrap();
        assert_eq!(m, 300);
        assert!((d - diversity(&all, 40)).abs() < 1e-12, "{d}");
        // Ringsteady has at most N = 40 distinct subsets.
        assert!(d <= 40.0 / 300.0 + 1e-12);
    }
}
