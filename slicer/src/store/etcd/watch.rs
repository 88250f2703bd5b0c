//! Following a job's assignment key with an etcd watch that survives errors.

use std::collections::VecDeque;
use std::time::Duration;

use etcd_client::{Client, EventType, WatchOptions, WatchStream};
use steady_slice::Assignment;

use super::bounded;
use crate::store::{decode_value, AssignmentWatch, RejectedValue, Revision};

/// The state of one watch between items.
struct Follower {
    client: Client,
    job: String,
    key: String,
    known: u64,
    /// The revision to watch from: the one after the last seen. `None`: read the key
    /// first (at the start, and after the revision was compacted away).
    from: Option<i64>,
    stream: Option<WatchStream>,
    /// Items found and not yet handed out (one etcd response may carry several events).
    ready: VecDeque<Result<Assignment, RejectedValue>>,
    failures: u32,
    timeout: Duration,
}

/// The watch of `key` (job `job`'s assignment) for generations above `known`.
pub(super) fn follow(
    client: Client,
    job: &str,
    key: String,
    known: u64,
    timeout: Duration,
) -> AssignmentWatch {
    let follower = Follower {
        client,
        job: job.to_owned(),
        key,
        known,
        from: None,
        stream: None,
        ready: VecDeque::new(),
        failures: 0,
        timeout,
    };
    AssignmentWatch::new(futures_util::stream::unfold(follower, |mut f| async move {
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
                    tracing::warn!(job = %f.job, %error, failures = f.failures, "store watch: cannot watch etcd");
                    continue;
                }
            }
            f.next_response().await;
        }
    }))
}

impl Follower {
    /// Reads the key if needed, then opens the watch from the revision after it.
    async fn open(&mut self) -> Result<(), crate::store::StoreError> {
        let from = match self.from {
            Some(from) => from,
            None => {
                let mut kv = self.client.kv_client();
                let response = bounded(self.timeout, "get", kv.get(self.key.as_str(), None)).await?;
                if let Some(kv) = response.kvs().first() {
                    self.offer(kv.mod_revision(), kv.value());
                }
                // The header's revision is the store's as of the read: watching from the
                // next one misses nothing written after it.
                let read_at = response.header().map_or(0, |h| h.revision());
                *self.from.insert(read_at + 1)
            }
        };
        let options = WatchOptions::new().with_start_revision(from);
        let mut watch = self.client.watch_client();
        let stream = bounded(self.timeout, "watch", watch.watch(self.key.as_str(), Some(options))).await?;
        tracing::debug!(job = %self.job, from, "store watch: watching etcd");
        self.stream = Some(stream);
        Ok(())
    }

    /// Waits for the watch's next response and queues what it carries; on an error or the
    /// end of the stream, drops it to be opened again.
    async fn next_response(&mut self) {
        let Some(stream) = self.stream.as_mut() else { return };
        let response = match stream.message().await {
            Ok(Some(response)) => response,
            Ok(None) | Err(_) => {
                tracing::warn!(job = %self.job, "store watch: etcd watch ended: watching again");
                self.stream = None;
                self.failures += 1;
                return;
            }
        };
        if response.canceled() {
            if response.compact_revision() > 0 {
                // Our start revision is gone: read the newest value again.
                tracing::warn!(job = %self.job, compacted = response.compact_revision(), "store watch: revision compacted");
                self.from = None;
            }
            self.stream = None;
            self.failures += 1;
            return;
        }
        self.failures = 0;
        for event in response.events() {
            let Some(kv) = event.kv() else { continue };
            self.from = Some(kv.mod_revision() + 1);
            match event.event_type() {
                EventType::Put => {
                    let value = kv.value().to_vec();
                    self.offer(kv.mod_revision(), &value);
                }
                EventType::Delete => {
                    tracing::warn!(job = %self.job, "store watch: assignment key deleted; the last good one stays");
                }
            }
        }
    }

    /// Queues a stored value: a newer generation, or a rejection.
    fn offer(&mut self, revision: i64, value: &[u8]) {
        match decode_value(value) {
            Ok(a) if a.generation() > self.known => {
                self.known = a.generation();
                self.ready.push_back(Ok(a));
            }
            Ok(_) => {}
            Err(error) => {
                self.ready.push_back(Err(RejectedValue { revision: Revision::new(revision), error }))
            }
        }
    }
}
