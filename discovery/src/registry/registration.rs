//! [`Registration`]: one task key held under a lease; registering at a given index, and
//! claiming the lowest free one.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};
use steady_core::TaskState;

use super::record::{valid_address, TaskRecord};
use super::{bounded, check_job, indices_in, keys_only, unavailable, Registry, RegistryError, MAX_TASKS};
use crate::identity::Identity;
use steady_etcd::{HeldLease, LeaseMode};
use tokio::time::Instant;

/// A task's key in the registry, held under a lease that a task of its own renews.
///
/// While it lives, `/steady/jobs/<job>/tasks/<index>` holds `<state> <address>` (see
/// [`TaskRecord`](super::TaskRecord)) and every watcher of the job sees the task.
///
/// # Shutting down
///
/// A task that is going away calls [`Registration::drain`] first (watchers stop sending
/// it new requests; an assigner moves its slices), waits for its requests in flight,
/// then [`Registration::release`] (or drops the registration), which revokes the lease:
/// the key disappears at once and the index is free for the next claimant. A task that
/// crashes stops renewing; etcd deletes its key a TTL later.
///
/// # Through an outage of etcd
///
/// The lease is kept as an identity, not a lock ([`LeaseMode::Tolerant`]): while etcd
/// does not answer, the keeper keeps retrying (within half a second of each failure) and
/// the registration still counts as held, past the TTL too, so its holder keeps using
/// its index. A restarted etcd restores its leases with a fresh TTL and the next renewal
/// is answered: nothing was lost, nothing moves. [`Registration::is_confirmed`] tells
/// whether etcd has vouched for the lease within its TTL.
///
/// The cost, where etcd stays up but this task cannot reach it (a partition) for longer
/// than the TTL: etcd deletes the key, another claimant may take the index, and for a
/// while two tasks use it (their subsets overlap) until this task reaches etcd again
/// and learns the lease is gone.
///
/// # Losing it
///
/// When etcd answers that it no longer knows the lease (it lapsed or was revoked), the
/// key is gone (or going) and [`Registration::lost`] resolves; this registration is not
/// renewed or re-created. Its holder calls [`Registration::reclaim`], which takes the
/// same index back when it is free (or its key still records this member), and else the
/// lowest free one.
pub struct Registration {
    registry: Registry,
    job: String,
    index: usize,
    key: String,
    address: String,
    draining: AtomicBool,
    lease: HeldLease,
}

impl fmt::Debug for Registration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registration")
            .field("key", &self.key)
            .field("address", &self.address)
            .field("state", &self.state())
            .field("lease", &self.lease.id())
            .field("held", &self.is_held())
            .finish()
    }
}

impl Registration {
    /// Follows whether the lease counts as held (`false` once lost; it never turns
    /// `true` again). The channel closes when the registration is dropped.
    pub fn held(&self) -> tokio::sync::watch::Receiver<bool> {
        self.lease.held()
    }

    /// The job it belongs to.
    pub fn job(&self) -> &str {
        &self.job
    }

    /// Its index in the job.
    pub fn index(&self) -> usize {
        self.index
    }

    /// Its key, `/steady/jobs/<job>/tasks/<index>`.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The address (or member name) it registered.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The etcd lease its key is attached to.
    pub fn lease_id(&self) -> i64 {
        self.lease.id()
    }

    /// The state it last wrote: [`TaskState::Serving`] until [`Registration::drain`]
    /// succeeds, [`TaskState::Draining`] after.
    pub fn state(&self) -> TaskState {
        if self.draining.load(Ordering::Acquire) {
            TaskState::Draining
        } else {
            TaskState::Serving
        }
    }

    /// Whether the registration counts as held: `true` until etcd answers that the lease
    /// is gone (also while etcd does not answer; see "Through an outage of etcd"),
    /// `false` once [`Registration::lost`] has resolved.
    pub fn is_held(&self) -> bool {
        self.lease.is_alive()
    }

    /// Whether the registration is held and etcd vouches for its lease now: a renewal
    /// was answered within the last TTL (counted from its sending). `false` while etcd
    /// has not answered for a TTL, even though the registration still counts as held.
    pub fn is_confirmed(&self) -> bool {
        self.lease.is_confirmed()
    }

    /// Until when etcd is known to keep the lease: the sending of the last answered
    /// renewal plus the TTL (never later than etcd's own expiry, unless the lease is
    /// revoked). In the past while etcd has not answered for a TTL.
    pub fn renewed_until(&self) -> Instant {
        self.lease.renewed_until()
    }

    /// Resolves when the lease is lost, on etcd's word (it lapsed or was revoked): the
    /// key is gone; see "Losing it" above. An outage of etcd alone never resolves it.
    pub async fn lost(&self) {
        let mut held = self.lease.held();
        // An error means the keeper ended, which it does only after reporting the loss
        // or being stopped by release: either way the lease is no longer held.
        let _ = held.wait_for(|alive| !*alive).await;
    }

    /// Marks the task draining: rewrites its value as `draining <address>`, on condition
    /// that the key is still attached to this registration's lease.
    ///
    /// Watchers see it in their next view: a balancer stops sending it new requests,
    /// while requests in flight finish. Draining twice is harmless.
    ///
    /// # Errors
    ///
    /// [`RegistryError::Lost`] when the key is no longer ours (the lease lapsed, or
    /// another task registered the same index); [`RegistryError::Unavailable`] when etcd
    /// does not answer (the state is then unknown: retry).
    pub async fn drain(&self) -> Result<(), RegistryError> {
        if !self.is_held() {
            return Err(RegistryError::Lost);
        }
        let value = TaskRecord { address: self.address.clone(), state: TaskState::Draining }.encode();
        let txn =
            Txn::new().when([Compare::lease(self.key.as_str(), CompareOp::Equal, self.lease.id())]).and_then(
                [TxnOp::put(self.key.as_str(), value, Some(PutOptions::new().with_lease(self.lease.id())))],
            );
        let mut kv = self.registry.client.kv_client();
        let response = bounded(self.registry.timeout(), "drain transaction", kv.txn(txn)).await?;
        if !response.succeeded() {
            return Err(RegistryError::Lost);
        }
        self.draining.store(true, Ordering::Release);
        tracing::info!(key = %self.key, "registry: draining");
        Ok(())
    }

    /// The registry this registration is held in.
    pub(super) fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Records that the key now says draining.
    pub(super) fn mark_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// Revokes the lease and waits for etcd's answer: the key is deleted at once, and a
    /// claimed index is free for the next claimant. Dropping the registration does the
    /// same without waiting (when a tokio runtime is running; else the lease lapses).
    ///
    /// # Errors
    ///
    /// [`RegistryError::Unavailable`] when etcd does not answer: the lease then lapses
    /// by itself within a TTL, since nothing renews it any more.
    pub async fn release(self) -> Result<(), RegistryError> {
        self.lease.revoke().await.map_err(unavailable)?;
        tracing::info!(key = %self.key, "registry: released");
        Ok(())
    }

    /// Stops renewing the lease without revoking it, as a crashed process would: the key
    /// stays until etcd expires the lease, a TTL after its last renewal. For tests and
    /// drills of what a crash does to the other tasks.
    pub fn crash(self) {
        self.lease.stop_renewing();
    }

    /// Claims an index again, for the same job and member, after this registration was
    /// [lost](Registration::lost): this registration's own index when it is free or its
    /// key still holds exactly what this registration wrote (under another lease: an old
    /// one a restarted etcd restored, say), else the lowest free index, as
    /// [`Registry::claim`] does. The new registration has a new lease and this one's
    /// state (serving, or draining after [`Registration::drain`]).
    ///
    /// After a mass loss (every task of a job cut off from etcd for a TTL) every task
    /// takes its own index back, so no subset moves, at a cost of one lease grant and
    /// one transaction per task. See [`Registry::claim_preferring`] for the transaction.
    ///
    /// Meant for a lost registration: on one still held it takes its own key over with
    /// the new lease, and this registration then no longer carries the key.
    ///
    /// # Errors
    ///
    /// As [`Registry::claim`]; on any error nothing new is held (retry on
    /// [`RegistryError::Unavailable`]).
    pub async fn reclaim(&self) -> Result<Registration, RegistryError> {
        self.registry.claim_at(&self.job, &self.address, self.state(), Some(self.index)).await
    }

    /// The index as a task [`Identity`] (origin [`Origin::Registry`](crate::identity::Origin::Registry)),
    /// which holds this registration (and so its lease) until it is dropped.
    pub fn into_identity(self) -> Identity {
        Identity::leased(self.index, self)
    }
}

impl Registry {
    /// Registers task `index` of `job` at `address`, serving, under a new lease that is
    /// kept alive until the registration is released or dropped.
    ///
    /// The index is authoritative: a key already there (a previous holder of the same
    /// index, alive or not) is overwritten. Use [`Registry::claim`] to be given a free
    /// index instead.
    ///
    /// # Errors
    ///
    /// [`RegistryError::InvalidArgument`] for a bad job name, an index at or past
    /// [`MAX_TASKS`] or an address that is not 1 to 512 bytes without whitespace;
    /// [`RegistryError::Unavailable`] when etcd does not answer (nothing is left behind:
    /// a lease granted before the failure is revoked, or lapses).
    pub async fn register(
        &self,
        job: &str,
        index: usize,
        address: &str,
    ) -> Result<Registration, RegistryError> {
        check_job(job)?;
        check_address(address)?;
        if index >= MAX_TASKS {
            return Err(RegistryError::InvalidArgument { what: "index", reason: "below MAX_TASKS (65,536)" });
        }
        let lease = self.grant_lease().await?;
        let key = self.task_key(job, index);
        let value = TaskRecord { address: address.to_owned(), state: TaskState::Serving }.encode();
        let mut kv = self.client.kv_client();
        let put = kv.put(key.as_str(), value, Some(PutOptions::new().with_lease(lease.id())));
        bounded(self.timeout(), "put", put).await?;
        tracing::info!(%key, address, lease = lease.id(), "registry: registered");
        Ok(self.registration(job, index, key, address, TaskState::Serving, lease))
    }

    /// Takes the lowest free index of `job` for `member` (a frontend's name, or a
    /// backend's address), under a new lease kept alive until the registration is
    /// released or dropped; its value is `serving <member>`.
    ///
    /// "Free" means no key: an index whose holder crashed is free once its lease
    /// lapses, so replacements fill holes and the job stays contiguous (`0..M`).
    ///
    /// # Errors
    ///
    /// [`RegistryError::InvalidArgument`] for a bad job name or member;
    /// [`RegistryError::JobFull`] when indices `0..MAX_TASKS` are all held;
    /// [`RegistryError::Contended`] after [`RegistryConfig::max_claim_attempts`](super::RegistryConfig::max_claim_attempts)
    /// lost races; [`RegistryError::Unavailable`] when etcd does not answer. On any error
    /// nothing is held.
    pub async fn claim(&self, job: &str, member: &str) -> Result<Registration, RegistryError> {
        self.claim_at(job, member, TaskState::Serving, None).await
    }

    /// Takes `index` of `job` for `member` if it is free or its key records `member`,
    /// else the lowest free index as [`Registry::claim`] does; under a new lease, serving.
    ///
    /// For a member that knows its index from before: a lost registration (see
    /// [`Registration::reclaim`]), or a restarted process that kept its last index. A
    /// key that records `member` (`serving <member>`) is the member's own, whoever's
    /// lease it is attached to (an old one of its own that a restarted etcd restored
    /// with a fresh TTL, a crashed predecessor's that has not lapsed yet), and is taken
    /// over: rewritten under the new lease, so that the old lease's lapse or revocation
    /// no longer deletes it. Member names must therefore be unique in a job.
    ///
    /// # Costs
    ///
    /// One lease grant and one transaction, `If(value(key) == record) Then(put) Else(
    /// If(version(key) == 0) Then(put) Else(read the job's keys))`, when the index is
    /// taken back; otherwise the claim goes on as [`Registry::claim`] with the keys that
    /// transaction read.
    ///
    /// # Errors
    ///
    /// As [`Registry::claim`], and [`RegistryError::InvalidArgument`] for an index at or
    /// past [`MAX_TASKS`]. On any error nothing is held.
    pub async fn claim_preferring(
        &self,
        job: &str,
        member: &str,
        index: usize,
    ) -> Result<Registration, RegistryError> {
        self.claim_at(job, member, TaskState::Serving, Some(index)).await
    }

    /// Claims for `member` in `state`: `preferred` when it is free or its key holds
    /// exactly the record this claim writes, else the lowest free index.
    async fn claim_at(
        &self,
        job: &str,
        member: &str,
        state: TaskState,
        preferred: Option<usize>,
    ) -> Result<Registration, RegistryError> {
        check_job(job)?;
        check_address(member)?;
        if preferred.is_some_and(|index| index >= MAX_TASKS) {
            return Err(RegistryError::InvalidArgument { what: "index", reason: "below MAX_TASKS (65,536)" });
        }
        let lease = self.grant_lease().await?;
        let value = TaskRecord { address: member.to_owned(), state }.encode();
        let held = match preferred {
            Some(index) => match self.take_own_index(job, index, &value, &lease).await? {
                Ok(registration_key) => {
                    tracing::info!(key = %registration_key, member, lease = lease.id(), "registry: re-claimed its own index");
                    return Ok(self.registration(job, index, registration_key, member, state, lease));
                }
                Err(held) => held,
            },
            None => self.held_indices(job).await?,
        };
        self.claim_lowest_free(job, member, state, value, lease, held).await
    }

    /// One transaction: puts `value` at `index` under `lease` when the key holds exactly
    /// `value` (it is the member's own, under whatever lease) or does not exist. Returns
    /// the key when it did; else the job's held indices, read in the same transaction.
    async fn take_own_index(
        &self,
        job: &str,
        index: usize,
        value: &str,
        lease: &HeldLease,
    ) -> Result<Result<String, Vec<usize>>, RegistryError> {
        let (key, prefix) = (self.task_key(job, index), self.tasks_prefix(job));
        let put = || TxnOp::put(key.as_str(), value, Some(PutOptions::new().with_lease(lease.id())));
        // etcd compares are conjunctions: "ours or free" is a transaction nested in the
        // else branch, still one round trip and one atomic step.
        let if_free = Txn::new()
            .when([Compare::version(key.as_str(), CompareOp::Equal, 0)])
            .and_then([put()])
            .or_else([TxnOp::get(prefix.as_str(), Some(keys_only(MAX_TASKS)))]);
        let txn = Txn::new()
            .when([Compare::value(key.as_str(), CompareOp::Equal, value)])
            .and_then([put()])
            .or_else([TxnOp::txn(if_free)]);
        let mut kv = self.client.kv_client();
        let response = bounded(self.timeout(), "re-claim transaction", kv.txn(txn)).await?;
        if response.succeeded() {
            return Ok(Ok(key));
        }
        let inner = response.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Txn(inner) => Some(inner),
            _ => None,
        });
        match inner {
            Some(inner) if inner.succeeded() => Ok(Ok(key)),
            Some(inner) => {
                let mut held = held_in(&inner, prefix.len()).unwrap_or_default();
                // The comparison failed, so `index` is held even if the read was cut short.
                if let Err(position) = held.binary_search(&index) {
                    held.insert(position, index);
                }
                Ok(Err(held))
            }
            // Not what etcd answers; read the job's keys as a plain claim would.
            None => self.held_indices(job).await.map(Err),
        }
    }

    /// The lowest free index, by create-if-absent transactions, starting from the
    /// indices `held`.
    async fn claim_lowest_free(
        &self,
        job: &str,
        member: &str,
        state: TaskState,
        value: String,
        lease: HeldLease,
        mut held: Vec<usize>,
    ) -> Result<Registration, RegistryError> {
        let prefix = self.tasks_prefix(job);
        let mut kv = self.client.kv_client();
        for attempt in 1..=self.config.max_claim_attempts {
            let index = lowest_free(&held);
            if index >= MAX_TASKS {
                return Err(RegistryError::JobFull { job: job.to_owned() });
            }
            let key = self.task_key(job, index);
            let txn = Txn::new()
                .when([Compare::version(key.as_str(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(
                    key.as_str(),
                    value.as_str(),
                    Some(PutOptions::new().with_lease(lease.id())),
                )])
                .or_else([TxnOp::get(prefix.as_str(), Some(keys_only(MAX_TASKS)))]);
            let response = bounded(self.timeout(), "claim transaction", kv.txn(txn)).await?;
            if response.succeeded() {
                tracing::info!(%key, member, attempt, lease = lease.id(), "registry: claimed");
                return Ok(self.registration(job, index, key, member, state, lease));
            }
            // Someone created `index` since our read: take the keys this transaction
            // read (atomically with the failed comparison) and try the lowest free one.
            // (Without a read, which is not what etcd answers, assume only that `index`
            // is taken.)
            held = held_in(&response, prefix.len()).unwrap_or(held);
            // The comparison failed, so `index` is held even if the read was cut short.
            if let Err(position) = held.binary_search(&index) {
                held.insert(position, index);
            }
            tracing::debug!(%key, attempt, "registry: index taken meanwhile; trying the next free one");
        }
        Err(RegistryError::Contended { job: job.to_owned(), attempts: self.config.max_claim_attempts })
    }

    /// [`Registry::claim`] as a task [`Identity`]: the lowest free index of `job`, held
    /// until the identity is dropped (see [`Registration::into_identity`]).
    ///
    /// # Errors
    ///
    /// As [`Registry::claim`].
    pub async fn claim_index(&self, job: &str, member: &str) -> Result<Identity, RegistryError> {
        self.claim(job, member).await.map(Registration::into_identity)
    }

    /// A lease for a registration: kept as an identity, not a lock (see
    /// [`Registration`]'s "Through an outage of etcd").
    async fn grant_lease(&self) -> Result<HeldLease, RegistryError> {
        HeldLease::grant(&self.client, self.config.lease_ttl, self.timeout(), "registry", LeaseMode::Tolerant)
            .await
            .map_err(unavailable)
    }

    fn registration(
        &self,
        job: &str,
        index: usize,
        key: String,
        address: &str,
        state: TaskState,
        lease: HeldLease,
    ) -> Registration {
        Registration {
            registry: self.clone(),
            job: job.to_owned(),
            index,
            key,
            address: address.to_owned(),
            draining: AtomicBool::new(state == TaskState::Draining),
            lease,
        }
    }
}

/// The indices a transaction's get of the job's keys read, if it has one.
fn held_in(response: &etcd_client::TxnResponse, prefix_len: usize) -> Option<Vec<usize>> {
    response.op_responses().into_iter().find_map(|op| match op {
        TxnOpResponse::Get(get) => Some(indices_in(prefix_len, get.kvs().iter().map(|kv| kv.key()))),
        _ => None,
    })
}

/// The smallest index not in `held` (ascending, without duplicates).
fn lowest_free(held: &[usize]) -> usize {
    held.iter().enumerate().find(|&(position, &index)| position != index).map_or(held.len(), |(p, _)| p)
}

fn check_address(address: &str) -> Result<(), RegistryError> {
    if valid_address(address) {
        Ok(())
    } else {
        Err(RegistryError::InvalidArgument { what: "address", reason: "1 to 512 bytes, no whitespace" })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lowest_free_index_fills_holes_first() {
        assert_eq!(lowest_free(&[]), 0);
        assert_eq!(lowest_free(&[0, 1, 2]), 3);
        assert_eq!(lowest_free(&[1, 2]), 0);
        assert_eq!(lowest_free(&[0, 1, 3, 4, 7]), 2);
    }
}
