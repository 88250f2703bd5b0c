//! Quality metrics for subsetting: balance, diversity, churn and spread.
//!
//! Each metric takes the subsets of a whole frontend job (one `Vec` per frontend,
//! as [`subsets`] computes them) so that the lab, the tests and the benchmarks measure
//! exactly the same thing.
//!
//! * **Balance** — [`connection_counts`] and [`normalised_utilisation`]: with `M × k`
//!   connections over `N` backends, no algorithm can do better than giving the busiest
//!   backend `ceil(M × k / N)`; utilisation is that ideal divided by the actual maximum
//!   (1.0 is ideal; 0.5 means the busiest backend has twice the ideal load).
//! * **Diversity** — [`diversity`]: distinct subsets (as sets) divided by the most there
//!   could be, `min(M, C(N, k))`.
//! * **Churn** — [`churn`]: after a change of `N`, `M` or `k`, how many connections each
//!   frontend that exists both before and after must open (the members of its new
//!   subset that were not in its old one); max and mean over frontends.
//! * **Spread** — [`spread`]: the largest fraction of one subset inside any window of
//!   `w` consecutive backend numbers, i.e. the worst share of a frontend's connections
//!   that a rolling restart of `w` tasks at a time takes down at once.

use std::collections::HashSet;

use crate::{SubsetError, Subsetting};

/// The subsets of frontends `0..frontends`, each of size `size` over `backends` tasks
/// (see [`Subsetting::job_subsets`]).
///
/// # Errors
///
/// As [`Subsetting::subset`].
pub fn subsets<A: Subsetting + ?Sized>(
    algorithm: &A,
    frontends: usize,
    backends: usize,
    size: usize,
) -> Result<Vec<Vec<usize>>, SubsetError> {
    algorithm.job_subsets(frontends, backends, size)
}

/// How many frontends connect to each backend: `counts[n]` for `n` in `0..backends`.
///
/// Members at or above `backends` are ignored (they cannot come from a valid subset).
pub fn connection_counts(subsets: &[Vec<usize>], backends: usize) -> Vec<usize> {
    let mut counts = vec![0; backends];
    for &b in subsets.iter().flatten() {
        if let Some(c) = counts.get_mut(b) {
            *c += 1;
        }
    }
    counts
}

/// `ceil(total / N) / max_n C_n` for the connection counts `C` (1.0 when there are no
/// connections): the fraction of the provisioned capacity that is used when every
/// backend is provisioned for the busiest one, relative to the best possible.
pub fn normalised_utilisation(counts: &[usize]) -> f64 {
    let total: usize = counts.iter().sum();
    let max = counts.iter().copied().max().unwrap_or(0);
    if max == 0 {
        return 1.0;
    }
    total.div_ceil(counts.len()) as f64 / max as f64
}

/// The number of distinct subsets (as sets) divided by `min(M, C(N, k))`, where `k` is
/// the size of the first subset (1.0 when there are no frontends; for subsets that could
/// not come from `N` backends the denominator is taken as at least 1).
pub fn diversity(subsets: &[Vec<usize>], backends: usize) -> f64 {
    if subsets.is_empty() {
        return 1.0;
    }
    let distinct: HashSet<Vec<usize>> = subsets
        .iter()
        .map(|s| {
            let mut s = s.clone();
            s.sort_unstable();
            s
        })
        .collect();
    distinct.len() as f64 / max_distinct_subsets(subsets.len(), backends, subsets[0].len()) as f64
}

/// `min(M, C(N, k))`, the most distinct subsets `M` frontends can have, and at least 1
/// (the denominator of [`diversity`]).
pub fn max_distinct_subsets(frontends: usize, backends: usize, size: usize) -> u128 {
    let frontends = frontends as u128;
    binomial_at_most(backends, size, frontends).min(frontends).max(1)
}

/// `C(n, k)`, or any value `>= cap` once it reaches `cap` (avoids overflow).
fn binomial_at_most(n: usize, k: usize, cap: u128) -> u128 {
    if k > n {
        return 0;
    }
    let k = k.min(n - k) as u128;
    let n = n as u128;
    let mut c: u128 = 1;
    for i in 0..k {
        // c × (n - i) / (i + 1) stays exact: c is C(n, i) and C(n, i+1) is an integer.
        c = c * (n - i) / (i + 1);
        if c >= cap {
            return c;
        }
    }
    c
}

/// Connections opened per frontend by a change from `before` to `after`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Churn {
    /// The most connections any one frontend must open.
    pub max: usize,
    /// The mean over the frontends that exist both before and after.
    pub mean: f64,
    /// All connections opened.
    pub total: usize,
}

/// The churn from `before` to `after`: for each frontend present in both (the shorter
/// list's length), the members of its new subset that were not in its old one.
pub fn churn(before: &[Vec<usize>], after: &[Vec<usize>]) -> Churn {
    let mut max = 0;
    let mut total = 0;
    let mut old: HashSet<usize> = HashSet::new();
    let frontends = before.len().min(after.len());
    for (b, a) in before.iter().zip(after) {
        old.clear();
        old.extend(b.iter().copied());
        let opened = a.iter().filter(|n| !old.contains(n)).count();
        max = max.max(opened);
        total += opened;
    }
    let mean = if frontends == 0 { 0.0 } else { total as f64 / frontends as f64 };
    Churn { max, mean, total }
}

/// The largest fraction of `subset` that lies inside any window of `window`
/// consecutive backend numbers (windows do not wrap: a rolling restart walks from task 0
/// up). 0.0 for an empty subset; 1.0 when `window` covers the whole job.
pub fn spread(subset: &[usize], window: usize) -> f64 {
    if subset.is_empty() {
        return 0.0;
    }
    let mut sorted = subset.to_vec();
    sorted.sort_unstable();
    // Two pointers: for each member as the window's lowest, count members below lowest + window.
    let mut best = 0;
    let mut hi = 0;
    for lo in 0..sorted.len() {
        hi = hi.max(lo);
        while hi < sorted.len() && sorted[hi] - sorted[lo] < window {
            hi += 1;
        }
        best = best.max(hi - lo);
    }
    best as f64 / subset.len() as f64
}

/// The worst [`spread`] over a whole frontend job.
pub fn worst_spread(subsets: &[Vec<usize>], window: usize) -> f64 {
    subsets.iter().map(|s| spread(s, window)).fold(0.0, f64::max)
}

/// One subsetting scenario: `frontends` tasks calling `backends` tasks, `size` connections each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Scenario {
    /// `M`, the frontend job's size.
    pub frontends: usize,
    /// `N`, the backend job's size.
    pub backends: usize,
    /// `k`, the subset size.
    pub size: usize,
}

/// Every quality metric of one algorithm in one [`Scenario`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Report {
    /// [`normalised_utilisation`] of the connection counts.
    pub utilisation: f64,
    /// The busiest backend's connection count.
    pub max_connections: usize,
    /// The best possible busiest count, `ceil(M × min(k, N) / N)`.
    pub ideal_max_connections: usize,
    /// [`diversity`].
    pub diversity: f64,
    /// [`churn`] when the backend job grows by one task (`N -> N + 1`).
    pub backend_growth_churn: Churn,
    /// [`churn`] when the backend job loses its last task (`N -> N - 1`; zero when `N <= 1`).
    pub backend_shrink_churn: Churn,
    /// [`churn`] of the existing frontends when the frontend job grows (`M -> M + 1`).
    pub frontend_churn: Churn,
    /// [`churn`] when the subset grows by one (`k -> k + 1`): one is the least possible
    /// while `k < N`.
    pub size_churn: Churn,
    /// [`worst_spread`] for the given window.
    pub spread: f64,
    /// The window the spread was measured with.
    pub window: usize,
}

impl Report {
    /// Measures `algorithm` in `scenario`, with spread over windows of `window` tasks.
    ///
    /// # Errors
    ///
    /// As [`Subsetting::subset`] (e.g. `N + 1 > MAX_BACKENDS`).
    pub fn measure<A: Subsetting + ?Sized>(
        algorithm: &A,
        scenario: Scenario,
        window: usize,
    ) -> Result<Self, SubsetError> {
        let Scenario { frontends: m, backends: n, size: k } = scenario;
        let base = subsets(algorithm, m, n, k)?;
        let counts = connection_counts(&base, n);
        let total: usize = counts.iter().sum();
        let shrink = if n > 1 { churn(&base, &subsets(algorithm, m, n - 1, k)?) } else { churn(&[], &[]) };
        Ok(Self {
            utilisation: normalised_utilisation(&counts),
            max_connections: counts.iter().copied().max().unwrap_or(0),
            ideal_max_connections: if n == 0 { 0 } else { total.div_ceil(n) },
            diversity: diversity(&base, n),
            backend_growth_churn: churn(&base, &subsets(algorithm, m, n + 1, k)?),
            backend_shrink_churn: shrink,
            frontend_churn: churn(&base, &subsets(algorithm, m.saturating_add(1), n, k)?),
            size_churn: churn(&base, &subsets(algorithm, m, n, k.saturating_add(1))?),
            spread: worst_spread(&base, window),
            window,
        })
    }
}

/// The scenarios of the article's figure 2, sampled every `step` along each axis:
/// `k = 20`, `M` in `1, 1 + step, ... <= 256`, `N` in `20, 20 + step, ... <= 256`,
/// keeping those with `M × k > N`. `step = 1` is the full grid (59,148 scenarios).
pub fn article_grid(step: usize) -> Vec<Scenario> {
    const SIZE: usize = 20;
    let step = step.max(1);
    let mut grid = Vec::new();
    for frontends in (1..=256).step_by(step) {
        for backends in (SIZE..=256).step_by(step) {
            if frontends * SIZE > backends {
                grid.push(Scenario { frontends, backends, size: SIZE });
            }
        }
    }
    grid
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utilisation_is_one_when_balanced_and_halves_when_one_backend_doubles() {
        assert_eq!(normalised_utilisation(&[2, 2, 2]), 1.0);
        // 7 connections over 3 backends: ideal max is 3.
        assert_eq!(normalised_utilisation(&[3, 2, 2]), 1.0);
        assert_eq!(normalised_utilisation(&[4, 2, 0]), 0.5);
        assert_eq!(normalised_utilisation(&[]), 1.0);
    }

    #[test]
    fn diversity_counts_sets_not_orders() {
        let s = vec![vec![0, 1], vec![1, 0], vec![2, 3]];
        assert!((diversity(&s, 4) - 2.0 / 3.0).abs() < 1e-12);
        // Only C(3, 2) = 3 subsets are possible with N = 3, k = 2.
        let s = vec![vec![0, 1], vec![1, 2], vec![0, 2], vec![0, 1]];
        assert_eq!(diversity(&s, 3), 1.0);
    }

    #[test]
    fn max_distinct_subsets_is_min_m_binomial() {
        assert_eq!(max_distinct_subsets(1000, 10, 4), 210);
        assert_eq!(max_distinct_subsets(100, 10, 4), 100);
        assert_eq!(max_distinct_subsets(5, 3, 3), 1);
        assert_eq!(max_distinct_subsets(0, 3, 3), 1);
    }

    #[test]
    fn binomial_saturates_instead_of_overflowing() {
        assert_eq!(binomial_at_most(10, 4, u128::MAX), 210);
        assert!(binomial_at_most(100_000, 50_000, 1000) >= 1000);
        assert_eq!(binomial_at_most(3, 5, 10), 0);
    }

    #[test]
    fn churn_counts_opened_connections_of_surviving_frontends() {
        let before = vec![vec![0, 1, 2], vec![3, 4, 5]];
        let after = vec![vec![0, 1, 6], vec![6, 7, 8], vec![9, 9, 9]];
        let c = churn(&before, &after);
        assert_eq!(c, Churn { max: 3, mean: 2.0, total: 4 });
    }

    #[test]
    fn spread_finds_the_densest_window() {
        assert_eq!(spread(&[0, 1, 2, 3], 4), 1.0);
        assert_eq!(spread(&[0, 10, 20, 30], 4), 0.25);
        assert_eq!(spread(&[0, 2, 10, 11], 2), 0.5);
        assert_eq!(spread(&[], 3), 0.0);
    }
}
