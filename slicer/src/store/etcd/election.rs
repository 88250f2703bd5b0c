//! One writer per job: a lease kept alive, and a leader key created only if absent.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, Error as EtcdError, EventType, PutOptions, Txn, TxnOp, TxnOpResponse,
    WatchOptions,
};
use steady_etcd::HeldLease;
use tokio::sync::watch;

use super::{bounded, EtcdStore};
use crate::store::leadership::Term;
use crate::store::{Leadership, StoreError, StoreFuture};

/// How many campaign steps in a row may fail to reach etcd before the campaign gives up.
const MAX_CAMPAIGN_FAILURES: u32 = 5;

/// A term of an [`EtcdStore`] job: the lease and the leader key it created.
pub(crate) struct EtcdTerm {
    /// The term's own lease, or the store's session lease shared by all its terms
    /// ([`super::EtcdConfig::session_lease`]).
    lease: Arc<HeldLease>,
    /// Whether `lease` is the session's: resigning then deletes the key alone.
    shared: bool,
    leader_key: Vec<u8>,
    /// The leader key's `create_revision`: no other term has it.
    fence: i64,
    client: Client,
    timeout: Duration,
    /// Resigned, or left to lapse: a drop has nothing to release.
    ended: std::sync::atomic::AtomicBool,
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
    /// Revokes the term's own lease, which deletes the leader key with it; on a session
    /// lease, deletes the leader key if it is still this term's (the session goes on for
    /// the other terms).
    fn resign(&self) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            if !self.shared {
                return self.lease.revoke().await.map_err(StoreError::unavailable);
            }
            let txn = Txn::new()
                .when([Compare::create_revision(self.leader_key.clone(), CompareOp::Equal, self.fence)])
                .and_then([TxnOp::delete(self.leader_key.clone(), None)]);
            let mut kv = self.client.kv_client();
            steady_etcd::bounded(self.timeout, "resign", kv.txn(txn))
                .await
                .map_err(StoreError::unavailable)?;
            Ok(())
        })
    }

    /// Lets the lease lapse: the term ends within a TTL (on a session lease, every term
    /// of the session with it: what a crash of the process would do).
    fn stop_renewing(&self) {
        self.ended.store(true, std::sync::atomic::Ordering::Relaxed);
        self.lease.stop_renewing();
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// Deletes `leader_key` if it is still the term fenced by `fence`.
fn delete_if_ours(leader_key: &[u8], fence: i64) -> Txn {
    Txn::new()
        .when([Compare::create_revision(leader_key.to_vec(), CompareOp::Equal, fence)])
        .and_then([TxnOp::delete(leader_key.to_vec(), None)])
}

impl Drop for EtcdTerm {
    /// A term on its own lease goes with the lease (revoked when dropped). A term on the
    /// session lease, dropped without resigning (its task aborted, or ended by a panic),
    /// would keep its key for the session's life: its key is deleted (if still its own),
    /// in the background, as resigning would.
    fn drop(&mut self) {
        if !self.shared || self.ended.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (mut kv, timeout) = (self.client.kv_client(), self.timeout);
            let txn = delete_if_ours(&self.leader_key, self.fence);
            runtime.spawn(async move {
                if let Err(error) = steady_etcd::bounded(timeout, "release", kv.txn(txn)).await {
                    tracing::warn!(%error, "a dropped term's leader key stays until the session lapses");
                }
            });
        }
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
    let mut lease: Option<Arc<HeldLease>> = None;
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
        if !lease.as_ref().is_some_and(|l| l.is_alive()) {
            lease = match store.lease_for_campaign().await {
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
                let term = EtcdTerm {
                    lease,
                    shared: store.config.session_lease,
                    leader_key: leader_key.into_bytes(),
                    fence,
                    client: client.clone(),
                    timeout,
                    ended: std::sync::atomic::AtomicBool::new(false),
                };
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

    /// With a session lease, two jobs' terms share one lease: resigning one deletes its
    /// key alone and the other term goes on; the session lapsing ends both.
    #[tokio::test]
    async fn terms_on_a_session_lease_resign_alone_and_lapse_together() {
        let Some(etcd) = steady_testing::Etcd::start() else { return };
        let config =
            crate::EtcdConfig::new([etcd.endpoint()]).lease_ttl(Duration::from_secs(2)).session_lease(true);
        let store = EtcdStore::connect(config).await.unwrap();
        let users = campaign(&store, "users", "a").await.unwrap();
        let orders = campaign(&store, "orders", "a").await.unwrap();
        let lease = |l: &Leadership| l.term::<EtcdTerm>().unwrap().lease();
        assert_eq!(lease(&users), lease(&orders), "one session lease");
        let mut kv = store.client.kv_client();
        users.resign().await.unwrap();
        assert_eq!(kv.get(store.leader_key("users"), None).await.unwrap().kvs().len(), 0);
        assert!(orders.is_held());
        assert_eq!(kv.get(store.leader_key("orders"), None).await.unwrap().kvs().len(), 1);
        // Another candidate waits; the session left to lapse ends the term it holds.
        let other =
            EtcdStore::connect(crate::EtcdConfig::new([etcd.endpoint()]).lease_ttl(Duration::from_secs(2)))
                .await
                .unwrap();
        let waiting =
            tokio::spawn(
                async move { campaign(&other, "orders", "b").await.map(|l| l.candidate().to_owned()) },
            );
        orders.stop_renewing();
        tokio::time::timeout(Duration::from_secs(10), orders.lost())
            .await
            .expect("the term ends with its session");
        let next = tokio::time::timeout(Duration::from_secs(10), waiting).await.unwrap().unwrap().unwrap();
        assert_eq!(next, "b");
    }

    /// A term on the session that no one holds a handle to (a campaign dropped just after
    /// etcd made it leader) keeps its key for the session's life; `release` ends it, and
    /// only a key on the session.
    #[tokio::test]
    async fn release_deletes_a_term_no_one_holds_and_only_the_session_s() {
        use crate::store::AssignmentStore;
        let Some(etcd) = steady_testing::Etcd::start() else { return };
        let config =
            crate::EtcdConfig::new([etcd.endpoint()]).lease_ttl(Duration::from_secs(2)).session_lease(true);
        let store = EtcdStore::connect(config).await.unwrap();
        let other = EtcdStore::connect(crate::EtcdConfig::new([etcd.endpoint()])).await.unwrap();
        // As a campaign cancelled after etcd made it leader: a term no one holds.
        std::mem::forget(campaign(&store, "users", "a").await.unwrap());
        let theirs = campaign(&other, "orders", "b").await.unwrap();
        let mut kv = store.client.kv_client();
        assert_eq!(
            kv.get(store.leader_key("users"), None).await.unwrap().kvs().len(),
            1,
            "kept by the session"
        );
        store.release("users").await.unwrap();
        store.release("orders").await.unwrap();
        assert_eq!(kv.get(store.leader_key("users"), None).await.unwrap().kvs().len(), 0);
        assert!(theirs.is_held(), "another lease's term is not released");
        assert_eq!(kv.get(store.leader_key("orders"), None).await.unwrap().kvs().len(), 1);
        // A term dropped without resigning (its task aborted) deletes its key by itself.
        drop(campaign(&store, "carts", "a").await.unwrap());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !kv.get(store.leader_key("carts"), None).await.unwrap().kvs().is_empty() {
            assert!(tokio::time::Instant::now() < deadline, "a dropped term's key stays");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
