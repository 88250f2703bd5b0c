//! [`watch_job`]: a job's view, following its prefix with an etcd watch that survives
//! errors.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, EventType, GetOptions, KeyValue, WatchOptions, WatchStream};
use steady_core::{JobView, Task};
use tokio::sync::watch;

use super::record::{index_of, TaskRecord};
use super::{bounded, check_job, Registry, RegistryError, MAX_TASKS};
use crate::source::Discovery;

/// What a job watch has done so far; cheap to clone (clones share the counts).
#[derive(Clone, Default)]
pub struct WatchCounters(Arc<Counts>);

#[derive(Default)]
struct Counts {
    events: AtomicU64,
    views: AtomicU64,
    rejected: AtomicU64,
    errors: AtomicU64,
    reads: AtomicU64,
}

/// A snapshot of a [`WatchCounters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WatchCounts {
    /// etcd events (puts and deletes of task keys) applied.
    pub events: u64,
    /// Views published (each a change; the first read's view included).
    pub views: u64,
    /// Keys or values rejected: a key that is not a task index below
    /// [`MAX_TASKS`](super::MAX_TASKS), or a value that is not a
    /// [`TaskRecord`](super::TaskRecord). The task is treated as absent.
    pub rejected: u64,
    /// Failed reads, failed watch openings, and watch streams that ended or were
    /// cancelled.
    pub errors: u64,
    /// Whole reads of the prefix: the first, and one after each compaction that
    /// overtook the watch.
    pub reads: u64,
}

impl WatchCounters {
    /// The counts now.
    pub fn get(&self) -> WatchCounts {
        let c = &self.0;
        WatchCounts {
            events: c.events.load(Ordering::Relaxed),
            views: c.views.load(Ordering::Relaxed),
            rejected: c.rejected.load(Ordering::Relaxed),
            errors: c.errors.load(Ordering::Relaxed),
            reads: c.reads.load(Ordering::Relaxed),
        }
    }

    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

impl fmt::Debug for WatchCounters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.get().fmt(f)
    }
}

/// The view of `job` from the registry, following its task keys.
///
/// The first view is the job's keys as read before this returns; after that a task of
/// its own watches the prefix from the next revision, so nothing written between the
/// read and the watch is missed, and publishes one new view per etcd watch response
/// that changes anything (several events in one response make one view). Each view's
/// size is the highest index present plus one; indices with no key (holes) are absent
/// from it, and draining tasks are [`TaskState::Draining`](crate::TaskState::Draining).
/// A task whose record has a zone field carries it as its
/// [`Task::locality`](steady_core::Task::locality), so the view's
/// [`JobView::zones`] and [`JobView::zone_sizes`] follow the job's zones (a frontend job's
/// zone sizes are what a zone-aware frontend hands its balancer); a record without one
/// is a task in no zone. The job's zone keys (`P J /zones/`) are outside the watched
/// prefix.
///
/// # Failures
///
/// * A watch that fails or ends is opened again from the revision after the last one
///   seen, after a backoff (50 ms doubling to 2 s, reset by the next response); the
///   last view stays in force meanwhile. If that revision was compacted away, the prefix
///   is read again in full.
/// * A key that is not a task index below [`MAX_TASKS`], or a value that is not a
///   [`TaskRecord`](super::TaskRecord), is skipped (its task is absent) and counted;
///   see [`watch_job_counted`].
///
/// Dropping the [`Discovery`] stops the task.
///
/// # Errors
///
/// [`RegistryError::InvalidArgument`] for a bad job name; [`RegistryError::Unavailable`]
/// when the first read fails (nothing is spawned).
pub async fn watch_job(registry: &Registry, job: &str) -> Result<Discovery, RegistryError> {
    watch_job_counted(registry, job).await.map(|(discovery, _)| discovery)
}

/// [`watch_job`], with the counts of what the watch does.
///
/// # Errors
///
/// As [`watch_job`].
pub async fn watch_job_counted(
    registry: &Registry,
    job: &str,
) -> Result<(Discovery, WatchCounters), RegistryError> {
    check_job(job)?;
    let counters = WatchCounters::default();
    let (views, receiver) = watch::channel(JobView::default());
    let mut follower = JobFollower {
        client: registry.client.clone(),
        job: job.to_owned(),
        prefix: registry.tasks_prefix(job),
        timeout: registry.timeout(),
        tasks: BTreeMap::new(),
        from: 0,
        counters: counters.clone(),
        views,
    };
    follower.read().await?;
    follower.publish();
    // The first view is the one in force, not news: receivers cloned from this one
    // wait for the next change.
    let mut receiver = receiver;
    receiver.borrow_and_update();
    let task = tokio::spawn(follower.run());
    Ok((Discovery::spawned(receiver, task), counters))
}

/// The state of one job watch: the tasks as last seen, and where to resume.
struct JobFollower {
    client: Client,
    job: String,
    prefix: String,
    timeout: Duration,
    tasks: BTreeMap<usize, Task<String>>,
    /// The revision to watch from: the one after the last seen.
    from: i64,
    counters: WatchCounters,
    views: watch::Sender<JobView<String>>,
}

impl JobFollower {
    /// Watches (and re-reads when needed) for ever; ends only when aborted.
    async fn run(mut self) {
        let mut stream: Option<WatchStream> = None;
        let mut must_read = false;
        let mut failures: u32 = 0;
        loop {
            if stream.is_none() {
                if failures > 0 {
                    tokio::time::sleep(steady_etcd::watch_backoff(failures)).await;
                }
                match self.open(must_read).await {
                    Ok(opened) => (stream, must_read) = (Some(opened), false),
                    Err(error) => {
                        failures += 1;
                        WatchCounters::add(&self.counters.0.errors, 1);
                        tracing::warn!(job = %self.job, %error, failures, "registry watch: cannot watch etcd");
                        continue;
                    }
                }
            }
            let Some(open) = stream.as_mut() else { continue };
            let response = match open.message().await {
                Ok(Some(response)) => response,
                Ok(None) | Err(_) => {
                    tracing::warn!(job = %self.job, from = self.from, "registry watch: etcd watch ended; watching again");
                    (stream, failures) = (None, failures + 1);
                    WatchCounters::add(&self.counters.0.errors, 1);
                    continue;
                }
            };
            if response.canceled() {
                if response.compact_revision() > 0 {
                    // Our start revision is gone: read the whole prefix again.
                    tracing::warn!(job = %self.job, compacted = response.compact_revision(), "registry watch: revision compacted; reading again");
                    must_read = true;
                }
                (stream, failures) = (None, failures + 1);
                WatchCounters::add(&self.counters.0.errors, 1);
                continue;
            }
            failures = 0;
            for event in response.events() {
                let Some(kv) = event.kv() else { continue };
                self.from = self.from.max(kv.mod_revision() + 1);
                match event.event_type() {
                    EventType::Put => self.apply_put(kv),
                    EventType::Delete => self.apply_delete(kv),
                }
            }
            WatchCounters::add(&self.counters.0.events, response.events().len() as u64);
            self.publish();
        }
    }

    /// Reads the prefix first if `must_read`, then opens the watch from [`Self::from`].
    async fn open(&mut self, must_read: bool) -> Result<WatchStream, RegistryError> {
        if must_read {
            self.read().await?;
            self.publish();
        }
        let options = WatchOptions::new().with_prefix().with_start_revision(self.from);
        let mut watch = self.client.watch_client();
        let stream = bounded(self.timeout, "watch", watch.watch(self.prefix.as_str(), Some(options))).await?;
        tracing::debug!(job = %self.job, from = self.from, "registry watch: watching etcd");
        Ok(stream)
    }

    /// Replaces the tasks with the prefix's keys as they are now (at most
    /// [`MAX_TASKS`] of them), and resumes after the read's revision.
    async fn read(&mut self) -> Result<(), RegistryError> {
        let options = GetOptions::new().with_prefix().with_limit(MAX_TASKS as i64);
        let mut kv = self.client.kv_client();
        let response = bounded(self.timeout, "get", kv.get(self.prefix.as_str(), Some(options))).await?;
        WatchCounters::add(&self.counters.0.reads, 1);
        self.tasks.clear();
        for kv in response.kvs() {
            self.apply_put(kv);
        }
        let unread = (response.count() as u64).saturating_sub(response.kvs().len() as u64);
        if unread > 0 {
            tracing::warn!(job = %self.job, unread, "registry watch: more keys than MAX_TASKS; the rest are ignored");
            WatchCounters::add(&self.counters.0.rejected, unread);
        }
        // The header's revision is the store's as of the read: watching from the next
        // one misses nothing written after it.
        self.from = response.header().map_or(0, |h| h.revision()) + 1;
        Ok(())
    }

    fn apply_put(&mut self, kv: &KeyValue) {
        let Some(index) = self.index_of(kv) else { return };
        match TaskRecord::decode(kv.value()) {
            Ok(record) => {
                let task = Task { address: record.address, state: record.state, locality: record.locality };
                self.tasks.insert(index, task);
            }
            Err(error) => {
                tracing::warn!(job = %self.job, index, %error, "registry watch: bad value; the task is skipped");
                WatchCounters::add(&self.counters.0.rejected, 1);
                self.tasks.remove(&index);
            }
        }
    }

    fn apply_delete(&mut self, kv: &KeyValue) {
        if let Some(index) = self.index_of(kv) {
            self.tasks.remove(&index);
        }
    }

    /// The index a key names, or `None` (counted) for a key under the prefix that is
    /// not a task below [`MAX_TASKS`].
    fn index_of(&self, kv: &KeyValue) -> Option<usize> {
        let index = kv.key().get(self.prefix.len()..).and_then(|segment| index_of(segment, MAX_TASKS));
        if index.is_none() {
            tracing::warn!(job = %self.job, key = %String::from_utf8_lossy(kv.key()), "registry watch: not a task key");
            WatchCounters::add(&self.counters.0.rejected, 1);
        }
        index
    }

    /// Publishes the tasks as a view if it differs from the one in force.
    fn publish(&self) {
        let size = self.tasks.last_key_value().map_or(0, |(i, _)| i + 1);
        let view = JobView { size, tasks: Arc::new(self.tasks.clone()) };
        let changed = self.views.send_if_modified(|current| {
            if *current == view {
                return false;
            }
            *current = view;
            // Counted before receivers are woken, so that one who sees the view sees
            // the count.
            WatchCounters::add(&self.counters.0.views, 1);
            true
        });
        if changed {
            tracing::debug!(job = %self.job, size, tasks = self.tasks.len(), "registry watch: new view");
        }
    }
}
