//! The control task: membership, connections, health and the routing table, off the
//! request path.
//!
//! It owns every decision: which backends the frontend wants (its subset, minus tasks
//! that are not serving, plus stand-ins for members whose connection failed, plus the
//! affinity connections keyed requests asked for), opening and closing connections,
//! reconnecting with backoff, and publishing a new routing table whenever what the
//! table is built from changes. It runs whenever something arrives (a job view, a
//! command, a connection outcome, request feedback, an assignment, a timer), whether or
//! not requests flow, and stops when the last `Balance` handle is dropped.
//!
//! Its state is in pieces, each with its own methods:
//! * [`slots::Slots`]: the wanted tasks' connections, their failure history and backoff;
//! * [`attempts::Attempts`]: connection attempts under way;
//! * [`draining::Draining`]: retired connections finishing their requests;
//! * [`affinity::AffinitySet`]: connections to replicas outside the subset;
//! * [`assignments::Assignments`]: the assignment source and the assignment in force;
//! * [`outliers::Outliers`]: outlier ejection and its history;
//! * [`slow_start::SlowStarts`]: slow start of members that join or come back;
//!
//! The reactions to failing members (request feedback, outlier detection) are in
//! [`failures`].
//! * [`publisher::Publisher`]: the routing table's publication.
//!
//! Every handler is a plain function: nothing the task does waits, so one event is
//! handled whole before the next is looked at.

use std::collections::HashSet;
use std::fmt;
use std::future::poll_fn;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{FutureExt, Stream, StreamExt};
use steady_slice::Assignment;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::config::{BalanceConfig, Load};
use crate::connector::{Address, Connector};
use crate::error::BoxError;
use crate::route::endpoint::{Endpoint, Feedback, Link, Opening, Reactions};
use crate::route::load::LoadSignal;
use crate::route::pick::fresh_rng;
use crate::route::table::{Counters, Shared};
use steady_core::JobView;

mod affinity;
mod assignments;
mod attempts;
mod draining;
mod failures;
mod order;
mod outliers;
mod publisher;
mod slots;
mod slow_start;

use affinity::AffinitySet;
pub(crate) use assignments::AssignmentSource;
use assignments::Assignments;
use attempts::Attempts;
use draining::Draining;
use order::candidate_order;
use outliers::Outliers;
use publisher::{Publisher, TableInputs};
use slots::{SlotState, Slots};
use slow_start::SlowStarts;

/// What a `Balance` handle asks of the control task.
pub(crate) enum Command {
    SetSubsetSize(usize),
    /// Follow this assignment source (replacing any previous one).
    Assignments(AssignmentSource),
    /// A keyed request needs these replicas: connect to the ones outside the subset.
    Affinity(Vec<u32>),
}

impl fmt::Debug for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::SetSubsetSize(k) => write!(f, "SetSubsetSize({k})"),
            Self::Assignments(_) => write!(f, "Assignments(..)"),
            Self::Affinity(tasks) => write!(f, "Affinity({tasks:?})"),
        }
    }
}

/// The control task of one balancer.
pub(crate) struct Control<T, C, S, J> {
    config: BalanceConfig,
    /// The job source; `None` once it ended (the last view stays in force).
    job: Option<J>,
    view: JobView<T>,
    commands: mpsc::UnboundedReceiver<Command>,
    feedback: mpsc::UnboundedReceiver<Feedback>,
    /// Handed to every endpoint, for its requests to report failures and drains.
    feedback_tx: mpsc::UnboundedSender<Feedback>,
    attempts: Attempts<T, C, S>,
    slots: Slots<T, S>,
    draining: Draining<S>,
    affinity: AffinitySet,
    assignments: Assignments,
    publisher: Publisher<S>,
    /// The last connection attempt's id (also the id of the connection it makes).
    last_attempt: u64,
    /// Set after a restart: reconcile before waiting for the next event.
    stale: bool,
    /// Connections leaving rotation, retired once a table without them is published (so
    /// that no published table names a retired connection).
    retiring: Vec<(Arc<Endpoint<S>>, &'static str)>,
    outliers: Outliers,
    slow_start: SlowStarts<S>,
    /// The subset's health at the last reconcile, for the panic threshold.
    health: SubsetHealth,
    /// With Peak EWMA: when the latency estimates of members with no timed response
    /// lately are next aged (see `Endpoint::age_latency`).
    next_aging: Option<Instant>,
}

/// How often, and after how long without a timed response, a member's latency
/// estimate is aged.
const LATENCY_AGING: Duration = Duration::from_secs(1);

/// How many of the subset's first `k` members are out of rotation (ejected, or failed
/// and backing off), as of the last reconcile.
#[derive(Debug, Clone, Copy, Default)]
struct SubsetHealth {
    /// The subset's size without stand-ins (at most `k`).
    primary: usize,
    /// Of those, how many are out of rotation.
    out: usize,
    /// More than the configured share is out: ejected members serve again.
    panic: bool,
}

/// Restarts this far apart are not consecutive.
const RESTARTS_FORGOTTEN_AFTER: Duration = Duration::from_secs(60);
/// The longest pause between consecutive restarts.
const MAX_RESTART_PAUSE: Duration = Duration::from_secs(10);

impl<T, C, S, J> Control<T, C, S, J>
where
    T: Address,
    C: Connector<T, S>,
    S: Send + Sync + 'static,
    J: Stream<Item = JobView<T>> + Send + Unpin + 'static,
{
    pub(crate) fn new(
        config: BalanceConfig,
        connector: C,
        job: J,
        commands: mpsc::UnboundedReceiver<Command>,
        shared: Arc<Shared<S>>,
    ) -> Self {
        let (feedback_tx, feedback) = mpsc::unbounded_channel();
        let outliers = Outliers::new(config.outliers, Instant::now());
        let slow_start = SlowStarts::new(config.slow_start);
        let assignments = Assignments::new(config.backoff);
        let next_aging = matches!(config.load, Load::PeakEwma { .. }).then(|| Instant::now() + LATENCY_AGING);
        Self {
            attempts: Attempts::new(connector, config.connect_timeout),
            // Jitter seeded per process (not by the frontend index, which frontends of other
            // client jobs share): their retries do not fall in step.
            slots: Slots::new(config.backoff, fresh_rng()),
            affinity: AffinitySet::new(config.max_affinity, config.affinity_idle),
            config,
            job: Some(job),
            view: JobView::default(),
            commands,
            feedback,
            feedback_tx,
            draining: Draining::new(),
            assignments,
            publisher: Publisher::new(shared),
            last_attempt: 0,
            stale: false,
            retiring: Vec::new(),
            outliers,
            slow_start,
            health: SubsetHealth::default(),
            next_aging,
        }
    }

    /// Runs the control task until every `Balance` handle is gone, surviving panics in
    /// its own code (and in the user code it runs: the job stream, address comparisons).
    ///
    /// A panic is caught, logged and counted (`BalanceStats::control_restarts`); the task
    /// then rebuilds its membership from the last job view, keeping the connections that
    /// work (see `recover`). The routing table in force stays published meanwhile, so
    /// requests never meet a dead balancer. Restarts that follow each other within a minute wait 10 ms, 20 ms, ...
    /// up to 10 s before running again, so a panic that repeats does not spin.
    pub(crate) async fn supervise(mut self) {
        let mut consecutive = 0u32;
        let mut last_restart: Option<Instant> = None;
        loop {
            match AssertUnwindSafe(self.run()).catch_unwind().await {
                Ok(()) => break,
                Err(panic) => {
                    let message = panic_message(&*panic);
                    let now = Instant::now();
                    consecutive =
                        if last_restart.is_some_and(|t| now.duration_since(t) < RESTARTS_FORGOTTEN_AFTER) {
                            consecutive.saturating_add(1)
                        } else {
                            0
                        };
                    last_restart = Some(now);
                    Counters::add(&self.shared().counters.control_restarts, 1);
                    tracing::error!(panic = %message, consecutive, "balancer control task panicked: rebuilding from the last job view");
                    self.recover();
                    if consecutive > 0 {
                        let pause = Duration::from_millis(10)
                            .saturating_mul(1 << consecutive.min(10))
                            .min(MAX_RESTART_PAUSE);
                        tokio::time::sleep(pause).await;
                    }
                }
            }
        }
    }

    /// Forgets the bookkeeping a panic may have left half changed, keeping what the task
    /// follows (the view, the sources, the assignment in force) and the connections that
    /// work (so the table in force stays good): attempts under way are dropped with their
    /// slots, affinity connections are forgotten, and the next turn reconciles afresh.
    fn recover(&mut self) {
        // A failure may have been half handled: a connection known broken is retired now.
        for endpoint in self.slots.take_broken() {
            self.retiring.push((endpoint, "failed"));
        }
        self.slots.retain_settled();
        self.affinity = AffinitySet::new(self.config.max_affinity, self.config.affinity_idle);
        self.publisher.forget_published();
        self.stale = true;
    }

    async fn run(&mut self) {
        loop {
            if std::mem::take(&mut self.stale) {
                self.reconcile();
            }
            let next_timer = [
                self.slots.next_retry(),
                self.affinity.next_sweep(),
                self.outliers.next_deadline(),
                self.slow_start.next_deadline(),
                self.next_aging,
            ]
            .into_iter()
            .flatten()
            .min();
            // `biased`: the branches are tried in this order, so that
            // * a stop (every handle gone) wins over everything else;
            // * feedback (a failed call, a drained connection) only takes things away,
            //   and comes before the events that build a new table, so that no table
            //   is built with an endpoint already known to be broken;
            // * timers come last: a deadline that has passed is handled on the next
            //   turn, a few microseconds late at worst.
            // No branch starves the others: commands and feedback come at most one per
            // request (affinity commands once per slice and table), every handler is
            // short and does not wait, and the loop selects afresh after each.
            tokio::select! {
                biased;
                command = self.commands.recv() => match command {
                    None => break,
                    Some(command) => self.on_command(command),
                },
                Some(feedback) = self.feedback.recv() => self.on_feedback(feedback),
                (task, attempt, result) = poll_fn(|cx| {
                    let slots = &self.slots;
                    self.attempts.poll_outcome(cx, |task, attempt| slots.get(task).is_some_and(|s| s.awaits(attempt)))
                }), if !self.attempts.is_idle() => self.on_connected(task, attempt, result),
                view = next_view(&mut self.job), if self.job.is_some() => self.on_view(view),
                item = self.assignments.next(), if self.assignments.is_following() => self.on_assignment(item),
                () = sleep_until(next_timer), if next_timer.is_some() => self.on_timer(),
            }
        }
        tracing::debug!(open = self.publisher.shared().open.load(Ordering::Relaxed), "balancer stopped");
    }

    fn shared(&self) -> &Shared<S> {
        self.publisher.shared()
    }

    fn on_command(&mut self, command: Command) {
        match command {
            Command::SetSubsetSize(k) => {
                tracing::info!(from = self.config.subset_size, to = k, "subset size changed");
                self.config.subset_size = k;
            }
            Command::Assignments(source) => self.assignments.follow(source),
            Command::Affinity(tasks) => {
                let subset = self.shared().table.load().wanted.clone();
                let (view, draining_too) = (&self.view, self.config.keyed_to_draining);
                let address_of = |t| keyed_address(view, draining_too, t);
                self.affinity.request(tasks, &subset, address_of, &self.slots, Instant::now());
            }
        }
        self.reconcile();
    }

    fn on_view(&mut self, view: Option<JobView<T>>) {
        match view {
            Some(view) => {
                self.view = view;
                self.reconcile();
            }
            // The source ended: the last view stays in force.
            None => self.job = None,
        }
    }

    fn on_assignment(&mut self, item: Option<Result<Assignment, BoxError>>) {
        if self.assignments.accept(item, &self.publisher.shared().counters) {
            self.reconcile();
        }
    }

    fn on_timer(&mut self) {
        let now = Instant::now();
        for (task, address) in self.slots.due(now) {
            let attempt = self.connect(task, address);
            self.slots.set_state(task, SlotState::Connecting { attempt });
        }
        let mut changed = self.affinity.sweep(&self.slots, now);
        changed |= self.detect_outliers(now);
        let slots = &self.slots;
        self.slow_start
            .advance(now, |id| slots.iter().any(|(_, s)| s.endpoint().is_some_and(|e| e.id == id)));
        if self.next_aging.is_some_and(|t| t <= now) {
            self.next_aging = Some(now + LATENCY_AGING);
            for (_, slot) in self.slots.iter() {
                if let Some(endpoint) = slot.endpoint() {
                    endpoint.age_latency(now, LATENCY_AGING);
                }
            }
        }
        if changed {
            self.reconcile();
        }
    }

    fn on_connected(&mut self, task: usize, attempt: u64, result: Result<S, BoxError>) {
        let Some(slot) = self.slots.get(task).filter(|s| s.awaits(attempt)) else {
            // A stale attempt (the task left, or a newer attempt replaced it): drop its
            // connection.
            return;
        };
        let address = slot.address.clone();
        let state = match result {
            Ok(service) => {
                let rotation = Arc::downgrade(self.publisher.shared());
                // Back after a broken connection: probation. Joining the subset while
                // requests flow: slow start. The first members of a fresh balancer, and
                // affinity connections (replicas keyed requests are waiting for, already
                // serving other frontends), open fully.
                let returning = self.slots.has_failed(task, &address);
                let joining = self.requests_flow() && !self.affinity.contains(task);
                let gate = self.slow_start.initial_gate(returning, joining);
                let reactions = Reactions {
                    consecutive: self.config.outliers.consecutive_failures.unwrap_or(0),
                    after_probe: self.slow_start.after_probe(),
                };
                let opening = Opening { gate, load: LoadSignal::new(self.config.load), reactions };
                let link = Link { feedback: self.feedback_tx.clone(), rotation };
                let endpoint = Arc::new(Endpoint::new(task, attempt, service, opening, link));
                if gate.slow_start_share().is_some() {
                    self.slow_start.start(endpoint.clone(), Instant::now());
                }
                Counters::add(&self.shared().counters.opened, 1);
                self.shared().open.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(task, returning, gate = gate.word(), "connected");
                SlotState::Ready(endpoint)
            }
            Err(error) => {
                let (failures, until) = self.slots.record_failure(task, &address, false);
                Counters::add(&self.shared().counters.connect_failures, 1);
                tracing::warn!(task, %error, failures, retry_in = ?until - Instant::now(), "connection failed");
                SlotState::Backoff { until }
            }
        };
        self.slots.set_state(task, state);
        self.reconcile();
    }

    /// The backends to keep connections to, in preference order: the first `k` serving
    /// tasks of the frontend's order, then as many stand-ins as there are failed or
    /// ejected members among those `k` (at most `max_stand_ins`). Stand-ins already
    /// connected are kept (so a recovering candidate never displaces a healthy one); the
    /// rest come next in order, skipping failed and ejected tasks. Also records how much
    /// of the subset is out, and whether that puts it in panic (see [`SubsetHealth`]).
    fn wanted(&mut self, now: Instant) -> Vec<usize> {
        if self.view.size > steady_subset::MAX_BACKENDS {
            // No subset can be computed for such a view: keep the one in force.
            return self.shared().table.load().wanted.clone();
        }
        let outliers = &self.outliers;
        let (view, slots) = (&self.view, &self.slots);
        // A subset larger than the job is the whole job.
        let k = self.config.subset_size.min(view.size);
        let mut order = candidate_order(&self.config.algorithm, self.config.frontend, view.size, k);
        let mut primary = Vec::with_capacity(k);
        let mut failed = 0;
        if k > 0 {
            for task in order.by_ref() {
                let Some(address) = view.serving_task(task) else { continue };
                primary.push(task);
                failed += usize::from(slots.is_failed(task, address, now) || outliers.is_ejected(task, now));
                if primary.len() == k {
                    break;
                }
            }
        }
        let needed = failed.min(self.config.max_stand_ins);
        let mut stand_ins: Vec<usize> = slots
            .iter()
            .filter(|(task, slot)| {
                slot.endpoint().is_some()
                    && !primary.contains(task)
                    && !self.affinity.contains(*task)
                    && view.serving_task(*task) == Some(&slot.address)
            })
            .map(|(task, _)| task)
            .take(needed)
            .collect();
        // The order continues right after the last primary member.
        for task in order {
            if stand_ins.len() >= needed {
                break;
            }
            let Some(address) = view.serving_task(task) else { continue };
            if !primary.contains(&task)
                && !stand_ins.contains(&task)
                && !slots.is_failed(task, address, now)
                && !outliers.is_ejected(task, now)
            {
                stand_ins.push(task);
            }
        }
        let share = self.config.outliers.max_ejected_share;
        let panic = failed as f64 > share * primary.len() as f64;
        if panic != self.health.panic {
            if panic {
                Counters::add(&self.shared().counters.panics, 1);
                tracing::warn!(
                    out = failed,
                    subset = primary.len(),
                    "panic: most of the subset is out; ejected members serve again"
                );
            } else {
                tracing::info!(out = failed, subset = primary.len(), "panic over");
            }
        }
        self.health = SubsetHealth { primary: primary.len(), out: failed, panic };
        primary.extend(stand_ins);
        primary
    }

    /// Brings connections in line with the wanted set, then publishes the table.
    fn reconcile(&mut self) {
        let now = Instant::now();
        self.slots.forget_old_failures(now);
        let subset = self.wanted(now);
        let draining_too = self.config.keyed_to_draining;
        // Subset members serve; affinity connections reach a draining owner too when
        // configured (subset members are serving, so one lookup does for both).
        let affinity =
            self.affinity.wanted(&subset, |t| keyed_address(&self.view, draining_too, t), &self.slots, now);
        let wanted: Vec<usize> = subset.iter().chain(&affinity).copied().collect();
        let keep: HashSet<usize> = wanted.iter().copied().collect();
        // Close what is no longer wanted, or whose task moved to another address.
        let gone: Vec<usize> = self
            .slots
            .iter()
            .filter(|(task, slot)| {
                !keep.contains(task) || keyed_address(&self.view, draining_too, *task) != Some(&slot.address)
            })
            .map(|(task, _)| task)
            .collect();
        for task in gone {
            if let Some(SlotState::Ready(endpoint)) = self.slots.remove(task).map(|slot| slot.state) {
                self.retiring.push((endpoint, "left the subset"));
            }
        }
        // Open what is newly wanted.
        for &task in &wanted {
            if !self.slots.contains(task) {
                // A kept subset (for a view no subset can be computed for) may name
                // tasks that no longer serve: skip them.
                let Some(address) = keyed_address(&self.view, draining_too, task).cloned() else { continue };
                let attempt = self.connect(task, address.clone());
                self.slots.insert_connecting(task, address, attempt);
                if affinity.contains(&task) {
                    Counters::add(&self.shared().counters.affinity_opened, 1);
                }
            }
        }
        let (view, slots, max_affinity) = (&self.view, &self.slots, self.config.max_affinity);
        // Ejected members leave the table, unless the subset is in panic.
        let ejected = if self.health.panic { Vec::new() } else { self.outliers.ejected(now) };
        let mut connected = self.slots.connected();
        connected.retain(|task, _| ejected.binary_search(task).is_err());
        let reachable = |task: u32| {
            let task = task as usize;
            if ejected.binary_search(&task).is_ok() {
                return false;
            }
            keyed_address(view, draining_too, task).is_some_and(|address| {
                match slots.get(task).map(|s| &s.state) {
                    Some(SlotState::Ready(_) | SlotState::Connecting { .. }) => true,
                    Some(SlotState::Backoff { .. }) => false,
                    // Not connected: an affinity connection would be asked for, if any is allowed.
                    None => max_affinity > 0 && !slots.is_failed(task, address, now),
                }
            })
        };
        let reachability = self.assignments.replica_tasks().iter().fold(0u64, |digest, &t| {
            steady_subset::hash::hash_pair(digest, u64::from(t) << 1 | u64::from(reachable(t)))
        });
        let (ejected, panic) = (self.outliers.ejected(now), self.health.panic);
        self.publisher.publish(TableInputs {
            subset,
            connected,
            ejected,
            panic,
            assignment: self.assignments.current(),
            frontend: self.config.frontend,
            fan_out: self.config.fan_out,
            reachable: &reachable,
            reachability,
        });
        // The published table no longer names them: retire them (each closes once its
        // requests have finished).
        for (endpoint, why) in self.retiring.drain(..) {
            self.draining.retire(endpoint, why, self.publisher.shared());
        }
    }

    /// Starts a connection attempt; returns its id. It comes to an outcome (see
    /// [`attempts`]) within the connect timeout, without holding up the control task.
    fn connect(&mut self, task: usize, address: T) -> u64 {
        self.last_attempt += 1;
        let attempt = self.last_attempt;
        tracing::debug!(task, ?address, attempt, "connecting");
        self.attempts.start(task, attempt, address);
        attempt
    }
}

/// The next view from the job source (pending forever once it is gone). A source that
/// panics counts as ended (it is dropped: a stream that panicked may panic on every poll),
/// and the last view stays in force.
async fn next_view<T, J: Stream<Item = JobView<T>> + Unpin>(job: &mut Option<J>) -> Option<JobView<T>> {
    let Some(source) = job else { return std::future::pending().await };
    match AssertUnwindSafe(source.next()).catch_unwind().await {
        Ok(view) => view,
        Err(_) => {
            tracing::error!("the job view source panicked: following it no more, the last view stays");
            *job = None;
            None
        }
    }
}

/// What a caught panic says (its message when it is a string).
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string panic".to_owned())
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Where requests may reach `task`: serving, or draining too when keyed requests may go
/// to draining owners ([`BalanceConfig::keyed_to_draining`]).
fn keyed_address<T>(view: &JobView<T>, draining_too: bool, task: usize) -> Option<&T> {
    if draining_too {
        view.live_task(task)
    } else {
        view.serving_task(task)
    }
}
