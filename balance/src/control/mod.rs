//! The control task: membership, connections, health and the routing table, off the
//! request path.
//!
//! It owns every decision: which backends the frontend wants (its subset, minus tasks
//! that are not serving, plus stand-ins for members whose connection failed), opening
//! and closing connections, reconnecting with backoff, and publishing a new routing
//! table whenever the set of ready members changes. It runs whenever something
//! arrives (a job view, a command, a connection result, request feedback, a timer),
//! whether or not requests flow, and stops when the last `Balance` handle is dropped.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures_util::{Stream, StreamExt};
use std::future::poll_fn;
use steady_subset::prng::SplitMix64;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::assignment::Assignment;
use crate::config::BalanceConfig;
use crate::connector::{Address, Connector};
use crate::endpoint::{Endpoint, Feedback};
use crate::error::BoxError;
use crate::job::JobView;
use crate::slices::SliceTable;
use crate::table::{Counters, RoutingTable, Shared};

mod affinity;
mod assignments;
mod attempts;
mod health;
mod order;

use affinity::AffinityUse;
use assignments::next_assignment;
pub(crate) use assignments::AssignmentSource;
use attempts::Attempts;
use health::Health;
use order::candidate_order;

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

/// The connection to one wanted backend task.
enum SlotState<S> {
    /// A connection attempt is under way (identified by `attempt`).
    Connecting { attempt: u64 },
    /// Connected and in rotation.
    Ready(Arc<Endpoint<S>>),
    /// The last attempt or call failed; retry at `until`.
    Backoff { until: Instant },
}

struct Slot<T, S> {
    address: T,
    state: SlotState<S>,
}

impl<T, S> Slot<T, S> {
    /// Whether the slot waits for connection attempt `attempt` (no newer attempt
    /// replaced it).
    fn awaits(&self, attempt: u64) -> bool {
        matches!(self.state, SlotState::Connecting { attempt: a } if a == attempt)
    }
}

pub(crate) struct Control<T, C, S, J> {
    config: BalanceConfig,
    attempts: Attempts<T, C, S>,
    job: Option<J>,
    view: JobView<T>,
    commands: mpsc::UnboundedReceiver<Command>,
    feedback: mpsc::UnboundedReceiver<Feedback>,
    feedback_tx: mpsc::UnboundedSender<Feedback>,
    shared: Arc<Shared<S>>,
    slots: BTreeMap<usize, Slot<T, S>>,
    /// Out of rotation, waiting for requests in flight to finish, by connection id.
    draining: HashMap<u64, Arc<Endpoint<S>>>,
    next_id: u64,
    rng: SplitMix64,
    version: u64,
    assignments: Option<AssignmentSource>,
    assignment: Option<Assignment>,
    /// On-demand connections to replicas outside the subset, by task.
    affinity: HashMap<usize, AffinityUse>,
    next_sweep: Option<Instant>,
    /// What the last published table was built from, to skip needless publications.
    published: Vec<u64>,
    /// Tasks that failed, until they connect and serve again.
    health: HashMap<usize, Health<T>>,
}

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
        let rng = SplitMix64::new(config.frontend as u64 ^ 0xC0_FFEE);
        Self {
            attempts: Attempts::new(connector, config.connect_timeout),
            config,
            job: Some(job),
            view: JobView::default(),
            commands,
            feedback,
            feedback_tx,
            shared,
            slots: BTreeMap::new(),
            draining: HashMap::new(),
            next_id: 0,
            rng,
            version: 0,
            assignments: None,
            assignment: None,
            affinity: HashMap::new(),
            next_sweep: None,
            published: Vec::new(),
            health: HashMap::new(),
        }
    }

    pub(crate) async fn run(mut self) {
        loop {
            let next_timer = [self.next_retry(), self.next_sweep].into_iter().flatten().min();
            tokio::select! {
                command = self.commands.recv() => match command {
                    // Every handle is gone: stop, closing all connections.
                    None => break,
                    Some(command) => self.on_command(command).await,
                },
                item = next_assignment(&mut self.assignments), if self.assignments.is_some() => {
                    self.on_assignment(item).await;
                }
                Some(feedback) = self.feedback.recv() => self.on_feedback(feedback).await,
                (task, attempt, result) = poll_fn(|cx| {
                    self.attempts.poll_outcome(cx, |task, attempt| self.slots.get(&task).is_some_and(|s| s.awaits(attempt)))
                }), if !self.attempts.is_idle() => {
                    self.on_connected(task, attempt, result).await;
                }
                view = next_view(&mut self.job), if self.job.is_some() => match view {
                    Some(view) => {
                        self.view = view;
                        self.reconcile().await;
                    }
                    // The source ended: the last view stays in force.
                    None => self.job = None,
                },
                () = sleep_until(next_timer), if next_timer.is_some() => {
                    self.retry_due().await;
                    self.sweep_affinity().await;
                }
            }
        }
        tracing::debug!(open = self.shared.open.load(Ordering::Relaxed), "balancer stopped");
    }

    /// The earliest backoff deadline.
    fn next_retry(&self) -> Option<Instant> {
        self.slots
            .values()
            .filter_map(|s| match s.state {
                SlotState::Backoff { until } => Some(until),
                _ => None,
            })
            .min()
    }

    /// The backends to keep connections to, in preference order: the first `k` serving
    /// tasks of the frontend's order, then as many stand-ins as there are failed members
    /// among those `k` (at most `max_stand_ins`). Stand-ins already connected are kept
    /// (so a recovering candidate never displaces a healthy one); the rest come next in
    /// order, skipping failed tasks.
    fn wanted(&self) -> Vec<usize> {
        if self.view.size > steady_subset::MAX_BACKENDS {
            // No subset can be computed for such a view: keep the one in force.
            return self.shared.table.load().wanted.clone();
        }
        let now = Instant::now();
        let k = self.config.subset_size;
        let mut order = candidate_order(&self.config.algorithm, self.config.frontend, self.view.size, k);
        let mut primary = Vec::with_capacity(k);
        let mut failed = 0;
        if k > 0 {
            for task in order.by_ref() {
                let Some(address) = self.view.serving_task(task) else { continue };
                primary.push(task);
                failed += usize::from(self.is_failed(task, address, now));
                if primary.len() == k {
                    break;
                }
            }
        }
        let needed = failed.min(self.config.max_stand_ins);
        let mut stand_ins: Vec<usize> = self
            .slots
            .iter()
            .filter(|(task, slot)| {
                matches!(slot.state, SlotState::Ready(_))
                    && !primary.contains(task)
                    && !self.affinity.contains_key(task)
                    && self.view.serving_task(**task) == Some(&slot.address)
            })
            .map(|(task, _)| *task)
            .take(needed)
            .collect();
        if stand_ins.len() < needed {
            // The order continues right after the last primary member.
            for task in order {
                if stand_ins.len() >= needed {
                    break;
                }
                let Some(address) = self.view.serving_task(task) else { continue };
                if !primary.contains(&task)
                    && !stand_ins.contains(&task)
                    && !self.is_failed(task, address, now)
                {
                    stand_ins.push(task);
                }
            }
        }
        primary.extend(stand_ins);
        primary
    }

    /// Brings connections in line with the wanted set, then publishes the table.
    async fn reconcile(&mut self) {
        // Forget failures of tasks no longer connected once they are long past.
        let now = Instant::now();
        let forget_after = self.config.backoff.max;
        let slots = &self.slots;
        self.health.retain(|task, h| {
            slots.contains_key(task) || h.retry_at.checked_add(forget_after).is_none_or(|t| t > now)
        });
        let subset = self.wanted();
        let affinity = self.affinity_wanted(&subset);
        let wanted: Vec<usize> = subset.iter().chain(&affinity).copied().collect();
        let keep: HashSet<usize> = wanted.iter().copied().collect();
        // Close what is no longer wanted, or whose task moved to another address.
        let gone: Vec<usize> = self
            .slots
            .iter()
            .filter(|(task, slot)| {
                !keep.contains(task) || self.view.serving_task(**task) != Some(&slot.address)
            })
            .map(|(task, _)| *task)
            .collect();
        for task in gone {
            if let Some(slot) = self.slots.remove(&task) {
                if let SlotState::Ready(endpoint) = slot.state {
                    self.retire(endpoint, "left the subset");
                }
            }
        }
        // Open what is newly wanted.
        for &task in &wanted {
            if !self.slots.contains_key(&task) {
                // A kept subset (for a view no subset can be computed for) may name
                // tasks that no longer serve: skip them.
                let Some(address) = self.view.serving_task(task).cloned() else { continue };
                let attempt = self.connect(task, address.clone());
                self.slots.insert(task, Slot { address, state: SlotState::Connecting { attempt } });
                if affinity.contains(&task) {
                    Counters::add(&self.shared.counters.affinity_opened, 1);
                }
            }
        }
        self.publish(subset);
    }

    async fn on_command(&mut self, command: Command) {
        match command {
            Command::SetSubsetSize(k) => {
                tracing::info!(from = self.config.subset_size, to = k, "subset size changed");
                self.config.subset_size = k;
            }
            Command::Assignments(source) => self.assignments = Some(source),
            Command::Affinity(tasks) => self.on_affinity(tasks),
        }
        self.reconcile().await;
    }

    /// Starts a connection attempt; returns its id. It comes to an outcome (see
    /// [`attempts`]) within the connect timeout, without holding up the control task.
    fn connect(&mut self, task: usize, address: T) -> u64 {
        self.next_id += 1;
        let attempt = self.next_id;
        tracing::debug!(task, ?address, attempt, "connecting");
        self.attempts.start(task, attempt, address);
        attempt
    }

    async fn on_connected(&mut self, task: usize, attempt: u64, result: Result<S, BoxError>) {
        let Some(slot) = self.slots.get(&task).filter(|s| s.awaits(attempt)) else {
            // A stale attempt (the task left, or a newer attempt replaced it): drop its
            // connection.
            return;
        };
        let address = slot.address.clone();
        let state = match result {
            Ok(service) => {
                let endpoint = Endpoint::new(
                    task,
                    attempt,
                    service,
                    self.config.load,
                    self.feedback_tx.clone(),
                    Arc::downgrade(&self.shared),
                );
                Counters::add(&self.shared.counters.opened, 1);
                self.shared.open.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(task, "connected");
                SlotState::Ready(Arc::new(endpoint))
            }
            Err(error) => {
                let (failures, until) = self.record_failure(task, &address, false);
                Counters::add(&self.shared.counters.connect_failures, 1);
                tracing::warn!(task, %error, failures, retry_in = ?until - Instant::now(), "connection failed");
                SlotState::Backoff { until }
            }
        };
        if let Some(slot) = self.slots.get_mut(&task) {
            slot.state = state;
        }
        self.reconcile().await;
    }

    async fn on_feedback(&mut self, feedback: Feedback) {
        match feedback {
            Feedback::Failed { task, id } => {
                let Some(slot) = self.slots.get(&task) else { return };
                let endpoint = match &slot.state {
                    SlotState::Ready(endpoint) if endpoint.id == id => endpoint.clone(),
                    // Already handled, or about an older connection.
                    _ => return,
                };
                let address = slot.address.clone();
                // A connection that served requests before failing starts the count
                // afresh; one that never did makes the backoff grow.
                let served =
                    endpoint.requests.load(Ordering::Relaxed) > endpoint.failures.load(Ordering::Relaxed);
                let (failures, until) = self.record_failure(task, &address, served);
                if let Some(slot) = self.slots.get_mut(&task) {
                    slot.state = SlotState::Backoff { until };
                }
                Counters::add(&self.shared.counters.ejections, 1);
                tracing::warn!(task, failures, retry_in = ?until - Instant::now(), "backend failed a call: out of rotation");
                self.retire(endpoint, "failed");
                self.reconcile().await;
            }
            Feedback::Drained { id } => {
                if self.draining.get(&id).is_some_and(|e| e.in_flight.load(Ordering::SeqCst) == 0) {
                    if let Some(endpoint) = self.draining.remove(&id) {
                        self.close(&endpoint);
                    }
                }
            }
        }
    }

    /// Retries every connection whose backoff has expired.
    async fn retry_due(&mut self) {
        let now = Instant::now();
        let due: Vec<(usize, T)> = self
            .slots
            .iter()
            .filter(|(_, s)| matches!(s.state, SlotState::Backoff { until } if until <= now))
            .map(|(task, s)| (*task, s.address.clone()))
            .collect();
        for (task, address) in due {
            let attempt = self.connect(task, address);
            if let Some(slot) = self.slots.get_mut(&task) {
                slot.state = SlotState::Connecting { attempt };
            }
        }
    }

    /// Takes a connection out of rotation; it closes once its requests have finished.
    fn retire(&mut self, endpoint: Arc<Endpoint<S>>, why: &'static str) {
        tracing::debug!(
            task = endpoint.task,
            in_flight = endpoint.in_flight.load(Ordering::Relaxed),
            why,
            "draining"
        );
        if endpoint.start_draining() {
            self.close(&endpoint);
        } else {
            self.draining.insert(endpoint.id, endpoint);
        }
    }

    fn close(&self, endpoint: &Endpoint<S>) {
        let c = &self.shared.counters;
        Counters::add(&c.closed, 1);
        Counters::add(&c.closed_requests, endpoint.requests.load(Ordering::Relaxed));
        Counters::add(&c.closed_failures, endpoint.failures.load(Ordering::Relaxed));
        Counters::add(&c.closed_keyed, endpoint.keyed.load(Ordering::Relaxed));
        self.shared.open.fetch_sub(1, Ordering::Relaxed);
        tracing::debug!(task = endpoint.task, "connection closed");
    }

    /// Publishes the ready members of `subset` and the slice table, if anything they
    /// are built from changed.
    fn publish(&mut self, subset: Vec<usize>) {
        let connected: HashMap<usize, Arc<Endpoint<S>>> = self
            .slots
            .iter()
            .filter_map(|(task, slot)| match &slot.state {
                SlotState::Ready(endpoint) => Some((*task, endpoint.clone())),
                _ => None,
            })
            .collect();
        let members: Vec<Arc<Endpoint<S>>> =
            subset.iter().filter_map(|t| connected.get(t).cloned()).collect();
        // What the table depends on: the subset, its ready members, every connection,
        // and the assignment's generation.
        let mut signature: Vec<u64> = subset.iter().map(|&t| t as u64).collect();
        signature.push(u64::MAX);
        signature.extend(members.iter().map(|e| e.id));
        signature.push(u64::MAX);
        let mut ids: Vec<u64> = connected.values().map(|e| e.id).collect();
        ids.sort_unstable();
        signature.extend(ids);
        signature.push(self.assignment.as_ref().map_or(u64::MAX, Assignment::generation));
        if signature == self.published {
            return;
        }
        self.published = signature;
        let slices = self
            .assignment
            .as_ref()
            .map(|a| SliceTable::build(a, self.config.frontend, self.config.fan_out, &connected));
        self.version += 1;
        tracing::info!(
            version = self.version,
            ready = members.len(),
            wanted = subset.len(),
            affinity = self.affinity.len(),
            generation = ?slices.as_ref().map(|s| s.generation),
            subset = ?subset,
            "routing table updated"
        );
        let mut affinity: Vec<Arc<Endpoint<S>>> =
            connected.iter().filter(|(t, _)| !subset.contains(t)).map(|(_, e)| e.clone()).collect();
        affinity.sort_unstable_by_key(|e| e.task);
        self.shared.publish(RoutingTable {
            version: self.version,
            members,
            wanted: subset,
            affinity,
            slices,
        });
    }
}

impl<T, C, S, J> Drop for Control<T, C, S, J> {
    fn drop(&mut self) {
        // The control task is the only owner of the slot connections; requests still
        // in flight keep theirs until they finish.
        self.shared.publish(RoutingTable {
            version: self.version + 1,
            members: Vec::new(),
            wanted: Vec::new(),
            affinity: Vec::new(),
            slices: None,
        });
    }
}

/// The next view from the job source (pending forever once it is gone).
async fn next_view<T, J: Stream<Item = JobView<T>> + Unpin>(job: &mut Option<J>) -> Option<JobView<T>> {
    match job {
        Some(job) => job.next().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
