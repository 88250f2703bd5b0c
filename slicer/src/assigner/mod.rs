//! The Assigner service: one job's loop that turns load reports into assignments,
//! stores each new generation and hands it to the Distributor (Slicer's Assigner, in our
//! words; DESIGN §6 and §7).
//!
//! ```text
//! campaign for the job in the store ──► leader
//!   loop: wait for the cadence, or a task-set change (at once), or the term to end
//!         load  = estimate(fresh reports in the LoadBook)
//!         next  = assigner.assign(previous, tasks, load)      (steady-assigner)
//!         unchanged? publish nothing
//!         store.write(leadership, snapshot, next)              (fenced, conditioned)
//!           ok        ► Distributor.publish, LoadBook.published
//!           conflict  ► re-read the store, run again
//!           not leader► back to campaigning
//! ```
//!
//! # Contracts
//!
//! * **Never an invalid or unchanged assignment**: assigners only build valid ones, an
//!   unchanged run publishes nothing, and the store refuses a generation that is not
//!   newer.
//! * **Rate-limited**: two publications are at least [`AssignerConfig::min_interval`]
//!   apart, whatever the cadence and however often the task set changes.
//! * **One writer**: only the store's elected leader writes; a deposed one finds out
//!   from the store (fenced write) or from its lease, and campaigns again.
//! * **Stale reports are ignored**: a run sees only reports younger than
//!   [`AssignerConfig::stale_after`]; with none, the load is taken as uniform (see
//!   [`estimate()`]).
//! * **Never dies**: store errors are logged and retried with backoff; the loop ends
//!   only when its [`AssignerHandle`] is stopped or dropped.

mod estimate;

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use steady_assigner::{Assigner, ReplicaLimits, RunInput, Tasks};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub use estimate::estimate;

use crate::load::LoadBook;
use crate::store::{AssignmentStore, Leadership, Snapshot, StoreError};
use crate::Distributor;

/// How an Assigner service runs.
#[derive(Debug, Clone)]
pub struct AssignerConfig {
    /// Time between runs when nothing else happens (default 10 s).
    pub cadence: Duration,
    /// The least time between two publications (default 1 s).
    pub min_interval: Duration,
    /// Reports older than this are ignored (default 30 s).
    pub stale_after: Duration,
    /// Replicas per slice (default one).
    pub replicas: ReplicaLimits,
    /// The backoff after a store error, doubled up to 16 times this (default 100 ms).
    pub backoff: Duration,
}

impl Default for AssignerConfig {
    fn default() -> Self {
        Self {
            cadence: Duration::from_secs(10),
            min_interval: Duration::from_secs(1),
            stale_after: Duration::from_secs(30),
            replicas: ReplicaLimits::default(),
            backoff: Duration::from_millis(100),
        }
    }
}

/// What an Assigner service has done, for tests, logs and the demo.
#[derive(Debug, Default)]
pub struct AssignerStats {
    terms: AtomicU64,
    runs: AtomicU64,
    published: AtomicU64,
    conflicts: AtomicU64,
    errors: AtomicU64,
    generation: AtomicU64,
}

impl AssignerStats {
    /// Times this service became the job's leader.
    pub fn terms(&self) -> u64 {
        self.terms.load(Ordering::Relaxed)
    }
    /// Assigner runs.
    pub fn runs(&self) -> u64 {
        self.runs.load(Ordering::Relaxed)
    }
    /// Generations written and handed to the Distributor.
    pub fn published(&self) -> u64 {
        self.published.load(Ordering::Relaxed)
    }
    /// Writes that lost a race (then re-read and retried).
    pub fn conflicts(&self) -> u64 {
        self.conflicts.load(Ordering::Relaxed)
    }
    /// Store and assigner errors (each retried after a backoff).
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }
    /// The last generation this service published (0: none).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }
}

/// One job's Assigner: see the module documentation. Build it, then [`spawn`] it.
///
/// [`spawn`]: AssignerService::spawn
pub struct AssignerService {
    job: String,
    candidate: String,
    assigner: Arc<dyn Assigner + Send + Sync>,
    store: Arc<dyn AssignmentStore>,
    distributor: Distributor,
    book: LoadBook,
    config: AssignerConfig,
}

impl fmt::Debug for AssignerService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AssignerService")
            .field("job", &self.job)
            .field("candidate", &self.candidate)
            .field("assigner", &self.assigner.name())
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// A running Assigner service. Dropping it stops the service and resigns its term, so
/// a standby leads at once.
#[derive(Debug)]
pub struct AssignerHandle {
    stats: Arc<AssignerStats>,
    crash: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl AssignerHandle {
    /// What the service has done so far.
    pub fn stats(&self) -> &AssignerStats {
        &self.stats
    }

    /// Stops the service as a crash would: the term is not resigned but left to lapse
    /// (in etcd, a standby leads once the lease expires, within its TTL; the in-memory
    /// store has no lease and hands over at once). Returns when the service has stopped
    /// (at most after the store call in progress).
    pub async fn kill(mut self) {
        let _ = self.crash.send(true);
        let _ = (&mut self.task).await;
    }
}

impl Drop for AssignerHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl AssignerService {
    /// The Assigner of `job`, campaigning as `candidate` in `store`, publishing to
    /// `distributor`, reading reports from `book`.
    pub fn new(
        job: impl Into<String>,
        candidate: impl Into<String>,
        assigner: Arc<dyn Assigner + Send + Sync>,
        store: Arc<dyn AssignmentStore>,
        distributor: Distributor,
        book: LoadBook,
    ) -> Self {
        Self {
            job: job.into(),
            candidate: candidate.into(),
            assigner,
            store,
            distributor,
            book,
            config: AssignerConfig::default(),
        }
    }

    /// With `config`.
    pub fn config(mut self, config: AssignerConfig) -> Self {
        self.config = config;
        self
    }

    /// Runs the service on a task of its own, following the job's task set from
    /// `tasks` (a change triggers a run at once, within the rate limit).
    pub fn spawn(self, tasks: watch::Receiver<Tasks>) -> AssignerHandle {
        let stats = Arc::new(AssignerStats::default());
        let (crash, crashed) = watch::channel(false);
        let task = tokio::spawn(self.run(tasks, stats.clone(), crashed));
        AssignerHandle { stats, crash, task }
    }

    async fn run(
        self,
        mut tasks: watch::Receiver<Tasks>,
        stats: Arc<AssignerStats>,
        mut crashed: watch::Receiver<bool>,
    ) {
        let mut failures = 0u32;
        loop {
            let campaign = tokio::select! {
                c = self.store.campaign(&self.job, &self.candidate) => c,
                _ = crashed.wait_for(|&c| c) => return,
            };
            let leadership = match campaign {
                Ok(l) => l,
                Err(error) => {
                    tracing::warn!(%error, job = %self.job, "assigner: campaign failed");
                    self.back_off(&stats, &mut failures).await;
                    continue;
                }
            };
            stats.terms.fetch_add(1, Ordering::Relaxed);
            tracing::info!(job = %self.job, candidate = %self.candidate, "assigner: leading");
            let crash = tokio::select! {
                () = self.lead(&leadership, &mut tasks, &stats, &mut failures) => false,
                _ = crashed.wait_for(|&c| c) => true,
            };
            if crash {
                // Left to lapse, as a crashed process's term would be.
                leadership.stop_renewing();
                return;
            }
            tracing::info!(job = %self.job, candidate = %self.candidate, "assigner: term over");
        }
    }

    /// Runs the job while `leadership` holds.
    async fn lead(
        &self,
        leadership: &Leadership,
        tasks: &mut watch::Receiver<Tasks>,
        stats: &AssignerStats,
        failures: &mut u32,
    ) {
        let mut snapshot = None;
        let mut last_publication: Option<Instant> = None;
        loop {
            if !leadership.is_held() {
                return;
            }
            let current = match snapshot.take() {
                Some(s) => s,
                None => match self.store.read(&self.job).await {
                    Ok(s) => {
                        self.hand_out(&s, &tasks.borrow());
                        s
                    }
                    Err(error) => {
                        tracing::warn!(%error, job = %self.job, "assigner: store read failed");
                        self.back_off(stats, failures).await;
                        continue;
                    }
                },
            };
            if let Some(at) = last_publication {
                tokio::time::sleep_until(at + self.config.min_interval).await;
            }
            let view = tasks.borrow_and_update().clone();
            stats.runs.fetch_add(1, Ordering::Relaxed);
            match self.run_once(leadership, &current, &view).await {
                Ok(Some(written)) => {
                    *failures = 0;
                    stats.published.fetch_add(1, Ordering::Relaxed);
                    stats.generation.store(written.generation(), Ordering::Relaxed);
                    self.hand_out(&written, &view);
                    last_publication = Some(Instant::now());
                    snapshot = Some(written);
                }
                Ok(None) => snapshot = Some(current),
                Err(StoreError::Conflict) => {
                    stats.conflicts.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                Err(StoreError::NotLeader) => return,
                Err(error) => {
                    tracing::warn!(%error, job = %self.job, "assigner: run failed");
                    self.back_off(stats, failures).await;
                    continue;
                }
            }
            // Wait for the cadence, a task-set change or the end of the term.
            tokio::select! {
                () = tokio::time::sleep(self.config.cadence) => {}
                changed = tasks.changed() => {
                    if changed.is_err() {
                        // The task-set source is gone: keep the last view, run on cadence.
                        tokio::time::sleep(self.config.cadence).await;
                    }
                }
                () = leadership.lost() => return,
            }
        }
    }

    /// One assigner run on `current`; the written snapshot, or `None` when nothing
    /// changed.
    async fn run_once(
        &self,
        leadership: &Leadership,
        current: &Snapshot,
        tasks: &Tasks,
    ) -> Result<Option<Snapshot>, StoreError> {
        let serving = tasks.serving_ids();
        let fresh = self.book.fresh(&self.job, self.config.stale_after);
        let load = estimate(&fresh, current.assignment(), &serving);
        let input =
            RunInput { previous: current.assignment(), tasks, load: &load, replicas: self.config.replicas };
        let outcome = match self.assigner.assign(&input) {
            Ok(o) => o,
            Err(error) => {
                // No serving task, most likely: keep the assignment in force.
                tracing::warn!(%error, job = %self.job, "assigner: run refused its input");
                return Ok(None);
            }
        };
        if outcome.report.unchanged {
            return Ok(None);
        }
        tracing::debug!(job = %self.job, report = %outcome.report, "assigner: run");
        self.store.write(leadership, current, &outcome.assignment).await.map(Some)
    }

    /// Gives the assignment of `snapshot` to the Distributor and tells the LoadBook.
    fn hand_out(&self, snapshot: &Snapshot, tasks: &Tasks) {
        if let Some(a) = snapshot.assignment() {
            self.distributor.publish(&self.job, a.clone());
            let known =
                tasks.iter().map(|(t, _)| t).chain(a.slices().iter().flat_map(|s| s.replicas.clone()));
            self.book.published(&self.job, Arc::new(a.clone()), known.collect::<Vec<_>>());
        }
    }

    async fn back_off(&self, stats: &AssignerStats, failures: &mut u32) {
        stats.errors.fetch_add(1, Ordering::Relaxed);
        let factor = 1u32 << (*failures).min(4);
        *failures = failures.saturating_add(1);
        tokio::time::sleep(self.config.backoff * factor).await;
    }
}
