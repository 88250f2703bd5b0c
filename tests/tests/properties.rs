//! Invariants every subsetting algorithm must hold, over wide random inputs.

use proptest::prelude::*;
use steady_subset::{Algorithm, SubsetError, Subsetting, MAX_BACKENDS};

/// Any algorithm, by its index in `Algorithm::all()`.
fn any_algorithm() -> impl Strategy<Value = Algorithm> {
    (0..Algorithm::NAMES.len()).prop_map(|i| Algorithm::all().swap_remove(i))
}

/// The algorithms whose subsets nest.
fn any_ordered_algorithm() -> impl Strategy<Value = Algorithm> {
    any_algorithm().prop_filter("has an order", Algorithm::has_order)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 384, ..ProptestConfig::default() })]

    #[test]
    fn a_subset_is_min_k_n_distinct_backends_below_n(
        algorithm in any_algorithm(),
        frontend in 0usize..100_000,
        backends in 0usize..=10_000,
        extra in 0usize..=5,
        size_frac in 0.0f64..=1.0,
    ) {
        // k spans 0..=N+5, with small k as likely as large.
        let size = ((backends as f64 * size_frac * size_frac) as usize + extra).min(backends + 5);
        let subset = algorithm.subset(frontend, backends, size).unwrap();
        prop_assert_eq!(subset.len(), size.min(backends));
        prop_assert!(subset.iter().all(|&b| b < backends));
        let mut sorted = subset.clone();
        sorted.sort_unstable();
        sorted.dedup();
        prop_assert_eq!(sorted.len(), subset.len(), "duplicate members");
        // The same answer on every call.
        prop_assert_eq!(algorithm.subset(frontend, backends, size).unwrap(), subset);
    }

    #[test]
    fn an_ordered_algorithms_subset_is_the_prefix_of_its_order(
        algorithm in any_ordered_algorithm(),
        frontend in 0usize..100_000,
        backends in 0usize..=2_000,
        size in 0usize..=60,
    ) {
        let order: Vec<usize> = algorithm.order(frontend, backends).unwrap().unwrap().collect();
        let mut sorted = order.clone();
        sorted.sort_unstable();
        prop_assert_eq!(sorted, (0..backends).collect::<Vec<_>>(), "the order is a permutation of 0..N");
        let subset = algorithm.subset(frontend, backends, size).unwrap();
        prop_assert_eq!(&subset[..], &order[..size.min(backends)]);
        // Growing k only adds: subset(k) is a prefix of subset(k + 1).
        let larger = algorithm.subset(frontend, backends, size + 1).unwrap();
        prop_assert_eq!(&larger[..subset.len()], &subset[..]);
    }

    #[test]
    fn huge_inputs_never_panic(
        algorithm in any_algorithm(),
        frontend in any::<usize>(),
        size in any::<usize>(),
        backends in prop_oneof![Just(MAX_BACKENDS + 1), Just(usize::MAX), 0usize..64],
    ) {
        match algorithm.subset(frontend, backends, size) {
            Ok(subset) => prop_assert_eq!(subset.len(), size.min(backends)),
            Err(e) => prop_assert_eq!(e, SubsetError::TooManyBackends { backends, max: MAX_BACKENDS }),
        }
    }
}

#[test]
fn ordered_algorithms_have_the_least_subset_size_churn() {
    // k -> k + 1 opens exactly one connection for the algorithms with an order.
    use steady_subset::quality::{Report, Scenario};
    for algorithm in Algorithm::all().into_iter().filter(Algorithm::has_order) {
        let r = Report::measure(&algorithm, Scenario { frontends: 120, backends: 97, size: 20 }, 20).unwrap();
        assert_eq!((r.size_churn.max, r.size_churn.total), (1, 120), "{algorithm}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn job_subsets_equal_each_frontends_own_subset(
        algorithm in any_algorithm(),
        frontends in 0usize..120,
        backends in 0usize..300,
        size in 0usize..40,
    ) {
        let job = algorithm.job_subsets(frontends, backends, size).unwrap();
        prop_assert_eq!(job.len(), frontends);
        for (m, subset) in job.iter().enumerate() {
            prop_assert_eq!(subset, &algorithm.subset(m, backends, size).unwrap(), "frontend {}", m);
        }
    }
}
