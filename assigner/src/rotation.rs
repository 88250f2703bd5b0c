//! [`Rotation`]: Rudolph's assigner (from the post "Rudolph: An In-Process Auto Sharder"):
//! fixed bins, owners shifted by a rotation.
//!
//! The key space is cut into `c * n` equal bins (`n` serving tasks). Under rotation
//! `r` in `[0, c)`, bin `b` belongs to the serving task at position
//! `((b - r) mod c*n) / c`: each task owns `c` consecutive bins, and raising `r` by one
//! shifts every boundary one bin along. A run evaluates the `c` rotations and keeps the
//! one with the lowest `peak / total + penalty * |r - r_prev| / c`: the busiest task's
//! share of the load, plus the penalty times the key-space share that would change
//! owners (`|r - r_prev|` bins at each of the `n` boundaries). Ties go to the smaller
//! move, then the smaller rotation.
//!
//! The previous rotation is read back from the previous assignment when it has this
//! shape (same bins, owners of one rotation); otherwise nothing is penalised. With
//! `min` replicas above 1, a bin's replicas are its owner and the next tasks in order.
//! Under a [`crate::Placement`] that order is round-robin over zones (and racks), and a
//! next task the placement forbids is passed over, so every owner's replicas meet it
//! where the tasks allow; rotation does not search beyond that.
//! The search is `O(c * c * n)`; no coordinator is needed when every gateway sees the
//! same counts, which is why Rudolph runs it in-process.

use std::time::Instant;

use steady_slice::Assignment;

use crate::error::AssignError;
use crate::pieces::{bins_per_task, equal_ranges, equal_start, Piece};
use crate::placement::layout::Layout;
use crate::report::{finish, Outcome, RunNotes};
use crate::{serving_of, Assigner, RunInput};

/// Rudolph's rotation assigner.
#[derive(Debug, Clone, PartialEq)]
pub struct Rotation {
    bins_per_task: usize,
    penalty: f64,
}

impl Default for Rotation {
    /// Rudolph's evaluated setting: `c = 64` bins per task, penalty `0.125`.
    fn default() -> Self {
        Self { bins_per_task: 64, penalty: 0.125 }
    }
}

impl Rotation {
    /// `bins_per_task` bins per serving task (`c`) and the moving `penalty` (`lambda`).
    ///
    /// # Errors
    ///
    /// [`AssignError::BadConfig`] for `c = 0` or a negative or non-finite penalty.
    pub fn new(bins_per_task: usize, penalty: f64) -> Result<Self, AssignError> {
        if bins_per_task == 0 {
            return Err(AssignError::BadConfig { field: "bins_per_task", expected: "at least 1" });
        }
        if !(penalty.is_finite() && penalty >= 0.0) {
            return Err(AssignError::BadConfig {
                field: "penalty",
                expected: "a finite non-negative number",
            });
        }
        Ok(Self { bins_per_task, penalty })
    }

    /// The pieces of rotation `r`, replicas as task indices: bin `b`'s owner is the task
    /// at position `((b - r) mod m) / c` of the order, and its replicas are `sets[owner]`.
    fn pieces(&self, bins: &[Piece], sets: &[Vec<u32>], r: usize) -> Vec<Piece> {
        let m = bins.len();
        bins.iter()
            .enumerate()
            .map(|(b, p)| {
                let owner = ((b + m - r) % m) / self.bins_per_task;
                Piece { replicas: sets[owner].clone(), ..p.clone() }
            })
            .collect()
    }

    /// The rotation `previous` was made with, if it has this run's shape.
    fn previous_rotation(&self, previous: &Assignment, bins: &[Piece], sets: &[Vec<u32>]) -> Option<usize> {
        let slices = previous.slices();
        if slices.len() != bins.len() || slices.iter().zip(bins).any(|(s, b)| s.start.get() != b.start) {
            return None;
        }
        (0..self.bins_per_task).find(|&r| {
            self.pieces(bins, sets, r).iter().zip(slices).all(|(p, s)| {
                let mut a = p.replicas.clone();
                let mut b = s.replicas().to_vec();
                a.sort_unstable();
                b.sort_unstable();
                a == b
            })
        })
    }
}

impl Assigner for Rotation {
    fn name(&self) -> &'static str {
        "rotation"
    }

    fn assign(&self, input: &RunInput<'_>) -> Result<Outcome, AssignError> {
        let started = Instant::now();
        let layout = Layout::new(input.tasks, serving_of(input.tasks)?, input.placement, input.replicas);
        // Tasks in an order that puts consecutive ones in different zones (racks) where
        // the placement asks for a spread; the replicas of the bins a task owns are it and
        // the next tasks in that order (passing over those the placement forbids).
        let order = layout.spread_order();
        let n = order.len();
        let replicas = layout.min_r;
        let positions: Vec<Vec<u32>> = (0..n).map(|k| layout.spread_replicas(&order, k, replicas)).collect();
        let sets: Vec<Vec<u32>> =
            positions.iter().map(|set| set.iter().map(|&p| layout.serving[p as usize]).collect()).collect();
        let c = bins_per_task(self.bins_per_task, n);
        let this = Self { bins_per_task: c, ..self.clone() };
        let bins = equal_ranges(c * n, input.load);
        debug_assert!(bins.iter().enumerate().all(|(b, p)| p.start == equal_start(b, c * n)));
        let before = input.previous.and_then(|p| this.previous_rotation(p, &bins, &sets));
        let total = input.load.total();
        let mut best: Option<(f64, usize, usize)> = None;
        for r in 0..c {
            let mut loads = vec![0.0; n];
            for (b, p) in bins.iter().enumerate() {
                let owner = ((b + c * n - r) % (c * n)) / c;
                for &x in &positions[owner] {
                    loads[x as usize] += p.load / replicas as f64;
                }
            }
            let peak = loads.iter().copied().fold(0.0, f64::max);
            let distance = before.map_or(0, |r0| r.abs_diff(r0));
            let share = if total > 0.0 { peak / total } else { 0.0 };
            let cost = share + this.penalty * distance as f64 / c as f64;
            let better = match best {
                None => true,
                Some((bc, bd, _)) => cost < bc || (cost == bc && distance < bd),
            };
            if better {
                best = Some((cost, distance, r));
            }
        }
        let r = best.map_or(0, |b| b.2);
        let pieces = this.pieces(&bins, &sets, r);
        let notes = RunNotes { count_changed_ranges: true, ..RunNotes::default() };
        finish(self.name(), input, &layout, &pieces, notes, started)
    }
}
