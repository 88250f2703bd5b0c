//! [`Registration`]: one task key held under a lease; registering at a given index, and
//! claiming the lowest free one.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use steady_core::{Locality, TaskState, Zone};

use super::claim::{Claim, Spot};
use super::record::{valid_address, TaskRecord};
use super::{bounded, check_job, unavailable, Registry, RegistryError, MAX_TASKS};
use crate::identity::Identity;
use steady_etcd::{HeldLease, LeaseMode};
use tokio::time::Instant;

/// A task's key in the registry, held under a lease that a task of its own renews.
///
/// While it lives, `/steady/jobs/<job>/tasks/<index>` holds `<state> <address>` (see
/// [`TaskRecord`](super::TaskRecord)), with ` zone=<zone>/<zone-index>` for a task in a
/// zone, and every watcher of the job sees the task. A task in a zone also holds its
/// zone key, `/steady/jobs/<job>/zones/<zone>/<zone-index>`, under the same lease.
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
    locality: Option<Locality>,
    zone_key: Option<String>,
    address: String,
    draining: AtomicBool,
    lease: HeldLease,
}

impl fmt::Debug for Registration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registration")
            .field("key", &self.key)
            .field("zone_key", &self.zone_key)
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

    /// Its zone and index within the zone, for a task registered or claimed in a zone.
    pub fn locality(&self) -> Option<&Locality> {
        self.locality.as_ref()
    }

    /// Its zone key, `/steady/jobs/<job>/zones/<zone>/<zone-index>`, for a task in a zone.
    pub fn zone_key(&self) -> Option<&str> {
        self.zone_key.as_deref()
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
    /// succeeds, [`TaskState::Draining`] after (until [`Registration::undrain`]).
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

    /// Marks the task draining: rewrites its value as `draining <address>` (keeping its
    /// zone field), on condition that the key is still attached to this registration's
    /// lease. The zone key is left as it is: a draining task keeps its zone index.
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
        self.write_state(TaskState::Draining).await?;
        tracing::info!(key = %self.key, "registry: draining");
        Ok(())
    }

    /// Rewrites its value in `state`, on condition that the key is still attached to
    /// this registration's lease.
    pub(super) async fn write_state(&self, state: TaskState) -> Result<(), RegistryError> {
        if !self.is_held() {
            return Err(RegistryError::Lost);
        }
        let value = self.record(state);
        let txn =
            Txn::new().when([Compare::lease(self.key.as_str(), CompareOp::Equal, self.lease.id())]).and_then(
                [TxnOp::put(self.key.as_str(), value, Some(PutOptions::new().with_lease(self.lease.id())))],
            );
        let mut kv = self.registry.client.kv_client();
        let response = bounded(self.registry.timeout(), "state transaction", kv.txn(txn)).await?;
        if !response.succeeded() {
            return Err(RegistryError::Lost);
        }
        self.mark_state(state);
        Ok(())
    }

    /// The value of its key in `state`.
    pub(super) fn record(&self, state: TaskState) -> String {
        TaskRecord::new(self.address.as_str(), state).in_zone(self.locality.clone()).encode()
    }

    /// The registry this registration is held in.
    pub(super) fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Records that the key now says `state` (draining, or serving).
    pub(super) fn mark_state(&self, state: TaskState) {
        self.draining.store(state == TaskState::Draining, Ordering::Release);
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
    /// A registration in a zone takes its zone index back too when its zone key is free
    /// or still holds its job index (and its task key is free or its own), in the same
    /// transaction; else it claims the lowest free job index and zone index of its zone,
    /// as [`Registry::claim_in_zone`] does. See [`Registry::claim_preferring_in_zone`].
    ///
    /// Meant for a lost registration: on one still held it takes its own keys over with
    /// the new lease, and this registration then no longer carries them.
    ///
    /// # Errors
    ///
    /// As [`Registry::claim`]; on any error nothing new is held (retry on
    /// [`RegistryError::Unavailable`]).
    pub async fn reclaim(&self) -> Result<Registration, RegistryError> {
        let zone = self.locality.as_ref().map(|l| l.zone.clone());
        let spot = Spot { index: self.index, locality: self.locality.clone() };
        self.registry.claim_at(&self.job, &self.address, self.state(), zone.as_ref(), Some(spot)).await
    }

    /// The index as a task [`Identity`] (origin [`Origin::Registry`](crate::identity::Origin::Registry)),
    /// which holds this registration (and so its lease) until it is dropped. For a
    /// registration in a zone, the identity's index is the index **within** the zone and
    /// its zone is set ([`Identity::zone`]); otherwise it is the job index.
    pub fn into_identity(self) -> Identity {
        match self.locality.clone() {
            Some(Locality { zone, index }) => Identity::leased(index, self).with_zone(Some(zone)),
            None => Identity::leased(self.index, self),
        }
    }
}

impl Registry {
    /// Registers task `index` of `job` at `address`, serving, in no zone, under a new
    /// lease that is kept alive until the registration is released or dropped.
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
        self.register_at(job, index, None, address).await
    }

    /// Registers task `index` of `job` at `address`, serving, at `locality` (its zone
    /// and index within the zone), under a new lease: as [`Registry::register`], and the
    /// zone key `P J /zones/<zone>/<zone-index>` (holding `index`) is written with the
    /// task key in one transaction, under the same lease, so that claims in the zone
    /// ([`Registry::claim_in_zone`]) pass over the zone index.
    ///
    /// Both are authoritative: keys already there are overwritten. For a StatefulSet per
    /// zone, the zone index is the pod's ordinal and the job index is
    /// `ordinal × zones + the zone's position` (the DNS source's convention, see
    /// `dns::DnsConfig::zoned`).
    ///
    /// # Errors
    ///
    /// As [`Registry::register`], and [`RegistryError::InvalidArgument`] for a zone
    /// index at or past [`MAX_TASKS`].
    pub async fn register_in_zone(
        &self,
        job: &str,
        index: usize,
        locality: Locality,
        address: &str,
    ) -> Result<Registration, RegistryError> {
        self.register_at(job, index, Some(locality), address).await
    }

    async fn register_at(
        &self,
        job: &str,
        index: usize,
        locality: Option<Locality>,
        address: &str,
    ) -> Result<Registration, RegistryError> {
        check_job(job)?;
        check_address(address)?;
        check_index("index", index)?;
        if let Some(locality) = &locality {
            check_index("zone index", locality.index)?;
        }
        let lease = self.grant_lease().await?;
        let key = self.task_key(job, index);
        let zone_key = locality.as_ref().map(|l| self.zone_key(job, &l.zone, l.index));
        let value = TaskRecord::new(address, TaskState::Serving).in_zone(locality.clone()).encode();
        let with_lease = || Some(PutOptions::new().with_lease(lease.id()));
        let mut puts = vec![TxnOp::put(key.as_str(), value, with_lease())];
        if let Some(zone_key) = &zone_key {
            puts.push(TxnOp::put(zone_key.as_str(), index.to_string(), with_lease()));
        }
        let mut kv = self.client.kv_client();
        bounded(self.timeout(), "register transaction", kv.txn(Txn::new().and_then(puts))).await?;
        tracing::info!(%key, zone_key = zone_key.as_deref(), address, lease = lease.id(), "registry: registered");
        let spot = Spot { index, locality };
        Ok(self.registration(job, spot, address, TaskState::Serving, lease))
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
        self.claim_at(job, member, TaskState::Serving, None, None).await
    }

    /// Takes the lowest free index of `job` **and** the lowest free index within `zone`
    /// for `member`, under a new lease; its value is
    /// `serving <member> zone=<zone>/<zone-index>`.
    ///
    /// Race-free as [`Registry::claim`] is: each attempt is one transaction,
    /// `If(version(task key) == 0 and version(zone key) == 0) Then(put both with the
    /// lease) Else(read the job's task keys and the zone's keys)`, the zone key being
    /// `P J /zones/<zone>/<zone-index>` (holding the job index). Concurrent claimants get
    /// distinct job indices, and distinct zone indices within each zone; a zone index is
    /// free again when its holder's lease goes, as a job index is, so replacements fill a
    /// zone's holes. Claimants of different zones contend only for job indices.
    ///
    /// # Errors
    ///
    /// As [`Registry::claim`]; [`RegistryError::JobFull`] also when the zone's indices
    /// `0..MAX_TASKS` are all held. On any error nothing is held.
    pub async fn claim_in_zone(
        &self,
        job: &str,
        zone: &Zone,
        member: &str,
    ) -> Result<Registration, RegistryError> {
        self.claim_at(job, member, TaskState::Serving, Some(zone), None).await
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
        self.claim_at(job, member, TaskState::Serving, None, Some(Spot { index, locality: None })).await
    }

    /// [`Registry::claim_preferring`] in a zone: takes job index `index` and `locality`
    /// (its zone and zone index) back when each of the two keys is free or already
    /// records this member there (the task key `serving <member> zone=<zone>/<zone-index>`,
    /// the zone key `index`), in one transaction; else claims the lowest free job index
    /// and zone index as [`Registry::claim_in_zone`] does, in `locality`'s zone.
    ///
    /// # Costs
    ///
    /// One lease grant and one transaction of four nested alternatives (each key ours or
    /// free) when both are taken back; otherwise the claim goes on from the keys that
    /// transaction read.
    ///
    /// # Errors
    ///
    /// As [`Registry::claim_in_zone`], and [`RegistryError::InvalidArgument`] for an
    /// index or a zone index at or past [`MAX_TASKS`]. On any error nothing is held.
    pub async fn claim_preferring_in_zone(
        &self,
        job: &str,
        member: &str,
        index: usize,
        locality: Locality,
    ) -> Result<Registration, RegistryError> {
        let zone = locality.zone.clone();
        let spot = Spot { index, locality: Some(locality) };
        self.claim_at(job, member, TaskState::Serving, Some(&zone), Some(spot)).await
    }

    /// Claims for `member` in `state` (in `zone`, if given): `preferred` when each of
    /// its keys is free or holds exactly what this claim writes, else the lowest free
    /// index (and zone index).
    async fn claim_at(
        &self,
        job: &str,
        member: &str,
        state: TaskState,
        zone: Option<&Zone>,
        preferred: Option<Spot>,
    ) -> Result<Registration, RegistryError> {
        check_job(job)?;
        check_address(member)?;
        if let Some(spot) = &preferred {
            check_index("index", spot.index)?;
            if let Some(locality) = &spot.locality {
                check_index("zone index", locality.index)?;
            }
        }
        let lease = self.grant_lease().await?;
        let claim = Claim {
            registry: self,
            job,
            member,
            state,
            zone,
            lease: &lease,
            tasks_prefix: self.tasks_prefix(job),
            zone_prefix: zone.map(|z| self.zone_prefix(job, z)),
        };
        let held = match preferred {
            Some(spot) => match claim.take_own(&spot).await? {
                Ok(()) => {
                    tracing::info!(key = %self.task_key(job, spot.index), member, lease = lease.id(), "registry: re-claimed its own index");
                    return Ok(self.registration(job, spot, member, state, lease));
                }
                Err(held) => held,
            },
            None => claim.read_held().await?,
        };
        let spot = claim.lowest_free(held).await?;
        Ok(self.registration(job, spot, member, state, lease))
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

    /// [`Registry::claim_in_zone`] as a task [`Identity`] whose [`Identity::index`] is
    /// the index **within** `zone` (what a zone-aware frontend subsets with) and whose
    /// [`Identity::zone`] is `zone`; held until the identity is dropped.
    ///
    /// # Errors
    ///
    /// As [`Registry::claim_in_zone`].
    pub async fn claim_index_in_zone(
        &self,
        job: &str,
        zone: &Zone,
        member: &str,
    ) -> Result<Identity, RegistryError> {
        self.claim_in_zone(job, zone, member).await.map(Registration::into_identity)
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
        spot: Spot,
        address: &str,
        state: TaskState,
        lease: HeldLease,
    ) -> Registration {
        Registration {
            registry: self.clone(),
            job: job.to_owned(),
            index: spot.index,
            key: self.task_key(job, spot.index),
            zone_key: spot.locality.as_ref().map(|l| self.zone_key(job, &l.zone, l.index)),
            locality: spot.locality,
            address: address.to_owned(),
            draining: AtomicBool::new(state == TaskState::Draining),
            lease,
        }
    }
}

fn check_index(what: &'static str, index: usize) -> Result<(), RegistryError> {
    if index < MAX_TASKS {
        Ok(())
    } else {
        Err(RegistryError::InvalidArgument { what, reason: "below MAX_TASKS (65,536)" })
    }
}

fn check_address(address: &str) -> Result<(), RegistryError> {
    if valid_address(address) {
        Ok(())
    } else {
        Err(RegistryError::InvalidArgument { what: "address", reason: "1 to 512 bytes, no whitespace" })
    }
}
