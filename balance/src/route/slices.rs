//! The keyed half of the routing table: for each slice of the assignment in force,
//! the replicas this frontend uses and which of them are ready.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use steady_slice::{Assignment, SliceKey};
use steady_subset::prng::SplitMix64;
use steady_subset::{Ringsteady, Subsetting};

use super::endpoint::Endpoint;
use super::pick::p2c;

/// The replicas of slice `i` this frontend uses: all of them when there are at most
/// `fan_out`, otherwise its own Ringsteady subset of the replica list (so that many
/// frontends spread a hot slice's load evenly over all its replicas).
pub(crate) fn chosen_replicas(replicas: &[u32], frontend: usize, fan_out: usize) -> Vec<u32> {
    if replicas.len() <= fan_out {
        return replicas.to_vec();
    }
    Ringsteady::new()
        .subset(frontend, replicas.len(), fan_out)
        .expect("replica lists are far below MAX_BACKENDS")
        .into_iter()
        .map(|i| replicas[i])
        .collect()
}

/// The replicas of a slice this frontend uses, its own zone's first: when some replicas
/// are in the frontend's zone (`is_local`) and one of those chosen is `usable` (ready,
/// or may become so), [`chosen_replicas`] of the local ones only; otherwise of them all,
/// as without zones.
fn preferred_replicas(
    replicas: &[u32],
    frontend: usize,
    fan_out: usize,
    is_local: Option<&dyn Fn(u32) -> bool>,
    usable: impl Fn(u32) -> bool,
) -> Vec<u32> {
    if let Some(is_local) = is_local {
        let local: Vec<u32> = replicas.iter().copied().filter(|&t| is_local(t)).collect();
        if !local.is_empty() && local.len() < replicas.len() {
            let chosen = chosen_replicas(&local, frontend, fan_out);
            if chosen.iter().any(|&t| usable(t)) {
                return chosen;
            }
        }
    }
    chosen_replicas(replicas, frontend, fan_out)
}

/// Slice starts, and per slice the chosen replicas and the ready ones, laid out flat.
///
/// Lookup uses a radix index on the key's top bits: `first[b]` is the slice holding the
/// first key of bucket `b`, so the slice of any key in the bucket lies between
/// `first[b]` and `first[b + 1]`, usually one or two slices apart; a binary search
/// settles the rest. With about two buckets per slice, a lookup reads two small arrays.
#[derive(Debug)]
pub(crate) struct SliceTable<S> {
    pub(crate) generation: u64,
    starts: Vec<u64>,
    /// `64 - bits` of the radix index.
    shift: u32,
    /// `first[b]`: the slice holding key `b << shift`; one extra entry at the end.
    first: Vec<u32>,
    /// `chosen[chosen_at[i]..chosen_at[i + 1]]`: slice i's chosen replicas.
    chosen: Vec<u32>,
    chosen_at: Vec<u32>,
    /// `ready[ready_at[i]..ready_at[i + 1]]`: the connected ones among them.
    ready: Vec<Arc<Endpoint<S>>>,
    ready_at: Vec<u32>,
    /// Per slice: whether this table already asked for its missing replicas.
    asked: Vec<AtomicBool>,
    /// Per slice: whether some chosen replica is ready or can become so (its task serves
    /// and is connecting, or can be connected). A keyed request for a slice without one
    /// follows the no-replica policy at once instead of waiting for what cannot come.
    servable: Vec<bool>,
}

impl<S> SliceTable<S> {
    /// Builds the table for `assignment` from the endpoints connected now; `reachable`
    /// says whether a task not connected may become so (see [`SliceTable::servable`]);
    /// `is_local`, for a zone-aware frontend, whether a task is in its zone (its zone's
    /// replicas are then preferred, see [`preferred_replicas`]).
    pub(crate) fn build(
        assignment: &Assignment,
        frontend: usize,
        fan_out: usize,
        connected: &HashMap<usize, Arc<Endpoint<S>>>,
        reachable: &dyn Fn(u32) -> bool,
        is_local: Option<&dyn Fn(u32) -> bool>,
    ) -> Self {
        let n = assignment.slices().len();
        let mut table = Self {
            generation: assignment.generation(),
            starts: Vec::with_capacity(n),
            shift: 64,
            first: Vec::new(),
            chosen: Vec::new(),
            chosen_at: Vec::with_capacity(n + 1),
            ready: Vec::new(),
            ready_at: Vec::with_capacity(n + 1),
            asked: (0..n).map(|_| AtomicBool::new(false)).collect(),
            servable: Vec::with_capacity(n),
        };
        table.chosen_at.push(0);
        table.ready_at.push(0);
        for slice in assignment.slices() {
            table.starts.push(slice.start.get());
            let mut servable = false;
            let usable = |t: u32| connected.contains_key(&(t as usize)) || reachable(t);
            for task in preferred_replicas(&slice.replicas, frontend, fan_out.max(1), is_local, usable) {
                table.chosen.push(task);
                if let Some(endpoint) = connected.get(&(task as usize)) {
                    table.ready.push(endpoint.clone());
                    servable = true;
                } else {
                    servable |= reachable(task);
                }
            }
            table.servable.push(servable);
            table.chosen_at.push(table.chosen.len() as u32);
            table.ready_at.push(table.ready.len() as u32);
        }
        table.build_index();
        table
    }

    /// Builds the radix index: about two buckets per slice, at most 2^20.
    fn build_index(&mut self) {
        let bits = (usize::BITS - self.starts.len().leading_zeros() + 1).clamp(1, 20);
        self.shift = 64 - bits;
        let buckets = 1usize << bits;
        self.first = Vec::with_capacity(buckets + 1);
        let mut slice = 0usize;
        for b in 0..buckets {
            let key = (b as u64) << self.shift;
            while slice + 1 < self.starts.len() && self.starts[slice + 1] <= key {
                slice += 1;
            }
            self.first.push(slice as u32);
        }
        // Past the last bucket: the last slice.
        self.first.push((self.starts.len() - 1) as u32);
    }

    /// The slice holding `key`.
    #[inline]
    pub(crate) fn index(&self, key: SliceKey) -> usize {
        let key = key.get();
        let b = (key >> self.shift) as usize;
        let (lo, hi) = (self.first[b] as usize, self.first[b + 1] as usize);
        // The answer is in lo..=hi: the last start <= key among them.
        lo + self.starts[lo + 1..=hi].partition_point(|&s| s <= key)
    }

    /// Slice `i`'s chosen replicas.
    pub(crate) fn chosen(&self, i: usize) -> &[u32] {
        &self.chosen[self.chosen_at[i] as usize..self.chosen_at[i + 1] as usize]
    }

    /// Slice `i`'s ready replicas.
    #[inline]
    pub(crate) fn ready(&self, i: usize) -> &[Arc<Endpoint<S>>] {
        &self.ready[self.ready_at[i] as usize..self.ready_at[i + 1] as usize]
    }

    /// Whether some of slice `i`'s chosen replicas is ready or may become so: when not,
    /// waiting for one is in vain.
    #[inline]
    pub(crate) fn servable(&self, i: usize) -> bool {
        self.servable[i]
    }

    /// Whether some of slice `i`'s chosen replicas are not connected and nobody has
    /// asked for them yet under this table (true at most once per slice and table).
    #[inline]
    pub(crate) fn wants_more_replicas(&self, i: usize) -> bool {
        let missing = self.ready_at[i + 1] - self.ready_at[i] < self.chosen_at[i + 1] - self.chosen_at[i];
        missing && !self.asked[i].load(Ordering::Relaxed) && !self.asked[i].swap(true, Ordering::Relaxed)
    }

    /// Power of two choices among slice `i`'s ready replicas.
    #[inline]
    pub(crate) fn pick(&self, i: usize, rng: &mut SplitMix64) -> Option<&Arc<Endpoint<S>>> {
        p2c(self.ready(i), rng)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hot_slice_is_spread_evenly_over_its_replicas() {
        // 20 replicas, fan-out 3, 200 frontends: each replica chosen about 30 times.
        let replicas: Vec<u32> = (100..120).collect();
        let mut count: HashMap<u32, usize> = HashMap::new();
        for m in 0..200 {
            let chosen = chosen_replicas(&replicas, m, 3);
            assert_eq!(chosen.len(), 3);
            for t in chosen {
                *count.entry(t).or_default() += 1;
            }
        }
        assert_eq!(count.len(), 20);
        let (lo, hi) = (count.values().min().unwrap(), count.values().max().unwrap());
        assert!(*lo >= 27 && *hi <= 33, "{count:?}");
    }

    #[test]
    fn radix_lookup_agrees_with_a_binary_search_of_every_start() {
        use steady_slice::Slice;
        let mut rng = SplitMix64::new(3);
        for slices in [1usize, 2, 3, 17, 1000] {
            for clustered in [false, true] {
                // Random starts, or many crowded into one small range (a hot spot).
                let mut starts: Vec<u64> = (1..slices)
                    .map(|_| if clustered { (1 << 40) + rng.below(5000) } else { rng.next() })
                    .collect();
                starts.push(0);
                starts.sort_unstable();
                starts.dedup();
                let a =
                    Assignment::new(1, starts.iter().map(|&s| Slice::new(SliceKey(s), vec![0])).collect())
                        .unwrap();
                let t = SliceTable::<()>::build(&a, 0, 3, &HashMap::new(), &|_| true, None);
                // Every start and its neighbours, every bucket edge, random keys.
                let edges: Vec<u64> = (0..t.first.len() as u64 - 1)
                    .flat_map(|b| {
                        let edge = b << t.shift;
                        [edge, edge.saturating_sub(1)]
                    })
                    .collect();
                let probes = starts
                    .iter()
                    .flat_map(|&s| [s, s.saturating_sub(1), s.saturating_add(1)])
                    .chain(edges)
                    .chain((0..2000).map(|_| rng.next()))
                    .chain([0, u64::MAX, 1 << 40]);
                for key in probes {
                    assert_eq!(t.index(SliceKey(key)), a.slice_index(SliceKey(key)), "key {key}");
                }
            }
        }
    }

    #[test]
    fn a_zone_aware_frontend_uses_its_zone_s_replicas_while_one_is_usable() {
        // The odd tasks are local: replicas 1 and 3; 2, 4 and 6 are not.
        let is_local = |t: u32| t % 2 == 1;
        let replicas = [2, 1, 3, 4, 6];
        let local = preferred_replicas(&replicas, 0, 3, Some(&is_local), |_| true);
        assert_eq!(local, [1, 3]);
        // No local replica usable: all of them, as without zones.
        let all = preferred_replicas(&replicas, 0, 3, Some(&is_local), |t| !is_local(t));
        assert_eq!(all, chosen_replicas(&replicas, 0, 3));
        // Without zones, or with no local replica: today's choice.
        assert_eq!(preferred_replicas(&replicas, 0, 3, None, |_| true), chosen_replicas(&replicas, 0, 3));
        assert_eq!(preferred_replicas(&[2, 4], 0, 3, Some(&is_local), |_| true), [2, 4]);
    }

    #[test]
    fn small_replica_lists_are_used_whole() {
        assert_eq!(chosen_replicas(&[4, 2], 9, 3), [4, 2]);
    }
}
