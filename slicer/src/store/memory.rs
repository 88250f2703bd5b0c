//! [`MemoryStore`]: the embedded assignment store, in one process.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use steady_slice::Assignment;
use tokio::sync::watch;

use super::leadership::Term;
use super::{
    check_name, check_write, AssignmentStore, AssignmentWatch, Leadership, Revision, Snapshot, StoreError,
    StoreFuture,
};

/// The default of [`MemoryStore::with_max_jobs`].
const MAX_STORED_JOBS: usize = 1024;

/// The embedded [`AssignmentStore`]: jobs held in this process, watchers fed by tokio
/// watch channels. The default for one machine and for tests.
///
/// Clones share the store. Its election is the trivial one: a job's leader is whoever
/// campaigned first, until it resigns, drops or stops renewing its [`Leadership`]; the
/// write is fenced as in etcd (a handle whose term is over gets
/// [`StoreError::NotLeader`]). Revisions count the store's writes.
///
/// # Memory
///
/// At most 1,024 jobs (or [`MemoryStore::with_max_jobs`]); a job's entry is
/// made by a write, a watch or a campaign, and an entry that holds nothing (no
/// assignment, no leader, no watcher, no campaigner) is dropped when room is needed.
/// Beyond the limit, watch and campaign fail with [`StoreError::TooManyJobs`]. Reads
/// never make an entry.
#[derive(Debug, Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Tells this store's leaderships from another's.
    id: u64,
    max_jobs: usize,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    jobs: HashMap<String, Job>,
    /// The last revision written, over all jobs.
    revision: i64,
    /// The last term granted, over all jobs.
    term: u64,
}

#[derive(Debug)]
struct Job {
    assignment: watch::Sender<(Revision, Option<Assignment>)>,
    /// The current term, if anyone leads.
    leader: watch::Sender<Option<u64>>,
}

impl Job {
    fn new() -> Self {
        Self { assignment: watch::Sender::new((Revision::ABSENT, None)), leader: watch::Sender::new(None) }
    }

    fn holds_anything(&self) -> bool {
        self.assignment.borrow().1.is_some()
            || self.leader.borrow().is_some()
            || self.assignment.receiver_count() > 0
            || self.leader.receiver_count() > 0
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        Self { inner: Arc::new(Inner { id, max_jobs: MAX_STORED_JOBS, state: Mutex::default() }) }
    }

    /// An empty store that holds at most `max` jobs instead of 1,024.
    pub fn with_max_jobs(max: usize) -> Self {
        let store = Self::new();
        let inner = Inner { id: store.inner.id, max_jobs: max, state: Mutex::default() };
        Self { inner: Arc::new(inner) }
    }

    /// How many jobs it holds now.
    pub fn jobs(&self) -> usize {
        self.inner.lock().jobs.len()
    }

    /// How many jobs it holds at most ([`MemoryStore::with_max_jobs`]).
    pub fn max_jobs(&self) -> usize {
        self.inner.max_jobs
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl State {
    /// The job's entry, made if there is room.
    fn entry(&mut self, job: &str, max_jobs: usize) -> Result<&mut Job, StoreError> {
        if !self.jobs.contains_key(job) && self.jobs.len() >= max_jobs {
            self.jobs.retain(|_, j| j.holds_anything());
            if self.jobs.len() >= max_jobs {
                return Err(StoreError::TooManyJobs { limit: max_jobs });
            }
        }
        Ok(self.jobs.entry(job.to_owned()).or_insert_with(Job::new))
    }
}

/// A term of a [`MemoryStore`] job.
#[derive(Debug)]
pub(crate) struct MemoryTerm {
    store: Arc<Inner>,
    job: String,
    term: u64,
    held: watch::Sender<bool>,
}

impl MemoryTerm {
    /// Ends the term if it is still the job's (idempotent).
    pub(crate) fn release(&self) {
        let state = self.store.lock();
        if let Some(job) = state.jobs.get(&self.job) {
            job.leader.send_if_modified(|leader| {
                let ours = *leader == Some(self.term);
                if ours {
                    *leader = None;
                }
                ours
            });
        }
        self.held.send_replace(false);
    }
}

impl Term for MemoryTerm {
    fn resign(&self) -> StoreFuture<'_, ()> {
        self.release();
        Box::pin(async { Ok(()) })
    }

    /// The in-memory store has no lease to let lapse: the term ends at once.
    fn stop_renewing(&self) {
        self.release();
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl Drop for MemoryTerm {
    fn drop(&mut self) {
        self.release();
    }
}

impl AssignmentStore for MemoryStore {
    fn read<'a>(&'a self, job: &'a str) -> StoreFuture<'a, Snapshot> {
        Box::pin(async move {
            check_name("job", job)?;
            let state = self.inner.lock();
            Ok(match state.jobs.get(job).map(|j| j.assignment.borrow().clone()) {
                Some((revision, Some(a))) => Snapshot::valid(job, revision, a),
                Some((revision, None)) => Snapshot::nothing(job, revision),
                None => Snapshot::nothing(job, Revision::ABSENT),
            })
        })
    }

    fn write<'a>(
        &'a self,
        leadership: &'a Leadership,
        previous: &'a Snapshot,
        next: &'a Assignment,
    ) -> StoreFuture<'a, Snapshot> {
        Box::pin(async move {
            check_write(leadership, previous, next)?;
            let Some(term) = leadership.term::<MemoryTerm>() else {
                return Err(StoreError::NotLeader);
            };
            if term.store.id != self.inner.id {
                return Err(StoreError::NotLeader);
            }
            let mut state = self.inner.lock();
            let revision = Revision::new(state.revision + 1);
            let job = state.jobs.get(leadership.job()).ok_or(StoreError::NotLeader)?;
            // The term first: a deposed writer learns that it is deposed, whatever its
            // revision, as from etcd.
            if *job.leader.borrow() != Some(term.term) {
                return Err(StoreError::NotLeader);
            }
            if job.assignment.borrow().0 != previous.revision() {
                return Err(StoreError::Conflict);
            }
            job.assignment.send_replace((revision, Some(next.clone())));
            state.revision = revision.get();
            Ok(Snapshot::valid(leadership.job(), revision, next.clone()))
        })
    }

    fn watch(&self, job: &str, known_generation: u64) -> Result<AssignmentWatch, StoreError> {
        check_name("job", job)?;
        let mut updates = self.inner.lock().entry(job, self.inner.max_jobs)?.assignment.subscribe();
        // The current value counts as news: it is sent at once if newer than known.
        updates.mark_changed();
        let stream =
            futures_util::stream::unfold((updates, known_generation), |(mut updates, known)| async move {
                loop {
                    // Fails only when the store itself is gone.
                    updates.changed().await.ok()?;
                    let newer = updates.borrow_and_update().1.clone().filter(|a| a.generation() > known);
                    if let Some(a) = newer {
                        let generation = a.generation();
                        return Some((Ok(a), (updates, generation)));
                    }
                }
            });
        Ok(AssignmentWatch::new(stream))
    }

    fn campaign<'a>(&'a self, job: &'a str, candidate: &'a str) -> StoreFuture<'a, Leadership> {
        Box::pin(async move {
            check_name("job", job)?;
            check_name("candidate", candidate)?;
            loop {
                let mut leader = {
                    let mut state = self.inner.lock();
                    state.term += 1;
                    let term = state.term;
                    let entry = state.entry(job, self.inner.max_jobs)?;
                    let won = entry.leader.send_if_modified(|leader| {
                        let free = leader.is_none();
                        if free {
                            *leader = Some(term);
                        }
                        free
                    });
                    if won {
                        let (held, watching) = watch::channel(true);
                        let term = MemoryTerm { store: self.inner.clone(), job: job.to_owned(), term, held };
                        return Ok(Leadership::new(job, candidate, watching, term));
                    }
                    entry.leader.subscribe()
                };
                // Our receiver keeps the entry from being dropped while we wait.
                let _ = leader.wait_for(Option::is_none).await;
            }
        })
    }
}
