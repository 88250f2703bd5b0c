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
        let (leader, revision) = match try_lead(client, timeout, &leader_key, candidate, id).await {
            Ok(Attempt::Led { fence }) => {
                let lease = lease.take().expect("granted above");
                let held = lease.held();
                tracing::info!(job, candidate, lease = id, fence, "campaign: leading");
                let term = EtcdTerm { lease, leader_key: leader_key.into_bytes(), fence };
                return Ok(Leadership::new(job, candidate, held, term));
            }
            Ok(Attempt::Held { leader, revision }) => (leader, revision),
            Err(error) => {
                failures += 1;
                tracing::warn!(job, %error, "campaign: transaction failed");
                continue;
            }
        };
        failures = 0;
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

/// What one try to take the leader key found.
#[derive(Debug, PartialEq, Eq)]
enum Attempt {
    /// The key is ours: a term fenced by the key's `create_revision`.
    Led { fence: i64 },
    /// Another candidate holds it (`leader`, its name, when it could be read), as of
    /// `revision`.
    Held { leader: Option<String>, revision: i64 },
}

/// Creates the leader key on `lease` if it is absent, in one transaction; else reads it.
///
/// A key found on `lease` itself is ours too: an earlier try of this campaign created it
/// and its answer was lost (it timed out, or the connection broke after etcd applied
/// it). Taking it for another candidate's would wait for ourselves, for as long as we
/// keep the lease alive, and every other candidate with us: no job led at all.
async fn try_lead(
    client: &Client,
    timeout: Duration,
    leader_key: &str,
    candidate: &str,
    lease: i64,
) -> Result<Attempt, StoreError> {
    let txn = Txn::new()
        .when([Compare::create_revision(leader_key, CompareOp::Equal, 0)])
        .and_then([TxnOp::put(leader_key, candidate, Some(PutOptions::new().with_lease(lease)))])
        .or_else([TxnOp::get(leader_key, None)]);
    let response = bounded(timeout, "campaign transaction", client.kv_client().txn(txn)).await?;
    let revision = response.header().map_or(0, |h| h.revision());
    if response.succeeded() {
        // The put created the key in this transaction, so its create_revision is the
        // transaction's revision.
        return Ok(Attempt::Led { fence: revision });
    }
    let holder = response.op_responses().into_iter().find_map(|op| match op {
        TxnOpResponse::Get(get) => get
            .kvs()
            .first()
            .map(|kv| (String::from_utf8_lossy(kv.value()).into_owned(), kv.lease(), kv.create_revision())),
        _ => None,
    });
    Ok(match holder {
        Some((_, holder_lease, created)) if holder_lease == lease => Attempt::Led { fence: created },
        holder => Attempt::Held { leader: holder.map(|(name, _, _)| name), revision },
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A try whose answer was lost (here: ignored) leaves the key on our lease; the next
    /// try must find it ours, with the fence of the first. Another lease finds it held.
    #[tokio::test]
    async fn a_try_that_finds_the_key_on_its_own_lease_leads() {
        let Some(etcd) = steady_testing::Etcd::start() else { return };
        let client = Client::connect([etcd.endpoint()], None).await.unwrap();
        let lease = |ttl| {
            let mut client = client.clone();
            async move { client.lease_grant(ttl, None).await.unwrap().id() }
        };
        let (ours, theirs) = (lease(30).await, lease(30).await);
        let timeout = Duration::from_secs(5);
        let Attempt::Led { fence } = try_lead(&client, timeout, "/job/leader", "a", ours).await.unwrap()
        else {
            panic!("the key was free");
        };
        // The first answer lost: the campaign tries again with the same lease.
        let again = try_lead(&client, timeout, "/job/leader", "a", ours).await.unwrap();
        assert_eq!(again, Attempt::Led { fence });
        let other = try_lead(&client, timeout, "/job/leader", "b", theirs).await.unwrap();
        assert!(matches!(other, Attempt::Held { leader: Some(ref name), .. } if name == "a"), "{other:?}");
    }
}
