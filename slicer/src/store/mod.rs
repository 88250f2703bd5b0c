//! Assignment stores: where the Assigner of each job keeps the job's current assignment,
//! writes each new generation, and holds the election that makes it the job's one writer
//! (Slicer's check-and-write, in our words; see `docs/slicer.md`).
//!
//! * [`AssignmentStore`]: the trait an Assigner service is written against (object safe:
//!   `Arc<dyn AssignmentStore>` works). [`AssignmentStore::read`] gives a [`Snapshot`]
//!   (the assignment and the [`Revision`] it was read at); [`AssignmentStore::write`]
//!   writes a newer generation *conditioned on that revision* (compare-and-swap) and
//!   *fenced* by a [`Leadership`]; [`AssignmentStore::watch`] follows the job as an
//!   [`AssignmentWatch`] stream; [`AssignmentStore::campaign`] waits to become the job's
//!   writer.
//! * Exclusive mode (`docs/exclusive.md`): [`AssignmentStore::write_exclusive`] stores
//!   a generation *and* recalls the one before it from the job's Slicelets, and
//!   [`AssignmentStore::settle`] completes a recall a previous call (or term) left
//!   pending. Only a store with leases has it ([`AssignmentStore::supports_exclusive`]).
//! * [`MemoryStore`]: the embedded default, in one process (tokio watch channels).
//! * `EtcdStore` (feature `etcd`, on by default): the same on an etcd cluster, so that
//!   Assigners on several machines elect one writer and a standby takes over when the
//!   writer dies. Its keys and values are a contract: see the `EtcdStore` docs.
//!
//! # The write protocol
//!
//! ```text
//! leadership = store.campaign(job, me)          // waits while another candidate leads
//! loop:
//!     snapshot = store.read(job)
//!     next     = assign(snapshot.assignment(), load)   // generation > snapshot.generation()
//!     match store.write(&leadership, &snapshot, &next):
//!         Ok(_)                      => done
//!         Err(StoreError::Conflict)  => re-read and retry (someone wrote meanwhile)
//!         Err(StoreError::NotLeader) => stop writing: this term is over
//! ```
//!
//! A write succeeds only if the job's assignment is still at the snapshot's revision
//! *and* the leadership's term is still the job's current term, checked by the store in
//! one step. So a writer that lost a race, or was deposed without knowing it (a paused
//! process whose lease lapsed), changes nothing: its write fails with a typed error.
//!
//! # Bounds
//!
//! Job and candidate names are 1 to [`MAX_JOB_NAME_LEN`] bytes, an encoded assignment at
//! most [`MAX_ASSIGNMENT_BYTES`]: a value above it is neither written nor decoded.

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use steady_slice::Assignment;

use steady_core::valid_job_name;
#[cfg(doc)]
use steady_core::MAX_JOB_NAME_LEN;

mod error;
#[cfg(feature = "etcd")]
mod etcd;
mod exclusive;
mod leadership;
mod memory;
mod watch;

pub use error::{StoreError, ValueError};
#[cfg(feature = "etcd")]
pub use etcd::{EtcdConfig, EtcdStore, DEFAULT_KEY_PREFIX};
pub(crate) use exclusive::check_exclusive;
pub use exclusive::{ExclusiveWrite, Recall};
pub use leadership::Leadership;
pub use memory::MemoryStore;
#[cfg(feature = "etcd")]
pub use steady_etcd::{ConnectError, EtcdAccess, EtcdTls};
pub use steady_slice::guard::Consistency;
pub use watch::{AssignmentWatch, RejectedValue};

/// The largest encoded assignment (steady-slice's binary codec) a store writes or reads:
/// 1 MiB, below etcd's default request limit of 1.5 MiB. It holds 15,000 slices of up to
/// 14 replicas each (an encoded slice takes 10 bytes plus 4 per replica). A larger
/// assignment is refused on write ([`StoreError::TooLarge`]); a larger stored value is
/// rejected without decoding ([`ValueError::TooLarge`]).
pub const MAX_ASSIGNMENT_BYTES: usize = 1 << 20;

/// What the store methods return: a boxed future, so the trait stays object safe.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// Where a job's assignment stands in its store: it increases with every change of the
/// job's key. `Revision::ABSENT` (0) means the key was never written. In etcd it is the
/// key's `mod_revision`; in a [`MemoryStore`], a counter of the store's writes.
///
/// Only a store makes them: a write conditioned on a revision can only name one that was
/// read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Revision(i64);

impl Revision {
    /// The revision of a key that holds nothing.
    pub const ABSENT: Revision = Revision(0);

    pub(crate) fn new(revision: i64) -> Self {
        Self(revision)
    }

    /// The number (etcd's `mod_revision` for an [`EtcdStore`]).
    pub fn get(self) -> i64 {
        self.0
    }
}

impl fmt::Display for Revision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "revision {}", self.0)
    }
}

/// A job's assignment as one read saw it, and the revision it saw: what a write is
/// conditioned on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    job: String,
    revision: Revision,
    stored: Stored,
}

/// What a job's key held when read.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Stored {
    Nothing,
    Valid(Assignment),
    Rejected(ValueError),
}

impl Snapshot {
    pub(crate) fn nothing(job: &str, revision: Revision) -> Self {
        Self { job: job.to_owned(), revision, stored: Stored::Nothing }
    }

    pub(crate) fn valid(job: &str, revision: Revision, assignment: Assignment) -> Self {
        Self { job: job.to_owned(), revision, stored: Stored::Valid(assignment) }
    }

    /// Decodes a stored value (`None`: the key is absent).
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    pub(crate) fn decode(job: &str, revision: Revision, value: Option<&[u8]>) -> Self {
        let stored = match value.map(decode_value) {
            None => Stored::Nothing,
            Some(Ok(a)) => Stored::Valid(a),
            Some(Err(e)) => Stored::Rejected(e),
        };
        Self { job: job.to_owned(), revision, stored }
    }

    /// The job read.
    pub fn job(&self) -> &str {
        &self.job
    }

    /// The revision the job's key was at ([`Revision::ABSENT`] if never written).
    pub fn revision(&self) -> Revision {
        self.revision
    }

    /// The assignment stored (`None`: nothing, or a value that is not a valid assignment,
    /// see [`Snapshot::rejected`]).
    pub fn assignment(&self) -> Option<&Assignment> {
        match &self.stored {
            Stored::Valid(a) => Some(a),
            _ => None,
        }
    }

    /// Why the stored value is not an assignment, when it is not (someone wrote the key
    /// around the store). A write may replace it with any generation.
    pub fn rejected(&self) -> Option<&ValueError> {
        match &self.stored {
            Stored::Rejected(e) => Some(e),
            _ => None,
        }
    }

    /// The stored assignment's generation (0: none). A write must offer a higher one.
    pub fn generation(&self) -> u64 {
        self.assignment().map_or(0, Assignment::generation)
    }

    /// The assignment itself (`None` as for [`Snapshot::assignment`]).
    pub fn into_assignment(self) -> Option<Assignment> {
        match self.stored {
            Stored::Valid(a) => Some(a),
            _ => None,
        }
    }
}

/// A per-job assignment store with one elected writer per job. Implemented by
/// [`MemoryStore`] and `EtcdStore`; the behaviour below is what both guarantee (the
/// tests `slicer/tests/store.rs` run one specification against both).
///
/// Every method bounds its waits except [`AssignmentStore::campaign`], which waits as
/// long as another candidate leads (wrap it in a timeout, or drop it, to give up).
pub trait AssignmentStore: fmt::Debug + Send + Sync + 'static {
    /// The job's current assignment and the revision it is at.
    ///
    /// # Errors
    ///
    /// [`StoreError::InvalidName`] for a job name of 0 or more than [`MAX_JOB_NAME_LEN`]
    /// bytes; [`StoreError::Unavailable`] when the store cannot answer in time. A stored
    /// value that is not a valid assignment is not an error: see [`Snapshot::rejected`].
    fn read<'a>(&'a self, job: &'a str) -> StoreFuture<'a, Snapshot>;

    /// Writes `next` as the job's assignment if the job is still at `previous`'s
    /// revision and `leadership` still holds the job's current term; returns the new
    /// snapshot (so the writer can write again without reading).
    ///
    /// The job is `leadership`'s; `previous` must be a snapshot of the same job.
    ///
    /// # Errors
    ///
    /// Checked before anything is sent: [`StoreError::WrongJob`] when `previous` is of
    /// another job; [`StoreError::NotNewer`] when `next`'s generation is not above
    /// `previous`'s; [`StoreError::TooLarge`] above [`MAX_ASSIGNMENT_BYTES`]. Then, from
    /// the store, nothing written: [`StoreError::NotLeader`] when the term is over (a
    /// deposed writer, whatever the revision), [`StoreError::Conflict`] when the job
    /// changed since `previous` (re-read and retry), [`StoreError::ConsistencyMismatch`]
    /// when the job is exclusive (its guard exists: write with
    /// [`AssignmentStore::write_exclusive`]), [`StoreError::Unavailable`] when it cannot
    /// answer in time (the write may or may not have happened: re-read).
    fn write<'a>(
        &'a self,
        leadership: &'a Leadership,
        previous: &'a Snapshot,
        next: &'a Assignment,
    ) -> StoreFuture<'a, Snapshot>;

    /// The job's assignments with a generation above `known_generation` (0: all), in
    /// order: the current one first if it qualifies, then each newer one written. An
    /// older or equal generation is skipped. A stored value that is not a valid
    /// assignment comes through as an error and is counted
    /// ([`AssignmentWatch::rejected`]); the stream carries on, so a follower keeps its
    /// last good assignment. It never ends on its own: trouble reaching the store is
    /// retried with backoff. Between two items it may skip generations that were
    /// replaced before it saw them, never the newest.
    ///
    /// Feed it to `SteadyChannel::follow_assignments` or `Balance::follow_assignments`
    /// to follow the store directly (the backup distribution path).
    ///
    /// # Errors
    ///
    /// [`StoreError::InvalidName`] for a bad job name;
    /// [`StoreError::TooManyJobs`] from a full [`MemoryStore`].
    fn watch(&self, job: &str, known_generation: u64) -> Result<AssignmentWatch, StoreError>;

    /// Waits until `candidate` is the job's one writer, and returns its [`Leadership`]
    /// (held until resigned, dropped, or lost). While another candidate leads, it waits
    /// for that term to end (a resignation, or in etcd its lease lapsing).
    ///
    /// # Errors
    ///
    /// [`StoreError::InvalidName`] for a bad job or candidate name;
    /// [`StoreError::Unavailable`] when the store cannot be reached (after bounded
    /// retries); [`StoreError::TooManyJobs`] from a full [`MemoryStore`].
    fn campaign<'a>(&'a self, job: &'a str, candidate: &'a str) -> StoreFuture<'a, Leadership>;

    /// Ends any term of `job` this store holds with no [`Leadership`] to show for it: a
    /// campaign dropped (cancelled) after the store made it leader but before it
    /// returned. A store whose terms are released with their campaign (each on its own
    /// lease, revoked when dropped; the memory store) has nothing to do (the default). On
    /// an etcd store with a session lease ([`EtcdConfig::session_lease`]) it deletes the
    /// job's leader key if it is on the session: call it after cancelling a campaign, or
    /// the key stays for as long as the session lives and no one else can lead the job.
    /// The campaign's winning transaction, if it was on its way, may land after a first
    /// call: call it again once it can have (the fleet does, a second later).
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`].
    ///
    /// [`EtcdConfig::session_lease`]: crate::EtcdConfig::session_lease
    fn release<'a>(&'a self, job: &'a str) -> StoreFuture<'a, ()> {
        let _ = job;
        Box::pin(async { Ok(()) })
    }

    /// Whether the store has exclusive mode ([`AssignmentStore::write_exclusive`]): it
    /// needs leases (`EtcdStore` has it; [`MemoryStore`] does not).
    fn supports_exclusive(&self) -> bool {
        false
    }

    /// Writes `next` as the job's assignment in exclusive mode (`docs/exclusive.md`, "The
    /// Assigner's steps"), replacing generation `G1` (the one the job's guard grants; 0
    /// when the job has no guard yet, which makes it exclusive) by `G2 = next`:
    ///
    /// 1. settles a recall left pending first, as [`AssignmentStore::settle`];
    /// 2. in one transaction, fenced by the term and conditioned on `previous`'s revision
    ///    and on the guard it read: stores `next` and puts the guard `recalling G1 G2`;
    /// 3. waits until every Slicelet's hold is `bridge G1 G2` or gone (a hold that does
    ///    not decode blocks, and is logged);
    /// 4. fenced by the term and conditioned on the guard still `recalling G1 G2`: puts
    ///    `granted G2`.
    ///
    /// Steps 1 and 3 are each bounded by the store's recall bound (`EtcdConfig::recall_timeout`).
    /// Once step 2 succeeded the assignment *is* stored, so the call returns `Ok`
    /// whatever happens after it: [`Recall::Pending`] when the recall did not complete
    /// (in time, or because the term ended or etcd stopped answering), which the next
    /// [`AssignmentStore::settle`] (this term's or the next leader's) completes. Until
    /// then, keys that move pause; no two tasks hold one.
    ///
    /// # Errors
    ///
    /// Nothing written in every case. Before anything is sent: as
    /// [`AssignmentStore::write`] ([`StoreError::WrongJob`], [`StoreError::NotNewer`],
    /// [`StoreError::TooLarge`]), [`StoreError::NotExclusive`] for a slice of more than
    /// one task (replicas or warming), [`StoreError::Unsupported`] from a store without
    /// leases. Then: [`StoreError::RecallPending`] when a recall left pending does not
    /// complete in time, [`StoreError::InvalidGuard`] when the guard does not decode,
    /// [`StoreError::NotLeader`], [`StoreError::Conflict`] (the assignment or the guard
    /// changed since read) and [`StoreError::Unavailable`] as for
    /// [`AssignmentStore::write`].
    fn write_exclusive<'a>(
        &'a self,
        leadership: &'a Leadership,
        previous: &'a Snapshot,
        next: &'a Assignment,
    ) -> StoreFuture<'a, ExclusiveWrite> {
        let _ = (leadership, previous, next);
        Box::pin(async { Err(StoreError::Unsupported("exclusive mode needs etcd's leases")) })
    }

    /// Completes a recall of `leadership`'s job left pending (by a
    /// [`AssignmentStore::write_exclusive`] that returned [`Recall::Pending`], or by a
    /// leader deposed mid-change): when the guard is `recalling G1 G2`, waits for the
    /// holds and grants `G2` (steps 3 and 4 of `write_exclusive`, bounded the same way).
    /// With no guard, or a granted one, it returns [`Recall::Clear`] after one read. An
    /// Assigner in exclusive mode calls it at the start of every term and before every
    /// run. A store without leases has no guards: [`Recall::Clear`].
    ///
    /// # Errors
    ///
    /// [`StoreError::RecallPending`] when the recall does not complete in time;
    /// [`StoreError::NotLeader`] when the term is over; [`StoreError::Conflict`] when
    /// the guard moved meanwhile; [`StoreError::InvalidGuard`];
    /// [`StoreError::Unavailable`].
    fn settle<'a>(&'a self, leadership: &'a Leadership) -> StoreFuture<'a, Recall> {
        let _ = leadership;
        Box::pin(async { Ok(Recall::Clear) })
    }
}

/// Refuses names no store may hold: a job or candidate name must have 1 to
/// [`MAX_JOB_NAME_LEN`] bytes. Every store checks this on every call; a caller that takes
/// names from a user (the `steady-slicer` binary) checks them up front with this.
///
/// # Errors
///
/// [`StoreError::InvalidName`] with `what` (`"job"` or `"candidate"`) and the length.
pub fn check_name(what: &'static str, name: &str) -> Result<(), StoreError> {
    if valid_job_name(name) {
        Ok(())
    } else {
        Err(StoreError::InvalidName { what, len: name.len() })
    }
}

/// The checks every store makes before a write reaches it.
pub(crate) fn check_write(
    leadership: &Leadership,
    previous: &Snapshot,
    next: &Assignment,
) -> Result<Vec<u8>, StoreError> {
    if previous.job() != leadership.job() {
        return Err(StoreError::WrongJob {
            snapshot: previous.job().to_owned(),
            leadership: leadership.job().to_owned(),
        });
    }
    if next.generation() <= previous.generation() {
        return Err(StoreError::NotNewer { stored: previous.generation(), offered: next.generation() });
    }
    let bytes = next.encode();
    if bytes.len() > MAX_ASSIGNMENT_BYTES {
        return Err(StoreError::TooLarge { bytes: bytes.len() });
    }
    Ok(bytes)
}

/// Decodes a stored value, refusing one above [`MAX_ASSIGNMENT_BYTES`] unread.
#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
pub(crate) fn decode_value(bytes: &[u8]) -> Result<Assignment, ValueError> {
    if bytes.len() > MAX_ASSIGNMENT_BYTES {
        return Err(ValueError::TooLarge { bytes: bytes.len() });
    }
    Assignment::decode(bytes).map_err(ValueError::Decode)
}
