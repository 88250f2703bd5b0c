//! Each watched job's current generation as A119 responses, encoded once for every
//! stream that sends it (and again only if the job's endpoint names change).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use steady_proto::autosharding::chunks::encoded_responses;

use super::names::{EndpointNames, JobNames};
use crate::distributor::Subscription;

/// One generation's responses: its chunks, then its metadata, each message encoded.
#[derive(Debug, Clone)]
struct Encoded {
    generation: u64,
    /// The names it was encoded with.
    names: JobNames,
    responses: Arc<[Bytes]>,
}

/// The encoded generations of the jobs that have A119 streams: one entry per such job,
/// holding its latest encoded generation only, dropped with the job's last stream. So it
/// holds at most one generation per watched job, and the jobs one may watch are bounded
/// by the Distributor's limits.
#[derive(Debug, Default)]
pub(crate) struct Generations {
    jobs: Mutex<HashMap<String, Entry>>,
    /// Generations encoded so far, over all jobs.
    encodings: AtomicU64,
}

#[derive(Debug)]
struct Entry {
    streams: usize,
    held: Arc<Held>,
}

/// A job's encoded generation, shared by its streams.
#[derive(Debug, Default)]
struct Held {
    /// The newest generation encoded.
    current: Mutex<Option<Encoded>>,
    /// Locked while a generation is encoded, so that the streams that find it stale at
    /// once wait for that one encoding instead of each making their own.
    encoding: tokio::sync::Mutex<()>,
}

impl Held {
    /// The generation held, if it is newer than `generation`, or `generation` itself
    /// encoded with `names`.
    fn at_least(&self, generation: u64, names: &JobNames) -> Option<Encoded> {
        let current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        current
            .as_ref()
            .filter(|held| {
                held.generation > generation || (held.generation == generation && held.names.same(names))
            })
            .cloned()
    }
}

impl Generations {
    /// Joins `job`'s entry (adding it for the job's first stream); the slot leaves it
    /// when dropped.
    pub(crate) fn join(self: &Arc<Self>, job: &str) -> Slot {
        let mut jobs = self.lock();
        let entry = jobs.entry(job.to_owned()).or_insert_with(|| Entry { streams: 0, held: Arc::default() });
        entry.streams += 1;
        Slot { job: job.to_owned(), held: entry.held.clone(), generations: self.clone() }
    }

    /// Generations encoded so far.
    pub(crate) fn encodings(&self) -> u64 {
        self.encodings.load(Ordering::Relaxed)
    }

    /// How many jobs have an entry now.
    pub(crate) fn jobs(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One stream's place in a job's entry.
#[derive(Debug)]
pub(crate) struct Slot {
    job: String,
    held: Arc<Held>,
    generations: Arc<Generations>,
}

impl Slot {
    /// The responses of the job's newest assignment in `subscription` (marked seen),
    /// encoded with the job's `names` as they are now unless the entry holds that
    /// generation encoded with those names already; `None` while nothing is published.
    pub(crate) async fn newest(
        &self,
        subscription: &mut Subscription,
        names: &EndpointNames,
        max_chunk_bytes: usize,
    ) -> Option<(u64, Arc<[Bytes]>)> {
        // Locked before the assignment is read: streams that saw the same new generation
        // wait here for the first one's encoding, then find it held.
        let newest = subscription.updates().borrow_and_update().as_ref()?.assignment.generation();
        if let Some(held) = self.held.at_least(newest, &names.of(&self.job)) {
            return Some((held.generation, held.responses));
        }
        // Encoded by the first stream here; the others wait for it, then find it held.
        let _encoding = self.held.encoding.lock().await;
        // The assignment is cloned out of the Distributor's channel to be encoded: the
        // channel's lock (which the Distributor's publish waits for) is not held for it.
        // Names that are coming are waited for (bounded): a client sent this generation
        // keeps its names until the next one.
        names.settled(&self.job, super::names::NAMES_WAIT).await;
        let names = names.of(&self.job);
        let assignment = {
            let published = subscription.updates().borrow_and_update();
            let assignment = &published.as_ref()?.assignment;
            if let Some(held) = self.held.at_least(assignment.generation(), &names) {
                return Some((held.generation, held.responses));
            }
            assignment.clone()
        };
        let responses: Arc<[Bytes]> =
            encoded_responses(&assignment, |task| names.name(task), max_chunk_bytes).into();
        let generation = assignment.generation();
        self.generations.encodings.fetch_add(1, Ordering::Relaxed);
        let encoded = Encoded { generation, names, responses: responses.clone() };
        *self.held.current.lock().unwrap_or_else(|p| p.into_inner()) = Some(encoded);
        Some((generation, responses))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut jobs = self.generations.lock();
        if let Some(entry) = jobs.get_mut(&self.job) {
            entry.streams -= 1;
            if entry.streams == 0 {
                jobs.remove(&self.job);
            }
        }
    }
}
