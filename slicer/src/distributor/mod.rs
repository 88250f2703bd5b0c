//! [`Distributor`]: the server of `AssignmentDistributor.Watch`, fanning one publisher
//! out to many watchers. The client is `steady_proto::watch_assignments`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use steady_core::valid_job_name;
use steady_proto::assignment::WatchRequest;
use steady_slice::Assignment;
use tokio::sync::watch;
use tonic::Status;

mod server;

pub use server::DistributorServer;

use steady_core::MAX_JOB_NAME_LEN;

/// The default of [`Distributor::with_max_unpublished_jobs`].
const MAX_UNPUBLISHED_JOBS: usize = 1024;

/// The default of [`Distributor::with_max_watchers`].
const MAX_WATCHERS: usize = 65_536;

/// The server side: holds the current assignment of each job and streams every newer
/// one to every watcher of that job.
///
/// Clone it freely: clones publish to the same watchers. Serve it with
/// `tonic::transport::Server::builder().add_service(distributor.service())`.
///
/// # Memory
///
/// Watchers are remote peers, so what they can make it hold is bounded: it holds one
/// entry per published job (kept for good: publishers are trusted), and one per
/// unpublished job that has watchers, dropped with its last watcher. Job names are at
/// most [`MAX_JOB_NAME_LEN`] bytes, watchers may hold at most
/// [`Distributor::max_unpublished_jobs`] unpublished jobs at once, and at most
/// [`Distributor::max_watchers`] streams are open at once. The read-only queries
/// ([`Distributor::current`], [`Distributor::watchers`]) never add an entry.
#[derive(Debug, Clone)]
pub struct Distributor {
    pub(crate) jobs: Arc<Mutex<Jobs>>,
    /// Bumped by [`Distributor::close_watchers`]: every open stream ends.
    epoch: watch::Sender<u64>,
    max_unpublished_jobs: usize,
    max_watchers: usize,
}

/// The jobs a distributor holds: every published job, and every unpublished job with
/// at least one watcher.
#[derive(Debug, Default)]
pub(crate) struct Jobs {
    pub(crate) by_name: HashMap<String, watch::Sender<Option<Published>>>,
    /// How many entries of `by_name` hold no assignment yet.
    unpublished: usize,
    /// Watch streams open now, over all jobs.
    pub(crate) watchers: usize,
    /// Assignments published (newer than the one held) so far.
    pub(crate) publications: u64,
}

/// A published assignment and its `AssignmentUpdate` message, encoded once for every
/// watcher: each stream sends these bytes as they are.
#[derive(Debug, Clone)]
pub(crate) struct Published {
    pub(crate) assignment: Assignment,
    pub(crate) encoded: Bytes,
    /// How many distinct tasks serve a slice (counted once here, read by every A119
    /// stream that starts: its quantum is per task).
    pub(crate) tasks: usize,
}

impl Published {
    fn new(assignment: Assignment) -> Self {
        let encoded = steady_proto::encode_update(&assignment);
        let tasks: std::collections::HashSet<u32> =
            assignment.slices().iter().flat_map(|s| s.replicas().iter().copied()).collect();
        Self { assignment, encoded, tasks: tasks.len() }
    }

    fn generation(&self) -> u64 {
        self.assignment.generation()
    }
}

impl Default for Distributor {
    fn default() -> Self {
        Self {
            jobs: Arc::default(),
            epoch: watch::Sender::new(0),
            max_unpublished_jobs: MAX_UNPUBLISHED_JOBS,
            max_watchers: MAX_WATCHERS,
        }
    }
}

impl Distributor {
    /// A distributor with no assignments yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Lets watchers hold up to `max` jobs that nothing was published for at once
    /// (default 1,024; 0: watchers may watch published jobs only). A Watch request that
    /// would add one more fails with `RESOURCE_EXHAUSTED`; watching a job that is
    /// published, or that already has watchers, always works. Set it before cloning the
    /// distributor: the limit is each clone's own.
    pub fn with_max_unpublished_jobs(mut self, max: usize) -> Self {
        self.max_unpublished_jobs = max;
        self
    }

    /// Sets how many watch streams may be open at once, over all jobs (default 65,536). A
    /// Watch request beyond it fails with `RESOURCE_EXHAUSTED`: each stream holds a little
    /// memory and a task's attention, and a remote peer must not be able to open them
    /// without bound. Like the job limit, it is each clone's own: set it before cloning.
    pub fn with_max_watchers(mut self, max: usize) -> Self {
        self.max_watchers = max;
        self
    }

    /// How many unpublished jobs watchers may hold at once
    /// ([`Distributor::with_max_unpublished_jobs`]).
    pub fn max_unpublished_jobs(&self) -> usize {
        self.max_unpublished_jobs
    }

    /// How many watch streams may be open at once ([`Distributor::with_max_watchers`]).
    pub fn max_watchers(&self) -> usize {
        self.max_watchers
    }

    /// Ends every open watch stream (watchers reconnect and resume from the generation
    /// they have). Call it before a graceful server shutdown, which otherwise waits for
    /// the streams, which never end on their own.
    pub fn close_watchers(&self) {
        self.epoch.send_modify(|e| *e += 1);
    }

    fn lock(&self) -> MutexGuard<'_, Jobs> {
        self.jobs.lock().expect("not poisoned")
    }

    /// Publishes `assignment` for `job` if it is newer than the current one; returns
    /// whether it was. A job name no watcher could name (empty, or longer than
    /// [`MAX_JOB_NAME_LEN`]) is refused: nothing is published and it returns `false`.
    pub fn publish(&self, job: &str, assignment: Assignment) -> bool {
        if !valid_job_name(job) {
            tracing::warn!(job_len = job.len(), "distributor: job name refused, nothing published");
            return false;
        }
        // Encoded once here, outside the lock, for every watcher of every stream.
        let assignment = Published::new(assignment);
        // The whole publish holds the lock: otherwise the last watcher of an unpublished
        // job could remove its entry between our finding it and filling it, and the
        // assignment would be lost with the entry.
        let mut jobs = self.lock();
        let Jobs { by_name, unpublished, publications, .. } = &mut *jobs;
        let Some(sender) = by_name.get(job) else {
            by_name.insert(job.to_owned(), watch::Sender::new(Some(assignment)));
            *publications += 1;
            return true;
        };
        let mut was_unpublished = false;
        let published = sender.send_if_modified(|current| {
            if current.as_ref().is_some_and(|c| c.generation() >= assignment.generation()) {
                return false;
            }
            was_unpublished = current.is_none();
            *current = Some(assignment);
            true
        });
        if was_unpublished {
            *unpublished -= 1;
        }
        if published {
            *publications += 1;
        }
        published
    }

    /// Forgets `job` (a job no longer served: its spec was removed), if no watcher has it
    /// open; returns whether it did. A job with watchers is kept, its last assignment
    /// with it, so that they keep what they have: retire it again once they are gone.
    pub fn retire(&self, job: &str) -> bool {
        let mut jobs = self.lock();
        let Jobs { by_name, unpublished, .. } = &mut *jobs;
        match by_name.get(job) {
            Some(sender) if sender.receiver_count() == 0 => {
                if sender.borrow().is_none() {
                    *unpublished = unpublished.saturating_sub(1);
                }
                by_name.remove(job);
                true
            }
            Some(_) => false,
            None => true,
        }
    }

    /// The current assignment of `job` (`None` if nothing was published for it).
    pub fn current(&self, job: &str) -> Option<Assignment> {
        self.lock().by_name.get(job).and_then(|sender| sender.borrow().as_ref().map(|p| p.assignment.clone()))
    }

    /// How many watchers `job` has now.
    pub fn watchers(&self, job: &str) -> usize {
        self.lock().by_name.get(job).map_or(0, watch::Sender::receiver_count)
    }

    /// Watch streams open now, over all jobs.
    pub fn total_watchers(&self) -> usize {
        self.lock().watchers
    }

    /// Assignments published so far (each newer than the one it replaced).
    pub fn publications(&self) -> u64 {
        self.lock().publications
    }

    /// How many jobs it holds now: the published ones, and the unpublished ones that have
    /// watchers (see "Memory" above).
    pub fn jobs(&self) -> usize {
        self.lock().by_name.len()
    }

    /// The tonic service to add to a server: `AssignmentDistributor.Watch`, sending each
    /// generation's message as encoded once at [`Distributor::publish`] (the cost of a
    /// new generation is one encoding and a copy per watcher, whatever its size).
    pub fn service(&self) -> DistributorServer {
        DistributorServer::new(self.clone())
    }

    /// Whether something was published for `job` (and it is held still).
    pub(crate) fn is_published(&self, job: &str) -> bool {
        self.lock().by_name.get(job).is_some_and(|sender| sender.borrow().is_some())
    }

    /// Changes with each [`Distributor::close_watchers`]: a stream of another protocol
    /// over this distributor's jobs ends on it too.
    pub(crate) fn closings(&self) -> watch::Receiver<u64> {
        self.epoch.subscribe()
    }

    /// A new watcher of `job`: joins its entry, or adds one if there is room for another
    /// unpublished job. Every watcher counts against the limits, whatever protocol it
    /// is served by.
    pub(crate) fn subscribe(&self, job: String) -> Result<Subscription, Status> {
        let mut jobs = self.lock();
        if jobs.watchers >= self.max_watchers {
            return Err(Status::resource_exhausted(format!(
                "{} watch streams are open (limit {})",
                jobs.watchers, self.max_watchers
            )));
        }
        let updates = match jobs.by_name.get(&job) {
            Some(sender) => sender.subscribe(),
            None if jobs.unpublished >= self.max_unpublished_jobs => {
                return Err(Status::resource_exhausted(format!(
                    "watchers already wait for {} unpublished jobs (limit {})",
                    jobs.unpublished, self.max_unpublished_jobs
                )));
            }
            None => {
                let sender = watch::Sender::new(None);
                let updates = sender.subscribe();
                jobs.by_name.insert(job.clone(), sender);
                jobs.unpublished += 1;
                updates
            }
        };
        jobs.watchers += 1;
        Ok(Subscription { updates: Some(updates), job, jobs: self.jobs.clone() })
    }
}

/// One watcher's receiver of a job's assignments. Dropping it removes the job's entry
/// when it was the last watcher and nothing was published.
#[derive(Debug)]
pub(crate) struct Subscription {
    /// `Some` until dropped.
    updates: Option<watch::Receiver<Option<Published>>>,
    job: String,
    pub(crate) jobs: Arc<Mutex<Jobs>>,
}

impl Subscription {
    pub(crate) fn updates(&mut self) -> &mut watch::Receiver<Option<Published>> {
        self.updates.as_mut().expect("taken only on drop")
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        // Drop our receiver first, so that the count below no longer includes it. New
        // watchers subscribe under the same lock, so the count cannot grow meanwhile.
        drop(self.updates.take());
        let mut jobs = self.jobs.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let Jobs { by_name, unpublished, watchers, .. } = &mut *jobs;
        *watchers -= 1;
        let entry = by_name.get(&self.job);
        debug_assert!(entry.is_some(), "a watched job keeps its entry while it has watchers");
        if entry.is_some_and(|sender| sender.receiver_count() == 0 && sender.borrow().is_none()) {
            by_name.remove(&self.job);
            *unpublished -= 1;
        }
    }
}

/// The stream a watcher receives: each item an `AssignmentUpdate` message as encoded
/// once at publication.
pub type WatchStream = steady_proto::EncodedWatchStream;

impl Distributor {
    /// Streams `job`'s assignments newer than `known_generation`, encoded.
    ///
    /// # Errors
    ///
    /// `INVALID_ARGUMENT` for an empty job name or one longer than [`MAX_JOB_NAME_LEN`];
    /// `RESOURCE_EXHAUSTED` when the job is unpublished, has no watchers, and watchers
    /// already hold the most unpublished jobs allowed, or when
    /// [`Distributor::max_watchers`] streams are open.
    pub(crate) fn watch(&self, request: WatchRequest) -> Result<WatchStream, Status> {
        let WatchRequest { job, known_generation } = request;
        if !valid_job_name(&job) {
            return Err(Status::invalid_argument(format!(
                "job name of {} bytes: it must have 1 to {MAX_JOB_NAME_LEN}",
                job.len()
            )));
        }
        let mut subscription = self.subscribe(job)?;
        // Mark the current value unseen so a newer-than-known one is sent at once.
        subscription.updates().mark_changed();
        let closed = self.closings();
        let state = (subscription, closed, known_generation);
        let stream =
            futures_util::stream::unfold(state, |(mut subscription, mut closed, known)| async move {
                loop {
                    tokio::select! {
                        changed = subscription.updates().changed() => changed.ok()?,
                        _ = closed.changed() => return None,
                    }
                    let newer = subscription
                        .updates()
                        .borrow_and_update()
                        .as_ref()
                        .filter(|p| p.generation() > known)
                        .map(|p| (p.generation(), p.encoded.clone()));
                    if let Some((generation, encoded)) = newer {
                        return Some((Ok(encoded), (subscription, closed, generation)));
                    }
                }
            });
        Ok(Box::pin(stream))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_for_unknown_jobs_hold_nothing() {
        let distributor = Distributor::new();
        assert_eq!((distributor.current("nobody"), distributor.watchers("nobody")), (None, 0));
        assert_eq!(distributor.jobs(), 0);
        assert!(distributor.publish("known", Assignment::single(1, vec![0]).unwrap()));
        assert_eq!(distributor.current("other"), None);
        assert_eq!(distributor.watchers("other"), 0);
        assert_eq!(distributor.jobs(), 1);
    }

    #[test]
    fn a_retired_job_is_forgotten_once_no_watcher_has_it() {
        let distributor = Distributor::new();
        assert!(distributor.retire("never"), "a job it does not hold is retired already");
        distributor.publish("users", Assignment::single(1, vec![0]).unwrap());
        let watcher = distributor.subscribe("users".to_owned()).unwrap();
        assert!(!distributor.retire("users"), "kept for its watcher");
        assert_eq!(distributor.current("users").map(|a| a.generation()), Some(1));
        drop(watcher);
        assert!(distributor.retire("users"));
        assert_eq!((distributor.current("users"), distributor.jobs()), (None, 0));
    }
}
