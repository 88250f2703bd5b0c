//! [`AssignmentDiff`]: what changes owners between two assignments.

use crate::assignment::Assignment;
use crate::key::SliceKey;
use crate::range::KeyRange;

/// The key ranges whose set of replicas differs between two assignments, and the share
/// of the key space they cover: the *key churn* of going from one to the other.
///
/// Replica sets are compared as sets (order does not matter). A slice that is split or
/// merged without a change of replicas churns nothing; adding or removing one replica
/// churns the slice's whole range (its keys' owner set changed). Adjacent changed pieces
/// are merged into one range.
#[derive(Debug, Clone, PartialEq)]
pub struct AssignmentDiff {
    changed: Vec<KeyRange>,
    churn: f64,
}

impl AssignmentDiff {
    /// The ranges whose owners changed, in key order, adjacent ones merged.
    pub fn changed(&self) -> &[KeyRange] {
        &self.changed
    }

    /// The fraction of the key space whose owners changed, in `[0, 1]`.
    pub fn key_churn(&self) -> f64 {
        self.churn
    }

    /// Whether no key changed owners.
    pub fn is_empty(&self) -> bool {
        self.changed.is_empty()
    }
}

impl Assignment {
    /// What changes owners going from `self` to `next`; `O(slices of both)`, plus
    /// sorting each slice's replicas.
    pub fn diff(&self, next: &Assignment) -> AssignmentDiff {
        let owners = |a: &Assignment| -> Vec<Vec<u32>> {
            a.slices()
                .iter()
                .map(|s| {
                    let mut r = s.replicas().to_vec();
                    r.sort_unstable();
                    r
                })
                .collect()
        };
        let (old, new) = (owners(self), owners(next));
        let (a, b) = (self.slices(), next.slices());
        // Walk the union of both lists of starts: between two consecutive starts, each
        // assignment has one slice, and the piece churns if their owners differ.
        let (mut i, mut j) = (0, 0);
        let mut changed: Vec<KeyRange> = Vec::new();
        let mut churned: u128 = 0;
        let mut piece_start = SliceKey::MIN;
        loop {
            let next_a = a.get(i + 1).map(|s| s.start);
            let next_b = b.get(j + 1).map(|s| s.start);
            let piece_end = match (next_a, next_b) {
                (Some(x), Some(y)) => Some(x.min(y)),
                (x, None) => x,
                (None, y) => y,
            };
            if old[i] != new[j] {
                let piece = KeyRange::new(piece_start, piece_end);
                churned += piece.len();
                match changed.last_mut() {
                    Some(last) if last.end() == Some(piece_start) => {
                        *last = KeyRange::new(last.start(), piece_end)
                    }
                    _ => changed.push(piece),
                }
            }
            let Some(end) = piece_end else { break };
            if next_a == Some(end) {
                i += 1;
            }
            if next_b == Some(end) {
                j += 1;
            }
            piece_start = end;
        }
        AssignmentDiff { changed, churn: churned as f64 / 18_446_744_073_709_551_616.0 }
    }
}

#[cfg(test)]
mod tests {
    use crate::{Assignment, KeyRange, Slice, SliceKey};

    fn assignment(slices: &[(u64, &[u32])]) -> Assignment {
        Assignment::new(1, slices.iter().map(|&(start, r)| Slice::new(SliceKey(start), r)).collect()).unwrap()
    }

    #[test]
    fn splits_merges_and_reordered_replicas_churn_nothing() {
        let a = assignment(&[(0, &[1, 2]), (1 << 63, &[3])]);
        let split = assignment(&[(0, &[2, 1]), (1 << 62, &[1, 2]), (1 << 63, &[3])]);
        assert!(a.diff(&split).is_empty());
        assert_eq!(split.diff(&a).key_churn(), 0.0);
        assert!(a.diff(&a).is_empty());
    }

    #[test]
    fn a_moved_slice_churns_its_range_and_adjacent_changes_merge() {
        let a = assignment(&[(0, &[1]), (1 << 62, &[2]), (1 << 63, &[3])]);
        let b = assignment(&[(0, &[1]), (1 << 62, &[4]), (1 << 63, &[3, 4])]);
        let d = a.diff(&b);
        assert_eq!(d.changed(), [KeyRange::new(SliceKey(1 << 62), None)]);
        assert_eq!(d.key_churn(), 0.75);
        // A new boundary inside a slice that changes owners on one side only.
        let c = assignment(&[(0, &[1]), (1 << 61, &[5]), (1 << 62, &[2]), (1 << 63, &[3])]);
        let d = a.diff(&c);
        assert_eq!(d.changed(), [KeyRange::new(SliceKey(1 << 61), Some(SliceKey(1 << 62)))]);
        assert_eq!(d.key_churn(), 0.125);
    }
}
