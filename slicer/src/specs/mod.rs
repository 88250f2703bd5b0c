//! Job specs as data: what configures each job of the control plane, kept in a store and
//! managed while it runs (created, changed, removed), the foundation of a control plane
//! that serves many jobs.
//!
//! * [`JobConfig`]: one job's configuration, what `steady-slicer` takes today as per-job
//!   flags (`--job`, `--algorithm`, `--cadence-ms`, `--spec` or `--max-replicas`,
//!   `--consistency`, `--lease-ttl-secs`, and where the tasks come from: `--tasks`,
//!   `--registry` or `--dns`), and the one place its validation lives
//!   ([`JobConfig::validate`], each refusal a [`JobConfigError`] naming the field as the
//!   document names it). Its JSON form is a contract (below).
//! * [`SpecStore`]: where the specs live, with two backends: [`EtcdSpecs`] (feature
//!   `etcd`), under an etcd assignment store's key prefix, for instances on several
//!   machines; [`SpecDirectory`], a directory of `<job>.json` files, for the in-memory
//!   store. Both `put` (validated first: a bad spec is refused by job and field and the
//!   stored one stays), `get`, `list`, `delete`, and `watch`: the current set, then each
//!   change. A stored value that does not parse or validate (written by another tool,
//!   or a file edited by hand) is skipped by a watch with one error item naming the job,
//!   and the job's last good spec stays in force.
//!
//! # The document (version 1, frozen)
//!
//! ```json
//! {
//!   "version": 1,
//!   "job": "users",
//!   "algorithm": "weighted-move",
//!   "cadence_ms": 10000,
//!   "consistency": "eventual",
//!   "lease_ttl_secs": 5,
//!   "handover_ms": 2000,
//!   "tasks": { "registry": { "endpoints": ["https://etcd-0:2379"] } },
//!   "spec": { "replicas": { "min": 2, "max": 2 }, "constraints": { "spread": "zones" } }
//! }
//! ```
//!
//! `version` (1), `job` and `tasks` are required; the rest default as `steady-slicer`'s
//! flags do (`weighted-move`, 10,000 ms, `eventual`, 5 s, no handover, a spec of one
//! replica and no constraint). `tasks` is one of `{"count": N}`,
//! `{"registry": {"endpoints": [URL, ...]}}` or `{"dns": "NAME"}`; `spec` is the
//! assigner's job spec document (`steady_assigner::JobSpec`, `docs/placement.md`).
//! `drained` (optional, written only when not empty) lists the tasks an operator drained,
//! `[3, 5]` ([`JobConfig::drained`]).
//! Unknown fields are refused, anywhere: a typo must not pass unnoticed. A document is at
//! most [`MAX_SPEC_BYTES`]; the stores write every field, pretty-printed.
//!
//! # Bounds
//!
//! A document is at most [`MAX_SPEC_BYTES`] (64 KiB): a larger value is refused unread. A
//! store holds at most [`MAX_JOBS`] (10,000) specs: `put` refuses a new job past it
//! ([`SpecStoreError::TooManyJobs`]; a soft bound on etcd, where two instances' puts may
//! race past it), a watch holds no more in force and refuses a listing of more as a
//! whole ([`SpecStoreError::TooManySpecs`], keeping what is in force). So a watch holds
//! at most 10,000 specs of at most 64 KiB, whatever the store holds.
//!
//! # Example
//!
//! ```no_run
//! use futures_util::StreamExt;
//! use steady_slicer::specs::{JobConfig, SpecChange, SpecDirectory, SpecStore, TaskSource};
//! use std::time::Duration;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! // Specs in /etc/steady/jobs/<job>.json, read again every 5 s (and on reload()).
//! let store = SpecStore::Directory(SpecDirectory::open("/etc/steady/jobs", Duration::from_secs(5))?);
//! let mut users = JobConfig::new("users", TaskSource::Count(8)).max_replicas(2)?;
//! users.cadence = Duration::from_secs(5);
//! store.put(&users).await?; // validated first: a bad spec is refused by field
//! let mut watch = store.watch();
//! while let Some(item) = watch.next().await {
//!     match item {
//!         Ok(SpecChange::Current(jobs)) => println!("{} jobs", jobs.len()),
//!         Ok(SpecChange::Put(job)) => println!("run or reconfigure {}", job.job),
//!         Ok(SpecChange::Removed(job)) => println!("stop {job}"),
//!         // A bad file or value: the job's last good spec stays in force.
//!         Err(refused) => eprintln!("{refused}"),
//!     }
//! }
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::Stream;

mod config;
mod directory;
mod document;
mod error;
#[cfg(feature = "etcd")]
mod etcd;
mod in_force;

pub use config::{
    JobConfig, TaskSource, DEFAULT_ALGORITHM, DEFAULT_CADENCE, DEFAULT_LEASE_TTL, MAX_CADENCE,
    MAX_REGISTRY_ENDPOINTS,
};
pub use directory::SpecDirectory;
pub use error::{DocumentError, JobConfigError, RejectedSpec, SpecStoreError};
#[cfg(feature = "etcd")]
pub use etcd::EtcdSpecs;

/// The largest spec document, in bytes (64 KiB): a larger stored value is refused
/// unread, and [`JobConfig::validate`] refuses a config whose document would be larger.
pub const MAX_SPEC_BYTES: usize = 64 * 1024;

/// The most specs a store holds, and a watch holds in force (10,000).
pub const MAX_JOBS: usize = 10_000;

/// The segment under an etcd store's key prefix where [`EtcdSpecs`] keeps the specs:
/// `<prefix>.specs/<job>` (`/steady/jobs/.specs/users` under the default prefix).
/// Every key under the prefix is some job's (`<prefix><job>/assignment`, `.../leader`,
/// the registry's `.../tasks/<i>`), so [`JobConfig::validate`] refuses the job names
/// whose keys would fall here: `.specs` and those under `.specs/`.
pub const SPECS_SEGMENT: &str = ".specs";

/// The name under a store's key prefix where a fleet of instances keeps its own keys
/// (`steady_slicer::fleet`): no job is named `.fleet` or under `.fleet/`.
pub const FLEET_SEGMENT: &str = ".fleet";

/// The most tasks a job's spec may hold drained ([`JobConfig::drained`]).
pub const MAX_DRAINED: usize = 4096;

/// What a [`SpecWatch`] says: the specs in force at first, then each change.
#[derive(Debug, Clone, PartialEq)]
// Not boxed: a change is rare (an operator's edit), and a `Put` is matched and moved on.
#[allow(clippy::large_enum_variant)]
pub enum SpecChange {
    /// The first item: every valid spec stored, by job name (the watch's refusals of the
    /// others follow it).
    Current(Vec<JobConfig>),
    /// A job's spec created or changed.
    Put(JobConfig),
    /// A job's spec removed: the job is no longer configured.
    Removed(String),
}

/// Every spec in a store when listed: the valid ones by job name, and the refused ones.
#[derive(Debug, Default)]
pub struct SpecListing {
    /// The valid specs, by job name.
    pub specs: Vec<JobConfig>,
    /// The stored values that are not valid specs of their job.
    pub rejected: Vec<RejectedSpec>,
}

/// The stream [`SpecStore::watch`] returns: first [`SpecChange::Current`], then each
/// change, and an error item for each stored value it skips ([`SpecStoreError::Rejected`],
/// [`SpecStoreError::TooManyJobs`]) or listing it cannot take
/// ([`SpecStoreError::TooManySpecs`], [`SpecStoreError::Io`]), the specs in force staying.
/// (A store it cannot reach is retried with backoff and logged, not an item: nothing
/// changes meanwhile, and `Current` waits for the first listing that succeeds.) It never
/// ends on its own; dropping it stops the watch.
pub struct SpecWatch {
    inner: Pin<Box<dyn Stream<Item = Result<SpecChange, SpecStoreError>> + Send>>,
}

impl fmt::Debug for SpecWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpecWatch").finish_non_exhaustive()
    }
}

impl SpecWatch {
    fn new(inner: impl Stream<Item = Result<SpecChange, SpecStoreError>> + Send + 'static) -> Self {
        Self { inner: Box::pin(inner) }
    }
}

impl Stream for SpecWatch {
    type Item = Result<SpecChange, SpecStoreError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let item = self.inner.as_mut().poll_next(cx);
        if let Poll::Ready(Some(Err(error))) = &item {
            tracing::warn!(%error, "spec watch: skipped; the specs in force stay");
        }
        item
    }
}

/// Where job specs live: on etcd beside the assignments, or in a directory of files.
///
/// A concrete enum, not a trait: the two backends are this crate's, a program picks one
/// at start from its flags (the etcd store's instances use etcd, the in-memory store's a
/// directory), and so the operations are plain `async fn`s with no boxed futures, and one
/// watch type serves both. Each backend is also usable on its own.
#[derive(Debug, Clone)]
pub enum SpecStore {
    /// Under an etcd store's key prefix ([`EtcdSpecs`]).
    #[cfg(feature = "etcd")]
    Etcd(EtcdSpecs),
    /// `<job>.json` files in a directory ([`SpecDirectory`]).
    Directory(SpecDirectory),
}

impl SpecStore {
    /// Stores `config` as its job's spec, creating or replacing it, once it validates
    /// ([`JobConfig::check_first_run`], which runs the algorithm once for a fixed task
    /// count, off the runtime's threads).
    ///
    /// # Errors
    ///
    /// [`SpecStoreError::Invalid`] naming the job and field (nothing written, the stored
    /// spec unchanged); [`SpecStoreError::TooManyJobs`] for a new job past [`MAX_JOBS`];
    /// the backend's own ([`SpecStoreError::Unavailable`], [`SpecStoreError::Io`]).
    pub async fn put(&self, config: &JobConfig) -> Result<(), SpecStoreError> {
        match self {
            #[cfg(feature = "etcd")]
            Self::Etcd(store) => store.put(config).await,
            Self::Directory(store) => store.put(config).await,
        }
    }

    /// `job`'s spec (`None`: none stored).
    ///
    /// # Errors
    ///
    /// [`SpecStoreError::Rejected`] for a stored value that is not a valid spec of the
    /// job; [`SpecStoreError::Invalid`] for a name no job can have here; the backend's own.
    pub async fn get(&self, job: &str) -> Result<Option<JobConfig>, SpecStoreError> {
        match self {
            #[cfg(feature = "etcd")]
            Self::Etcd(store) => store.get(job).await,
            Self::Directory(store) => store.get(job).await,
        }
    }

    /// Every stored spec, the refused ones apart.
    ///
    /// # Errors
    ///
    /// [`SpecStoreError::TooManySpecs`] past [`MAX_JOBS`]; the backend's own.
    pub async fn list(&self) -> Result<SpecListing, SpecStoreError> {
        match self {
            #[cfg(feature = "etcd")]
            Self::Etcd(store) => store.list().await,
            Self::Directory(store) => store.list().await,
        }
    }

    /// Removes `job`'s spec; whether there was one.
    ///
    /// # Errors
    ///
    /// [`SpecStoreError::Invalid`] for a name no job can have here; the backend's own.
    pub async fn delete(&self, job: &str) -> Result<bool, SpecStoreError> {
        match self {
            #[cfg(feature = "etcd")]
            Self::Etcd(store) => store.delete(job).await,
            Self::Directory(store) => store.delete(job).await,
        }
    }

    /// Follows the specs: see [`SpecWatch`].
    pub fn watch(&self) -> SpecWatch {
        match self {
            #[cfg(feature = "etcd")]
            Self::Etcd(store) => store.watch(),
            Self::Directory(store) => store.watch(),
        }
    }

    /// Has a directory's watches read it again now, not at their next poll (SIGHUP's
    /// job); nothing on etcd, whose watches are told of each change.
    pub fn reload(&self) {
        match self {
            #[cfg(feature = "etcd")]
            Self::Etcd(_) => {}
            Self::Directory(store) => store.reload(),
        }
    }
}

/// Validates `config` for a `put`, off the runtime's threads (one run of the algorithm
/// for a fixed task count), and gives its document.
async fn checked_document(config: &JobConfig) -> Result<String, SpecStoreError> {
    let owned = config.clone();
    let checked = tokio::task::spawn_blocking(move || owned.check_first_run().map(|_| owned.to_json())).await;
    let invalid = |error| SpecStoreError::Invalid { job: config.job.clone(), error };
    match checked {
        Ok(result) => result.map_err(invalid),
        // The check panicked (no such case is known) or the runtime is shutting down.
        Err(error) => {
            Err(invalid(JobConfigError::new("document", format!("a spec that can be checked ({error})"))))
        }
    }
}
