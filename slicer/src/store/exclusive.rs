//! What the stores share of exclusive mode (the protocol is `docs/exclusive.md`'s; the
//! etcd side is `etcd/exclusive.rs`): what [`super::AssignmentStore::write_exclusive`]
//! and [`super::AssignmentStore::settle`] report, and the checks made before a write.

use steady_slice::Assignment;
use tokio::time::Instant;

use super::{Snapshot, StoreError};

/// Where a job's recall stands after [`super::AssignmentStore::write_exclusive`] or
/// [`super::AssignmentStore::settle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recall {
    /// No recall was under way: the guard grants the stored assignment, or the job has
    /// no guard (it is not exclusive). ([`super::AssignmentStore::settle`] only.)
    Clear,
    /// The recall of `from` for `to` completed: the guard grants `to`.
    Granted {
        /// The generation recalled (0: none).
        from: u64,
        /// The generation granted.
        to: u64,
        /// When etcd answered the grant.
        at: Instant,
    },
    /// The recall of `from` for `to` did not complete within the store's bound: the
    /// assignment `to` is stored and the guard says `recalling from to`;
    /// [`super::AssignmentStore::settle`] completes it. ([`super::AssignmentStore::write_exclusive`]
    /// only: `settle` reports a recall it cannot complete as [`StoreError::RecallPending`].)
    Pending {
        /// The generation recalled (0: none).
        from: u64,
        /// The generation stored, to be granted.
        to: u64,
    },
}

/// What [`super::AssignmentStore::write_exclusive`] did: the assignment is stored, and its
/// recall completed or is left to [`super::AssignmentStore::settle`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExclusiveWrite {
    /// The job as written (write again with it, without reading).
    pub snapshot: Snapshot,
    /// When etcd answered the transaction that stored the assignment and began its
    /// recall (a recall's time runs from here to [`Recall::Granted`]'s `at`).
    pub published_at: Instant,
    /// [`Recall::Granted`] or [`Recall::Pending`].
    pub recall: Recall,
}

/// Refuses an assignment exclusive mode cannot hold: a slice of more than one task
/// (replicas and warming ones together).
///
/// # Errors
///
/// [`StoreError::NotExclusive`] naming the first such slice.
pub(crate) fn check_exclusive(next: &Assignment) -> Result<(), StoreError> {
    match next.slices().iter().position(|s| s.replicas().len() + s.warming().len() > 1) {
        Some(slice) => {
            let s = &next.slices()[slice];
            Err(StoreError::NotExclusive { slice, tasks: s.replicas().len() + s.warming().len() })
        }
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use steady_slice::{Slice, SliceKey};

    use super::*;

    #[test]
    fn an_exclusive_assignment_has_one_task_per_slice() {
        let one =
            Assignment::new(3, vec![Slice::new(SliceKey(0), vec![1]), Slice::new(SliceKey(9), vec![2])]);
        assert!(check_exclusive(&one.unwrap()).is_ok());
        let two =
            Assignment::new(3, vec![Slice::new(SliceKey(0), vec![1]), Slice::new(SliceKey(9), vec![2, 3])]);
        assert!(matches!(
            check_exclusive(&two.unwrap()),
            Err(StoreError::NotExclusive { slice: 1, tasks: 2 })
        ));
        let warming = Slice::new(SliceKey(0), vec![1]).with_warming([2]);
        let warming = Assignment::new(4, vec![warming]).unwrap();
        assert!(warming.has_warming());
        assert!(matches!(check_exclusive(&warming), Err(StoreError::NotExclusive { slice: 0, tasks: 2 })));
    }
}
