//! Exclusive mode on etcd: the Assigner's steps of `docs/exclusive.md` (publish and
//! recall in one transaction, wait for the holds, grant), each transaction fenced by the
//! term.
//!
//! Why the order is safe is the specification's business; what this file adds:
//!
//! * The guard compared in the publish transaction is the one *read* (after settling),
//!   not one derived from the snapshot: a job whose assignment predates its guard (an
//!   eventual job made exclusive) starts from `recalling 0 G2`, and a guard that moved
//!   since the read fails the transaction (a conflict) instead of being overwritten.
//! * The wait reads the holds prefix, then watches it from the revision after the read,
//!   so no change between the two is missed; a watch that fails or is cancelled is read
//!   and opened again. It keeps only the holds that block (memory: what etcd holds under
//!   the prefix), and a hold that does not decode blocks (logged): the protocol cannot
//!   tell what it grants.
//! * Waiting is bounded by [`super::EtcdConfig::recall_timeout`] and ends early when the
//!   term is lost (the grant would be refused anyway).

use std::collections::HashSet;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, EventType, GetOptions, Txn, TxnOp, WatchOptions};
use steady_slice::guard::{Guard, Hold};
use steady_slice::Assignment;
use tokio::time::Instant;

use super::{bounded, fence, got, still_leads, EtcdStore, EtcdTerm};
use crate::store::{
    check_exclusive, check_write, ExclusiveWrite, Leadership, Recall, Revision, Snapshot, StoreError,
};

/// The first pause before reading the holds again after a failed read or watch; it
/// doubles up to [`MAX_RETRY`].
const FIRST_RETRY: Duration = Duration::from_millis(50);
const MAX_RETRY: Duration = Duration::from_secs(1);

/// How many blocking holds a recall left pending names in its log line.
const LOGGED_HOLDS: usize = 8;

/// [`crate::store::AssignmentStore::write_exclusive`] on etcd.
pub(super) async fn write(
    store: &EtcdStore,
    leadership: &Leadership,
    previous: &Snapshot,
    next: &Assignment,
) -> Result<ExclusiveWrite, StoreError> {
    let bytes = check_write(leadership, previous, next)?;
    check_exclusive(next)?;
    let term = store.term_of(leadership)?;
    let job = leadership.job();
    // 1. A recall left pending first: the guard must grant something before it recalls it.
    let (guard, _) = settle_term(store, leadership, term).await?;
    let (from, to) = (guard.map_or(0, Guard::latest), next.generation());
    if from >= to {
        // The guard grants a generation the snapshot does not know of.
        return Err(StoreError::NotNewer { stored: from, offered: to });
    }
    let guard_key = store.guard_key(job);
    let guard_is_as_read = match guard {
        None => Compare::create_revision(guard_key.clone(), CompareOp::Equal, 0),
        Some(g) => Compare::value(guard_key.clone(), CompareOp::Equal, g.encode()),
    };
    // 2. Publish and recall, in one transaction.
    let assignment_key = store.assignment_key(job);
    let mut when = vec![
        Compare::mod_revision(assignment_key.clone(), CompareOp::Equal, previous.revision().get()),
        guard_is_as_read,
    ];
    when.extend(fence(term));
    let txn = Txn::new()
        .when(when)
        .and_then([
            TxnOp::put(assignment_key, bytes, None),
            TxnOp::put(guard_key, Guard::Recalling { from, to }.encode(), None),
        ])
        .or_else([TxnOp::get(term.leader_key(), None)]);
    let mut kv = store.client.kv_client();
    let response = bounded(store.timeout(), "publish transaction", kv.txn(txn)).await?;
    if !response.succeeded() {
        // The term first: a deposed writer learns it whatever else changed.
        return Err(if still_leads(got(&response, 0).as_ref(), term) {
            StoreError::Conflict
        } else {
            StoreError::NotLeader
        });
    }
    let published_at = Instant::now();
    let revision = response.header().map_or(0, |h| h.revision());
    let snapshot = Snapshot::valid(job, Revision::new(revision), next.clone());
    tracing::debug!(job, from, to, revision, "exclusive: published; recalling");
    // 3 and 4. The assignment is stored: whatever happens now, the call succeeded, and
    // what is left is settle's.
    let recall = match complete(store, leadership, term, from, to).await {
        Ok(Some(at)) => Recall::Granted { from, to, at },
        Ok(None) => Recall::Pending { from, to },
        Err(error) => {
            tracing::warn!(job, from, to, %error, "exclusive: recall left pending");
            Recall::Pending { from, to }
        }
    };
    Ok(ExclusiveWrite { snapshot, published_at, recall })
}

/// [`crate::store::AssignmentStore::settle`] on etcd.
pub(super) async fn settle(store: &EtcdStore, leadership: &Leadership) -> Result<Recall, StoreError> {
    let term = store.term_of(leadership)?;
    settle_term(store, leadership, term).await.map(|(_, recall)| recall)
}

/// Settles a pending recall; the guard as it then stands (`None`: the job has none, or
/// `Granted`) and what was done.
async fn settle_term(
    store: &EtcdStore,
    leadership: &Leadership,
    term: &EtcdTerm,
) -> Result<(Option<Guard>, Recall), StoreError> {
    let job = leadership.job();
    match read_guard(store, job).await? {
        None => Ok((None, Recall::Clear)),
        Some(granted @ Guard::Granted(_)) => Ok((Some(granted), Recall::Clear)),
        Some(Guard::Recalling { from, to }) => {
            tracing::info!(job, from, to, "exclusive: settling a recall left pending");
            match complete(store, leadership, term, from, to).await? {
                Some(at) => Ok((Some(Guard::Granted(to)), Recall::Granted { from, to, at })),
                None => Err(StoreError::RecallPending { job: job.to_owned(), from, to }),
            }
        }
    }
}

/// The job's guard (`None`: absent, the job is not exclusive).
async fn read_guard(store: &EtcdStore, job: &str) -> Result<Option<Guard>, StoreError> {
    let mut kv = store.client.kv_client();
    let response = bounded(store.timeout(), "get guard", kv.get(store.guard_key(job), None)).await?;
    response
        .kvs()
        .first()
        .map(|kv| {
            Guard::decode(kv.value()).map_err(|error| StoreError::InvalidGuard { job: job.to_owned(), error })
        })
        .transpose()
}

/// Steps 3 and 4: waits for the recall of `from` for `to`, then grants `to`. `Some(when
/// the grant was answered)`, or `None` when the holds did not allow it in time.
async fn complete(
    store: &EtcdStore,
    leadership: &Leadership,
    term: &EtcdTerm,
    from: u64,
    to: u64,
) -> Result<Option<Instant>, StoreError> {
    let job = leadership.job();
    let guard = Guard::Recalling { from, to };
    let mut blocking = HashSet::new();
    let limit = store.config.recall_timeout;
    let recalled = tokio::select! {
        // Biased: a lost term ends the wait first (the grant would be refused).
        biased;
        () = leadership.lost() => return Err(StoreError::NotLeader),
        waited = tokio::time::timeout(limit, wait_for_holds(store, job, guard, &mut blocking)) => waited.is_ok(),
    };
    if !recalled {
        let named: Vec<String> =
            blocking.iter().take(LOGGED_HOLDS).map(|k| String::from_utf8_lossy(k).into_owned()).collect();
        tracing::warn!(
            job,
            from,
            to,
            holds = blocking.len(),
            ?named,
            ?limit,
            "exclusive: recall not done in time"
        );
        return Ok(None);
    }
    grant(store, job, term, from, to).await.map(Some)
}

/// Step 4: `granted to`, if the term holds and the guard is still `recalling from to`.
async fn grant(
    store: &EtcdStore,
    job: &str,
    term: &EtcdTerm,
    from: u64,
    to: u64,
) -> Result<Instant, StoreError> {
    let guard_key = store.guard_key(job);
    let mut when =
        vec![Compare::value(guard_key.clone(), CompareOp::Equal, Guard::Recalling { from, to }.encode())];
    when.extend(fence(term));
    let txn = Txn::new()
        .when(when)
        .and_then([TxnOp::put(guard_key, Guard::Granted(to).encode(), None)])
        .or_else([TxnOp::get(term.leader_key(), None)]);
    let mut kv = store.client.kv_client();
    let response = bounded(store.timeout(), "grant transaction", kv.txn(txn)).await?;
    if response.succeeded() {
        tracing::debug!(job, from, to, "exclusive: granted");
        return Ok(Instant::now());
    }
    Err(if still_leads(got(&response, 0).as_ref(), term) {
        StoreError::Conflict
    } else {
        StoreError::NotLeader
    })
}

/// Waits until no hold under the job's prefix blocks the recall `guard`; `blocking` holds
/// the keys of those that do (kept by the caller, to name them if it gives up). Never
/// returns otherwise: the caller bounds it.
async fn wait_for_holds(store: &EtcdStore, job: &str, guard: Guard, blocking: &mut HashSet<Vec<u8>>) {
    let prefix = store.holds_prefix(job);
    let mut failures = 0u32;
    loop {
        if failures > 0 {
            let pause = FIRST_RETRY * 2u32.pow((failures - 1).min(5));
            tokio::time::sleep(pause.min(MAX_RETRY)).await;
        }
        failures += 1;
        let mut kv = store.client.kv_client();
        let read = kv.get(prefix.as_str(), Some(GetOptions::new().with_prefix()));
        let response = match bounded(store.timeout(), "get holds", read).await {
            Ok(response) => response,
            Err(error) => {
                tracing::warn!(job, %error, "exclusive: cannot read the holds");
                continue;
            }
        };
        blocking.clear();
        for kv in response.kvs() {
            if blocks(job, guard, kv.key(), kv.value()) {
                blocking.insert(kv.key().to_vec());
            }
        }
        if blocking.is_empty() {
            return;
        }
        // Everything after the read, so that no change between the two is missed.
        let from = response.header().map_or(0, |h| h.revision()) + 1;
        let options = WatchOptions::new().with_prefix().with_start_revision(from);
        let mut watch = store.client.watch_client();
        let mut stream = match bounded(
            store.timeout(),
            "watch holds",
            watch.watch(prefix.as_str(), Some(options)),
        )
        .await
        {
            Ok(stream) => stream,
            Err(error) => {
                tracing::warn!(job, %error, "exclusive: cannot watch the holds");
                continue;
            }
        };
        tracing::debug!(job, %guard, holds = blocking.len(), from, "exclusive: waiting for holds");
        loop {
            let response = match stream.message().await {
                Ok(Some(response)) if !response.canceled() => response,
                // Ended, failed or cancelled (a compacted revision too): read again.
                _ => break,
            };
            failures = 0;
            for event in response.events() {
                let Some(kv) = event.kv() else { continue };
                match event.event_type() {
                    EventType::Put if blocks(job, guard, kv.key(), kv.value()) => {
                        blocking.insert(kv.key().to_vec());
                    }
                    EventType::Put | EventType::Delete => {
                        blocking.remove(kv.key());
                    }
                }
            }
            if blocking.is_empty() {
                return;
            }
        }
        tracing::warn!(job, "exclusive: the watch of the holds ended: reading again");
    }
}

/// Whether the hold stored at `key` keeps `guard`'s recall from completing: every hold
/// but `bridge G1 G2` does, and so does a value that is not a hold (logged).
fn blocks(job: &str, guard: Guard, key: &[u8], value: &[u8]) -> bool {
    match Hold::decode(value) {
        Ok(hold) => !guard.recall_done_with(hold),
        Err(error) => {
            let key = String::from_utf8_lossy(key);
            tracing::warn!(job, %key, %error, "exclusive: a hold that does not decode blocks the recall");
            true
        }
    }
}
