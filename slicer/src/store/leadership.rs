//! [`Leadership`]: a candidate's term as a job's one writer.

use std::any::Any;
use std::fmt;

use tokio::sync::watch;

use super::{StoreError, StoreFuture};

/// A candidate's term as the one writer of a job, from [`super::AssignmentStore::campaign`].
///
/// Writes name it ([`super::AssignmentStore::write`]) and the store checks, in the same
/// step as the revision, that its term is still the job's current one: a writer whose
/// term ended without its knowing (a paused process whose etcd lease lapsed) gets
/// [`StoreError::NotLeader`] and changes nothing.
///
/// The term ends when the handle is resigned ([`Leadership::resign`]) or dropped (the
/// next candidate leads at once), or, in etcd, when its lease lapses: renewals failed for
/// a whole TTL. [`Leadership::is_held`] and [`Leadership::lost`] report the last: they
/// are this process's view, which ends no later than etcd's (renewals are timed from when
/// they were sent), but the fenced write is the authority.
pub struct Leadership {
    job: String,
    candidate: String,
    held: watch::Receiver<bool>,
    term: Box<dyn Term>,
}

/// A store's side of a term (each store has its own). Dropping it releases the term
/// unless it was left to lapse ([`Leadership::stop_renewing`]).
///
/// A trait, so that this module names no store: each store implements it and, when a
/// write names a [`Leadership`], finds its own kind of term with [`Leadership::term`]
/// (a term of another store is not a term there: `NotLeader`).
pub(crate) trait Term: fmt::Debug + Send + Sync + 'static {
    /// Ends the term now.
    fn resign(&self) -> StoreFuture<'_, ()>;
    /// Stops keeping the term alive without ending it (see [`Leadership::stop_renewing`]).
    fn stop_renewing(&self);
    /// For [`Leadership::term`]'s downcast.
    fn as_any(&self) -> &dyn Any;
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("job", &self.job)
            .field("candidate", &self.candidate)
            .field("held", &self.is_held())
            .field("term", &self.term)
            .finish()
    }
}

impl Leadership {
    pub(crate) fn new(job: &str, candidate: &str, held: watch::Receiver<bool>, term: impl Term) -> Self {
        Self { job: job.to_owned(), candidate: candidate.to_owned(), held, term: Box::new(term) }
    }

    /// The job led.
    pub fn job(&self) -> &str {
        &self.job
    }

    /// The candidate that leads.
    pub fn candidate(&self) -> &str {
        &self.candidate
    }

    /// Whether the term still holds, as far as this process knows (see the type's docs).
    pub fn is_held(&self) -> bool {
        *self.held.borrow()
    }

    /// Resolves when the term is over: its lease lapsed, or renewing it failed for a
    /// whole TTL. An Assigner selects on it to stop writing and campaign again.
    pub async fn lost(&self) {
        let mut held = self.held.clone();
        // A closed channel means the renewing side is gone: the term is over too.
        let _ = held.wait_for(|held| !*held).await;
    }

    /// Ends the term now, so that another candidate can lead at once.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when etcd could not be told: the term then ends when
    /// its lease lapses, within a TTL.
    pub async fn resign(self) -> Result<(), StoreError> {
        self.term.resign().await
    }

    /// Stops renewing the term without releasing it, as a process that hangs or is cut
    /// off would: for fault injection (tests, demos). In etcd the term ends when the
    /// lease lapses (within a TTL) and a standby can then lead; the in-memory store has
    /// no lease, so there it ends at once. The handle stays usable, so that a test can
    /// check that a deposed writer's write is refused; dropping it releases nothing more.
    pub fn stop_renewing(&self) {
        self.term.stop_renewing();
    }

    /// The term, if it is a `T` (a term of the store asking).
    pub(crate) fn term<T: Term>(&self) -> Option<&T> {
        self.term.as_any().downcast_ref::<T>()
    }
}
