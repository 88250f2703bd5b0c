//! The Assigner service: one job's loop that turns load reports into assignments,
//! stores each new generation and hands it to the Distributor (Slicer's Assigner, in our
//! words; see `docs/slicer.md`).
//!
//! ```text
//! campaign for the job in the store ──► leader
//!   loop: wait for the cadence, or a task-set change (at once), or the term to end
//!         load  = estimate(fresh Slicelet and client reports in the LoadBook)
//!         next  = assigner.assign(previous, tasks, load)      (steady-assigner)
//!         unchanged? publish nothing
//!         handover on and a range gains an owner?
//!           next = warming step (old owners serve, new ones warm); the switch to the
//!           run's assignment is written `handover` later, before any other run
//!         store.write(leadership, snapshot, next)              (fenced, conditioned)
//!           ok        ► Distributor.publish, LoadBook.published
//!           conflict  ► re-read the store, run again
//!           not leader► back to campaigning
//! ```
//!
//! In exclusive mode ([`AssignerConfig::consistency`], `docs/exclusive.md`) each loop
//! first settles a recall left pending (`store.settle`: at the start of every term and
//! before every run; a recall that cannot complete yet is backed off and retried, the term
//! checked all the while), and the write is `store.write_exclusive`: stored, recalled from
//! the Slicelets, granted. A recall it leaves pending is the next settle's.
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
//! * **Stale reports are ignored**: a run sees only reports (the Slicelets' and the
//!   clients') younger than [`AssignerConfig::stale_after`]; with none, the load is taken
//!   as uniform (see [`estimate()`]).
//! * **Never dies**: store errors and lost races are retried with backoff, a panicking
//!   assigner run is caught and counted (the assignment in force stays); the loop ends
//!   only when its [`AssignerHandle`] is stopped, killed or dropped.

mod config;
mod estimate;
mod stats;
mod tasks;

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use steady_assigner::{profile_tasks, warming_step, Assigner, Assignment, RunInput, Tasks};
use steady_slice::guard::Consistency;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub use config::{AssignerConfig, AssignerConfigError, MIN_BACKOFF, MIN_CADENCE};
pub use estimate::{client_load, estimate};
pub use stats::{AssignerStats, PlacementState, RunRecord};
pub use tasks::{follow_job, tasks_of};

use config::CONFLICTS_BEFORE_BACKOFF;

use crate::load::LoadBook;
use crate::store::{AssignmentStore, Leadership, Snapshot, StoreError};
use crate::Distributor;

/// The second step of a handover under way.
struct Switch {
    /// The run's assignment, to write once the warm-up is over.
    target: Assignment,
    /// When the warm-up is over.
    at: Instant,
    /// The task set the run saw: a different one at the switch calls for a run at once.
    seen: Tasks,
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

/// How a running service is asked to end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Signal {
    Run,
    /// Resign the term (a standby leads at once) and stop.
    Stop,
    /// Leave the term to lapse, as a crashed process would, and stop.
    Crash,
}

/// A running Assigner service. Dropping it aborts the service: the term's handle is
/// dropped, which asks the store to release it (in etcd, a revoke sent in the
/// background; [`AssignerHandle::stop`] waits for the resignation instead).
#[derive(Debug)]
pub struct AssignerHandle {
    stats: Arc<AssignerStats>,
    signal: watch::Sender<Signal>,
    task: JoinHandle<()>,
    /// Closed when the service's task ends, however it ends (its sender lives in the
    /// task's future): what [`AssignerHandle::ended`] waits for.
    alive: watch::Receiver<()>,
}

impl AssignerHandle {
    /// What the service has done so far.
    pub fn stats(&self) -> &AssignerStats {
        &self.stats
    }

    /// The same statistics, shared: they stay readable after the handle is gone (a
    /// status page, a metrics callback).
    pub fn shared_stats(&self) -> Arc<AssignerStats> {
        self.stats.clone()
    }

    /// Whether the service's task is still running (it ends only when stopped).
    pub fn is_running(&self) -> bool {
        !self.task.is_finished()
    }

    /// A future that completes once the service's task has ended (it ends only when
    /// stopped, or with its runtime; a panic in it ends it too): what a supervisor awaits
    /// rather than polling [`AssignerHandle::is_running`]. It does not borrow the handle,
    /// so it may be awaited across [`AssignerHandle::stop`]; any number may wait.
    pub fn ended(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut alive = self.alive.clone();
        async move { while alive.changed().await.is_ok() {} }
    }

    /// Stops the service and resigns its term, so that a standby leads at once;
    /// returns once the resignation is done (or failed: then the lease lapses).
    pub async fn stop(self) {
        self.end(Signal::Stop).await;
    }

    /// Stops the service as a crash would: the term is not resigned but left to lapse
    /// (in etcd, a standby leads once the lease expires, within its TTL; the in-memory
    /// store has no lease and hands over at once). Returns when the service has stopped.
    pub async fn kill(self) {
        self.end(Signal::Crash).await;
    }

    async fn end(mut self, signal: Signal) {
        let _ = self.signal.send(signal);
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
    ///
    /// # Errors
    ///
    /// As [`AssignerConfig::validate`]; also, naming `consistency`, exclusive mode with a
    /// store that does not have it (`AssignmentStore::supports_exclusive`: a
    /// [`crate::MemoryStore`] has no leases).
    pub fn config(mut self, config: AssignerConfig) -> Result<Self, AssignerConfigError> {
        config.validate()?;
        if config.consistency == Consistency::Exclusive && !self.store.supports_exclusive() {
            return Err(AssignerConfigError {
                field: "consistency",
                expected: "eventual with this store (exclusive mode needs a store with leases: etcd)",
            });
        }
        self.config = config;
        Ok(self)
    }

    /// Runs the service on a task of its own, following the job's task set from
    /// `tasks` (a change triggers a run at once, within the rate limit).
    pub fn spawn(self, tasks: watch::Receiver<Tasks>) -> AssignerHandle {
        let stats = Arc::new(AssignerStats::default());
        let (signal, signals) = watch::channel(Signal::Run);
        let (alive_tx, alive) = watch::channel(());
        let run = self.run(tasks, stats.clone(), signals);
        let task = tokio::spawn(async move {
            // Dropped with this future: when it completes, panics or is aborted.
            let _alive = alive_tx;
            run.await;
        });
        AssignerHandle { stats, signal, task, alive }
    }

    async fn run(
        self,
        mut tasks: watch::Receiver<Tasks>,
        stats: Arc<AssignerStats>,
        mut signals: watch::Receiver<Signal>,
    ) {
        let mut failures = 0u32;
        // Kept across terms: the rate limit holds however often leadership changes.
        let mut last_publication: Option<Instant> = None;
        loop {
            let campaign = tokio::select! {
                biased;
                _ = signals.wait_for(|&s| s != Signal::Run) => None,
                c = self.store.campaign(&self.job, &self.candidate) => Some(c),
            };
            let Some(campaign) = campaign else {
                // The campaign is dropped: a term it won unseen is released.
                if let Err(error) = self.store.release(&self.job).await {
                    tracing::warn!(%error, job = %self.job, "assigner: releasing an abandoned campaign failed");
                }
                return;
            };
            let leadership = match campaign {
                Ok(l) => l,
                Err(error) => {
                    tracing::warn!(%error, job = %self.job, "assigner: campaign failed");
                    tokio::select! {
                        biased;
                        _ = signals.wait_for(|&s| s != Signal::Run) => return,
                        () = self.back_off(&stats, &mut failures) => continue,
                    }
                }
            };
            stats.terms.fetch_add(1, Ordering::Relaxed);
            stats.leading.store(true, Ordering::Relaxed);
            tracing::info!(job = %self.job, candidate = %self.candidate, "assigner: leading");
            let signal = tokio::select! {
                biased;
                s = signals.wait_for(|&s| s != Signal::Run) => s.map_or(Signal::Stop, |s| *s),
                () = self.lead(&leadership, &mut tasks, &stats, &mut failures, &mut last_publication) => Signal::Run,
            };
            stats.leading.store(false, Ordering::Relaxed);
            stats.recall_handed_over();
            match signal {
                Signal::Run => {
                    tracing::info!(job = %self.job, candidate = %self.candidate, "assigner: term over")
                }
                Signal::Crash => {
                    // Left to lapse, as a crashed process's term would be.
                    leadership.stop_renewing();
                    return;
                }
                Signal::Stop => {
                    if let Err(error) = leadership.resign().await {
                        tracing::warn!(%error, job = %self.job, "assigner: resigning failed; the term will lapse");
                    }
                    return;
                }
            }
        }
    }

    /// Runs the job while `leadership` holds.
    async fn lead(
        &self,
        leadership: &Leadership,
        tasks: &mut watch::Receiver<Tasks>,
        stats: &AssignerStats,
        failures: &mut u32,
        last_publication: &mut Option<Instant>,
    ) {
        let mut snapshot = None;
        let mut conflicts = 0u32;
        // A handover under way: the assignment to switch to, and when.
        let mut switch: Option<Switch> = None;
        // The task set changed during a handover's warm-up: run again right after it.
        let mut rerun = false;
        loop {
            if !leadership.is_held() {
                return;
            }
            // Exclusive mode: a recall left pending (by this term's last write, or by a
            // leader deposed mid-change) is completed before anything else is written.
            if self.config.consistency == Consistency::Exclusive {
                match self.store.settle(leadership).await {
                    Ok(recall) => stats.recall_settled(recall),
                    Err(StoreError::NotLeader) => return,
                    Err(error) => {
                        if matches!(error, StoreError::RecallPending { .. }) {
                            stats.recall_stuck();
                        }
                        tracing::warn!(%error, job = %self.job, "assigner: settling the recall failed");
                        self.back_off(stats, failures).await;
                        continue;
                    }
                }
            }
            let current = match snapshot.take() {
                Some(s) => s,
                None => match self.store.read(&self.job).await {
                    Ok(s) => {
                        let view = tasks.borrow().clone();
                        self.hand_out(&s, &view);
                        s
                    }
                    Err(error) => {
                        tracing::warn!(%error, job = %self.job, "assigner: store read failed");
                        self.back_off(stats, failures).await;
                        continue;
                    }
                },
            };
            if let Some(at) = *last_publication {
                tokio::time::sleep_until(at + self.config.min_interval).await;
            }
            let view = tasks.borrow_and_update().clone();
            self.book.set_tasks(&self.job, known_tasks(&view, current.assignment()));
            let step = match switch.take() {
                Some(Switch { target, seen, .. }) => {
                    rerun = seen != view;
                    self.switch_to(leadership, &current, target, stats).await
                }
                None => {
                    stats.runs.fetch_add(1, Ordering::Relaxed);
                    self.run_once(leadership, &current, &view, stats, &mut switch).await
                }
            };
            match step {
                Ok(Some(written)) => {
                    (*failures, conflicts) = (0, 0);
                    stats.published.fetch_add(1, Ordering::Relaxed);
                    stats.generation.store(written.generation(), Ordering::Relaxed);
                    self.hand_out(&written, &view);
                    *last_publication = Some(Instant::now());
                    snapshot = Some(written);
                }
                Ok(None) => snapshot = Some(current),
                Err(StoreError::Conflict) => {
                    // Someone wrote meanwhile: re-read and run again, backing off when
                    // it keeps happening (a writer around the store, say).
                    stats.conflicts.fetch_add(1, Ordering::Relaxed);
                    conflicts += 1;
                    if conflicts >= CONFLICTS_BEFORE_BACKOFF {
                        self.back_off(stats, failures).await;
                    }
                    continue;
                }
                Err(StoreError::NotLeader) => return,
                Err(error) => {
                    tracing::warn!(%error, job = %self.job, "assigner: write failed");
                    self.back_off(stats, failures).await;
                    continue;
                }
            }
            // A handover under way switches when its warm-up is over, before any run; a
            // task-set change seen at the switch is run on at once.
            if std::mem::take(&mut rerun) {
                continue;
            }
            if let Some(Switch { at, .. }) = &switch {
                tokio::select! {
                    biased;
                    () = leadership.lost() => return,
                    () = tokio::time::sleep_until(*at) => continue,
                }
            }
            // Wait for the cadence, a task-set change or the end of the term. Biased:
            // the end of the term is checked first, so a deposed leader never runs again.
            tokio::select! {
                biased;
                () = leadership.lost() => return,
                changed = tasks.changed() => {
                    if changed.is_err() {
                        // The task-set source is gone: keep the last view, run on cadence.
                        tokio::time::sleep(self.config.cadence).await;
                    }
                }
                () = tokio::time::sleep(self.config.cadence) => {}
            }
        }
    }

    /// One assigner run on `current`; the written snapshot, or `None` when nothing
    /// changed (or the run failed: the assignment in force stays). With handover on, what
    /// is written may be the run's warming step; `switch` then holds the run's assignment
    /// and when to write it.
    async fn run_once(
        &self,
        leadership: &Leadership,
        current: &Snapshot,
        tasks: &Tasks,
        stats: &AssignerStats,
        switch: &mut Option<Switch>,
    ) -> Result<Option<Snapshot>, StoreError> {
        let serving = tasks.serving_ids();
        let fresh = self.book.fresh(&self.job, self.config.stale_after);
        let clients = self.book.fresh_clients(&self.job, self.config.stale_after);
        let load = estimate(&fresh, &clients, current.assignment(), &serving);
        // Racks and capacities from the job spec (rules are validated with the config).
        let with_rules;
        let profiled = if self.config.task_rules.is_empty() {
            tasks
        } else {
            with_rules =
                profile_tasks(&self.config.task_rules, tasks.clone()).unwrap_or_else(|_| tasks.clone());
            &with_rules
        };
        let input = RunInput {
            previous: current.assignment(),
            tasks: profiled,
            load: &load,
            replicas: self.config.replicas,
            placement: &self.config.placement,
        };
        // A panicking assigner must not take the service down with it.
        let outcome = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.assigner.assign(&input)
        })) {
            Ok(Ok(o)) => o,
            Ok(Err(error)) => {
                // No serving task, most likely: keep the assignment in force, and say that
                // no placement can be met by none (the last run's state would be stale).
                if matches!(error, steady_assigner::AssignError::NoServingTasks) {
                    let none = steady_assigner::Infeasible::MinReplicas {
                        min: self.config.replicas.min(),
                        serving: 0,
                    };
                    stats.set_placement(PlacementState { violations: Vec::new(), infeasible: Some(none) });
                }
                stats.errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%error, job = %self.job, "assigner: run refused its input");
                return Ok(None);
            }
            Err(_) => {
                stats.errors.fetch_add(1, Ordering::Relaxed);
                tracing::error!(job = %self.job, assigner = self.assigner.name(), "assigner: run panicked");
                return Ok(None);
            }
        };
        let report = &outcome.report;
        stats.run_nanos.fetch_add(report.elapsed.as_nanos() as u64, Ordering::Relaxed);
        let placement =
            PlacementState { violations: report.violations.clone(), infeasible: report.infeasible.clone() };
        if stats.set_placement(placement) {
            match &report.infeasible {
                Some(why) => {
                    tracing::warn!(job = %self.job, %why, "assigner: placement infeasible; publishing the best assignment it allows")
                }
                None => tracing::info!(job = %self.job, "assigner: placement feasible again"),
            }
        }
        if report.unchanged {
            return Ok(None);
        }
        tracing::debug!(job = %self.job, report = %report, "assigner: run");
        let target = &outcome.assignment;
        let warming = match (self.config.handover, current.assignment()) {
            (Some(warm_up), Some(previous)) => warming_step(previous, target, tasks, target.generation())
                .and_then(|step| {
                    Some((step, target.renumbered(target.generation().checked_add(1)?).ok()?, warm_up))
                }),
            _ => None,
        };
        let written = match warming {
            Some((step, then, warm_up)) => {
                let written = self.write(leadership, current, &step, stats).await?;
                stats.handovers.fetch_add(1, Ordering::Relaxed);
                *switch = Some(Switch { target: then, at: Instant::now() + warm_up, seen: tasks.clone() });
                written
            }
            None => self.write(leadership, current, target, stats).await?,
        };
        stats.record(RunRecord {
            generation: written.generation(),
            at: std::time::SystemTime::now(),
            imbalance_before: report.imbalance_before,
            imbalance_after: report.imbalance_after,
            key_churn: report.key_churn,
            moves: report.moves,
            elapsed: report.elapsed,
        });
        Ok(Some(written))
    }

    /// The second step of a handover: writes `target` (the run's assignment, numbered
    /// after its warming step) over `current`.
    async fn switch_to(
        &self,
        leadership: &Leadership,
        current: &Snapshot,
        target: Assignment,
        stats: &AssignerStats,
    ) -> Result<Option<Snapshot>, StoreError> {
        // Another writer may have moved the store on: number the switch after it.
        let generation = current.assignment().map_or(1, |a| a.generation().saturating_add(1));
        let Ok(target) = target.renumbered(generation) else { return Ok(None) };
        tracing::debug!(job = %self.job, generation, "assigner: handover switch");
        self.write(leadership, current, &target, stats).await.map(Some)
    }

    /// Writes `next` over `current` as the job's mode says (both fenced by the term and
    /// conditioned on `current`; exclusive mode also recalls the generation replaced).
    async fn write(
        &self,
        leadership: &Leadership,
        current: &Snapshot,
        next: &Assignment,
        stats: &AssignerStats,
    ) -> Result<Snapshot, StoreError> {
        match self.config.consistency {
            Consistency::Eventual => self.store.write(leadership, current, next).await,
            Consistency::Exclusive => {
                let written = self.store.write_exclusive(leadership, current, next).await?;
                stats.recall_published(written.published_at, written.recall);
                Ok(written.snapshot)
            }
        }
    }

    /// Gives the assignment of `snapshot` to the Distributor and tells the LoadBook.
    fn hand_out(&self, snapshot: &Snapshot, tasks: &Tasks) {
        if let Some(a) = snapshot.assignment() {
            let a = Arc::new(a.clone());
            self.distributor.publish(&self.job, Assignment::clone(&a));
            self.book.published(&self.job, a.clone(), known_tasks(tasks, Some(&a)));
        }
    }

    async fn back_off(&self, stats: &AssignerStats, failures: &mut u32) {
        stats.errors.fetch_add(1, Ordering::Relaxed);
        let factor = 1u32 << (*failures).min(4);
        *failures = failures.saturating_add(1);
        tokio::time::sleep(self.config.backoff * factor).await;
    }
}

/// The tasks whose reports are wanted: every listed task, and every task the
/// assignment in force names (a task that left still reports what it served).
fn known_tasks(tasks: &Tasks, assignment: Option<&Assignment>) -> Vec<u32> {
    let mut known: Vec<u32> = tasks.iter().map(|(t, _)| t).collect();
    if let Some(a) = assignment {
        known.extend(a.slices().iter().flat_map(|s| s.replicas().iter().copied()));
    }
    known.sort_unstable();
    known.dedup();
    known
}
