//! [`EtcdStore`]: assignments and leader election on an etcd cluster.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, KeyValue, Txn, TxnOp, TxnOpResponse, TxnResponse};
use std::sync::Arc;

use steady_etcd::{ConnectError, EtcdAccess, HeldLease, LeaseMode};
use steady_slice::guard::{self, Consistency, Guard};
use steady_slice::Assignment;

use super::{
    check_name, check_write, AssignmentStore, AssignmentWatch, ExclusiveWrite, Leadership, Recall, Revision,
    Snapshot, StoreError, StoreFuture,
};

mod election;
mod exclusive;
mod watch;

pub(crate) use election::EtcdTerm;

/// The key prefix of an [`EtcdStore`] unless [`EtcdConfig::key_prefix`] says otherwise.
pub const DEFAULT_KEY_PREFIX: &str = "/steady/jobs/";

/// The longest [`EtcdConfig::key_prefix`], in bytes.
const MAX_PREFIX_LEN: usize = 256;

/// How an [`EtcdStore`] reaches etcd and names its keys.
#[derive(Debug, Clone)]
pub struct EtcdConfig {
    endpoints: Vec<String>,
    key_prefix: String,
    lease_ttl: Duration,
    request_timeout: Duration,
    recall_timeout: Duration,
    access: EtcdAccess,
    session_lease: bool,
}

impl EtcdConfig {
    /// The cluster at `endpoints` (`http://host:port`, or `https://` with
    /// [`EtcdConfig::access`] giving TLS), with the defaults: keys under
    /// [`DEFAULT_KEY_PREFIX`], a 5 s lease for leaderships, 5 s per request, 10 s for a
    /// recall, plaintext and no user.
    pub fn new<E: Into<String>>(endpoints: impl IntoIterator<Item = E>) -> Self {
        Self {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            key_prefix: DEFAULT_KEY_PREFIX.to_owned(),
            lease_ttl: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            recall_timeout: Duration::from_secs(10),
            access: EtcdAccess::new(),
            session_lease: false,
        }
    }

    /// How to authenticate to etcd: TLS with the cluster's CA (and a client certificate
    /// when etcd runs with `--client-cert-auth`), and a user and password when it runs
    /// with authentication. The user needs read and write access to the key prefix.
    /// Settings that cannot work fail [`EtcdStore::connect`] with [`StoreError::Connect`].
    pub fn access(mut self, access: EtcdAccess) -> Self {
        self.access = access;
        self
    }

    /// Puts the store's keys under `prefix` (1 to 256 bytes) instead of
    /// [`DEFAULT_KEY_PREFIX`].
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// A leadership's lease: whole seconds, 1 s to 1 hour (default 5 s). A standby takes
    /// over within about this long after a leader stops renewing. etcd raises a TTL below
    /// its minimum (1.5 election timeouts: 2 s with its default settings).
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }

    /// How long one request to etcd may take, 1 ms to 1 hour (default 5 s): past it the
    /// operation fails with [`StoreError::Unavailable`].
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// How long an exclusive job's Assigner waits for a recall, 1 ms to 1 hour (default
    /// 10 s): for the job's Slicelets to give up the assignment being replaced
    /// ([`AssignmentStore::write_exclusive`], [`AssignmentStore::settle`]). Live Slicelets
    /// take a round trip; a dead one's hold goes when its lease expires, so a bound above
    /// the Slicelets' lease TTL lets one call see a dead Slicelet out. Past it the recall
    /// is left pending, for the next `settle`.
    pub fn recall_timeout(mut self, timeout: Duration) -> Self {
        self.recall_timeout = timeout;
        self
    }

    /// One lease for every campaign of the store (and its clones), instead of one per
    /// campaign: what a process that leads many jobs wants (a fleet instance leading a
    /// thousand jobs renews one lease, not a thousand). The session is kept strictly as
    /// a term's own lease is; when it lapses, every term on it ends at once and the next
    /// campaigns take a new one. A term resigns by deleting its leader key (if still its
    /// own), not by revoking the lease. Default: off.
    pub fn session_lease(mut self, shared: bool) -> Self {
        self.session_lease = shared;
        self
    }

    fn validate(&self) -> Result<(), StoreError> {
        let invalid = |field, reason| Err(StoreError::InvalidConfig { field, reason });
        if self.endpoints.is_empty() {
            return invalid("endpoints", "at least one endpoint is needed");
        }
        if !(1..=MAX_PREFIX_LEN).contains(&self.key_prefix.len()) {
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
        let recall = self.recall_timeout;
        if recall < Duration::from_millis(1) || recall > Duration::from_secs(3600) {
            return invalid("recall_timeout", "1 ms to 1 hour");
        }
        Ok(())
    }
}

/// The [`AssignmentStore`] on an etcd cluster (v3 API, etcd 3.4 or later), for Assigners
/// on several machines: one elected writer per job, standbys that take over when its
/// lease lapses, and watchers that follow the job's key directly.
///
/// # Keys and values (a contract)
///
/// For a job `J` and the prefix `P` ([`DEFAULT_KEY_PREFIX`], `/steady/jobs/`):
///
/// * `P J /assignment`: the job's current assignment in steady-slice's frozen binary
///   format (`Assignment::encode`, version 1, magic `STAS`), at most
///   [`super::MAX_ASSIGNMENT_BYTES`]. Its `mod_revision` is the [`Revision`] a write is
///   conditioned on. Any etcd client may read and watch it; writers other than this store
///   must keep generations increasing, and a value that does not decode is rejected by
///   readers (the last good assignment stays).
/// * `P J /leader`: the current leader's candidate name (UTF-8), attached to its lease
///   (so it disappears when the lease lapses or is revoked). Its `create_revision`
///   identifies the term.
/// * `P J /exclusive/guard` (exclusive mode, `docs/exclusive.md`): the job's guard,
///   steady-slice's frozen ASCII record (`v1 granted G`, `v1 recalling G1 G2`;
///   `steady_slice::guard::Guard`), on no lease, written only by this store. **The job is
///   exclusive exactly when this key exists**: every party reads the mode from it.
/// * `P J /exclusive/holds/T/L` (exclusive mode): the hold of Slicelet task `T` on its
///   etcd lease `L` (decimal), `v1 full G` or `v1 bridge G1 G2`
///   (`steady_slice::guard::Hold`), attached to `L`; written only by that Slicelet,
///   read and watched by this store.
/// * `P .specs/J` (beside the store, not by it): job `J`'s spec, the JSON document of
///   `steady_slicer::specs::JobConfig`, kept by `steady_slicer::specs::EtcdSpecs`. So
///   that no job's keys fall among them, no job is named `.specs` or under `.specs/`.
///
/// # Operations
///
/// * A write is one transaction: `If(mod_revision(assignment) == read revision AND
///   create_revision(leader) == term AND lease(leader) == term's lease AND
///   create_revision(guard) == 0) Then(put)`. When it fails, the leader key and the
///   guard, read in the same transaction, tell [`StoreError::NotLeader`] (the term is
///   over) from [`StoreError::ConsistencyMismatch`] (the job is exclusive) from
///   [`StoreError::Conflict`].
/// * An exclusive write (`write_exclusive`) first settles a pending recall, then is one
///   transaction `If(the same fence AND mod_revision(assignment) == read revision AND
///   guard == granted G1 (or absent, G1 = 0: the job becomes exclusive))
///   Then(put assignment, put guard recalling G1 G2)`; then it reads the holds prefix
///   and watches it from the revision after the read until every hold is `bridge G1 G2`
///   or gone (bounded by [`EtcdConfig::recall_timeout`]); then
///   `If(the fence AND guard == recalling G1 G2) Then(put guard granted G2)`. `settle`
///   is the wait and the grant for a guard found `recalling`.
/// * A campaign grants a lease of [`EtcdConfig::lease_ttl`], keeps it alive (every third
///   of the TTL, a failed renewal retried within half a second), and creates the leader
///   key if absent (`If(create_revision(leader) == 0)`), else waits for its deletion and
///   tries again. A key found on the campaign's own lease is its term, fenced by the
///   key's `create_revision` (an earlier try created it and its answer was lost). The lease is kept strictly ([`steady_etcd::LeaseMode::Strict`]): the
///   leader counts its term over when no renewal has been answered for a TTL, even if
///   etcd was merely down and restores the lease when it comes back. With
///   [`EtcdConfig::session_lease`] every campaign of the store holds its key on one
///   session lease (granted anew once it lapses), so a key found on it is this process's
///   (a term of the same job not yet resigned, which the new one continues).
/// * Resigning revokes the term's lease, deleting the key; on a session lease it deletes
///   the key alone, `If(create_revision(leader) == fence)`.
/// * A watch reads the key, then follows it with an etcd watch from the next revision,
///   so nothing between the two is missed; after an error it re-establishes the watch
///   from the revision after the last it saw, with backoff (50 ms doubling to 2 s). If that
///   revision was compacted away it reads the key again (the newest value is what counts).
///
/// Each request is bounded by [`EtcdConfig::request_timeout`]; HTTP/2 keep-alives detect a
/// dead connection under a watch.
#[derive(Clone)]
pub struct EtcdStore {
    client: Client,
    config: EtcdConfig,
    /// The session lease of [`EtcdConfig::session_lease`], shared by the store's clones.
    session: Arc<tokio::sync::Mutex<Option<Arc<HeldLease>>>>,
}

impl fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdStore").field("config", &self.config).finish_non_exhaustive()
    }
}

impl EtcdStore {
    /// Connects to the cluster `config` names.
    ///
    /// # Errors
    ///
    /// [`StoreError::InvalidConfig`] for a configuration value out of range;
    /// [`StoreError::Unavailable`] when no endpoint can be reached within the request
    /// timeout (worth retrying); [`StoreError::Connect`] when etcd is reached but the
    /// [`EtcdConfig::access`] settings cannot work (a wrong CA, a refused client
    /// certificate or password, a user without access to the prefix: not worth
    /// retrying). One read of the key prefix is made to find out.
    pub async fn connect(config: EtcdConfig) -> Result<Self, StoreError> {
        config.validate()?;
        let (endpoints, timeout) = (&config.endpoints, config.request_timeout);
        let client = steady_etcd::connect_with(endpoints, timeout, &config.access, &config.key_prefix)
            .await
            .map_err(|error| match error {
                ConnectError::Unreachable { .. } => StoreError::unavailable(error),
                error => StoreError::Connect(error),
            })?;
        Ok(Self { client, config, session: Arc::default() })
    }

    /// The lease a campaign holds its leader key on: a new one, or with
    /// [`EtcdConfig::session_lease`] the session's (granted anew once it lapsed).
    pub(crate) async fn lease_for_campaign(&self) -> Result<Arc<HeldLease>, StoreError> {
        let grant = || {
            HeldLease::grant(
                &self.client,
                self.config.lease_ttl,
                self.timeout(),
                "leadership",
                LeaseMode::Strict,
            )
        };
        if !self.config.session_lease {
            return Ok(Arc::new(grant().await.map_err(StoreError::unavailable)?));
        }
        let mut session = self.session.lock().await;
        if let Some(lease) = session.as_ref().filter(|lease| lease.is_alive()) {
            return Ok(lease.clone());
        }
        let lease = Arc::new(grant().await.map_err(StoreError::unavailable)?);
        *session = Some(lease.clone());
        Ok(lease)
    }

    /// The configuration it runs with.
    pub fn config(&self) -> &EtcdConfig {
        &self.config
    }

    /// The key of `job`'s assignment (see "Keys and values").
    pub fn assignment_key(&self, job: &str) -> String {
        format!("{}{job}/assignment", self.config.key_prefix)
    }

    /// The key of `job`'s leader (see "Keys and values").
    pub fn leader_key(&self, job: &str) -> String {
        format!("{}{job}/leader", self.config.key_prefix)
    }

    /// The key of `job`'s guard in exclusive mode (see "Keys and values").
    pub fn guard_key(&self, job: &str) -> String {
        guard::guard_key(&self.config.key_prefix, job)
    }

    /// `job`'s guard in exclusive mode (`None`: the job has none, it is eventual), for a
    /// status page or a test; the store itself reads it in every exclusive write.
    ///
    /// # Errors
    ///
    /// [`StoreError::InvalidName`]; [`StoreError::InvalidGuard`] for a value that is not
    /// a guard; [`StoreError::Unavailable`].
    pub async fn guard(&self, job: &str) -> Result<Option<Guard>, StoreError> {
        check_name("job", job)?;
        exclusive::read_guard(self, job).await
    }

    /// The prefix of `job`'s Slicelets' holds in exclusive mode (see "Keys and values").
    pub fn holds_prefix(&self, job: &str) -> String {
        guard::holds_prefix(&self.config.key_prefix, job)
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.config.request_timeout
    }

    /// The TTL of its leases (a fleet membership's too).
    pub(crate) fn lease_ttl(&self) -> Duration {
        self.config.lease_ttl
    }

    /// Its etcd client, for the job specs and the fleet's keys kept under the same prefix
    /// (`crate::specs`, `crate::fleet`).
    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// Its key prefix.
    pub(crate) fn prefix(&self) -> &str {
        &self.config.key_prefix
    }

    /// `leadership`'s term, if it is a term of this store's job (else the writer is not
    /// the leader here).
    fn term_of<'l>(&self, leadership: &'l Leadership) -> Result<&'l EtcdTerm, StoreError> {
        let term = leadership.term::<EtcdTerm>().ok_or(StoreError::NotLeader)?;
        if term.leader_key() != self.leader_key(leadership.job()).as_bytes() {
            return Err(StoreError::NotLeader);
        }
        Ok(term)
    }
}

/// The conditions that fence a write by `term`: its leader key is still the one it
/// created, on its lease.
fn fence(term: &EtcdTerm) -> [Compare; 2] {
    let key = term.leader_key().to_vec();
    [
        Compare::create_revision(key.clone(), CompareOp::Equal, term.fence()),
        Compare::lease(key, CompareOp::Equal, term.lease()),
    ]
}

/// The key-value of the `index`th operation of a failed transaction's `or_else`, a get
/// (`None`: the key is absent).
fn got(response: &TxnResponse, index: usize) -> Option<KeyValue> {
    match response.op_responses().into_iter().nth(index) {
        Some(TxnOpResponse::Get(get)) => get.kvs().first().cloned(),
        _ => None,
    }
}

/// Whether a leader key read (`got`) is still `term`'s.
fn still_leads(leader: Option<&KeyValue>, term: &EtcdTerm) -> bool {
    leader.is_some_and(|kv| kv.create_revision() == term.fence() && kv.lease() == term.lease())
}

/// Runs one etcd request within `timeout`, as a [`StoreError`].
async fn bounded<T>(
    timeout: Duration,
    what: &'static str,
    request: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, StoreError> {
    steady_etcd::bounded(timeout, what, request).await.map_err(StoreError::unavailable)
}

impl AssignmentStore for EtcdStore {
    fn read<'a>(&'a self, job: &'a str) -> StoreFuture<'a, Snapshot> {
        Box::pin(async move {
            check_name("job", job)?;
            let mut kv = self.client.kv_client();
            let response = bounded(self.timeout(), "get", kv.get(self.assignment_key(job), None)).await?;
            Ok(match response.kvs().first() {
                Some(kv) => Snapshot::decode(job, Revision::new(kv.mod_revision()), Some(kv.value())),
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
            let bytes = check_write(leadership, previous, next)?;
            let term = self.term_of(leadership)?;
            let job = leadership.job();
            let (assignment_key, guard_key) = (self.assignment_key(job), self.guard_key(job));
            let mut when = vec![
                Compare::mod_revision(assignment_key.clone(), CompareOp::Equal, previous.revision().get()),
                // Eventual writes only to a job that is not exclusive.
                Compare::create_revision(guard_key.clone(), CompareOp::Equal, 0),
            ];
            when.extend(fence(term));
            let txn = Txn::new()
                .when(when)
                .and_then([TxnOp::put(assignment_key, bytes, None)])
                .or_else([TxnOp::get(term.leader_key(), None), TxnOp::get(guard_key, None)]);
            let mut kv = self.client.kv_client();
            let response = bounded(self.timeout(), "write transaction", kv.txn(txn)).await?;
            if response.succeeded() {
                let revision = response.header().map_or(0, |h| h.revision());
                return Ok(Snapshot::valid(job, Revision::new(revision), next.clone()));
            }
            // Which condition failed: the term is checked first, so that a deposed writer
            // learns that it is deposed whatever its revision or the job's mode.
            if !still_leads(got(&response, 0).as_ref(), term) {
                return Err(StoreError::NotLeader);
            }
            if got(&response, 1).is_some() {
                return Err(StoreError::ConsistencyMismatch {
                    job: job.to_owned(),
                    stored: Consistency::Exclusive,
                });
            }
            Err(StoreError::Conflict)
        })
    }

    fn release<'a>(&'a self, job: &'a str) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            check_name("job", job)?;
            let session = self.session.lock().await.as_ref().map(|lease| lease.id());
            let Some(id) = session else { return Ok(()) };
            let key = self.leader_key(job);
            let txn = Txn::new()
                .when([Compare::lease(key.as_str(), CompareOp::Equal, id)])
                .and_then([TxnOp::delete(key.as_str(), None)]);
            bounded(self.timeout(), "release", self.client.kv_client().txn(txn)).await?;
            Ok(())
        })
    }

    fn watch(&self, job: &str, known_generation: u64) -> Result<AssignmentWatch, StoreError> {
        check_name("job", job)?;
        Ok(watch::follow(
            self.client.clone(),
            job,
            self.assignment_key(job),
            known_generation,
            self.timeout(),
        ))
    }

    fn campaign<'a>(&'a self, job: &'a str, candidate: &'a str) -> StoreFuture<'a, Leadership> {
        Box::pin(async move {
            check_name("job", job)?;
            check_name("candidate", candidate)?;
            election::campaign(self, job, candidate).await
        })
    }

    fn supports_exclusive(&self) -> bool {
        true
    }

    fn write_exclusive<'a>(
        &'a self,
        leadership: &'a Leadership,
        previous: &'a Snapshot,
        next: &'a Assignment,
    ) -> StoreFuture<'a, ExclusiveWrite> {
        Box::pin(exclusive::write(self, leadership, previous, next))
    }

    fn settle<'a>(&'a self, leadership: &'a Leadership) -> StoreFuture<'a, Recall> {
        Box::pin(exclusive::settle(self, leadership))
    }
}
