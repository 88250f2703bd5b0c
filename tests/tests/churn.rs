//! Backend churn: how many members of a subset change when the backend job resizes by one.

use std::collections::HashSet;

use proptest::prelude::*;
use steady_subset::{
    Algorithm, DecimalRocksteadier, PreferenceOrder, Random, Ringsteady, Rocksteadier, Subsetting,
};

/// The most members any frontend in `frontends` must replace when N goes `from -> to`.
fn worst_change(
    algorithm: &dyn Subsetting,
    frontends: std::ops::Range<usize>,
    from: usize,
    to: usize,
    size: usize,
) -> usize {
    frontends
        .map(|m| {
            let before: HashSet<usize> = algorithm.subset(m, from, size).unwrap().into_iter().collect();
            algorithm.subset(m, to, size).unwrap().into_iter().filter(|b| !before.contains(b)).count()
        })
        .max()
        .unwrap_or(0)
}

/// Backend sizes that cross lot boundaries (multiples of 10) in every way, small and large.
fn sizes_across_lot_boundaries() -> Vec<usize> {
    let mut sizes: Vec<usize> = (1..=130).collect();
    for boundary in [1_000, 10_000, 65_536, 100_000] {
        sizes.extend(boundary - 11..=boundary + 11);
    }
    sizes
}

/// Both lot algorithms with lots of `lot`.
fn lot_algorithms(lot: usize) -> [Box<dyn Subsetting>; 2] {
    [
        Box::new(Rocksteadier::with_lot_size(lot).unwrap()),
        Box::new(DecimalRocksteadier::with_lot_size(lot).unwrap()),
    ]
}

#[test]
fn lot_algorithms_change_at_most_one_member_when_n_changes_by_one() {
    for r in lot_algorithms(10) {
        let name = r.name();
        for n in sizes_across_lot_boundaries() {
            for size in [1, 3, 10, 20, 45] {
                // Frontends 0..200: twenty whole frontend lots.
                assert!(worst_change(&*r, 0..200, n, n + 1, size) <= 1, "{name} growth N={n} k={size}");
                assert!(worst_change(&*r, 0..200, n + 1, n, size) <= 1, "{name} shrink N={} k={size}", n + 1);
            }
        }
    }
}

#[test]
fn lot_algorithms_with_other_lot_sizes_keep_the_bound() {
    for lot in [1, 3, 7, 16] {
        for r in lot_algorithms(lot) {
            for n in 1..=70 {
                assert!(worst_change(&*r, 0..(lot * 6), n, n + 1, 8) <= 1, "{} L={lot} N={n}", r.name());
            }
        }
    }
}

/// The most members any prefix of length `1..=k_max` loses between two orders.
fn worst_prefix_change(before: &[usize], after: &[usize], k_max: usize) -> usize {
    let mut in_after = HashSet::new();
    let mut in_before = HashSet::new();
    let mut worst = 0;
    for k in 1..=k_max.min(before.len()).min(after.len()) {
        in_after.insert(after[k - 1]);
        in_before.insert(before[k - 1]);
        worst = worst.max(in_before.difference(&in_after).count());
    }
    worst
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Every subset size at once, at random job sizes up to a million: a new lot joining
    /// the ring and a padding slot turning real each cost at most one member.
    #[test]
    fn decimal_rocksteadier_changes_at_most_one_member_of_any_prefix(
        frontend in 0usize..1_000_000,
        backends in prop_oneof![1usize..300, 1usize..1_000_000],
        lot in prop_oneof![Just(10usize), 1usize..40],
    ) {
        let r = DecimalRocksteadier::with_lot_size(lot).unwrap();
        let k_max = 150;
        let before: Vec<usize> = r.order(frontend, backends).unwrap().take(k_max).collect();
        let after: Vec<usize> = r.order(frontend, backends + 1).unwrap().take(k_max).collect();
        prop_assert!(worst_prefix_change(&before, &after, k_max) <= 1, "growth");
        prop_assert!(worst_prefix_change(&after, &before, k_max) <= 1, "shrink");
    }
}

#[test]
fn random_changes_at_most_one_member_when_n_changes_by_one() {
    let r = Random::default();
    for n in (1..=130).chain([9_999, 10_000]) {
        assert!(worst_change(&r, 0..100, n, n + 1, 20) <= 1, "N={n}");
        assert!(worst_change(&r, 0..100, n + 1, n, 20) <= 1, "N={}", n + 1);
    }
}

#[test]
fn ringsteady_churn_bounds() {
    // Unscaled, positions never move: at most one change, like consistent hashing.
    // Scaled, every backend slides a little towards the new evenly spaced slots, which
    // can also move a frontend's start by one rank: at most two changes. (The lab's
    // grid measures 2 as the worst for scaled Ringsteady.)
    for n in 1..=300 {
        assert!(worst_change(&Ringsteady::unscaled(), 0..300, n, n + 1, 20) <= 1, "unscaled N={n}");
        assert!(worst_change(&Ringsteady::new(), 0..300, n, n + 1, 20) <= 2, "scaled N={n}");
    }
}

#[test]
fn deterministic_can_replace_a_whole_subset() {
    // The reason Rocksteadier exists: the SRE book's algorithm reshuffles on every resize.
    let d = Algorithm::from_name("deterministic").unwrap();
    let worst = (20..60).map(|n| worst_change(&d, 0..100, n, n + 1, 10)).max().unwrap();
    assert_eq!(worst, 10);
}

#[test]
fn round_robin_and_deterministic_reproduce_the_articles_round_structure() {
    // N = 10, k = 4. Round robin: only N / gcd(k, N) = 5 distinct subsets.
    let rr = Algorithm::from_name("round-robin").unwrap();
    let distinct: HashSet<Vec<usize>> = (0..50)
        .map(|m| {
            let mut s = rr.subset(m, 10, 4).unwrap();
            s.sort_unstable();
            s
        })
        .collect();
    assert_eq!(distinct.len(), 5);

    // Deterministic: N div k = 2 subsets per round, disjoint, 2 backends left over;
    // rounds differ.
    let d = Algorithm::from_name("deterministic").unwrap();
    let mut rounds = HashSet::new();
    for round in 0..20 {
        let a: HashSet<usize> = d.subset(2 * round, 10, 4).unwrap().into_iter().collect();
        let b: HashSet<usize> = d.subset(2 * round + 1, 10, 4).unwrap().into_iter().collect();
        assert!(a.is_disjoint(&b));
        assert_eq!(a.union(&b).count(), 8);
        let mut key: Vec<usize> = a.into_iter().collect();
        key.sort_unstable();
        rounds.insert(key);
    }
    assert!(rounds.len() > 15, "rounds should shuffle differently: {} distinct", rounds.len());
}
