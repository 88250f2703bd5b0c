//! The connection slots of the wanted backends, with their failure history and backoff.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use steady_subset::prng::SplitMix64;
use tokio::time::Instant;

use crate::connector::Address;
use crate::route::endpoint::Endpoint;
use steady_core::Backoff;

/// The connection to one wanted backend task.
pub(super) enum SlotState<S> {
    /// A connection attempt is under way (identified by `attempt`).
    Connecting { attempt: u64 },
    /// Connected and in rotation.
    Ready(Arc<Endpoint<S>>),
    /// The last attempt or call failed; retry at `until`.
    Backoff { until: Instant },
}

/// A wanted backend task: where it is and how its connection stands.
pub(super) struct Slot<T, S> {
    pub(super) address: T,
    pub(super) state: SlotState<S>,
}

impl<T, S> Slot<T, S> {
    /// Whether the slot waits for connection attempt `attempt` (no newer attempt
    /// replaced it).
    pub(super) fn awaits(&self, attempt: u64) -> bool {
        matches!(self.state, SlotState::Connecting { attempt: a } if a == attempt)
    }

    /// The connection, when there is one in rotation.
    pub(super) fn endpoint(&self) -> Option<&Arc<Endpoint<S>>> {
        match &self.state {
            SlotState::Ready(endpoint) => Some(endpoint),
            _ => None,
        }
    }
}

/// A task that failed (a connection attempt, or a call), kept whether or not it is
/// still wanted, so that a failing stand-in is not reopened at once when its slot goes.
struct FailureHistory<T> {
    address: T,
    /// Consecutive failures: connection attempts that failed, or connections that
    /// failed before serving any request. Drives the backoff.
    failures: u32,
    /// No new attempt before this.
    retry_at: Instant,
}

/// The slots by task, and the failure history of every task that failed.
pub(super) struct Slots<T, S> {
    slots: BTreeMap<usize, Slot<T, S>>,
    /// Tasks that failed, until they connect and serve again (or their failure is long past).
    failed: HashMap<usize, FailureHistory<T>>,
    backoff: Backoff,
    /// Jitter for the backoff.
    rng: SplitMix64,
}

impl<T: Address, S> Slots<T, S> {
    pub(super) fn new(backoff: Backoff, rng: SplitMix64) -> Self {
        Self { slots: BTreeMap::new(), failed: HashMap::new(), backoff, rng }
    }

    pub(super) fn get(&self, task: usize) -> Option<&Slot<T, S>> {
        self.slots.get(&task)
    }

    pub(super) fn contains(&self, task: usize) -> bool {
        self.slots.contains_key(&task)
    }

    /// Every slot, by ascending task.
    pub(super) fn iter(&self) -> impl Iterator<Item = (usize, &Slot<T, S>)> {
        self.slots.iter().map(|(task, slot)| (*task, slot))
    }

    /// The connection of `task`, when it is ready.
    pub(super) fn endpoint(&self, task: usize) -> Option<&Arc<Endpoint<S>>> {
        self.slots.get(&task).and_then(Slot::endpoint)
    }

    /// Every connection in rotation, by task.
    pub(super) fn connected(&self) -> HashMap<usize, Arc<Endpoint<S>>> {
        self.iter().filter_map(|(task, slot)| Some((task, slot.endpoint()?.clone()))).collect()
    }

    /// A new slot for `task`, waiting for connection attempt `attempt`.
    pub(super) fn insert_connecting(&mut self, task: usize, address: T, attempt: u64) {
        self.slots.insert(task, Slot { address, state: SlotState::Connecting { attempt } });
    }

    /// Takes out the connected slots whose connection is known broken (a failed call or
    /// readiness marked it), returning their connections.
    pub(super) fn take_broken(&mut self) -> Vec<Arc<Endpoint<S>>> {
        let broken: Vec<usize> = self
            .iter()
            .filter(|(_, slot)| slot.endpoint().is_some_and(|e| e.is_broken()))
            .map(|(t, _)| t)
            .collect();
        broken.into_iter().filter_map(|t| self.slots.remove(&t)?.endpoint().cloned()).collect()
    }

    /// Keeps only the slots that are connected or backing off (after a restart of the
    /// control task: an attempt under way may belong to a slot half updated; its outcome
    /// is then ignored, and the task is connected afresh if still wanted).
    pub(super) fn retain_settled(&mut self) {
        self.slots.retain(|_, slot| !matches!(slot.state, SlotState::Connecting { .. }));
    }

    pub(super) fn remove(&mut self, task: usize) -> Option<Slot<T, S>> {
        self.slots.remove(&task)
    }

    /// Sets the state of `task`'s slot, if it still has one.
    pub(super) fn set_state(&mut self, task: usize, state: SlotState<S>) {
        if let Some(slot) = self.slots.get_mut(&task) {
            slot.state = state;
        }
    }

    /// The earliest backoff deadline.
    pub(super) fn next_retry(&self) -> Option<Instant> {
        self.slots
            .values()
            .filter_map(|s| match s.state {
                SlotState::Backoff { until } => Some(until),
                _ => None,
            })
            .min()
    }

    /// The slots whose backoff has expired, with their addresses.
    pub(super) fn due(&self, now: Instant) -> Vec<(usize, T)> {
        self.iter()
            .filter(|(_, s)| matches!(s.state, SlotState::Backoff { until } if until <= now))
            .map(|(task, s)| (task, s.address.clone()))
            .collect()
    }

    /// Whether `task` (at `address`) is unusable: it failed, and is waiting out its
    /// backoff or retrying, and has not connected since.
    pub(super) fn is_failed(&self, task: usize, address: &T, now: Instant) -> bool {
        let Some(history) = self.failed.get(&task).filter(|h| h.address == *address) else { return false };
        match self.slots.get(&task).map(|s| &s.state) {
            Some(SlotState::Ready(_)) => false,
            Some(SlotState::Connecting { .. } | SlotState::Backoff { .. }) => true,
            None => now < history.retry_at,
        }
    }

    /// Whether `task` (at `address`) failed before and has not served since: a new
    /// connection to it is a return from failure.
    pub(super) fn has_failed(&self, task: usize, address: &T) -> bool {
        self.failed.get(&task).is_some_and(|h| h.address == *address)
    }

    /// Records a failure of `task` and returns the consecutive failures and when to
    /// retry it. `served` says whether its connection served a request before failing,
    /// which restarts the count.
    pub(super) fn record_failure(&mut self, task: usize, address: &T, served: bool) -> (u32, Instant) {
        let now = Instant::now();
        let history = self.failed.entry(task).or_insert_with(|| FailureHistory {
            address: address.clone(),
            failures: 0,
            retry_at: now,
        });
        if history.address != *address || served {
            history.address = address.clone();
            history.failures = 0;
        }
        history.failures += 1;
        history.retry_at = now + self.backoff.delay(history.failures, &mut self.rng);
        (history.failures, history.retry_at)
    }

    /// Forgets the failures of tasks without a slot once they are a longest backoff past.
    pub(super) fn forget_old_failures(&mut self, now: Instant) {
        let forget_after = self.backoff.max;
        let slots = &self.slots;
        self.failed.retain(|task, h| {
            slots.contains_key(task) || h.retry_at.checked_add(forget_after).is_none_or(|t| t > now)
        });
    }
}
