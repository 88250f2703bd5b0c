//! Decimal Rocksteadier against the faithful one: what it adds (exact balance for fleets
//! of round sizes, better balance on the article's grid) and what it keeps (diversity,
//! spread).
//! Churn is in `churn.rs`, the order and prefix properties in `properties.rs`, the frozen
//! order in `golden.rs`, the better grid mean in `quality_grid.rs`.

use steady_subset::quality::{connection_counts, diversity, normalised_utilisation, subsets, worst_spread};
use steady_subset::{DecimalRocksteadier, Rocksteadier, Subsetting};

fn utilisation(algorithm: &dyn Subsetting, frontends: usize, backends: usize, size: usize) -> f64 {
    let all = subsets(algorithm, frontends, backends, size).unwrap();
    normalised_utilisation(&connection_counts(&all, backends))
}

/// The lab's production-like family: M and N in {10, 50, 100, 500, 1000, 5000}, k in
/// {10, 20, 50, 100}.
fn production_like() -> Vec<(usize, usize, usize)> {
    let sizes = [10, 50, 100, 500, 1000, 5000];
    let mut scenarios = Vec::new();
    for frontends in sizes {
        for backends in sizes {
            for size in [10, 20, 50, 100] {
                scenarios.push((frontends, backends, size));
            }
        }
    }
    scenarios
}

#[test]
fn round_fleet_sizes_get_exactly_balanced_connections() {
    let decimal = DecimalRocksteadier::default();
    for (m, n, k) in production_like() {
        assert_eq!(utilisation(&decimal, m, n, k), 1.0, "M={m} N={n} k={k}");
    }
}

#[test]
fn the_faithful_order_misses_exact_balance_at_round_sizes() {
    // What the decimal ring fixes: 50 frontends of 10 connections over 500 backends
    // could use each backend once; Rocksteadier's unscaled lot positions double some.
    let faithful = Rocksteadier::default();
    assert_eq!(utilisation(&faithful, 50, 500, 10), 0.5);
    assert_eq!(utilisation(&DecimalRocksteadier::default(), 50, 500, 10), 1.0);
}

#[test]
fn every_frontend_gets_its_own_subset() {
    // The lab's diversity point: 5,000 frontends, 100 backends, 10 connections.
    let all = subsets(&DecimalRocksteadier::default(), 5000, 100, 10).unwrap();
    assert_eq!(diversity(&all, 100), 1.0);
}

#[test]
fn a_rolling_restart_takes_down_no_more_of_a_subset_than_with_rocksteadier() {
    // M = 500, N = 300, k = 20, restarting 5 to 40 consecutive backends at a time.
    for window in [5, 10, 20, 40] {
        let decimal = worst_spread(&subsets(&DecimalRocksteadier::default(), 500, 300, 20).unwrap(), window);
        let faithful = worst_spread(&subsets(&Rocksteadier::default(), 500, 300, 20).unwrap(), window);
        assert!(decimal <= faithful, "w={window}: {decimal} > {faithful}");
    }
}
