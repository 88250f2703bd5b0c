//! Bounded-load keyed routing: a keyed request whose replica has far more requests in
//! flight than the mean goes to the next candidate under the bound (see
//! [`crate::KeyedLoadBound`] for the rule and what it trades).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use steady_subset::prng::SplitMix64;

use super::endpoint::Endpoint;
use super::pick::p2c;
use crate::config::{KeyedLoadBound, KeyedSpill, MAX_NEIGHBOUR_STEPS};

/// A slice table's bound: the configuration, the replicas the mean is taken over, and
/// the count of requests spilled off their slice's replicas.
#[derive(Debug)]
pub(crate) struct LoadBound<S> {
    factor: f64,
    /// The configured floor, as a count of requests in flight.
    floor: usize,
    spill: KeyedSpill,
    /// Every connected replica of the assignment in force, once, by task: what the mean
    /// is taken over, and the last resort.
    pool: Vec<Arc<Endpoint<S>>>,
    spilled: Arc<AtomicU64>,
}

/// Requests this frontend has in flight on `e`.
#[inline]
fn in_flight<S>(e: &Endpoint<S>) -> usize {
    e.calls.in_flight.load(Ordering::Relaxed)
}

impl<S> LoadBound<S> {
    /// The bound `config` over `pool` (the connected replicas), counting spills in `spilled`.
    pub(crate) fn new(
        config: KeyedLoadBound,
        mut pool: Vec<Arc<Endpoint<S>>>,
        spilled: Arc<AtomicU64>,
    ) -> Self {
        pool.sort_unstable_by_key(|e| (e.task, e.id));
        Self { factor: config.factor, floor: config.floor as usize, spill: config.spill, pool, spilled }
    }

    /// Whether `picked` has more than the floor in flight: only then can it be over the
    /// bound, and [`LoadBound::place`] has to look. One atomic load: the fast path.
    #[inline]
    pub(crate) fn may_be_over(&self, picked: &Endpoint<S>) -> bool {
        in_flight(picked) > self.floor
    }

    /// Where a request for slice `i` goes, its pick `picked` having more than the floor in
    /// flight: `picked` while under the bound; else the least loaded of the slice's
    /// other replicas under it; else (spilling to neighbours) the first replica under it
    /// of the next slices (`ready(j)` for slice `j` of `slices`) on another task; else
    /// power of two choices over every connected replica, if that finds one less loaded than
    /// `picked`; else `picked`.
    #[inline(never)]
    pub(crate) fn place<'a>(
        &'a self,
        picked: &'a Arc<Endpoint<S>>,
        i: usize,
        slices: usize,
        ready: impl Fn(usize) -> &'a [Arc<Endpoint<S>>],
        rng: &mut SplitMix64,
    ) -> &'a Arc<Endpoint<S>> {
        let n = self.pool.len().max(1);
        let total: usize = self.pool.iter().map(|e| in_flight(e)).sum();
        let bound = self.factor * total as f64 / n as f64 + self.floor as f64;
        let load = in_flight(picked);
        if load as f64 <= bound {
            return picked;
        }
        let under = |e: &Arc<Endpoint<S>>| e.gate().is_open() && in_flight(e) as f64 <= bound;
        let own = ready(i);
        if let Some(other) = own.iter().filter(|e| e.id != picked.id && under(e)).min_by_key(|e| in_flight(e))
        {
            return other;
        }
        if self.spill == KeyedSpill::Neighbour {
            for step in 1..=MAX_NEIGHBOUR_STEPS.min(slices.saturating_sub(1)) {
                let next = ready((i + step) % slices);
                if let Some(e) = next.iter().find(|e| !own.iter().any(|o| o.task == e.task) && under(e)) {
                    self.spilled.fetch_add(1, Ordering::Relaxed);
                    return e;
                }
            }
        }
        match p2c(&self.pool, rng) {
            Some(e) if in_flight(e) < load && !own.iter().any(|o| o.id == e.id) => {
                self.spilled.fetch_add(1, Ordering::Relaxed);
                e
            }
            _ => picked,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoints(loads: &[usize]) -> Vec<Arc<Endpoint<()>>> {
        loads
            .iter()
            .enumerate()
            .map(|(t, &l)| {
                let e = Endpoint::detached(t, t as u64, ());
                e.calls.in_flight.store(l, Ordering::Relaxed);
                Arc::new(e)
            })
            .collect()
    }

    /// Slices of one replica each: slice `j` on task `j`.
    fn place(bound: &LoadBound<()>, all: &[Arc<Endpoint<()>>], i: usize, rng: &mut SplitMix64) -> usize {
        let ready = |j: usize| std::slice::from_ref(&all[j]);
        bound.place(&all[i], i, all.len(), ready, rng).task
    }

    #[test]
    fn under_the_bound_the_owner_always_serves() {
        let mut rng = SplitMix64::new(1);
        let spilled = Arc::new(AtomicU64::new(0));
        // factor 1.5, floor 2; random loads, each owner at or under 1.5 x mean + 2.
        for round in 0..2_000u64 {
            let loads: Vec<usize> = (0..8).map(|_| rng.below(20) as usize).collect();
            let all = endpoints(&loads);
            let bound = LoadBound::new(KeyedLoadBound::new(1.5, 2), all.clone(), spilled.clone());
            let limit = 1.5 * loads.iter().sum::<usize>() as f64 / 8.0 + 2.0;
            for i in 0..8 {
                let owner_under = loads[i] as f64 <= limit;
                let to = place(&bound, &all, i, &mut rng);
                if owner_under {
                    assert_eq!(to, i, "round {round}: {loads:?}, owner {i} under {limit}");
                } else {
                    assert_ne!(to, i, "round {round}: {loads:?}, owner {i} over {limit}");
                    assert!(loads[to] as f64 <= limit, "round {round}: {loads:?} went to {to}");
                }
            }
        }
        // Nothing in flight over the floor: the fast path does not even look.
        let all = endpoints(&[2, 0, 0, 0]);
        let bound = LoadBound::new(KeyedLoadBound::new(1.0, 2), all.clone(), spilled);
        assert!(!bound.may_be_over(&all[0]));
    }

    #[test]
    fn an_owner_over_the_bound_hands_to_the_next_candidate() {
        let mut rng = SplitMix64::new(2);
        let spilled = Arc::new(AtomicU64::new(0));
        // Mean 2, bound 1.5 x 2 + 2 = 5: task 0 (10) is over it, task 1 (5) is not.
        let all = endpoints(&[10, 5, 0, 1]);
        let bound = LoadBound::new(KeyedLoadBound::new(1.5, 2), all.clone(), spilled.clone());
        assert!(bound.may_be_over(&all[0]));
        // The next slice's owner, every time (deterministic: one warm place).
        for _ in 0..100 {
            assert_eq!(place(&bound, &all, 0, &mut rng), 1);
        }
        assert_eq!(spilled.load(Ordering::Relaxed), 100);
        // A slice with another replica under the bound: that one first, not counted.
        let two = [all[0].clone(), all[3].clone()];
        assert_eq!(bound.place(&all[0], 0, 1, |_| &two[..], &mut rng).task, 3);
        assert_eq!(spilled.load(Ordering::Relaxed), 100);
        // The next slices all over the bound too: the least loaded of two from every
        // connection, never a busier one than the owner.
        // (Ten busy tasks: the eight slices after the owner's are all busy.)
        let all = endpoints(&[30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 0, 0]);
        let bound = LoadBound::new(KeyedLoadBound::new(1.0, 2), all.clone(), spilled.clone());
        let mut idle = 0;
        for _ in 0..200 {
            let to = place(&bound, &all, 0, &mut rng);
            assert!(to == 0 || to >= 10, "{to}");
            idle += usize::from(to >= 10);
        }
        assert!(idle > 20, "{idle}");
        // Spilling to the subset skips the neighbours.
        let all = endpoints(&[10, 0, 0, 0]);
        let subset =
            LoadBound::new(KeyedLoadBound::new(1.5, 2).with_spill(KeyedSpill::Subset), all.clone(), spilled);
        let mut seen = [false; 4];
        for _ in 0..200 {
            seen[place(&subset, &all, 0, &mut rng)] = true;
        }
        assert_eq!(seen, [false, true, true, true]);
    }
}
