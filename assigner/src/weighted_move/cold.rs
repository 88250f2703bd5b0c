//! [`ColdIndex`]: the least loaded task of each group, kept current as loads change, so
//! that the forced phases (moves off leaving tasks, replica counts, placement repairs)
//! find where a replica goes in `O(groups * log tasks)` instead of a scan of every task.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::placement::layout::Layout;

/// A min-heap of `(load, position)` per group, with lazy deletion: every change of a
/// position's load pushes a new entry, and an entry whose load is not the position's
/// current one is stale and dropped when it reaches the top. The top valid entry of a
/// group is then its least loaded position, ties to the lowest position: the order a
/// scan of positions by `(load, position)` gives.
#[derive(Debug)]
pub(super) struct ColdIndex {
    heaps: Vec<BinaryHeap<Reverse<(u64, u32)>>>,
}

/// `f64::total_cmp`'s order as an unsigned key.
fn key(load: f64) -> u64 {
    let bits = load.to_bits();
    if bits >> 63 == 0 {
        bits | (1 << 63)
    } else {
        !bits
    }
}

impl ColdIndex {
    pub(super) fn new(layout: &Layout, loads: &[f64]) -> Self {
        let mut heaps = vec![BinaryHeap::new(); layout.groups];
        for (t, &load) in loads.iter().enumerate() {
            heaps[layout.group[t] as usize].push(Reverse((key(load), t as u32)));
        }
        Self { heaps }
    }

    /// Position `t` (in `group`) now carries `load`.
    pub(super) fn update(&mut self, group: u32, t: u32, load: f64) {
        self.heaps[group as usize].push(Reverse((key(load), t)));
    }

    /// The least loaded position of `group` not in `exclude`, with its load's key.
    pub(super) fn coldest(&mut self, group: usize, loads: &[f64], exclude: &[u32]) -> Option<(u64, u32)> {
        let heap = &mut self.heaps[group];
        let mut skipped = Vec::new();
        let found = loop {
            let Some(&Reverse((k, t))) = heap.peek() else { break None };
            if k != key(loads[t as usize]) {
                heap.pop();
                continue;
            }
            if exclude.contains(&t) {
                skipped.extend(heap.pop());
                continue;
            }
            break Some((k, t));
        };
        heap.extend(skipped);
        found
    }
}

#[cfg(test)]
mod tests {
    use super::key;

    #[test]
    fn keys_order_loads_as_total_cmp_does() {
        let loads = [-1.5, -0.0, 0.0, 1e-300, 0.5, 2.0, f64::MAX];
        for w in loads.windows(2) {
            assert!(key(w[0]) < key(w[1]), "{} {}", w[0], w[1]);
        }
    }
}
