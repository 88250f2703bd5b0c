//! Following the spec keys with an etcd watch that survives errors: a listing, then the
//! watch from the revision after it; after an error, a listing again.

use std::collections::VecDeque;

use etcd_client::{EventType, WatchOptions, WatchStream};

use super::{bounded, EtcdSpecs, MAX_RESPONSE_BYTES};
use crate::specs::in_force::{InForce, SpecItem};
use crate::specs::{SpecChange, SpecStoreError, SpecWatch};

/// The state of one watch between items.
struct Follower {
    specs: EtcdSpecs,
    in_force: InForce,
    /// No listing has succeeded yet: the next one's items start with `Current`.
    first: bool,
    /// The revision to watch from: the one after the last seen. `None`: list first (at
    /// the start, and after any error: a compacted revision, a connection lost).
    from: Option<i64>,
    stream: Option<WatchStream>,
    ready: VecDeque<SpecItem>,
    failures: u32,
    /// The size of the last listing refused as too large, so it is said once.
    refused_listing: Option<usize>,
}

/// The watch of `specs`' keys.
pub(super) fn follow(specs: EtcdSpecs) -> SpecWatch {
    let follower = Follower {
        specs,
        in_force: InForce::default(),
        first: true,
        from: None,
        stream: None,
        ready: VecDeque::new(),
        failures: 0,
        refused_listing: None,
    };
    SpecWatch::new(futures_util::stream::unfold(follower, |mut f| async move {
        loop {
            if let Some(item) = f.ready.pop_front() {
                return Some((item, f));
            }
            if f.stream.is_none() {
                if f.failures > 0 {
                    tokio::time::sleep(steady_etcd::watch_backoff(f.failures)).await;
                }
                if let Err(error) = f.open().await {
                    f.failures += 1;
                    match error {
                        SpecStoreError::TooManySpecs { found, .. } => {
                            if f.refused_listing.replace(found) != Some(found) {
                                f.ready.push_back(Err(error));
                            }
                        }
                        error => {
                            tracing::warn!(%error, failures = f.failures, "spec watch: cannot watch etcd")
                        }
                    }
                    continue;
                }
            }
            f.next_response().await;
        }
    }))
}

impl Follower {
    /// Lists the specs if needed (queueing what changed), then opens the watch from the
    /// revision after the listing.
    async fn open(&mut self) -> Result<(), SpecStoreError> {
        let from = match self.from {
            Some(from) => from,
            None => {
                let mut listing = self.in_force.listing();
                let listed = self
                    .specs
                    .list_pages(|job, revision, value| {
                        let fingerprint = revision as u64;
                        match job {
                            Ok(job) => listing.offer(&job, fingerprint, value),
                            Err((name, error)) => listing.offer_refused(&name, fingerprint, error),
                        }
                    })
                    .await;
                let read_at = match listed {
                    Ok(read_at) => read_at,
                    Err(error) => {
                        let items = listing.abandon(self.first);
                        self.ready.extend(items);
                        return Err(error);
                    }
                };
                self.refused_listing = None;
                let mut items = listing.finish(std::mem::take(&mut self.first));
                let refused: Vec<String> = items
                    .iter()
                    .filter_map(|item| match item {
                        Err(SpecStoreError::Rejected(r)) if !self.in_force.has(&r.job) => Some(r.job.clone()),
                        _ => None,
                    })
                    .collect();
                // A job whose value is bad and that has no spec in force here (this watch
                // started after the value went bad): the last good one in the key's
                // history, as the watches that saw it have in force; in the first
                // listing's `Current`, so that the set of jobs is whole from the start.
                for job in refused {
                    let Some((_, config)) = self.specs.last_good(&job, read_at + 1).await else {
                        tracing::warn!(
                            job,
                            "spec watch: a bad value and no good one in its history: not served here"
                        );
                        continue;
                    };
                    match (items.first_mut(), self.in_force.recover(config)) {
                        (Some(Ok(SpecChange::Current(jobs))), Some(Ok(SpecChange::Put(config)))) => {
                            let at = jobs.partition_point(|c| c.job < config.job);
                            jobs.insert(at, config);
                        }
                        (_, recovered) => items.extend(recovered),
                    }
                }
                self.ready.extend(items);
                // The listing's revision is the store's as of the read: watching from the
                // next one misses nothing written after it.
                *self.from.insert(read_at + 1)
            }
        };
        let options = WatchOptions::new().with_prefix().with_start_revision(from);
        let mut watch = self.specs.client.watch_client().max_decoding_message_size(MAX_RESPONSE_BYTES);
        let timeout = self.specs.timeout;
        let stream =
            bounded(timeout, "spec watch", watch.watch(self.specs.prefix.as_str(), Some(options))).await?;
        tracing::debug!(prefix = %self.specs.prefix, from, "spec watch: watching etcd");
        self.stream = Some(stream);
        Ok(())
    }

    /// Waits for the watch's next response and queues what it carries; on an error or
    /// the end of the stream, drops it, to list again.
    async fn next_response(&mut self) {
        let Some(stream) = self.stream.as_mut() else { return };
        let response = match stream.message().await {
            Ok(Some(response)) if !response.canceled() => response,
            outcome => {
                // Ended, failed, or cancelled (a compacted start revision among the
                // causes): list again, which also says what changed meanwhile.
                let compacted =
                    outcome.as_ref().ok().and_then(Option::as_ref).map_or(0, |r| r.compact_revision());
                tracing::warn!(prefix = %self.specs.prefix, compacted, "spec watch: etcd watch ended: listing again");
                self.stream = None;
                self.from = None;
                self.failures += 1;
                return;
            }
        };
        self.failures = 0;
        for event in response.events() {
            let Some(kv) = event.kv() else { continue };
            self.from = Some(kv.mod_revision() + 1);
            let job = self.specs.job_of(kv.key());
            let item = match (event.event_type(), job) {
                (EventType::Put, Ok(job)) => self.in_force.offer(&job, kv.mod_revision() as u64, kv.value()),
                (EventType::Put, Err((name, error))) => {
                    self.in_force.offer_refused(&name, kv.mod_revision() as u64, error)
                }
                (EventType::Delete, Ok(job)) => self.in_force.remove(&job),
                (EventType::Delete, Err(_)) => None,
            };
            self.ready.extend(item);
        }
    }
}
