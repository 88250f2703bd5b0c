//! One writer per job: a lease kept alive, and a leader key created only if absent.

use std::fmt;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, Error as EtcdError, EventType, LeaseKeepAliveStream, LeaseKeeper, PutOptions,
    Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{bounded, EtcdStore};
use crate::store::leadership::Term;
use crate::store::{Leadership, StoreError};

/// How many campaign steps in a row may fail to reach etcd before the campaign gives up.
const MAX_CAMPAIGN_FAILURES: u32 = 5;

/// A lease that a task of its own keeps alive, revoked when dropped (unless left to
/// lapse).
struct LeaseGuard {
    client: Client,
    id: i64,
    timeout: Duration,
    keeper: JoinHandle<()>,
    /// Tells the keeper to stop renewing (it still reports the lapse).
    stop: watch::Sender<bool>,
    /// `true` while the lease is alive, as far as the keeper knows.
    held: watch::Receiver<bool>,
}

impl LeaseGuard {
    /// Grants a lease of `ttl` and starts keeping it alive.
    async fn grant(client: &Client, ttl: Duration, timeout: Duration) -> Result<Self, StoreError> {
        let mut leases = client.lease_client();
        let granted_at = Instant::now();
        let response = bounded(timeout, "lease grant", leases.grant(ttl.as_secs() as i64, None)).await?;
        let (id, ttl) = (response.id(), Duration::from_secs(response.ttl().max(1) as u64));
        let (held_tx, held) = watch::channel(true);
        let (stop, stopped) = watch::channel(false);
        let keeper =
            tokio::spawn(keep_alive(client.clone(), id, ttl, granted_at + ttl, timeout, held_tx, stopped));
        Ok(Self { client: client.clone(), id, timeout, keeper, stop, held })
    }

    fn is_alive(&self) -> bool {
        *self.held.borrow()
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        self.keeper.abort();
        if *self.stop.borrow() {
            return; // Left to lapse, as a crashed process's would.
        }
        // Revoking deletes the leader key at once, so a standby need not wait for a TTL.
        // Without a runtime (or if etcd is unreachable) the lease lapses by itself.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (mut leases, id, timeout) = (self.client.lease_client(), self.id, self.timeout);
            runtime.spawn(async move {
                if let Err(error) = bounded(timeout, "lease revoke", leases.revoke(id)).await {
                    tracing::warn!(lease = id, %error, "leadership: cannot revoke the lease; it will lapse");
                }
            });
        }
    }
}

/// Renews lease `id` every third of `ttl` until told to stop, and reports (through
/// `held`) when it lapses: at `expires`, pushed back by each renewal to the time the
/// renewal was *sent* plus the TTL etcd grants. Measured from the sending, our deadline
/// is never later than etcd's, so this process never believes it leads after etcd let
/// the lease go.
async fn keep_alive(
    mut client: Client,
    id: i64,
    ttl: Duration,
    mut expires: Instant,
    timeout: Duration,
    held: watch::Sender<bool>,
    mut stop: watch::Receiver<bool>,
) {
    let period = ttl / 3;
    let mut renewals: Option<(LeaseKeeper, LeaseKeepAliveStream)> = None;
    let mut renewing = true;
    loop {
        tokio::select! {
            // The lapse first: when it is due, nothing else may report the lease alive.
            biased;
            _ = tokio::time::sleep_until(expires) => {
                held.send_replace(false);
                tracing::warn!(lease = id, "leadership: lease lapsed");
                return;
            }
            _ = stop.changed(), if renewing => {
                renewing = false;
                renewals = None;
                continue;
            }
            _ = tokio::time::sleep(period), if renewing => {}
        }
        let sent = Instant::now();
        match tokio::time::timeout(timeout.min(period), renew(&mut client, id, &mut renewals)).await {
            Ok(Renewal::Renewed(granted)) => expires = sent + Duration::from_secs(granted),
            Ok(Renewal::Gone) => {
                held.send_replace(false);
                tracing::warn!(lease = id, "leadership: etcd no longer knows the lease (lapsed or revoked)");
                return;
            }
            Ok(Renewal::Failed(error)) => {
                tracing::warn!(lease = id, %error, "leadership: lease renewal failed; retrying");
                renewals = None;
            }
            Err(_) => {
                tracing::warn!(lease = id, "leadership: lease renewal timed out; retrying");
                renewals = None;
            }
        }
    }
}

/// What one renewal found.
enum Renewal {
    /// The lease lives on for this many seconds.
    Renewed(u64),
    /// etcd does not know the lease any more: the term is over.
    Gone,
    /// No answer (a broken stream, an unreachable etcd): try again while time is left.
    Failed(String),
}

/// One renewal, on the keep-alive stream (opened first if needed).
async fn renew(
    client: &mut Client,
    id: i64,
    renewals: &mut Option<(LeaseKeeper, LeaseKeepAliveStream)>,
) -> Renewal {
    let granted = |ttl: i64| if ttl > 0 { Renewal::Renewed(ttl as u64) } else { Renewal::Gone };
    if let Some((keeper, responses)) = renewals.as_mut() {
        if let Err(error) = keeper.keep_alive().await {
            return Renewal::Failed(error.to_string());
        }
        return match responses.message().await {
            Ok(Some(response)) => granted(response.ttl()),
            Ok(None) => Renewal::Failed("keep-alive stream ended".to_owned()),
            Err(error) => Renewal::Failed(error.to_string()),
        };
    }
    // Opening the stream renews once; etcd-client reports a lease etcd does not know
    // (a first answer with TTL 0) as this error, and only then.
    match client.lease_keep_alive(id).await {
        Ok(opened) => *renewals = Some(opened),
        Err(EtcdError::LeaseKeepAliveError(message)) if message == "lease not found" => return Renewal::Gone,
        Err(error) => return Renewal::Failed(error.to_string()),
    }
    // The opening renewal's TTL is not handed out: ask for it.
    match client.lease_client().time_to_live(id, None).await {
        Ok(response) => granted(response.ttl()),
        Err(error) => Renewal::Failed(error.to_string()),
    }
}

/// A term of an [`EtcdStore`] job: the lease and the leader key it created.
pub(crate) struct EtcdTerm {
    lease: LeaseGuard,
    leader_key: Vec<u8>,
    /// The leader key's `create_revision`: no other term has it.
    fence: i64,
}

impl fmt::Debug for EtcdTerm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdTerm")
            .field("lease", &self.lease.id)
            .field("leader_key", &String::from_utf8_lossy(&self.leader_key))
            .field("fence", &self.fence)
            .finish()
    }
}

impl EtcdTerm {
    pub(crate) fn lease(&self) -> i64 {
        self.lease.id
    }

    pub(crate) fn fence(&self) -> i64 {
        self.fence
    }

    pub(crate) fn leader_key(&self) -> &[u8] {
        &self.leader_key
    }

    pub(crate) fn stop_renewing(&self) {
        self.lease.stop.send_replace(true);
    }

    pub(crate) async fn resign(&self) -> Result<(), StoreError> {
        self.lease.keeper.abort();
        // Drop revokes too, but without waiting: here the caller waits to know.
        self.lease.stop.send_replace(true);
        let mut leases = self.lease.client.lease_client();
        bounded(self.lease.timeout, "lease revoke", leases.revoke(self.lease.id)).await.map(drop)
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
    let mut lease: Option<LeaseGuard> = None;
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
        if !lease.as_ref().is_some_and(LeaseGuard::is_alive) {
            lease = match LeaseGuard::grant(client, store.config.lease_ttl, timeout).await {
                Ok(granted) => Some(granted),
                Err(error) => {
                    failures += 1;
                    tracing::warn!(job, %error, "campaign: cannot grant a lease");
                    continue;
                }
            };
        }
        let id = lease.as_ref().expect("granted above").id;
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
            let held = lease.held.clone();
            tracing::info!(job, candidate, lease = id, fence = revision, "campaign: leading");
            let term = EtcdTerm { lease, leader_key: leader_key.into_bytes(), fence: revision };
            return Ok(Leadership::new(job, candidate, held, Term::Etcd(Box::new(term))));
        }
        let leader = response.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Get(get) => {
                get.kvs().first().map(|kv| String::from_utf8_lossy(kv.value()).into_owned())
            }
            _ => None,
        });
        tracing::debug!(job, candidate, ?leader, "campaign: another candidate leads; waiting");
        let lease_alive = lease.as_ref().expect("granted above").held.clone();
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
