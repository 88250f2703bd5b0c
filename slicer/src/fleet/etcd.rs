//! [`EtcdFleet`]: the fleet's keys on the etcd cluster of an [`EtcdStore`].

use std::collections::BTreeMap;
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};
use steady_core::valid_job_name;
use steady_etcd::{HeldLease, LeaseMode};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::prefix::{self, Keys};
use super::{FleetError, Instance, MAX_INSTANCES};
use crate::specs::{FLEET_SEGMENT, MAX_JOBS};
use crate::store::EtcdStore;

/// How long a run request's key lives ([`EtcdFleet::request_run`]): far longer than an
/// instance takes to see it, short enough that the keys of removed jobs go by themselves.
pub const RUN_REQUEST_TTL: Duration = Duration::from_secs(60);

/// The fleet's keys on the etcd cluster of an [`EtcdStore`], under its key prefix (see
/// the module documentation for the keys). Cheap to clone; clones share the connection.
#[derive(Clone)]
pub struct EtcdFleet {
    client: Client,
    /// The store's prefix: the jobs' keys.
    jobs: String,
    /// `P .fleet/`.
    prefix: String,
    timeout: Duration,
    ttl: Duration,
}

impl std::fmt::Debug for EtcdFleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdFleet")
            .field("prefix", &self.prefix)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl EtcdFleet {
    /// The fleet on `store`'s cluster, under its key prefix; memberships use its lease
    /// TTL ([`crate::EtcdConfig::lease_ttl`]).
    pub fn new(store: &EtcdStore) -> Self {
        Self {
            client: store.client().clone(),
            jobs: store.prefix().to_owned(),
            prefix: format!("{}{FLEET_SEGMENT}/", store.prefix()),
            timeout: store.timeout(),
            ttl: store.lease_ttl(),
        }
    }

    /// The key of instance `name`.
    pub fn instance_key(&self, name: &str) -> String {
        format!("{}instances/{name}", self.prefix)
    }

    /// The key of job `job`'s run requests.
    pub fn run_key(&self, job: &str) -> String {
        format!("{}runs/{job}", self.prefix)
    }

    /// Joins the fleet as instance `name`, reached at `instance`: its key exists from
    /// the return on, and is kept alive by a task of the membership's until
    /// [`Membership::leave`] (or a drop) deletes it. If the lease ever lapses (etcd
    /// unreachable past the TTL) the key is put back on a new one as soon as etcd
    /// answers.
    ///
    /// # Errors
    ///
    /// [`FleetError::InvalidName`], [`FleetError::Malformed`] for an address with a
    /// space, [`FleetError::NameTaken`] when a live instance has the name,
    /// [`FleetError::Unavailable`].
    pub async fn join(&self, name: &str, instance: &Instance) -> Result<Membership, FleetError> {
        check("instance", name)?;
        instance.check()?;
        let key = self.instance_key(name);
        let record = instance.encode();
        let lease = self.claim(&key, &record).await?;
        let (stop, stopped) = watch::channel(false);
        let keeper = tokio::spawn(keep(self.clone(), key.clone(), record, lease, stopped));
        Ok(Membership { key, stop, keeper: Some(keeper) })
    }

    /// Puts `record` at `key` on a new lease, if no other lease holds the key.
    async fn claim(&self, key: &str, record: &str) -> Result<HeldLease, FleetError> {
        let lease =
            HeldLease::grant(&self.client, self.ttl, self.timeout, "fleet membership", LeaseMode::Tolerant)
                .await
                .map_err(unavailable)?;
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key, record, Some(PutOptions::new().with_lease(lease.id())))])
            .or_else([TxnOp::get(key, None)]);
        let response = steady_etcd::bounded(self.timeout, "fleet join", self.client.kv_client().txn(txn))
            .await
            .map_err(unavailable)?;
        if response.succeeded() {
            return Ok(lease);
        }
        let holder = response.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Get(get) => {
                get.kvs().first().map(|kv| String::from_utf8_lossy(kv.value()).into_owned())
            }
            _ => None,
        });
        let _ = lease.revoke().await;
        Err(FleetError::NameTaken {
            name: key.rsplit('/').next().unwrap_or_default().to_owned(),
            by: holder.unwrap_or_default(),
        })
    }

    /// The live instances, by name, as of now (records that do not read are left out,
    /// with a warning; at most [`MAX_INSTANCES`]).
    ///
    /// # Errors
    ///
    /// [`FleetError::Unavailable`].
    pub async fn instances(&self) -> Result<BTreeMap<String, Instance>, FleetError> {
        let prefix = format!("{}instances/", self.prefix);
        let options = etcd_client::GetOptions::new().with_prefix().with_limit(MAX_INSTANCES as i64);
        let listed = steady_etcd::bounded(
            self.timeout,
            "fleet list",
            self.client.kv_client().get(prefix.as_str(), Some(options)),
        )
        .await
        .map_err(unavailable)?;
        let keys = listed
            .kvs()
            .iter()
            .filter_map(|kv| {
                let name = std::str::from_utf8(kv.key().strip_prefix(prefix.as_bytes())?).ok()?;
                Some((
                    name.to_owned(),
                    prefix::Entry { revision: kv.mod_revision(), value: kv.value().to_vec() },
                ))
            })
            .collect();
        Ok(decode_instances(&keys))
    }

    /// The live instances as they change: the receiver's value is `None` until the first
    /// listing, then every change (a join, a leave, a lapse). Followed by a task that
    /// ends when every receiver is dropped; errors are retried with backoff.
    pub fn watch_instances(&self) -> watch::Receiver<Option<BTreeMap<String, Instance>>> {
        let keys = prefix::follow(
            self.client.clone(),
            format!("{}instances/", self.prefix),
            MAX_INSTANCES,
            self.timeout,
        );
        map_watch(keys, |keys| keys.as_ref().map(decode_instances))
    }

    /// Asks the fleet for a run of `job` now: its leader runs the job's Assigner at once
    /// (whether or not anything changed), as on a change of its tasks. The request's key
    /// lives [`RUN_REQUEST_TTL`] (on a lease of its own), so the keys of jobs long gone
    /// do not pile up under the prefix the instances read.
    ///
    /// # Errors
    ///
    /// [`FleetError::InvalidName`], [`FleetError::Unavailable`].
    pub async fn request_run(&self, job: &str) -> Result<(), FleetError> {
        check("job", job)?;
        let at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let ttl = i64::try_from(RUN_REQUEST_TTL.as_secs()).unwrap_or(i64::MAX);
        let lease = steady_etcd::bounded(self.timeout, "fleet run request's lease", async {
            self.client.lease_client().grant(ttl, None).await
        })
        .await
        .map_err(unavailable)?;
        let on_lease = PutOptions::new().with_lease(lease.id());
        steady_etcd::bounded(
            self.timeout,
            "fleet run request",
            self.client.kv_client().put(self.run_key(job), at.as_millis().to_string(), Some(on_lease)),
        )
        .await
        .map_err(unavailable)?;
        Ok(())
    }

    /// The run requests made from now on: each item the jobs asked to run since the last
    /// (requests made before the watch's first listing are not repeated).
    pub fn watch_run_requests(&self) -> RunRequests {
        let keys =
            prefix::follow(self.client.clone(), format!("{}runs/", self.prefix), MAX_JOBS, self.timeout);
        RunRequests { keys, seen: None }
    }

    /// The name of the candidate that leads `job` now (its leader key's value; `None`:
    /// no leader).
    ///
    /// # Errors
    ///
    /// [`FleetError::InvalidName`], [`FleetError::Unavailable`].
    pub async fn leader(&self, job: &str) -> Result<Option<String>, FleetError> {
        check("job", job)?;
        let key = format!("{}{job}/leader", self.jobs);
        let got = steady_etcd::bounded(self.timeout, "leader read", self.client.kv_client().get(key, None))
            .await
            .map_err(unavailable)?;
        Ok(got.kvs().first().map(|kv| String::from_utf8_lossy(kv.value()).into_owned()))
    }
}

/// Run requests as they come ([`EtcdFleet::watch_run_requests`]).
#[derive(Debug)]
pub struct RunRequests {
    keys: watch::Receiver<Option<Keys>>,
    /// Each job's request revision last seen; `None` before the first listing.
    seen: Option<BTreeMap<String, i64>>,
}

impl RunRequests {
    /// The jobs asked to run since the last call (never empty); `None` when the
    /// follower is gone (the runtime shuts down).
    pub async fn next(&mut self) -> Option<Vec<String>> {
        loop {
            self.keys.changed().await.ok()?;
            let now: BTreeMap<String, i64> = match &*self.keys.borrow_and_update() {
                Some(keys) => keys.iter().map(|(job, entry)| (job.clone(), entry.revision)).collect(),
                None => continue,
            };
            let asked: Vec<String> = match &self.seen {
                None => Vec::new(),
                Some(seen) => now
                    .iter()
                    .filter(|(job, r)| seen.get(*job) != Some(r))
                    .map(|(job, _)| job.clone())
                    .collect(),
            };
            self.seen = Some(now);
            if !asked.is_empty() {
                return Some(asked);
            }
        }
    }
}

/// An instance's place in the fleet ([`EtcdFleet::join`]): its key, kept alive by a task
/// until [`Membership::leave`] or a drop deletes it.
#[derive(Debug)]
pub struct Membership {
    key: String,
    stop: watch::Sender<bool>,
    keeper: Option<JoinHandle<()>>,
}

impl Membership {
    /// The instance's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Leaves the fleet: the key is deleted (its lease revoked) before the return, so the
    /// other instances see the departure at once and not a TTL later.
    pub async fn leave(mut self) {
        self.stop.send_replace(true);
        if let Some(keeper) = self.keeper.take() {
            let _ = keeper.await;
        }
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        // The keeper revokes its lease when told to stop (or, aborted with the runtime,
        // leaves it to lapse).
        self.stop.send_replace(true);
    }
}

/// The membership's task: while the lease lives, nothing to do; when it lapses, claim
/// the key again on a new one (retrying with backoff); when told to stop, revoke.
async fn keep(
    fleet: EtcdFleet,
    key: String,
    record: String,
    lease: HeldLease,
    mut stopped: watch::Receiver<bool>,
) {
    let mut lease = Some(lease);
    let mut failures = 0u32;
    loop {
        match &lease {
            Some(held) => {
                let mut alive = held.held();
                tokio::select! {
                    _ = alive.wait_for(|alive| !*alive) => {
                        tracing::warn!(key, "fleet: the membership's lease lapsed; joining again");
                        lease = None;
                    }
                    _ = stopped.wait_for(|stop| *stop) => break,
                }
            }
            None => {
                if failures > 0 {
                    tokio::select! {
                        () = tokio::time::sleep(steady_etcd::watch_backoff(failures)) => {}
                        _ = stopped.wait_for(|stop| *stop) => break,
                    }
                }
                match fleet.claim(&key, &record).await {
                    Ok(held) => {
                        lease = Some(held);
                        failures = 0;
                    }
                    Err(error) => {
                        failures += 1;
                        tracing::warn!(key, %error, failures, "fleet: cannot join again");
                    }
                }
            }
        }
    }
    if let Some(held) = lease {
        if let Err(error) = held.revoke().await {
            tracing::warn!(key, %error, "fleet: cannot revoke the membership; it will lapse");
        }
    }
}

/// A receiver of `f` applied to each value of `source`, kept by a task that ends with
/// every receiver of its own, or with the source.
fn map_watch<S, T>(mut source: watch::Receiver<S>, f: impl Fn(&S) -> T + Send + 'static) -> watch::Receiver<T>
where
    S: Send + Sync + 'static,
    T: PartialEq + Send + Sync + 'static,
{
    let (tx, rx) = watch::channel(f(&source.borrow_and_update()));
    tokio::spawn(async move {
        loop {
            tokio::select! {
                changed = source.changed() => if changed.is_err() { return },
                () = tx.closed() => return,
            }
            let value = f(&source.borrow_and_update());
            tx.send_if_modified(|now| {
                if *now == value {
                    return false;
                }
                *now = value;
                true
            });
        }
    });
    rx
}

fn decode_instances(keys: &Keys) -> BTreeMap<String, Instance> {
    keys.iter()
        .filter_map(|(name, entry)| match Instance::decode(&entry.value) {
            Ok(instance) => Some((name.clone(), instance)),
            Err(error) => {
                tracing::warn!(name, %error, "fleet: an instance key that does not read is left out");
                None
            }
        })
        .collect()
}

/// A job name any store takes; an instance name of the same length without `/` (it is
/// the last segment of its key).
fn check(what: &'static str, name: &str) -> Result<(), FleetError> {
    if valid_job_name(name) && (what == "job" || !name.contains('/')) {
        Ok(())
    } else {
        Err(FleetError::InvalidName { what, len: name.len() })
    }
}

fn unavailable(error: impl std::error::Error + Send + Sync + 'static) -> FleetError {
    FleetError::Unavailable(Box::new(error))
}
