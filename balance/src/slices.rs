//! The keyed half of the routing table: for each slice of the assignment in force,
//! the replicas this frontend uses and which of them are ready.

use std::collections::HashMap;
use std::sync::Arc;

use steady_subset::prng::SplitMix64;
use steady_subset::{Ringsteady, Subsetting};

use crate::assignment::Assignment;
use crate::endpoint::Endpoint;
use crate::slice_key::SliceKey;

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

/// Slice starts, and per slice the chosen replicas and the ready ones, laid out flat.
#[derive(Debug)]
pub(crate) struct SliceTable<S> {
    pub(crate) generation: u64,
    starts: Vec<u64>,
    /// `chosen[chosen_at[i]..chosen_at[i + 1]]`: slice i's chosen replicas.
    chosen: Vec<u32>,
    chosen_at: Vec<u32>,
    /// `ready[ready_at[i]..ready_at[i + 1]]`: the connected ones among them.
    ready: Vec<Arc<Endpoint<S>>>,
    ready_at: Vec<u32>,
}

impl<S> SliceTable<S> {
    /// Builds the table for `assignment` from the endpoints connected now.
    pub(crate) fn build(
        assignment: &Assignment,
        frontend: usize,
        fan_out: usize,
        connected: &HashMap<usize, Arc<Endpoint<S>>>,
    ) -> Self {
        let n = assignment.slices().len();
        let mut table = Self {
            generation: assignment.generation(),
            starts: Vec::with_capacity(n),
            chosen: Vec::new(),
            chosen_at: Vec::with_capacity(n + 1),
            ready: Vec::new(),
            ready_at: Vec::with_capacity(n + 1),
        };
        table.chosen_at.push(0);
        table.ready_at.push(0);
        for slice in assignment.slices() {
            table.starts.push(slice.start.get());
            for task in chosen_replicas(&slice.replicas, frontend, fan_out.max(1)) {
                table.chosen.push(task);
                if let Some(endpoint) = connected.get(&(task as usize)) {
                    table.ready.push(endpoint.clone());
                }
            }
            table.chosen_at.push(table.chosen.len() as u32);
            table.ready_at.push(table.ready.len() as u32);
        }
        table
    }

    /// The slice holding `key`.
    #[inline]
    pub(crate) fn index(&self, key: SliceKey) -> usize {
        self.starts.partition_point(|&s| s <= key.get()) - 1
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

    /// Power of two choices among slice `i`'s ready replicas.
    #[inline]
    pub(crate) fn pick(&self, i: usize, rng: &mut SplitMix64) -> Option<&Arc<Endpoint<S>>> {
        crate::table::p2c(self.ready(i), rng)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hot_slice_is_spread_evenly_over_its_replicas() {
        // 20 replicas, fan-out 3, 200 frontends: each replica chosen 30 times exactly.
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
    fn small_replica_lists_are_used_whole() {
        assert_eq!(chosen_replicas(&[4, 2], 9, 3), [4, 2]);
    }
}
