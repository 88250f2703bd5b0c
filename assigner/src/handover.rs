//! Handover: a move made in two steps, so that a slice's new owner can warm up before it
//! takes client traffic (Shard Manager's graceful handover, in our words).
//!
//! Going from `previous` to `target` in one step switches every moved key range at once:
//! the new owner starts cold and the old one stops at the same instant. In two steps:
//!
//! 1. [`warming_step`]: every key range keeps the replicas `previous` gives it (those
//!    still up: serving or draining), and the replicas `target` adds are named as
//!    *warming*: clients send them nothing for the range, their Slicelets announce it,
//!    and the application loads state (from the current owners, or from storage).
//! 2. After the warm-up time, `target` itself (renumbered after the warming step): the
//!    switch. The old owners keep answering for a grace period of their own (the
//!    Slicelet's), so requests routed by the older generation still land warm.
//!
//! A range whose old replicas are all gone has nothing to warm from: it takes `target`'s
//! replicas at once, in the warming step itself.

use steady_slice::{Assignment, Slice, SliceKey};

use crate::tasks::{TaskState, Tasks};

/// The first step of a handover from `previous` to `target`, numbered `generation`:
/// `None` when no range gains a replica that could warm (then publish `target` at once).
///
/// Over the union of both assignments' boundaries, each piece gets `previous`'s replicas
/// that are still up (serving or draining in `tasks`) and, as warming, `target`'s replicas
/// that are not among them; a piece whose old replicas are all gone gets `target`'s
/// replicas and no warming. Adjacent pieces with the same replicas and warming tasks are
/// merged. `O(slices of both)`. `None` too when the pieces would be more than an
/// assignment may hold, or `generation` is 0.
pub fn warming_step(
    previous: &Assignment,
    target: &Assignment,
    tasks: &Tasks,
    generation: u64,
) -> Option<Assignment> {
    let up = |t: &u32| matches!(tasks.state(*t), TaskState::Serving | TaskState::Draining);
    let (a, b) = (previous.slices(), target.slices());
    let (mut i, mut j) = (0, 0);
    let mut start = SliceKey::MIN;
    let mut slices: Vec<Slice> = Vec::new();
    let mut warms = false;
    loop {
        let old: Vec<u32> = a[i].replicas().iter().copied().filter(up).collect();
        let new = b[j].replicas();
        let piece = if old.is_empty() {
            Slice::new(start, new)
        } else {
            let warming: Vec<u32> = new.iter().copied().filter(|t| !old.contains(t)).collect();
            warms |= !warming.is_empty();
            Slice::new(start, old).with_warming(warming)
        };
        match slices.last() {
            Some(last) if last.replicas() == piece.replicas() && last.warming() == piece.warming() => {}
            _ => slices.push(piece),
        }
        // The next boundary of either assignment.
        let (next_a, next_b) = (a.get(i + 1).map(|s| s.start), b.get(j + 1).map(|s| s.start));
        start = match (next_a, next_b) {
            (None, None) => break,
            (Some(x), None) => x,
            (None, Some(y)) => y,
            (Some(x), Some(y)) => x.min(y),
        };
        if next_a == Some(start) {
            i += 1;
        }
        if next_b == Some(start) {
            j += 1;
        }
    }
    if !warms {
        return None;
    }
    Assignment::new(generation, slices).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(generation: u64, slices: &[(u64, &[u32])]) -> Assignment {
        Assignment::new(generation, slices.iter().map(|&(s, r)| Slice::new(SliceKey(s), r)).collect())
            .unwrap()
    }

    #[test]
    fn a_moved_range_keeps_its_old_owner_and_names_the_new_one_warming() {
        let previous = a(4, &[(0, &[1]), (100, &[2])]);
        // Keys 50..100 move from 1 to 3; 100.. unchanged.
        let target = a(5, &[(0, &[1]), (50, &[3]), (100, &[2])]);
        let tasks = Tasks::serving([1, 2, 3]).unwrap();
        let step = warming_step(&previous, &target, &tasks, 5).unwrap();
        assert_eq!(step.generation(), 5);
        let expect = vec![
            Slice::new(SliceKey(0), vec![1]),
            Slice::new(SliceKey(50), vec![1]).with_warming([3]),
            Slice::new(SliceKey(100), vec![2]),
        ];
        assert_eq!(step.slices(), expect);
    }

    #[test]
    fn a_draining_owner_hands_over_and_a_gone_one_cannot() {
        let previous = a(1, &[(0, &[1]), (100, &[2])]);
        let target = a(2, &[(0, &[3]), (100, &[3])]);
        let tasks =
            Tasks::new([(1, TaskState::Draining), (2, TaskState::Gone), (3, TaskState::Serving)]).unwrap();
        let step = warming_step(&previous, &target, &tasks, 2).unwrap();
        let expect =
            vec![Slice::new(SliceKey(0), vec![1]).with_warming([3]), Slice::new(SliceKey(100), vec![3])];
        assert_eq!(step.slices(), expect);
    }

    #[test]
    fn nothing_to_warm_is_no_step() {
        let previous = a(1, &[(0, &[1, 2])]);
        // A replica removed and a split: no range gains an owner.
        let target = a(2, &[(0, &[1]), (7, &[2])]);
        let tasks = Tasks::serving([1, 2]).unwrap();
        assert_eq!(warming_step(&previous, &target, &tasks, 2), None);
        assert_eq!(warming_step(&previous, &previous, &tasks, 2), None);
    }

    #[test]
    fn merged_target_slices_warm_piece_by_piece() {
        let previous = a(1, &[(0, &[1]), (10, &[2]), (20, &[1])]);
        let target = a(2, &[(0, &[1])]);
        let tasks = Tasks::serving([1, 2]).unwrap();
        let step = warming_step(&previous, &target, &tasks, 2).unwrap();
        let expect = vec![
            Slice::new(SliceKey(0), vec![1]),
            Slice::new(SliceKey(10), vec![2]).with_warming([1]),
            Slice::new(SliceKey(20), vec![1]),
        ];
        assert_eq!(step.slices(), expect);
    }
}
