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
//! Its state is in two pieces, each with its own methods, and a reconcile reads as
//! "membership plans from the view and the health":
//! * [`membership::Membership`]: which tasks to keep connections to (the subset and its
//!   stand-ins, from the frontend's order) and the connections themselves:
//!   [`slots::Slots`] (the wanted tasks' connections, their failure history and
//!   backoff), [`attempts::Attempts`] (connection attempts under way),
//!   [`draining::Draining`] (retired connections finishing their requests) and
//!   [`affinity::AffinitySet`] (connections to replicas outside the subset);
//! * [`health::Health`]: how the members fare: [`outliers::Outliers`] (outlier ejection
//!   and its history), [`slow_start::SlowStarts`] (members that join or come back take
//!   up load gradually), how much of the subset is out (the panic threshold), and the
//!   aging of latency estimates.
//!
//! Beside them: [`assignments::Assignments`] (the assignment source and the assignment
//! in force) and [`publisher::Publisher`] (the routing table's publication).
//!
//! Every handler is a plain function: nothing the task does waits, so one event is
//! handled whole before the next is looked at.

use std::collections::BTreeMap;
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

use crate::config::BalanceConfig;
use crate::connector::{Address, Connector};
use crate::error::BoxError;
use crate::route::endpoint::{Endpoint, Feedback, Link, Opening, Reactions};
use crate::route::load::LoadSignal;
use crate::route::table::{Counters, Shared};
use steady_core::{JobView, Zone, ZoneSizes, ZoneView};

mod affinity;
mod assignments;
mod attempts;
mod draining;
mod health;
mod membership;
mod order;
mod outliers;
mod publisher;
mod slots;
mod slow_start;
mod spill;

use crate::route::slices::ZonePreference;
pub(crate) use assignments::AssignmentSource;
use assignments::Assignments;
use health::Health;
use membership::{Inputs, Membership, ZoneInputs};
use publisher::{Publisher, TableInputs};

/// What a `Balance` handle asks of the control task.
pub(crate) enum Command {
    SetSubsetSize(usize),
    /// Follow this assignment source (replacing any previous one).
    Assignments(AssignmentSource),
    /// A keyed request needs these replicas: connect to the ones outside the subset.
    Affinity(Vec<u32>),
    /// The frontend job's size in each zone changed.
    SetFrontendZones(ZoneSizes),
}

impl fmt::Debug for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::SetSubsetSize(k) => write!(f, "SetSubsetSize({k})"),
            Self::Assignments(_) => write!(f, "Assignments(..)"),
            Self::Affinity(tasks) => write!(f, "Affinity({tasks:?})"),
            Self::SetFrontendZones(sizes) => write!(f, "SetFrontendZones({sizes:?})"),
        }
    }
}

/// The control task of one balancer.
pub(crate) struct Control<T, C, S, J> {
    config: BalanceConfig,
    /// The job source; `None` once it ended (the last view stays in force).
    job: Option<J>,
    view: JobView<T>,
    /// The view's zones, kept for a zone-aware frontend (empty otherwise, or when the
    /// view has none: the frontend then routes over the whole job).
    zones: BTreeMap<Zone, ZoneView>,
    commands: mpsc::UnboundedReceiver<Command>,
    feedback: mpsc::UnboundedReceiver<Feedback>,
    /// Handed to every endpoint, for its requests to report failures and drains.
    feedback_tx: mpsc::UnboundedSender<Feedback>,
    membership: Membership<T, C, S>,
    health: Health<S>,
    assignments: Assignments,
    publisher: Publisher<S>,
    /// Set after a restart: reconcile before waiting for the next event.
    stale: bool,
}

/// Restarts this far apart are not consecutive.
const RESTARTS_FORGOTTEN_AFTER: Duration = Duration::from_secs(60);
/// The most connection outcomes recorded before one reconcile (see `on_connected`).
const MAX_OUTCOMES_PER_TABLE: usize = 256;
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
        Self {
            membership: Membership::new(&config, connector),
            health: Health::new(&config),
            assignments: Assignments::new(config.backoff),
            config,
            job: Some(job),
            view: JobView::default(),
            zones: BTreeMap::new(),
            commands,
            feedback,
            feedback_tx,
            publisher: Publisher::new(shared),
            stale: false,
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
        self.membership.recover(&self.config);
        self.publisher.forget_published();
        self.stale = true;
    }

    async fn run(&mut self) {
        loop {
            if std::mem::take(&mut self.stale) {
                self.reconcile();
            }
            let next_timer =
                [self.membership.next_deadline(), self.health.next_deadline()].into_iter().flatten().min();
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
                (task, attempt, result) = poll_fn(|cx| self.membership.poll_attempts(cx)),
                    if self.membership.is_connecting() => self.on_connected(task, attempt, result),
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
            Command::SetFrontendZones(sizes) => {
                if let Some(zones) = &mut self.config.zones {
                    tracing::info!(frontends = ?sizes, "frontends per zone changed");
                    zones.frontends = sizes;
                }
            }
            Command::Affinity(tasks) => {
                let subset = self.shared().table.load().wanted.clone();
                self.membership.request_affinity(tasks, &subset, &self.view, &self.config, Instant::now());
            }
        }
        self.reconcile();
    }

    fn on_view(&mut self, view: Option<JobView<T>>) {
        match view {
            Some(view) => {
                self.view = view;
                self.zones = if self.config.zones.is_some() { self.view.zones() } else { BTreeMap::new() };
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
        let mut changed = self.membership.on_timer(now);
        let connected = self.membership.ready();
        let membership = &self.membership;
        let counters = &self.publisher.shared().counters;
        changed |= self.health.on_timer(now, &connected, |task| membership.has_slot(task), counters);
        if changed {
            self.reconcile();
        }
    }

    /// A connection attempt came to an outcome: records it, and every other outcome
    /// already in (at most [`MAX_OUTCOMES_PER_TABLE`] in all), then reconciles once. A
    /// fresh subset of thousands of members (a zone-aware frontend's spill subsets in a
    /// large job) then costs a few reconciles, not one each: each is linear in the job's
    /// size, and one per connection would keep the task busy past the connect timeout.
    fn on_connected(&mut self, task: usize, attempt: u64, result: Result<S, BoxError>) {
        let mut changed = self.record_outcome(task, attempt, result);
        for _ in 1..MAX_OUTCOMES_PER_TABLE {
            let Some((task, attempt, result)) =
                poll_fn(|cx| self.membership.poll_attempts(cx)).now_or_never()
            else {
                break;
            };
            changed |= self.record_outcome(task, attempt, result);
        }
        if changed {
            self.reconcile();
        }
    }

    /// Records one attempt's outcome: the connection in rotation from the next table, or
    /// the task backing off. Returns false for a stale attempt (the task left, or a newer
    /// attempt replaced it), whose connection is dropped.
    fn record_outcome(&mut self, task: usize, attempt: u64, result: Result<S, BoxError>) -> bool {
        let Some(address) = self.membership.awaiting(task, attempt) else {
            return false;
        };
        match result {
            Ok(service) => {
                let rotation = Arc::downgrade(self.publisher.shared());
                // Back after a broken connection: probation. Joining the subset while
                // requests flow: slow start. The first members of a fresh balancer, and
                // affinity connections (replicas keyed requests are waiting for, already
                // serving other frontends), open fully.
                let returning = self.membership.has_failed(task, &address);
                let joining = self.requests_flow() && !self.membership.is_affinity(task);
                let gate = self.health.opening_gate(returning, joining);
                let reactions = Reactions {
                    consecutive: self.config.outliers.consecutive_failures.unwrap_or(0),
                    after_probe: self.health.after_probe(),
                };
                let opening = Opening { gate, load: LoadSignal::new(self.config.load), reactions };
                let link = Link { feedback: self.feedback_tx.clone(), rotation };
                let endpoint = Arc::new(Endpoint::new(task, attempt, service, opening, link));
                if gate.slow_start_share().is_some() {
                    self.health.start_slow_start(endpoint.clone(), Instant::now());
                }
                Counters::add(&self.shared().counters.opened, 1);
                self.shared().open.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(task, returning, gate = %gate, "connected");
                self.membership.connected(task, endpoint);
            }
            Err(error) => {
                let (failures, until) = self.membership.connect_failed(task, &address);
                Counters::add(&self.shared().counters.connect_failures, 1);
                tracing::warn!(task, %error, failures, retry_in = ?until - Instant::now(), "connection failed");
            }
        }
        true
    }

    fn on_feedback(&mut self, feedback: Feedback) {
        match feedback {
            Feedback::Failed { task, id } => {
                let Some((failures, until)) = self.membership.transport_failed(task, id) else { return };
                Counters::add(&self.shared().counters.ejections, 1);
                tracing::warn!(task, failures, retry_in = ?until - Instant::now(), "backend failed a call: out of rotation");
                self.reconcile();
            }
            Feedback::Consecutive { task, id } => {
                let Some(endpoint) = self.membership.endpoint(task).filter(|e| e.id == id).cloned() else {
                    return;
                };
                let now = Instant::now();
                let others: Vec<(usize, Arc<Endpoint<S>>)> =
                    self.membership.ready().into_iter().filter(|(t, _)| *t != task).collect();
                if self.health.on_run(task, &endpoint, &others, &self.publisher.shared().counters, now) {
                    self.reconcile();
                }
            }
            Feedback::Probed { id } => {
                if let Some(endpoint) = self.membership.endpoint_by_id(id).cloned() {
                    self.health.probe_served(endpoint, Instant::now());
                }
            }
            Feedback::Drained { id } => self.membership.drained(id, self.publisher.shared()),
        }
    }

    /// Whether requests have been sent through this balancer (members that join then
    /// take up load gradually; the first ones open at once).
    fn requests_flow(&self) -> bool {
        let shared = self.shared();
        shared.counters.closed_requests.load(Ordering::Relaxed) > 0
            || shared.table.load().unkeyed().any(|e| e.calls.requests.load(Ordering::Relaxed) > 0)
    }

    /// The frontend's index over the whole job: its index, or a zone-aware frontend's
    /// index in the whole frontend job.
    fn job_index(&self) -> usize {
        self.config.zones.as_ref().map_or(self.config.frontend, |z| z.job_index(self.config.frontend))
    }

    /// Brings the connections in line with what is wanted, then publishes the table.
    ///
    /// Membership plans from its inputs, the view and the health: the subset, whose
    /// share out of rotation the health records (the panic threshold), then the
    /// affinity connections. The table is built from the connections in rotation,
    /// less the ejections the health keeps out.
    fn reconcile(&mut self) {
        let now = Instant::now();
        let counters = &self.publisher.shared().counters;
        let table = self.publisher.shared().table.load();
        let spilling = table.spill.as_ref().is_some_and(|s| s.zones().iter().any(|z| !z.members.is_empty()));
        let zones = match &self.config.zones {
            Some(routing) if !self.zones.is_empty() => {
                Some(ZoneInputs { routing, zones: &self.zones, spilling })
            }
            _ => None,
        };
        let inputs = Inputs { view: &self.view, health: &self.health, frontend: self.job_index(), zones };
        let (subset, spill, local_share) = match self.membership.plan(inputs, &self.config, now) {
            Some(planned) => {
                let (carrying, out) = planned.carrying();
                self.health.observe_subset(carrying, out, counters);
                let wanted = planned.wanted();
                (wanted, planned.spill, planned.local_share)
            }
            // No subset can be computed for such a view: keep the one in force.
            None => (table.wanted.clone(), Vec::new(), 1.0),
        };
        drop(table);
        self.membership.follow(&subset, &self.view, &self.config, counters, now);
        // Ejected members leave the table, unless the subset is in panic.
        let kept_out = self.health.kept_out(now);
        let connected = self.membership.in_rotation(&kept_out);
        let (membership, view, config) = (&self.membership, &self.view, &self.config);
        let reachable = |task: u32| membership.reachable(task as usize, &kept_out, view, config, now);
        let reachability = self.assignments.replica_tasks().iter().fold(0u64, |digest, &t| {
            steady_subset::hash::hash_pair(digest, u64::from(t) << 1 | u64::from(reachable(t)))
        });
        // A zone-aware frontend's keyed requests prefer its zone's replicas, as far as
        // they cover its zone's share of the demand.
        let routing = self.config.zones.as_ref().filter(|_| !self.zones.is_empty());
        let is_local = |task: u32| routing.is_some_and(|z| view.zone_of(task as usize) == Some(&z.zone));
        let preference = routing.map(|z| ZonePreference {
            is_local: &is_local,
            demand_share: z.demand_share(config.frontend),
            job_index: z.job_index(config.frontend),
        });
        let preference_digest = preference.as_ref().map_or(0, |p| {
            let locality = self.assignments.replica_tasks().iter().fold(p.job_index as u64, |digest, &t| {
                steady_subset::hash::hash_pair(digest, u64::from(t) << 1 | u64::from(is_local(t)))
            });
            steady_subset::hash::hash_pair(locality, p.demand_share.to_bits())
        });
        self.publisher.publish(TableInputs {
            subset,
            spill,
            local_share,
            preference,
            preference_digest,
            connected,
            ejected: self.health.ejected(now),
            panic: self.health.panic(),
            assignment: self.assignments.current(),
            frontend: if routing.is_some() { self.config.frontend } else { self.job_index() },
            fan_out: self.config.fan_out,
            reachable: &reachable,
            reachability,
            load_bound: self.config.keyed_load_bound,
        });
        // The published table no longer names them: retire them (each closes once its
        // requests have finished).
        self.membership.retire(self.publisher.shared());
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
