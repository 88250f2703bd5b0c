//! One writer per job: a lease kept alive, and a leader key created only if absent.

use std::fmt;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, Error as EtcdError, EventType, PutOptions, Txn, TxnOp, TxnOpResponse,
    WatchOptions,
};
use steady_etcd::{HeldLease, LeaseMode};
use tokio::sync::watch;

use super::{bounded, EtcdStore};
use crate::store::leadership::Term;
use crate::store::{Leadership, StoreError, StoreFuture};

/// How many campaign steps in a row may fail to reach etcd before the campaign gives up.
const MAX_CAMPAIGN_FAILURES: u32 = 5;

/// A term of an [`EtcdStore`] job: the lease and the leader key it created.
pub(crate) struct EtcdTerm {
    lease: HeldLease,
    leader_key: Vec<u8>,
    /// The leader key's `create_revision`: no other term has it.
    fence: i64,
}

impl fmt::Debug for EtcdTerm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdTerm")
            .field("lease", &self.lease.id())
            .field("leader_key", &String::from_utf8_lossy(&self.leader_key))
            .field("fence", &self.fence)
            .finish()
    }
}

impl EtcdTerm {
    pub(crate) fn lease(&self) -> i64 {
        self.lease.id()
    }

    pub(crate) fn fence(&self) -> i64 {
        self.fence
    }

    pub(crate) fn leader_key(&self) -> &[u8] {
        &self.leader_key
    }
}

impl Term for EtcdTerm {
    /// Revokes the lease, which deletes the leader key with it.
    fn resign(&self) -> StoreFuture<'_, ()> {
        Box::pin(async move { self.lease.revoke().await.map_err(StoreError::unavailable) })
    }

    /// Lets the lease lapse: the term ends within a TTL.
    fn stop_renewing(&self) {
        self.lease.stop_renewing();
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// Waits until `candidate` leads `job` (see [`EtcdStore`]'s "Operations").
pub(super) async fn campaign(
    store: &EtcdStore,
    job: &str,
    candidate: &str,
) -> Result<Leadership, StoreError> {
    let (client, timeout) = (&store.client, store.timeout());
    let leader_key = store.leader_key(job);
    let mut lease: Option<HeldLease> = None;
    let mut failures = 0;
    loop {
        if failures >= MAX_CAMPAIGN_FAILURES {
            return Err(StoreError::unavailable(format!(
                "etcd: campaign for job {job:?} failed {failures} times in a row"
            )));
        }
        if failures > 0 {
            tokio::time::sleep(Duration::from_millis(100) * failures).await;
        }
        // A lease that lapsed while we waited cannot carry the leader key: take another.
        // Strict: a term is a lock, so the leader must give it up no later than etcd
        // could hand the key to a standby, even while etcd cannot be asked.
        if !lease.as_ref().is_some_and(HeldLease::is_alive) {
            lease = match HeldLease::grant(
                client,
                store.config.lease_ttl,
                timeout,
                "leadership",
                LeaseMode::Strict,
            )
            .await
            .map_err(StoreError::unavailable)
            {
                Ok(granted) => Some(granted),
                Err(error) => {
                    failures += 1;
                    tracing::warn!(job, %error, "campaign: cannot grant a lease");
                    continue;
                }
            };
        }
        let id = lease.as_ref().expect("granted above").id();
        let txn = Txn::new()
            .when([Compare::create_revision(leader_key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(leader_key.clone(), candidate, Some(PutOptions::new().with_lease(id)))])
            .or_else([TxnOp::get(leader_key.clone(), None)]);
        let mut kv = client.kv_client();
        let response = match bounded(timeout, "campaign transaction", kv.txn(txn)).await {
            Ok(response) => response,
            Err(error) => {
                failures += 1;
                tracing::warn!(job, %error, "campaign: transaction failed");
                continue;
            }
        };
        failures = 0;
        let revision = response.header().map_or(0, |h| h.revision());
        if response.succeeded() {
            // The put created the key in this transaction, so its create_revision is the
            // transaction's revision.
            let lease = lease.take().expect("granted above");
            let held = lease.held();
            tracing::info!(job, candidate, lease = id, fence = revision, "campaign: leading");
            let term = EtcdTerm { lease, leader_key: leader_key.into_bytes(), fence: revision };
            return Ok(Leadership::new(job, candidate, held, term));
        }
        let leader = response.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Get(get) => {
                get.kvs().first().map(|kv| String::from_utf8_lossy(kv.value()).into_owned())
            }
            _ => None,
        });
        tracing::debug!(job, candidate, ?leader, "campaign: another candidate leads; waiting");
        let lease_alive = lease.as_ref().expect("granted above").held();
        // Bounded so that a watch that silently stalls cannot stall the campaign: at
        // worst we look again after a TTL.
        let wait = wait_for_deletion(client, &leader_key, revision + 1, lease_alive);
        if let Ok(Err(error)) = tokio::time::timeout(store.config.lease_ttl, wait).await {
            failures += 1;
            tracing::warn!(job, %error, "campaign: cannot watch the leader");
        }
    }
}

/// Waits until `key` is deleted at or after revision `from`, or our own lease lapses.
async fn wait_for_deletion(
    client: &Client,
    key: &str,
    from: i64,
    mut lease_alive: watch::Receiver<bool>,
) -> Result<(), EtcdError> {
    let mut watch = client.watch_client();
    let mut stream = watch.watch(key, Some(WatchOptions::new().with_start_revision(from))).await?;
    loop {
        tokio::select! {
            _ = lease_alive.wait_for(|alive| !*alive) => return Ok(()),
            message = stream.message() => match message? {
                Some(response) if response.events().iter().any(|e| e.event_type() == EventType::Delete) => return Ok(()),
                Some(response) if response.canceled() => return Ok(()),
                Some(_) => {}
                None => return Ok(()),
            },
        }
    }
}
