//! Rudolph's mode: a frontend makes its own keyed-routing assignments from the keyed
//! requests it sends. No Assigner service, no load reports, no store.
//!
//! The Slicer loop measures load where it lands (each backend's Slicelet reports it) and
//! one leader assigns for everybody. Rudolph (the post "Rudolph: An In-Process Auto
//! Sharder") needs none of that: each gateway counts the keys it sends per fixed bin, and
//! runs the rotation assigner over its own counts every so often. [`LocalAssignments`]
//! does that for a steady balancer:
//!
//! 1. it asks the balancer to count its keyed requests per bin
//!    (`Balance::count_keys`: one relaxed atomic increment per keyed request, as the
//!    Slicelet pays);
//! 2. every period (1 s by default), and at once when discovery's tasks change (a task
//!    drains, leaves or joins: its keys move now, not a period later), it takes the counts, folds them into a smoothed load
//!    (`memory` times the previous load plus the new counts), and runs its assigner
//!    (Rudolph's [`Rotation`] by default; any [`Assigner`] will do) with the previous
//!    assignment, the job's [`Tasks`] and that load;
//! 3. a new generation routes the balancer's keyed requests, as one from the Watch RPC
//!    would (`Balance::follow_assignments`).
//!
//! The first run happens at once, with no load yet: keyed requests have owners from the
//! start. The task ends when the balancer is dropped, or on [`LocalHandle::stop`].
//!
//! ```no_run
//! use std::time::Duration;
//! use steady_balance::BalanceConfig;
//! use steady_local::{tasks_of, LocalAssignments};
//! use tokio::sync::watch;
//! # async fn demo(balance: steady_balance::Balance<tower::util::BoxCloneSyncService<u64, u64, steady_balance::BoxError>>) -> Result<(), Box<dyn std::error::Error>> {
//! // The job's tasks, as discovery gives them (here: 8 tasks, all serving).
//! let (_job, tasks) = watch::channel(steady_local::Tasks::serving(0..8)?);
//! let local = LocalAssignments::rudolph().every(Duration::from_millis(500)).start(&balance, tasks)?;
//! // ... keyed requests through `balance` now go to the owners of their keys ...
//! println!("{:?}", local.stats());
//! # Ok(())
//! # }
//! ```
//!
//! # The trade-off: frontends decide apart
//!
//! Each frontend sees only its own requests. When the frontends' traffic is alike (a
//! load balancer in front spreads users evenly) their counts are alike, their rotations
//! agree, and each key still has one owner fleet-wide. When it is not, frontends may pick
//! different rotations, and a key's requests split between owners, each of which then
//! caches it. [`agreement`] measures this: for each key, the share of its requests that
//! reach its most common owner, over all frontends. The Slicer loop has no such gap (one
//! leader, one assignment), at the price of a control plane.
//!
//! # Dependencies
//!
//! `steady-balance`, `steady-assigner` (std only) and tokio. Nothing of the server side.

#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub, rust_2018_idioms)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use steady_assigner::{AssignError, Load, RunInput};
use steady_balance::{Balance, KeyCounts};
use steady_core::{ConfigError, JobView};
use steady_slice::KeyRange;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;

pub use steady_assigner::{Assigner, Assignment, ReplicaLimits, Rotation, SliceKey, TaskState, Tasks};

/// How an in-process assigner runs (a builder); [`LocalAssignments::start`] runs it for a
/// balancer, [`LocalAssignments::runner`] gives its steps to drive by hand.
#[derive(Clone)]
pub struct LocalAssignments {
    assigner: Arc<dyn Assigner + Send + Sync>,
    every: Duration,
    replicas: ReplicaLimits,
    bins_log2: u32,
    memory: f64,
}

impl fmt::Debug for LocalAssignments {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalAssignments")
            .field("assigner", &self.assigner)
            .field("every", &self.every)
            .field("replicas", &self.replicas)
            .field("bins", &(1usize << self.bins_log2))
            .field("memory", &self.memory)
            .finish()
    }
}

impl LocalAssignments {
    /// Rudolph's setting: the rotation assigner (64 bins per task, penalty 0.125), one
    /// replica, a run every second, 4,096 counting bins, and half of the previous load
    /// kept at each run (`memory` 0.5).
    pub fn rudolph() -> Self {
        Self::with_assigner(Rotation::default())
    }

    /// Runs `assigner` instead of the rotation (the rest as [`LocalAssignments::rudolph`]).
    pub fn with_assigner(assigner: impl Assigner + Send + Sync + 'static) -> Self {
        Self {
            assigner: Arc::new(assigner),
            every: Duration::from_secs(1),
            replicas: ReplicaLimits::new(1, 1).expect("one replica is within the limits"),
            bins_log2: 12,
            memory: 0.5,
        }
    }

    /// How often the assigner runs.
    pub fn every(mut self, period: Duration) -> Self {
        self.every = period;
        self
    }

    /// How many replicas each slice has.
    pub fn replicas(mut self, replicas: ReplicaLimits) -> Self {
        self.replicas = replicas;
        self
    }

    /// Counts keys in `2^bins_log2` bins (1 to 20; 12 by default). The assigner sees
    /// load at this grain: finer than its own slices (the rotation has 64 per task).
    pub fn bins_log2(mut self, bins_log2: u32) -> Self {
        self.bins_log2 = bins_log2;
        self
    }

    /// The share of the previous load kept at each run, in `[0, 1)`: 0 sees only the last
    /// period; closer to 1 remembers longer and moves less on a burst.
    pub fn memory(mut self, memory: f64) -> Self {
        self.memory = memory;
        self
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.every.is_zero() {
            return Err(ConfigError::new("local assignment period", self.every, "more than zero"));
        }
        if !(0.0..1.0).contains(&self.memory) {
            return Err(ConfigError::new("local assignment memory", self.memory, "0 up to 1 (excluded)"));
        }
        KeyCounts::new(self.bins_log2).map(drop)
    }

    /// The assigner's steps, to drive by hand (simulations, tests): feed it counts with
    /// [`LocalRunner::run`].
    ///
    /// # Errors
    ///
    /// [`ConfigError`] for a zero period, a memory outside `[0, 1)` or bins outside 1-20.
    pub fn runner(&self) -> Result<LocalRunner, ConfigError> {
        self.validate()?;
        let counts = KeyCounts::new(self.bins_log2)?;
        let ranges = (0..counts.bins()).map(|b| counts.range(b)).collect();
        Ok(LocalRunner { config: self.clone(), ranges, load: vec![0.0; counts.bins()], previous: None })
    }

    /// Runs for `balance`: counts its keyed requests and routes them by the assignments
    /// made from them, over the tasks `tasks` holds now (discovery's view, through
    /// [`tasks_of`]). Replaces any other assignment source the balancer follows.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] as [`LocalAssignments::runner`].
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime.
    pub fn start<S, K, C>(
        self,
        balance: &Balance<S, K, C>,
        tasks: watch::Receiver<Tasks>,
    ) -> Result<LocalHandle, ConfigError> {
        let runner = self.runner()?;
        let counts = balance.count_keys(self.bins_log2)?;
        if counts.bins() != runner.ranges.len() {
            // Someone counted this balancer's keys at another grain first.
            return Err(ConfigError::new(
                "key count bins",
                counts.bins(),
                "the bins this balancer already counts",
            ));
        }
        let (publish, assignments) = mpsc::channel::<Result<Assignment, Infallible>>(1);
        balance.follow_assignments(ReceiverStream::new(assignments));
        let (stats, stats_rx) = watch::channel(LocalStats::default());
        let (in_force, in_force_rx) = watch::channel(None);
        let task = tokio::spawn(run(runner, counts, tasks, publish, stats, in_force, self.every));
        Ok(LocalHandle { stats: stats_rx, assignment: in_force_rx, task })
    }
}

/// What the in-process assigner has done so far.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LocalStats {
    /// Runs of the assigner.
    pub runs: u64,
    /// New generations handed to the balancer.
    pub published: u64,
    /// Runs that failed (no serving task, ...); the last good assignment stays.
    pub errors: u64,
    /// The generation in force, once there is one.
    pub generation: Option<u64>,
    /// The last run's imbalance (busiest task's load over the mean) after it, by the
    /// counts this frontend saw.
    pub imbalance: Option<f64>,
    /// The share of the key space the last new generation moved.
    pub key_churn: Option<f64>,
}

/// The running in-process assigner of one balancer. Dropping the handle leaves it running
/// (it ends with the balancer); [`LocalHandle::stop`] ends it, and the balancer keeps the
/// last assignment.
#[derive(Debug)]
pub struct LocalHandle {
    stats: watch::Receiver<LocalStats>,
    assignment: watch::Receiver<Option<Assignment>>,
    task: JoinHandle<()>,
}

impl LocalHandle {
    /// What it has done so far.
    pub fn stats(&self) -> LocalStats {
        self.stats.borrow().clone()
    }

    /// The last assignment handed to the balancer.
    pub fn assignment(&self) -> Option<Assignment> {
        self.assignment.borrow().clone()
    }

    /// Whether the assigner has ended (its balancer was dropped, or it was stopped).
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Waits until a run has published generation `generation` or later.
    pub async fn wait_for_generation(&mut self, generation: u64) {
        self.wait_for(|s| s.generation.is_some_and(|g| g >= generation)).await;
    }

    /// Waits until the stats satisfy `condition` (at once if they do), or the assigner
    /// has ended.
    pub async fn wait_for(&mut self, condition: impl FnMut(&LocalStats) -> bool) {
        let _ = self.stats.wait_for(condition).await;
    }

    /// Stops the assigner; the balancer keeps the assignment in force.
    pub fn stop(self) {
        self.task.abort();
    }
}

/// The steps of an in-process assigner: the smoothed load per bin and the assignment in
/// force. [`LocalAssignments::start`] drives one on a timer.
#[derive(Debug)]
pub struct LocalRunner {
    config: LocalAssignments,
    ranges: Vec<KeyRange>,
    load: Vec<f64>,
    previous: Option<Assignment>,
}

impl LocalRunner {
    /// How many bins it counts in.
    pub fn bins(&self) -> usize {
        self.ranges.len()
    }

    /// The assignment in force, if a run made one.
    pub fn assignment(&self) -> Option<&Assignment> {
        self.previous.as_ref()
    }

    /// One run over the requests counted per bin since the last (`counts`, one per bin,
    /// as `KeyCounts::take` gives them) and the job's `tasks`. Returns the run's outcome;
    /// its assignment is the one in force from now on, unless the run failed (the
    /// previous one stays).
    ///
    /// # Errors
    ///
    /// [`AssignError::BadConfig`] when `counts` has not one count per bin; the assigner's
    /// errors (no serving task, ...).
    pub fn run(&mut self, counts: &[u64], tasks: &Tasks) -> Result<steady_assigner::Outcome, AssignError> {
        if counts.len() != self.ranges.len() {
            return Err(AssignError::BadConfig { field: "counts", expected: "one count per bin" });
        }
        let memory = self.config.memory;
        for (load, &count) in self.load.iter_mut().zip(counts) {
            *load = *load * memory + count as f64;
        }
        let ranges = self.ranges.iter().zip(&self.load).filter(|(_, l)| **l > 0.0).map(|(r, l)| (*r, *l));
        let load = Load::none().with_ranges(ranges)?;
        let input = RunInput {
            previous: self.previous.as_ref(),
            tasks,
            load: &load,
            replicas: self.config.replicas,
            placement: steady_assigner::Placement::none(),
        };
        let outcome = self.config.assigner.assign(&input)?;
        self.previous = Some(outcome.assignment.clone());
        Ok(outcome)
    }
}

async fn run(
    mut runner: LocalRunner,
    counts: KeyCounts,
    mut tasks: watch::Receiver<Tasks>,
    publish: mpsc::Sender<Result<Assignment, Infallible>>,
    stats: watch::Sender<LocalStats>,
    in_force: watch::Sender<Option<Assignment>>,
    every: Duration,
) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Whether discovery can still change the tasks (its sender may be dropped: then the
    // last view holds and only the cadence runs the assigner).
    let mut watching = true;
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            // A task drains, leaves or joins: run at once, so its keys move now.
            changed = tasks.changed(), if watching => watching = changed.is_ok(),
            // The balancer is gone.
            () = publish.closed() => return,
        }
        let current = tasks.borrow_and_update().clone();
        let fresh = match runner.run(&counts.take(), &current) {
            Ok(outcome) => {
                let report = outcome.report;
                stats.send_modify(|s| {
                    s.runs += 1;
                    s.imbalance = Some(report.imbalance_after);
                    if !report.unchanged {
                        s.key_churn = Some(report.key_churn);
                    }
                });
                (!report.unchanged).then_some(outcome.assignment)
            }
            Err(error) => {
                tracing::warn!(%error, "local assignments: run failed; the last assignment stays");
                stats.send_modify(|s| {
                    s.runs += 1;
                    s.errors += 1;
                });
                None
            }
        };
        if let Some(assignment) = fresh {
            let generation = assignment.generation();
            if publish.send(Ok(assignment.clone())).await.is_err() {
                return;
            }
            in_force.send_replace(Some(assignment));
            stats.send_modify(|s| {
                s.published += 1;
                s.generation = Some(generation);
            });
        }
    }
}

/// The assigner's task set for a discovery view: each task's index and state (tasks at or
/// above the view's size left out).
///
/// # Errors
///
/// [`AssignError::TaskOutOfRange`] for an index above `steady_slice::MAX_TASK`.
pub fn tasks_of<A>(view: &JobView<A>) -> Result<Tasks, AssignError> {
    Tasks::new(view.tasks.iter().filter(|(&i, _)| i < view.size).map(|(&i, task)| {
        let state = match task.state {
            steady_core::TaskState::Serving => TaskState::Serving,
            steady_core::TaskState::Draining => TaskState::Draining,
            steady_core::TaskState::Gone => TaskState::Gone,
        };
        (u32::try_from(i).unwrap_or(u32::MAX), state)
    }))
}

/// How far frontends that assign apart agree: for each key, the share of its requests
/// that reach its most common owner (the first replica of the key's slice under the
/// assignment of the frontend that sent it), summed over keys and divided by all
/// requests. 1.0: every key has one owner fleet-wide; 1/f at worst for f frontends.
///
/// `frontends` holds, per frontend, its assignment and the keys it sent with their counts.
/// Keys with no owner (no assignment) are left out; with no requests the agreement is 1.
pub fn agreement(frontends: &[(&Assignment, &[(SliceKey, u64)])]) -> f64 {
    let mut by_key: HashMap<SliceKey, HashMap<u32, u64>> = HashMap::new();
    for (assignment, keys) in frontends {
        for &(key, count) in *keys {
            if let Some(&owner) = assignment.slice_for(key).replicas().first() {
                *by_key.entry(key).or_default().entry(owner).or_default() += count;
            }
        }
    }
    let (agreeing, total) = by_key.values().fold((0u64, 0u64), |(agreeing, total), owners| {
        (agreeing + owners.values().max().copied().unwrap_or(0), total + owners.values().sum::<u64>())
    });
    if total == 0 {
        1.0
    } else {
        agreeing as f64 / total as f64
    }
}
