//! Deterministic subsetting (the SRE book's, chapter 20) and its balanced variant.
//!
//! Frontends are grouped into *rounds* of `count = N div k`. Every frontend of a
//! round shuffles the backends the same way and takes its own slice of `k`, so within
//! a round each backend is used at most once. Rounds differ in their shuffle, which
//! gives diversity; the `N mod k` backends left over at the end of a round's shuffle
//! go unused by that round.

use crate::hash::hash_pair;
use crate::prng::{shuffle, SplitMix64};
use crate::{check_backends, SubsetError, Subsetting};

/// The SRE book's deterministic subsetting.
///
/// # Specification (frozen)
///
/// With `k' = min(k, N)`, `count = N div k'`, round `g = m div count` and slot
/// `s = m mod count`: shuffle `[0, 1, ..., N-1]` with [`crate::prng::shuffle`] driven by
/// `SplitMix64::new(hash_pair(seed, g))`, and return entries `s×k' .. s×k' + k'`.
///
/// Properties: good balance (the leftovers of each round cause a little imbalance),
/// high diversity, no frontend churn, but changing `N` or `k` reshuffles every round:
/// a one-task resize can replace a frontend's whole subset. Not a
/// [`crate::PreferenceOrder`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Deterministic {
    /// A fleet-wide salt for the shuffles (default 0). All frontends of a fleet must
    /// use the same value; different backend jobs may use different ones.
    pub seed: u64,
}

/// Deterministic subsetting with the leftovers of each round chosen round-robin.
///
/// # Specification (frozen)
///
/// As [`Deterministic`], except that round `g` first sets aside its `e = N mod k'`
/// leftovers, the backends `(g×e + t) mod N` for `t` in `0..e`, and shuffles only the
/// remaining `N - e` backends (in ascending order before the shuffle). Every backend is
/// left out equally often across rounds, which improves balance when `M` is not a
/// multiple of `count`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeterministicBalanced {
    /// A fleet-wide salt for the shuffles (default 0); see [`Deterministic::seed`].
    pub seed: u64,
}

/// Round and slot of frontend `m`, or `None` when the subset is empty.
fn round_and_slot(frontend: usize, backends: usize, size: usize) -> Option<(usize, usize, usize)> {
    let k = size.min(backends);
    if k == 0 {
        return None;
    }
    let count = backends / k;
    Some((k, frontend / count, frontend % count))
}

/// The shuffled backends of one round: all of them, or for the balanced variant all
/// but the round's `N mod k` leftovers.
fn round_shuffle(seed: u64, backends: usize, k: usize, round: usize, balanced: bool) -> Vec<usize> {
    let mut candidates: Vec<usize> = if balanced {
        let leftovers = backends % k;
        // (g × e) mod N without overflow for any round.
        let first = ((round as u128 % backends as u128) * leftovers as u128 % backends as u128) as usize;
        let mut set_aside = vec![false; backends];
        for t in 0..leftovers {
            set_aside[(first + t) % backends] = true;
        }
        (0..backends).filter(|&b| !set_aside[b]).collect()
    } else {
        (0..backends).collect()
    };
    shuffle(&mut candidates, &mut SplitMix64::new(hash_pair(seed, round as u64)));
    candidates
}

/// One frontend's subset.
fn subset_into(
    seed: u64,
    balanced: bool,
    frontend: usize,
    backends: usize,
    size: usize,
    out: &mut Vec<usize>,
) -> Result<(), SubsetError> {
    check_backends(backends)?;
    out.clear();
    if let Some((k, round, slot)) = round_and_slot(frontend, backends, size) {
        let shuffled = round_shuffle(seed, backends, k, round, balanced);
        out.extend_from_slice(&shuffled[slot * k..slot * k + k]);
    }
    Ok(())
}

/// Every frontend's subset, shuffling each round once.
fn job_subsets(
    seed: u64,
    balanced: bool,
    frontends: usize,
    backends: usize,
    size: usize,
) -> Result<Vec<Vec<usize>>, SubsetError> {
    check_backends(backends)?;
    let mut all = Vec::with_capacity(frontends);
    let mut current: Option<(usize, Vec<usize>)> = None;
    for m in 0..frontends {
        let Some((k, round, slot)) = round_and_slot(m, backends, size) else {
            all.push(Vec::new());
            continue;
        };
        if current.as_ref().is_none_or(|(r, _)| *r != round) {
            current = Some((round, round_shuffle(seed, backends, k, round, balanced)));
        }
        let (_, shuffled) = current.as_ref().expect("set above");
        all.push(shuffled[slot * k..slot * k + k].to_vec());
    }
    Ok(all)
}

impl Subsetting for Deterministic {
    fn name(&self) -> &'static str {
        "deterministic"
    }

    fn subset_into(
        &self,
        frontend: usize,
        backends: usize,
        size: usize,
        out: &mut Vec<usize>,
    ) -> Result<(), SubsetError> {
        subset_into(self.seed, false, frontend, backends, size, out)
    }

    fn job_subsets(
        &self,
        frontends: usize,
        backends: usize,
        size: usize,
    ) -> Result<Vec<Vec<usize>>, SubsetError> {
        job_subsets(self.seed, false, frontends, backends, size)
    }
}

impl Subsetting for DeterministicBalanced {
    fn name(&self) -> &'static str {
        "deterministic-balanced"
    }

    fn subset_into(
        &self,
        frontend: usize,
        backends: usize,
        size: usize,
        out: &mut Vec<usize>,
    ) -> Result<(), SubsetError> {
        subset_into(self.seed, true, frontend, backends, size, out)
    }

    fn job_subsets(
        &self,
        frontends: usize,
        backends: usize,
        size: usize,
    ) -> Result<Vec<Vec<usize>>, SubsetError> {
        job_subsets(self.seed, true, frontends, backends, size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn as_set(v: Vec<usize>) -> BTreeSet<usize> {
        v.into_iter().collect()
    }

    #[test]
    fn a_round_uses_disjoint_slices_of_one_shuffle() {
        // N = 10, k = 4: two subsets per round, two backends left over.
        for round in 0..5 {
            let a = as_set(Deterministic::default().subset(2 * round, 10, 4).unwrap());
            let b = as_set(Deterministic::default().subset(2 * round + 1, 10, 4).unwrap());
            assert!(a.is_disjoint(&b));
        }
    }

    #[test]
    fn balanced_variant_sets_aside_leftovers_round_robin() {
        // The article's example: round 0 leaves out {0, 1}, round 1 leaves out {2, 3}.
        let alg = DeterministicBalanced::default();
        for (round, left_out) in [(0usize, [0usize, 1]), (1, [2, 3]), (4, [8, 9]), (5, [0, 1])] {
            let used: BTreeSet<usize> =
                (0..2).flat_map(|s| alg.subset(2 * round + s, 10, 4).unwrap()).collect();
            let expected: BTreeSet<usize> = (0..10).filter(|b| !left_out.contains(b)).collect();
            assert_eq!(used, expected, "round {round}");
        }
    }

    #[test]
    fn a_subset_as_large_as_the_job_is_the_whole_job() {
        let s = as_set(Deterministic::default().subset(3, 7, 9).unwrap());
        assert_eq!(s, (0..7).collect());
        let s = as_set(DeterministicBalanced::default().subset(3, 7, 7).unwrap());
        assert_eq!(s, (0..7).collect());
    }
}
