//! Golden vectors: the frozen contract of steady-subset.
//!
//! Every frontend of a fleet must compute the same subsets whichever version of the
//! library it runs. These tests recompute the subsets, generator outputs, bounded
//! draws, shuffles and hashes recorded in `tests/golden/*.txt` and fail on any
//! difference. A failure here means the change breaks every mixed-version fleet: do
//! not "fix" it by regenerating. Regenerate only when adding new vectors, with
//! `STEADY_BLESS=1 cargo test -p steady-tests --test golden`, and check that the diff
//! only adds lines.

use std::fmt::Write as _;
use std::path::PathBuf;

use steady_subset::hash::{hash_pair, mix64};
use steady_subset::prng::{shuffle, SplitMix64};
use steady_subset::{Algorithm, Subsetting};
use steady_testing::check_golden_file;

/// (frontend m, backends N, size k): small and large, k below, at and above N,
/// lot boundaries, the article's examples.
const TRIPLES: [(usize, usize, usize); 32] = [
    (0, 0, 5),
    (0, 1, 1),
    (2, 1, 3),
    (0, 10, 4),
    (1, 10, 4),
    (3, 10, 4),
    (7, 10, 4),
    (5, 11, 4),
    (10, 55, 10),
    (11, 55, 10),
    (12, 55, 10),
    (13, 55, 10),
    (19, 55, 10),
    (5, 20, 25),
    (77, 37, 37),
    (0, 100, 20),
    (7, 100, 20),
    (99, 101, 20),
    (17, 256, 20),
    (250, 241, 20),
    (123, 1_000, 20),
    (999, 1_009, 3),
    (4_321, 9_999, 20),
    (99_999, 10_000, 20),
    (31, 10_000, 100),
    (12_345, 65_536, 20),
    (4_321, 100_000, 20),
    (1, 1_000_000, 20),
    (500_000, 1_000_003, 20),
    (usize::MAX, 97, 5),
    (1 << 40, 1_000, 7),
    (3, 64, 64),
];

fn golden_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("golden").join(name)
}

fn join(v: impl IntoIterator<Item = impl ToString>) -> String {
    v.into_iter().map(|x| x.to_string()).collect::<Vec<_>>().join(" ")
}

fn subsets_file() -> String {
    let mut out = String::from(
        "# steady-subset golden subsets (frozen contract; see tests/tests/golden.rs).\n\
         # algorithm frontend backends size: members in preference order\n",
    );
    for algorithm in Algorithm::all() {
        for (m, n, k) in TRIPLES {
            // Large jobs only for the algorithms that answer in O(k log N).
            if n > 20_000
                && !matches!(
                    algorithm,
                    Algorithm::Ringsteady(_)
                        | Algorithm::Rocksteadier(_)
                        | Algorithm::DecimalRocksteadier(_)
                        | Algorithm::RoundRobin(_)
                )
            {
                continue;
            }
            let subset = algorithm.subset(m, n, k).unwrap();
            writeln!(out, "{algorithm} {m} {n} {k}: {}", join(subset)).unwrap();
        }
    }
    out
}

fn primitives_file() -> String {
    let mut out =
        String::from("# steady-subset golden primitives (frozen contract; see tests/tests/golden.rs).\n");
    for seed in [0u64, 1, 42, 0x9E37_79B9_7F4A_7C15, u64::MAX] {
        let mut rng = SplitMix64::new(seed);
        writeln!(out, "splitmix64 {seed}: {}", join((0..6).map(|_| rng.next()))).unwrap();
    }
    for (seed, bound) in [(0u64, 10u64), (7, 3), (7, 1 << 40), (99, u64::MAX), (5, 6)] {
        let mut rng = SplitMix64::new(seed);
        writeln!(out, "below {seed} {bound}: {}", join((0..8).map(|_| rng.below(bound)))).unwrap();
    }
    for (seed, len) in [(0u64, 10usize), (1, 10), (12_345, 10), (3, 1), (3, 2), (8, 17)] {
        let mut v: Vec<usize> = (0..len).collect();
        shuffle(&mut v, &mut SplitMix64::new(seed));
        writeln!(out, "shuffle {seed} {len}: {}", join(v)).unwrap();
    }
    for x in [0u64, 1, 2, 1 << 63, u64::MAX] {
        writeln!(out, "mix64 {x}: {}", mix64(x)).unwrap();
    }
    for (a, b) in [(0u64, 0u64), (0, 1), (1, 0), (12, 34), (u64::MAX, 5)] {
        writeln!(out, "hash_pair {a} {b}: {}", hash_pair(a, b)).unwrap();
    }
    out
}

/// Compares `computed` with the golden file `name` (see [`check_golden_file`]).
fn check(name: &str, computed: String) {
    check_golden_file(&golden_path(name), &computed);
}

#[test]
fn subsets_match_the_golden_vectors() {
    check("subsets.txt", subsets_file());
}

#[test]
fn prng_shuffle_and_hashes_match_the_golden_vectors() {
    check("primitives.txt", primitives_file());
}

#[test]
fn golden_subsets_cover_every_algorithm() {
    let file = std::fs::read_to_string(golden_path("subsets.txt")).unwrap();
    for name in Algorithm::NAMES {
        let lines = file.lines().filter(|l| l.starts_with(&format!("{name} "))).count();
        assert!(lines >= 24, "{name}: only {lines} golden subsets");
    }
}

/// The golden lines of `name`, as ((frontend, backends, size), members).
fn golden_subsets_of(name: &str) -> Vec<((usize, usize, usize), Vec<usize>)> {
    let file = std::fs::read_to_string(golden_path("subsets.txt")).unwrap();
    let prefix = format!("{name} ");
    file.lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .map(|rest| {
            let (head, members) = rest.split_once(':').expect("`m n k: members`");
            let triple: Vec<usize> = head.split_whitespace().map(|x| x.parse().unwrap()).collect();
            let members = members.split_whitespace().map(|x| x.parse().unwrap()).collect();
            ((triple[0], triple[1], triple[2]), members)
        })
        .collect()
}

/// From the first release the default is the decimal variant: a fleet that takes the
/// default computes `rocksteadier-decimal`'s frozen subsets, and `rocksteadier` stays
/// available by name with its own frozen subsets.
#[test]
fn the_default_algorithm_is_decimal_rocksteadier_and_computes_its_golden_subsets() {
    let default = Algorithm::default();
    assert_eq!(default, Algorithm::DecimalRocksteadier(steady_subset::DecimalRocksteadier::default()));
    assert_eq!(default.name(), "rocksteadier-decimal");

    let decimal = golden_subsets_of("rocksteadier-decimal");
    assert_eq!(decimal.len(), TRIPLES.len());
    for ((m, n, k), members) in &decimal {
        assert_eq!(&default.subset(*m, *n, *k).unwrap(), members, "default at ({m}, {n}, {k})");
    }

    // Pinned by name, Rocksteadier still computes its own golden subsets, and they differ
    // from the default's: the default really changed.
    let pinned = Algorithm::from_name("rocksteadier").unwrap();
    assert_eq!(pinned, Algorithm::Rocksteadier(steady_subset::Rocksteadier::default()));
    let faithful = golden_subsets_of("rocksteadier");
    assert_eq!(faithful.len(), TRIPLES.len());
    let mut differ = 0;
    for ((m, n, k), members) in &faithful {
        assert_eq!(&pinned.subset(*m, *n, *k).unwrap(), members, "rocksteadier at ({m}, {n}, {k})");
        differ += usize::from(&default.subset(*m, *n, *k).unwrap() != members);
    }
    assert!(differ > TRIPLES.len() / 2, "only {differ} golden subsets differ between the two");
}
