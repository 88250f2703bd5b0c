//! [`Piece`]: the mutable form of a slice that assigners work on, and helpers over lists
//! of pieces (equal ranges, task loads, imbalance).

use steady_slice::{Assignment, Slice, SliceKey};

use crate::load::{Load, SPACE};

/// A slice being built: keys `[start, end)` (`end` up to `2^64`), its replicas (task
/// indices) and its load.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Piece {
    pub(crate) start: u64,
    pub(crate) end: u128,
    pub(crate) replicas: Vec<u32>,
    pub(crate) load: f64,
}

impl Piece {
    /// Its share of the key space.
    pub(crate) fn fraction(&self) -> f64 {
        (self.end - u128::from(self.start)) as f64 / SPACE
    }

    /// The load each replica carries.
    pub(crate) fn per_replica(&self) -> f64 {
        self.load / self.replicas.len().max(1) as f64
    }
}

/// The pieces of an assignment with their loads.
pub(crate) fn pieces_of(assignment: &Assignment, load: &Load) -> Vec<Piece> {
    let slices = assignment.slices();
    slices
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let end = slices.get(i + 1).map_or(1u128 << 64, |n| u128::from(n.start.get()));
            Piece {
                start: s.start.get(),
                end,
                replicas: s.replicas().to_vec(),
                load: load.between(s.start.get(), end),
            }
        })
        .collect()
}

/// The start of the `k`-th of `m` equal ranges of the key space.
pub(crate) fn equal_start(k: usize, m: usize) -> u64 {
    ((k as u128) << 64).checked_div(m as u128).unwrap_or(0) as u64
}

/// How many fixed bins per task an assigner over `n` tasks can have when it asks for
/// `per_task`: at least one, and few enough that `n` times as many fit in an assignment.
pub(crate) fn bins_per_task(per_task: usize, n: usize) -> usize {
    per_task.min(steady_slice::MAX_SLICES / n.max(1)).max(1)
}

/// `m` equal ranges, with their loads and no replicas yet.
pub(crate) fn equal_ranges(m: usize, load: &Load) -> Vec<Piece> {
    (0..m)
        .map(|k| {
            let start = equal_start(k, m);
            let end = if k + 1 == m { 1u128 << 64 } else { u128::from(equal_start(k + 1, m)) };
            Piece { start, end, replicas: Vec::new(), load: load.between(start, end) }
        })
        .collect()
}

/// The load each of `tasks` (ascending) carries; replicas on other tasks are ignored.
pub(crate) fn task_loads(pieces: &[Piece], tasks: &[u32]) -> Vec<f64> {
    let mut loads = vec![0.0; tasks.len()];
    for p in pieces {
        let share = p.per_replica();
        for r in &p.replicas {
            if let Ok(i) = tasks.binary_search(r) {
                loads[i] += share;
            }
        }
    }
    loads
}

/// The busiest task's load over the mean task load; 1 when there is no load.
pub fn imbalance(loads: &[f64]) -> f64 {
    let total: f64 = loads.iter().sum();
    if loads.is_empty() || total <= 0.0 {
        return 1.0;
    }
    let max = loads.iter().copied().fold(0.0, f64::max);
    max / (total / loads.len() as f64)
}

/// The busiest task's load over its capacity against the total load over the total
/// capacity (`capacity[i]` for `loads[i]`, every one above zero); 1 when there is no load:
/// [`imbalance`] for tasks of different capacities, as a [`crate::Report`] gives it.
pub fn imbalance_over(loads: &[f64], capacity: &[f64]) -> f64 {
    let total: f64 = loads.iter().sum();
    let room: f64 = capacity.iter().sum();
    if loads.is_empty() || total <= 0.0 || room <= 0.0 {
        return 1.0;
    }
    let max = loads.iter().zip(capacity).map(|(l, c)| l / c).fold(0.0, f64::max);
    max / (total / room)
}

/// The slices of a list of pieces (replicas sorted), adjacent ones with the same replicas
/// kept apart.
pub(crate) fn to_slices(pieces: &[Piece]) -> Vec<Slice> {
    pieces
        .iter()
        .map(|p| {
            let mut replicas = p.replicas.clone();
            replicas.sort_unstable();
            Slice::new(SliceKey(p.start), replicas)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_ranges_cover_the_key_space() {
        let pieces = equal_ranges(3, &Load::none());
        assert_eq!(pieces[0].start, 0);
        assert_eq!(pieces[2].end, 1 << 64);
        let covered: f64 = pieces.iter().map(Piece::fraction).sum();
        assert!((covered - 1.0).abs() < 1e-12);
        assert_eq!(imbalance(&[1.0, 3.0]), 1.5);
        assert_eq!(imbalance(&[0.0, 0.0]), 1.0);
    }
}
