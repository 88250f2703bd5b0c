//! The initial assignment: fine-grained equal ranges, replicas round-robin.
//!
//! Slicer starts from an equal division of the key space. We make it fine-grained (about
//! 100 slices per task, Slicer's static model) rather than one range per task: the split
//! rule of weighted-move compares a slice with the mean slice load, so from one range per
//! task it cannot refine a hot region finely enough to balance it.

use crate::load::Load;
use crate::pieces::{equal_ranges, Piece};

/// `per_task * tasks.len()` equal ranges (at least one), the `k`-th on tasks
/// `k, k+1, .. k+replicas-1` (mod the number of tasks), with their loads.
pub(crate) fn round_robin(tasks: &[u32], per_task: usize, replicas: usize, load: &Load) -> Vec<Piece> {
    let n = tasks.len();
    let m = per_task.max(1).saturating_mul(n).clamp(1, steady_slice::MAX_SLICES);
    let mut pieces = equal_ranges(m, load);
    for (k, p) in pieces.iter_mut().enumerate() {
        p.replicas = (0..replicas.min(n)).map(|j| tasks[(k + j) % n]).collect();
    }
    pieces
}

/// How many slices per task the initial assignment has (Slicer's static model).
pub const SLICES_PER_TASK: usize = 100;
