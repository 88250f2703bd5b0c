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
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures_util::stream::FuturesUnordered;
use futures_util::{Stream, StreamExt};
use steady_subset::prng::SplitMix64;
use steady_subset::{Algorithm, Subsetting};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tower::{Service, ServiceExt};

use crate::config::BalanceConfig;
use crate::endpoint::{Endpoint, Feedback};
use crate::error::BoxError;
use crate::job::JobView;
use crate::table::{Counters, RoutingTable, Shared};

/// What a `Balance` handle asks of the control task.
#[derive(Debug)]
pub(crate) enum Command {
    SetSubsetSize(usize),
}

type Connecting<S> = Pin<Box<dyn Future<Output = (usize, u64, Result<S, BoxError>)> + Send>>;

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
    /// Consecutive failures (reset by a successful connection).
    failures: u32,
}

impl<T, S> Slot<T, S> {
    fn failed(&self) -> bool {
        matches!(self.state, SlotState::Backoff { .. })
    }
}

pub(crate) struct Control<T, C, S, J> {
    config: BalanceConfig,
    connector: C,
    job: Option<J>,
    view: JobView<T>,
    commands: mpsc::UnboundedReceiver<Command>,
    feedback: mpsc::UnboundedReceiver<Feedback>,
    feedback_tx: mpsc::UnboundedSender<Feedback>,
    shared: Arc<Shared<S>>,
    slots: BTreeMap<usize, Slot<T, S>>,
    /// Out of rotation, waiting for requests in flight to finish, by connection id.
    draining: HashMap<u64, Arc<Endpoint<S>>>,
    connecting: FuturesUnordered<Connecting<S>>,
    next_id: u64,
    rng: SplitMix64,
    version: u64,
}

impl<T, C, S, J> Control<T, C, S, J>
where
    T: Clone + PartialEq + fmt::Debug + Send + Sync + 'static,
    C: Service<T, Response = S> + Send + 'static,
    C::Error: Into<BoxError>,
    C::Future: Send + 'static,
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
            config,
            connector,
            job: Some(job),
            view: JobView::default(),
            commands,
            feedback,
            feedback_tx,
            shared,
            slots: BTreeMap::new(),
            draining: HashMap::new(),
            connecting: FuturesUnordered::new(),
            next_id: 0,
            rng,
            version: 0,
        }
    }

    pub(crate) async fn run(mut self) {
        loop {
            let next_retry = self.next_retry();
            tokio::select! {
                command = self.commands.recv() => match command {
                    // Every handle is gone: stop, closing all connections.
                    None => break,
                    Some(Command::SetSubsetSize(k)) => {
                        tracing::info!(from = self.config.subset_size, to = k, "subset size changed");
                        self.config.subset_size = k;
                        self.reconcile().await;
                    }
                },
                Some(feedback) = self.feedback.recv() => self.on_feedback(feedback).await,
                Some((task, attempt, result)) = self.connecting.next(), if !self.connecting.is_empty() => {
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
                () = sleep_until(next_retry), if next_retry.is_some() => self.retry_due().await,
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
    /// tasks of the frontend's order, then as many further serving tasks as there are
    /// failed members among those `k` (at most `max_stand_ins`), skipping failed ones.
    fn wanted(&self) -> Vec<usize> {
        let k = self.config.subset_size;
        let mut primary = Vec::with_capacity(k);
        let mut failed = 0;
        let mut stand_ins = Vec::new();
        for task in candidate_order(&self.config.algorithm, self.config.frontend, self.view.size, k) {
            let Some(address) = self.view.serving_task(task) else { continue };
            let is_failed = self.slots.get(&task).is_some_and(|s| s.failed() && s.address == *address);
            if primary.len() < k {
                primary.push(task);
                failed += usize::from(is_failed);
                continue;
            }
            if stand_ins.len() >= failed.min(self.config.max_stand_ins) {
                break;
            }
            if !is_failed {
                stand_ins.push(task);
            }
        }
        primary.extend(stand_ins);
        primary
    }

    /// Brings connections in line with the wanted set, then publishes the table.
    async fn reconcile(&mut self) {
        let wanted = self.wanted();
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
                let address = self.view.serving_task(task).expect("wanted tasks serve").clone();
                let attempt = self.connect(task, address.clone()).await;
                self.slots
                    .insert(task, Slot { address, state: SlotState::Connecting { attempt }, failures: 0 });
            }
        }
        self.publish(wanted);
    }

    /// Starts a connection attempt; returns its id.
    async fn connect(&mut self, task: usize, address: T) -> u64 {
        self.next_id += 1;
        let attempt = self.next_id;
        tracing::debug!(task, ?address, attempt, "connecting");
        let call = match self.connector.ready().await {
            Ok(connector) => Ok(connector.call(address)),
            Err(e) => Err(e.into()),
        };
        self.connecting.push(Box::pin(async move {
            let result = match call {
                Ok(future) => future.await.map_err(Into::into),
                Err(e) => Err(e),
            };
            (task, attempt, result)
        }));
        attempt
    }

    async fn on_connected(&mut self, task: usize, attempt: u64, result: Result<S, BoxError>) {
        let Some(slot) = self.slots.get_mut(&task) else { return };
        if !matches!(slot.state, SlotState::Connecting { attempt: a } if a == attempt) {
            // A stale attempt (the task left and came back): drop its connection.
            return;
        }
        match result {
            Ok(service) => {
                let endpoint = Endpoint::new(
                    task,
                    attempt,
                    service,
                    self.config.load,
                    self.feedback_tx.clone(),
                    Arc::downgrade(&self.shared),
                );
                slot.state = SlotState::Ready(Arc::new(endpoint));
                slot.failures = 0;
                Counters::add(&self.shared.counters.opened, 1);
                self.shared.open.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(task, "connected");
            }
            Err(error) => {
                slot.failures += 1;
                let delay = self.config.backoff.delay(slot.failures, &mut self.rng);
                slot.state = SlotState::Backoff { until: Instant::now() + delay };
                Counters::add(&self.shared.counters.connect_failures, 1);
                tracing::warn!(task, %error, failures = slot.failures, retry_in = ?delay, "connection failed");
            }
        }
        self.reconcile().await;
    }

    async fn on_feedback(&mut self, feedback: Feedback) {
        match feedback {
            Feedback::Failed { task, id } => {
                let Some(slot) = self.slots.get_mut(&task) else { return };
                let endpoint = match &slot.state {
                    SlotState::Ready(endpoint) if endpoint.id == id => endpoint.clone(),
                    // Already handled, or about an older connection.
                    _ => return,
                };
                slot.failures += 1;
                let delay = self.config.backoff.delay(slot.failures, &mut self.rng);
                slot.state = SlotState::Backoff { until: Instant::now() + delay };
                Counters::add(&self.shared.counters.ejections, 1);
                tracing::warn!(task, retry_in = ?delay, "backend failed a call: out of rotation");
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
            let attempt = self.connect(task, address).await;
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
        self.shared.open.fetch_sub(1, Ordering::Relaxed);
        tracing::debug!(task = endpoint.task, "connection closed");
    }

    /// Publishes the ready members of `wanted` if they, or `wanted`, changed.
    fn publish(&mut self, wanted: Vec<usize>) {
        let members: Vec<Arc<Endpoint<S>>> = wanted
            .iter()
            .filter_map(|task| match &self.slots.get(task)?.state {
                SlotState::Ready(endpoint) => Some(endpoint.clone()),
                _ => None,
            })
            .collect();
        let current = self.shared.table.load();
        let same = current.wanted == wanted
            && current.members.len() == members.len()
            && current.members.iter().zip(&members).all(|(a, b)| a.id == b.id);
        if same {
            return;
        }
        self.version += 1;
        tracing::info!(
            version = self.version,
            ready = members.len(),
            wanted = wanted.len(),
            subset = ?wanted,
            "routing table updated"
        );
        self.shared.publish(RoutingTable { version: self.version, members, wanted });
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

/// The frontend's order of backends: the algorithm's preference order when it has
/// one; otherwise its subset of size `k` followed by the other backends in ascending
/// order from the last member (a fixed, documented fallback for stand-ins).
fn candidate_order(
    algorithm: &Algorithm,
    frontend: usize,
    backends: usize,
    k: usize,
) -> Box<dyn Iterator<Item = usize> + Send> {
    match algorithm.order(frontend, backends) {
        Ok(Some(order)) => Box::new(order),
        Ok(None) => {
            let subset = algorithm.subset(frontend, backends, k).unwrap_or_default();
            let members: HashSet<usize> = subset.iter().copied().collect();
            let from = subset.last().map_or(0, |&b| b + 1);
            let rest = (0..backends)
                .map(move |i| (from + i) % backends.max(1))
                .filter(move |b| !members.contains(b));
            Box::new(subset.into_iter().chain(rest))
        }
        // Larger than MAX_BACKENDS: no subset can be computed; want nothing.
        Err(error) => {
            tracing::error!(%error, "cannot compute the subset");
            Box::new(std::iter::empty())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fallback_order_starts_with_the_subset_and_covers_every_backend() {
        let d = Algorithm::from_name("deterministic").unwrap();
        let order: Vec<usize> = candidate_order(&d, 3, 30, 5).collect();
        assert_eq!(&order[..5], &d.subset(3, 30, 5).unwrap()[..]);
        let mut sorted = order.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..30).collect::<Vec<_>>());
        let r = Algorithm::default();
        let order: Vec<usize> = candidate_order(&r, 3, 30, 5).collect();
        assert_eq!(&order[..5], &r.subset(3, 30, 5).unwrap()[..]);
    }
}
