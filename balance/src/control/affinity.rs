//! Affinity connections: on-demand connections to replicas outside the subset that
//! keyed requests need, bounded in number (least recently active out first) and
//! closed when idle.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::slots::Slots;
use crate::connector::Address;

/// When an affinity connection was last seen busy.
struct AffinityUse {
    /// The endpoint's request count at the last look.
    requests: u64,
    /// When it was last requested or seen serving.
    active: Instant,
}

/// The affinity tasks this frontend keeps connections to, and their activity.
pub(super) struct AffinitySet {
    uses: HashMap<usize, AffinityUse>,
    /// When to look for idle connections next; `None` while there are none.
    next_sweep: Option<Instant>,
    max: usize,
    idle: Duration,
}

impl AffinitySet {
    /// At most `max` connections, each closed after `idle` without a request.
    pub(super) fn new(max: usize, idle: Duration) -> Self {
        Self { uses: HashMap::new(), next_sweep: None, max, idle }
    }

    pub(super) fn contains(&self, task: usize) -> bool {
        self.uses.contains_key(&task)
    }

    /// When the next sweep for idle connections is due.
    pub(super) fn next_sweep(&self) -> Option<Instant> {
        self.next_sweep
    }

    /// The affinity tasks still worth a connection: up (`address_of`: serving, or
    /// draining too when keyed requests may go to draining owners), and not in the
    /// subset. A failed task keeps its slot (and its retries) if it has one, but is not
    /// reopened before its backoff ends.
    pub(super) fn wanted<'v, T: Address + 'v, S>(
        &self,
        subset: &[usize],
        address_of: impl Fn(usize) -> Option<&'v T>,
        slots: &Slots<T, S>,
        now: Instant,
    ) -> Vec<usize> {
        let mut tasks: Vec<usize> = self
            .uses
            .keys()
            .copied()
            .filter(|t| {
                !subset.contains(t)
                    && address_of(*t)
                        .is_some_and(|address| slots.contains(*t) || !slots.is_failed(*t, address, now))
            })
            .collect();
        tasks.sort_unstable();
        tasks
    }

    /// A keyed request needs `tasks`: keep affinity connections to the serving ones
    /// outside `subset`, within the bound. Over the bound, the least recently active
    /// go first, sparing the ones just requested while others remain.
    pub(super) fn request<'v, T: Address + 'v, S>(
        &mut self,
        tasks: Vec<u32>,
        subset: &[usize],
        address_of: impl Fn(usize) -> Option<&'v T>,
        slots: &Slots<T, S>,
        now: Instant,
    ) {
        self.refresh(slots, now);
        let requested: Vec<usize> = tasks
            .into_iter()
            .map(|t| t as usize)
            .filter(|t| !subset.contains(t) && address_of(*t).is_some())
            .collect();
        for &task in &requested {
            self.uses.entry(task).or_insert(AffinityUse { requests: 0, active: now }).active = now;
        }
        while self.uses.len() > self.max {
            let victim = self
                .uses
                .iter()
                .filter(|(t, _)| !requested.contains(t))
                .min_by_key(|(_, u)| u.active)
                .or_else(|| self.uses.iter().min_by_key(|(_, u)| u.active))
                .map(|(t, _)| *t);
            match victim {
                Some(task) => self.uses.remove(&task),
                None => break,
            };
        }
        if !self.uses.is_empty() && self.next_sweep.is_none() {
            self.next_sweep = now.checked_add(self.sweep_period());
        }
    }

    /// Forgets the connections idle for the configured time, if a sweep is due;
    /// returns whether it forgot any (the caller then closes them).
    pub(super) fn sweep<T: Address, S>(&mut self, slots: &Slots<T, S>, now: Instant) -> bool {
        if self.next_sweep.is_none_or(|at| at > now) {
            return false;
        }
        self.refresh(slots, now);
        let idle = self.idle;
        let before = self.uses.len();
        self.uses.retain(|task, used| {
            let keep = now.duration_since(used.active) < idle;
            if !keep {
                tracing::debug!(task, "affinity connection idle: closing");
            }
            keep
        });
        self.next_sweep = if self.uses.is_empty() { None } else { now.checked_add(self.sweep_period()) };
        self.uses.len() != before
    }

    /// Half the idle timeout, within 10 ms and an hour.
    fn sweep_period(&self) -> Duration {
        (self.idle / 2).clamp(Duration::from_millis(10), Duration::from_secs(3600))
    }

    /// Marks the connections that served requests since the last look, or have some in
    /// flight, as active now.
    fn refresh<T: Address, S>(&mut self, slots: &Slots<T, S>, now: Instant) {
        for (task, used) in &mut self.uses {
            if let Some(endpoint) = slots.endpoint(*task) {
                let requests = endpoint.calls.requests.load(Ordering::Relaxed);
                if requests != used.requests || endpoint.calls.in_flight.load(Ordering::Relaxed) > 0 {
                    used.requests = requests;
                    used.active = now;
                }
            }
        }
    }
}
