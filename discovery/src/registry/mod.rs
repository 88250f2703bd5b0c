//! The etcd registry (feature `etcd`): tasks registered under a lease, job views that
//! follow a job's prefix, and indices taken as the lowest free one (see `docs/discovery.md`).
//!
//! ```no_run
//! # async fn run() -> Result<(), steady_discovery::registry::RegistryError> {
//! use steady_discovery::registry::{self, Registry, RegistryConfig};
//!
//! let registry = Registry::connect(RegistryConfig::new(["http://127.0.0.1:2379"])).await?;
//! // A frontend: its index in its own job, held under a lease while `identity` lives.
//! let identity = registry.claim_index("web", "web-host-a").await?;
//! // Its backends: a view that follows the `api` job's registrations.
//! let backends = registry::watch_job(&registry, "api").await?;
//! # let _ = (identity, backends);
//! // A backend of `api`: registered at index 3; drains, then leaves.
//! let registration = registry.register("api", 3, "10.0.0.7:50051").await?;
//! registration.drain().await?;
//! registration.release().await?;
//! # Ok(()) }
//! ```
//!
//! # Keys and values (a contract)
//!
//! With the prefix `P` ([`DEFAULT_KEY_PREFIX`], `/steady/jobs/`), task `i` of job `J` is
//! the key `P J /tasks/ i` (`/steady/jobs/api/tasks/3`), `i` in canonical decimal
//! (`3`, never `03`) below [`MAX_TASKS`]. Its value is a [`TaskRecord`]:
//! `<state> <address>`, e.g. `serving 10.0.0.7:50051`, or for a task in a zone
//! `<state> <address> zone=<zone>/<zone-index>`, e.g.
//! `serving 10.0.0.7:50051 zone=us-east1-b/3` (records without the zone field, all
//! those written before zones, read as tasks in no zone). Every key is attached to its
//! holder's lease, so it disappears when the holder revokes the lease or stops renewing
//! it (crashes) for a TTL.
//!
//! A task in a zone also holds its **zone key**, `P J /zones/ Z / z`
//! (`/steady/jobs/api/zones/us-east1-b/3`) for zone `Z` and zone index `z` (canonical
//! decimal below [`MAX_TASKS`]); its value is the task's job index in canonical decimal
//! (`7`). It is written with the task key in one transaction and under the same lease,
//! so the two come and go together; it exists so that a claim can take a zone index
//! race-free (etcd can compare a key's existence, not "no record names this zone
//! index"). Zone keys are under `P J /zones/`, outside the tasks' prefix: watchers,
//! [`Registry::job_size`] and budgeted drains read `P J /tasks/` only and never see
//! them. The record's zone field, not the zone key, is what watchers read.
//!
//! Frontends and backends use the same layout, each in its own job: a frontend job's
//! "address" is its member name (nobody connects to it). So one frontend job `web` and
//! its backend job `api` are `/steady/jobs/web/tasks/*` and `/steady/jobs/api/tasks/*`.
//! Other keys under `P J /` (steady-slicer's `assignment`, `leader`) do not collide.
//!
//! # Operations and their costs
//!
//! * [`Registry::register`]: grant a lease, put the key (one round trip each), then
//!   renew every third of the TTL. An explicit index is authoritative: it overwrites a
//!   previous holder's key (a replacement with the same StatefulSet ordinal takes over
//!   without waiting for the old lease to lapse; the old holder's later drain fails with
//!   [`RegistryError::Lost`], and its revoke no longer touches the key).
//! * [`Registry::register_in_zone`]: as `register`, with the zone key written in the
//!   same transaction (both authoritative).
//! * [`Registry::claim`] / [`Registry::claim_index`]: the lowest free index, taken by
//!   `If(version(key) == 0) Then(put with lease) Else(read the job's keys)`; on a
//!   conflict the next attempt uses the keys read in the same transaction. Each failed
//!   attempt means another holder created a key since our read, so `C` simultaneous
//!   claimants need at most `C` attempts each; a claim gives up after
//!   [`RegistryConfig::max_claim_attempts`].
//! * [`Registration::reclaim`] / [`Registry::claim_preferring`]: a member's own index
//!   back, in one transaction, `If(value(key) == its record) Then(put) Else(
//!   If(version(key) == 0) Then(put) Else(read the job's keys))`: taken when it is free
//!   or its key records the member (under any lease: an old one of its own that a
//!   restarted etcd restored, a crashed predecessor's); else a claim of the lowest free
//!   index goes on from the keys read. After a mass loss every task takes its own
//!   index back at one transaction each.
//! * [`Registry::claim_in_zone`] / [`Registry::claim_index_in_zone`]: the lowest free
//!   job index and the lowest free index within the zone, taken together by
//!   `If(version(task key) == 0 and version(zone key) == 0) Then(put both) Else(read the
//!   job's task keys and the zone's keys)`, with the same bound on attempts. The
//!   identity's index is the zone index. [`Registry::claim_preferring_in_zone`] and
//!   [`Registration::reclaim`] of a zoned registration take both indices back in one
//!   transaction (four nested alternatives: each key ours or free), else claim the
//!   lowest free ones in the zone.
//! * [`Registration::drain_within`] / [`Registration::drain_within_budget`]: one read
//!   transaction (the job's task keys and `P J /maintenance` at one revision), then,
//!   when the [`DrainBudget`] has room, `If(mod_revision(maintenance) == read and
//!   lease(task key) == ours) Then(put maintenance, put the draining record)`; a drain
//!   that has to wait reads again every 50 ms. Admissions anywhere in the job (any zone)
//!   conflict on the one maintenance key, so they are serialized.
//!
//! # Through an outage of etcd
//!
//! Leases are kept as identities, not locks (`steady_etcd::LeaseMode::Tolerant`): while
//! etcd does not answer, registrations still count as held and their keepers retry
//! within half a second of each failure; a restarted etcd restores the leases with a
//! fresh TTL and the next renewal is answered, so no index moves. A registration is
//! lost only when etcd answers that its lease is gone ([`Registration::lost`]); its
//! holder then re-claims ([`Registration::reclaim`]).
//! * [`watch_job`]: one read of the prefix, then one etcd watch from the next revision.
//! * [`Registry::job_size`]: one keys-only read of the prefix.
//!
//! Every request is bounded by [`RegistryConfig::request_timeout`].

use std::fmt;
use std::future::Future;
use std::time::Duration;

use etcd_client::{Client, GetOptions};
use steady_core::Zone;
pub use steady_etcd::{ConnectError, EtcdAccess, EtcdTls};

mod claim;
mod maintenance;
mod record;
mod registration;
mod watch;

pub use maintenance::{DrainBudget, DrainScope};
pub use record::{RecordError, TaskRecord, MAX_ADDRESS_BYTES, MAX_VALUE_BYTES};
pub use registration::Registration;
pub use watch::{watch_job, watch_job_counted, WatchCounters, WatchCounts};

/// The key prefix unless [`RegistryConfig::key_prefix`] says otherwise (shared with
/// steady-slicer's etcd store: a job's keys sit together).
pub const DEFAULT_KEY_PREFIX: &str = "/steady/jobs/";

/// The most tasks a job may have: indices are below it, and a job view considers at
/// most this many keys. Registering or claiming at or past it is an error; keys past it
/// are ignored by watchers (and counted as rejected).
pub const MAX_TASKS: usize = 65_536;

/// The longest job name, in bytes.
pub const MAX_JOB_BYTES: usize = 256;

/// The longest [`RegistryConfig::key_prefix`], in bytes.
const MAX_PREFIX_BYTES: usize = 256;

/// How a [`Registry`] reaches etcd, names its keys and holds its leases.
#[derive(Debug, Clone)]
pub struct RegistryConfig {
    endpoints: Vec<String>,
    key_prefix: String,
    lease_ttl: Duration,
    request_timeout: Duration,
    max_claim_attempts: usize,
    access: EtcdAccess,
}

impl RegistryConfig {
    /// The cluster at `endpoints` (`http://host:port`, or `https://` with
    /// [`RegistryConfig::access`] giving TLS), with the defaults: keys under
    /// [`DEFAULT_KEY_PREFIX`], a 10 s lease, 5 s per request, 1,024 claim attempts,
    /// plaintext and no user.
    pub fn new<E: Into<String>>(endpoints: impl IntoIterator<Item = E>) -> Self {
        Self {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            key_prefix: DEFAULT_KEY_PREFIX.to_owned(),
            lease_ttl: Duration::from_secs(10),
            request_timeout: Duration::from_secs(5),
            max_claim_attempts: 1024,
            access: EtcdAccess::new(),
        }
    }

    /// How to authenticate to etcd: TLS with the cluster's CA (and a client certificate
    /// when etcd runs with `--client-cert-auth`), and a user and password when it runs
    /// with authentication. The user needs read and write access to the key prefix.
    /// Settings that cannot work fail [`Registry::connect`] with
    /// [`RegistryError::Connect`].
    pub fn access(mut self, access: EtcdAccess) -> Self {
        self.access = access;
        self
    }

    /// Puts the keys under `prefix` (1 to 256 bytes) instead of [`DEFAULT_KEY_PREFIX`].
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// The lease of each registration and claim: whole seconds, 1 s to 1 hour (default
    /// 10 s). A crashed task's key disappears (and its index is free) about this long
    /// after its last renewal. etcd raises a TTL below its minimum (1.5 election
    /// timeouts: 2 s with its default settings).
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }

    /// How long one request to etcd may take, 1 ms to 1 hour (default 5 s): past it the
    /// operation fails with [`RegistryError::Unavailable`].
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// How many create-if-absent transactions one claim may try, 1 to 100,000 (default
    /// 1,024): past it the claim fails with [`RegistryError::Contended`].
    pub fn max_claim_attempts(mut self, attempts: usize) -> Self {
        self.max_claim_attempts = attempts;
        self
    }

    /// The configured lease TTL.
    pub fn ttl(&self) -> Duration {
        self.lease_ttl
    }

    fn validate(&self) -> Result<(), RegistryError> {
        let invalid = |field, reason| Err(RegistryError::InvalidConfig { field, reason });
        if self.endpoints.is_empty() {
            return invalid("endpoints", "at least one endpoint is needed");
        }
        if !(1..=MAX_PREFIX_BYTES).contains(&self.key_prefix.len()) {
            return invalid("key_prefix", "1 to 256 bytes");
        }
        let ttl = self.lease_ttl;
        if ttl.subsec_nanos() != 0 || !(1..=3600).contains(&ttl.as_secs()) {
            return invalid("lease_ttl", "whole seconds, 1 s to 1 hour");
        }
        let timeout = self.request_timeout;
        if timeout < Duration::from_millis(1) || timeout > Duration::from_secs(3600) {
            return invalid("request_timeout", "1 ms to 1 hour");
        }
        if !(1..=100_000).contains(&self.max_claim_attempts) {
            return invalid("max_claim_attempts", "1 to 100,000");
        }
        Ok(())
    }
}

/// Why a registry operation failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegistryError {
    /// A [`RegistryConfig`] value is out of range.
    InvalidConfig {
        /// The setting.
        field: &'static str,
        /// What it must be.
        reason: &'static str,
    },
    /// A job name (1 to 256 bytes, no `/`), address (see [`TaskRecord`]) or index
    /// (below [`MAX_TASKS`]) is not acceptable.
    InvalidArgument {
        /// Which argument.
        what: &'static str,
        /// What it must be.
        reason: &'static str,
    },
    /// etcd could not be reached or refused the request, or did not answer within the
    /// request timeout. Nothing was promised: the operation may be retried.
    Unavailable(String),
    /// etcd was reached at connect but the [`RegistryConfig::access`] settings cannot
    /// work (TLS, client certificate, user and password, or the user's access to the
    /// key prefix): fix the settings; retrying will not help.
    Connect(ConnectError),
    /// Every index below [`MAX_TASKS`] of the job (or, for a claim in a zone, of the
    /// zone) is taken.
    JobFull {
        /// The job.
        job: String,
    },
    /// A claim lost the race for a free index this many times in a row (see
    /// [`RegistryConfig::max_claim_attempts`]).
    Contended {
        /// The job.
        job: String,
        /// The transactions tried.
        attempts: usize,
    },
    /// The registration is no longer ours: its lease lapsed or was revoked, or another
    /// task registered at the same index.
    Lost,
    /// A budgeted drain ([`Registration::drain_within`], [`Registration::drain_within_budget`])
    /// did not get its turn in the time it was given: the budget `scope` names (the
    /// job's, or the asking task's zone's) had no room, `draining` being the tasks that
    /// counted toward it. The task is left serving.
    DrainRefused {
        /// The job.
        job: String,
        /// Which budget refused: the job's, or the zone's (with the zone). When both
        /// had no room, the job's.
        scope: DrainScope,
        /// The other tasks draining when the wait ran out that count toward that budget
        /// (job indices: all of the job's, or those in the zone), ascending.
        draining: Vec<usize>,
        /// The most that budget lets drain at once.
        max: usize,
    },
}

impl fmt::Display for RegistryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidConfig { field, reason } => write!(f, "registry config: {field}: {reason}"),
            Self::InvalidArgument { what, reason } => write!(f, "registry: {what}: {reason}"),
            Self::Unavailable(cause) => write!(f, "registry: etcd unavailable: {cause}"),
            Self::Connect(cause) => write!(f, "registry: {cause}"),
            Self::JobFull { job } => write!(f, "registry: job {job:?} has no free index below {MAX_TASKS}"),
            Self::Contended { job, attempts } => {
                write!(f, "registry: job {job:?}: no free index won in {attempts} attempts")
            }
            Self::Lost => f.write_str("registry: the registration's lease or key is no longer ours"),
            Self::DrainRefused { job, scope: DrainScope::Job, draining, max } => write!(
                f,
                "registry: job {job:?}: tasks {draining:?} are draining and at most {max} may drain at once: \
                 not drained, still serving"
            ),
            Self::DrainRefused { job, scope: DrainScope::Zone(zone), draining, max } => write!(
                f,
                "registry: job {job:?}: tasks {draining:?} of zone {zone} are draining and at most {max} \
                 may drain at once in a zone: not drained, still serving"
            ),
        }
    }
}

impl std::error::Error for RegistryError {}

/// A connection to the etcd registry; cheap to clone (clones share the connection).
///
/// See the module documentation for the keys, values and operations.
#[derive(Clone)]
pub struct Registry {
    client: Client,
    config: RegistryConfig,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry").field("config", &self.config).finish_non_exhaustive()
    }
}

impl Registry {
    /// Connects to the cluster `config` names.
    ///
    /// # Errors
    ///
    /// [`RegistryError::InvalidConfig`] for a configuration value out of range;
    /// [`RegistryError::Unavailable`] when no endpoint answers within the request
    /// timeout (worth retrying); [`RegistryError::Connect`] when etcd is reached but the
    /// [`RegistryConfig::access`] settings cannot work (not worth retrying). One read of
    /// the key prefix is made to find out.
    pub async fn connect(config: RegistryConfig) -> Result<Self, RegistryError> {
        config.validate()?;
        let (endpoints, timeout) = (&config.endpoints, config.request_timeout);
        let client = steady_etcd::connect_with(endpoints, timeout, &config.access, &config.key_prefix)
            .await
            .map_err(|error| match error {
                ConnectError::Unreachable { .. } => RegistryError::Unavailable(error.to_string()),
                error => RegistryError::Connect(error),
            })?;
        Ok(Self { client, config })
    }

    /// The configuration it runs with.
    pub fn config(&self) -> &RegistryConfig {
        &self.config
    }

    /// The prefix of `job`'s task keys, `P J /tasks/`.
    pub fn tasks_prefix(&self, job: &str) -> String {
        format!("{}{job}/tasks/", self.config.key_prefix)
    }

    /// The key every admitted budgeted drain of `job` rewrites, whatever its zone
    /// ([`Registration::drain_within`]), `P J /maintenance`: outside the tasks' prefix,
    /// so watchers of the job never see it.
    pub fn maintenance_key(&self, job: &str) -> String {
        format!("{}{job}/maintenance", self.config.key_prefix)
    }

    /// The prefix of `job`'s zone keys in `zone`, `P J /zones/ zone /`.
    pub fn zone_prefix(&self, job: &str, zone: &Zone) -> String {
        format!("{}{job}/zones/{zone}/", self.config.key_prefix)
    }

    /// The zone key of index `zone_index` within `zone` in `job`,
    /// `P J /zones/ zone / zone_index` (its value: the holder's job index).
    pub fn zone_key(&self, job: &str, zone: &Zone, zone_index: usize) -> String {
        format!("{}{zone_index}", self.zone_prefix(job, zone))
    }

    /// The key of task `index` of `job`, `P J /tasks/ index`.
    pub fn task_key(&self, job: &str, index: usize) -> String {
        format!("{}{index}", self.tasks_prefix(job))
    }

    /// `M` or `N` as the registry sees it now: the highest index held in `job`, plus
    /// one (0 for an empty job). Holes below it (indices whose holder crashed and has
    /// no replacement yet) count: the job's size does not shrink when a middle task
    /// goes, so nobody else's subset moves.
    ///
    /// # Errors
    ///
    /// [`RegistryError::InvalidArgument`] for a bad job name;
    /// [`RegistryError::Unavailable`] when etcd does not answer.
    pub async fn job_size(&self, job: &str) -> Result<usize, RegistryError> {
        check_job(job)?;
        let held = self.held_indices(job).await?;
        Ok(held.last().map_or(0, |i| i + 1))
    }

    /// The indices held in `job`, ascending (one keys-only read of at most
    /// [`MAX_TASKS`] keys; other keys are ignored).
    async fn held_indices(&self, job: &str) -> Result<Vec<usize>, RegistryError> {
        let prefix = self.tasks_prefix(job);
        let options = keys_only(MAX_TASKS);
        let mut kv = self.client.kv_client();
        let response = bounded(self.timeout(), "get", kv.get(prefix.as_str(), Some(options))).await?;
        Ok(indices_in(prefix.len(), response.kvs().iter().map(|kv| kv.key())))
    }

    fn timeout(&self) -> Duration {
        self.config.request_timeout
    }
}

/// A prefix read of the keys only, at most `limit` of them (a few more than
/// [`MAX_TASKS`] would only be keys that are not tasks).
fn keys_only(limit: usize) -> GetOptions {
    GetOptions::new().with_prefix().with_keys_only().with_limit(limit as i64)
}

/// The task indices among `keys` (each starting with a prefix `prefix_len` bytes
/// long), ascending, without duplicates.
fn indices_in<'a>(prefix_len: usize, keys: impl Iterator<Item = &'a [u8]>) -> Vec<usize> {
    let mut indices: Vec<usize> =
        keys.filter_map(|key| record::index_of(key.get(prefix_len..)?, MAX_TASKS)).collect();
    indices.sort_unstable();
    indices.dedup();
    indices
}

/// Checks a job name: 1 to [`MAX_JOB_BYTES`] bytes, no `/`, no whitespace or control
/// characters.
fn check_job(job: &str) -> Result<(), RegistryError> {
    let ok = (1..=MAX_JOB_BYTES).contains(&job.len())
        && !job.chars().any(|c| c == '/' || c.is_whitespace() || c.is_control());
    if ok {
        Ok(())
    } else {
        Err(RegistryError::InvalidArgument {
            what: "job",
            reason: "1 to 256 bytes, no '/', whitespace or control characters",
        })
    }
}

/// Runs one etcd request within `timeout`, as a [`RegistryError`].
async fn bounded<T>(
    timeout: Duration,
    what: &'static str,
    request: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, RegistryError> {
    steady_etcd::bounded(timeout, what, request).await.map_err(unavailable)
}

/// An etcd call's failure as the registry reports it.
fn unavailable(error: steady_etcd::CallError) -> RegistryError {
    RegistryError::Unavailable(error.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configurations_out_of_range_are_refused() {
        let ok = RegistryConfig::new(["http://127.0.0.1:2379"]);
        assert_eq!(ok.validate(), Ok(()));
        let field = |c: RegistryConfig| match c.validate() {
            Err(RegistryError::InvalidConfig { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(field(RegistryConfig::new(Vec::<String>::new())), "endpoints");
        assert_eq!(field(ok.clone().key_prefix("")), "key_prefix");
        assert_eq!(field(ok.clone().lease_ttl(Duration::from_millis(1500))), "lease_ttl");
        assert_eq!(field(ok.clone().lease_ttl(Duration::ZERO)), "lease_ttl");
        assert_eq!(field(ok.clone().request_timeout(Duration::ZERO)), "request_timeout");
        assert_eq!(field(ok.max_claim_attempts(0)), "max_claim_attempts");
    }

    #[test]
    fn job_names_and_task_keys() {
        for bad in ["", "a/b", "a b", "a\n"] {
            assert!(check_job(bad).is_err(), "{bad:?}");
        }
        assert!(check_job(&"j".repeat(MAX_JOB_BYTES)).is_ok());
        assert!(check_job(&"j".repeat(MAX_JOB_BYTES + 1)).is_err());
        let prefix = "/steady/jobs/api/tasks/";
        let keys = ["0", "10", "2", "02", "x", "10", "65536", "65535"].map(|s| format!("{prefix}{s}"));
        let indices = indices_in(prefix.len(), keys.iter().map(|k| k.as_bytes()));
        assert_eq!(indices, vec![0, 2, 10, 65_535]);
    }
}
