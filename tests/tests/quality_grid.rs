//! Connection balance on the article's figure-2 grid (k = 20, 1 <= M <= 256,
//! 20 <= N <= 256, M*k > N).
//!
//! The sampled grid (every 16th M and N) always runs; the full grid is `#[ignore]`d:
//! `cargo test --release -p steady-tests --test quality_grid -- --ignored`
//! (or `cargo run --release -p steady-lab -- grid --step 1` for the figures).

use steady_subset::quality::{article_grid, connection_counts, normalised_utilisation, subsets};
use steady_subset::Algorithm;

fn mean_utilisation(algorithm: &Algorithm, step: usize) -> f64 {
    let grid = article_grid(step);
    let total: f64 = grid
        .iter()
        .map(|s| {
            let all = subsets(algorithm, s.frontends, s.backends, s.size).unwrap();
            normalised_utilisation(&connection_counts(&all, s.backends))
        })
        .sum();
    total / grid.len() as f64
}

fn check(step: usize) {
    let rocksteadier = mean_utilisation(&Algorithm::from_name("rocksteadier").unwrap(), step);
    let balanced = mean_utilisation(&Algorithm::from_name("deterministic-balanced").unwrap(), step);
    let random = mean_utilisation(&Algorithm::from_name("random").unwrap(), step);
    assert!(rocksteadier >= 0.93, "rocksteadier mean utilisation {rocksteadier:.4}");
    // Measured: 0.9491 against 0.9446 on the sample, 0.9496 against 0.9462 on the full grid
    // (docs/rocksteadier-decimal.md). The orders are frozen, so this cannot drift.
    let decimal = mean_utilisation(&Algorithm::from_name("rocksteadier-decimal").unwrap(), step);
    assert!(
        decimal > rocksteadier + 0.003,
        "rocksteadier-decimal {decimal:.4} vs rocksteadier {rocksteadier:.4}"
    );
    assert!(balanced >= 0.97, "deterministic-balanced mean utilisation {balanced:.4}");
    // The article's point: coordination beats independent random choices by far.
    assert!(random < 0.75 && rocksteadier > random + 0.2, "random {random:.4}");
}

#[test]
fn sampled_grid_meets_the_utilisation_targets() {
    assert_eq!(article_grid(16).len(), 225);
    check(16);
}

#[test]
#[ignore = "full grid: about a minute in release, far longer in debug"]
fn full_grid_meets_the_utilisation_targets() {
    check(1);
}

#[test]
fn the_grid_is_the_articles() {
    let grid = article_grid(1);
    assert!(grid.iter().all(|s| s.size == 20 && s.frontends * 20 > s.backends));
    assert!(grid.iter().all(|s| (1..=256).contains(&s.frontends) && (20..=256).contains(&s.backends)));
    // M >= 13 keeps all 237 values of N; M = 2..=12 keeps N < 20M, that is 20(M - 1)
    // values; M = 1 keeps none. 244 * 237 + 20 * (1 + ... + 11) = 59,148.
    assert_eq!(grid.len(), 59_148);
}
