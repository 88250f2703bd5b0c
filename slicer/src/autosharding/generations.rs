//! Each watched job's current generation as A119 responses, encoded once for every
//! stream that sends it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use steady_proto::autosharding::chunks::encoded_responses;

use super::names::EndpointNames;
use crate::distributor::Subscription;

/// One generation's responses: its chunks, then its metadata, each message encoded.
#[derive(Debug)]
pub(crate) struct Encoded {
    pub(crate) generation: u64,
    pub(crate) responses: Arc<[Bytes]>,
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
    /// Locked while a generation is encoded, so that the streams that find it stale at
    /// once wait for that one encoding instead of each making their own.
    current: Arc<tokio::sync::Mutex<Option<Encoded>>>,
}

impl Generations {
    /// Joins `job`'s entry (adding it for the job's first stream); the slot leaves it
    /// when dropped.
    pub(crate) fn join(self: &Arc<Self>, job: &str) -> Slot {
        let mut jobs = self.lock();
        let entry =
            jobs.entry(job.to_owned()).or_insert_with(|| Entry { streams: 0, current: Arc::default() });
        entry.streams += 1;
        Slot { job: job.to_owned(), current: entry.current.clone(), generations: self.clone() }
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
    current: Arc<tokio::sync::Mutex<Option<Encoded>>>,
    generations: Arc<Generations>,
}

impl Slot {
    /// The responses of the job's newest assignment in `subscription` (marked seen),
    /// encoded with the job's `names` as they are now unless the entry holds that
    /// generation already; `None` while nothing is published.
    pub(crate) async fn newest(
        &self,
        subscription: &mut Subscription,
        names: &EndpointNames,
        max_chunk_bytes: usize,
    ) -> Option<(u64, Arc<[Bytes]>)> {
        // Locked before the assignment is read: streams that saw the same new generation
        // wait here for the first one's encoding, then find it held.
        let mut current = self.current.lock().await;
        let published = subscription.updates().borrow_and_update();
        let assignment = &published.as_ref()?.assignment;
        let generation = assignment.generation();
        match current.as_ref() {
            Some(held) if held.generation >= generation => Some((held.generation, held.responses.clone())),
            _ => {
                let names = names.of(&self.job);
                let responses: Arc<[Bytes]> =
                    encoded_responses(assignment, |task| names.name(task), max_chunk_bytes).into();
                drop(published);
                self.generations.encodings.fetch_add(1, Ordering::Relaxed);
                *current = Some(Encoded { generation, responses: responses.clone() });
                Some((generation, responses))
            }
        }
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
