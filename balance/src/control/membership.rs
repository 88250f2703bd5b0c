//! Membership: which backend tasks the frontend keeps connections to, and those
//! connections from the attempt to the close.
//!
//! It plans from its [`Inputs`] (the job view and the members' health): the subset
//! (the first `k` serving tasks of the frontend's order, and stand-ins for those out),
//! then the affinity connections keyed requests asked for; and it brings the
//! connections in line with the plan (opening, retiring, reconnecting with backoff).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::time::Instant;

use super::affinity::AffinitySet;
use super::attempts::{Attempts, Outcome};
use super::draining::Draining;
use super::health::Health;
use super::order::candidate_order;
use super::slots::{SlotState, Slots};
use super::spill;
use crate::config::{BalanceConfig, ZoneRouting};
use crate::connector::{Address, Connector};
use crate::route::endpoint::Endpoint;
use crate::route::pick::fresh_rng;
use crate::route::table::{Counters, Shared};
use steady_core::{JobView, Zone, ZoneView};

/// What membership plans from: the job view, the members' health (ejected tasks are
/// out, and stand-ins replace them), and for a zone-aware frontend the view's zones.
pub(super) struct Inputs<'a, T, S> {
    pub(super) view: &'a JobView<T>,
    pub(super) health: &'a Health<S>,
    /// The frontend's index over the whole job, when it routes over the whole job (a
    /// zone-aware frontend's index in the whole frontend job).
    pub(super) frontend: usize,
    /// `None` routes over the whole job (no zone routing, or a view without zones).
    pub(super) zones: Option<ZoneInputs<'a>>,
}

/// A zone-aware frontend's inputs: its routing settings, the view's zones, and whether
/// requests spill now (over connections in rotation).
pub(super) struct ZoneInputs<'a> {
    pub(super) routing: &'a ZoneRouting,
    pub(super) zones: &'a BTreeMap<Zone, ZoneView>,
    pub(super) spilling: bool,
}

/// One pool's planned subset: the tasks to keep connections to, in preference order.
pub(super) struct Group {
    /// The first `k` serving tasks of the frontend's order, then the stand-ins.
    pub(super) tasks: Vec<usize>,
    /// How many of `tasks` are the first `k` (the rest are stand-ins).
    pub(super) primary: usize,
    /// How many of those `primary` are out of rotation (failed and backing off, or
    /// ejected).
    pub(super) out: usize,
}

/// A zone that some of the unkeyed requests spill to, and the subset they go over.
pub(super) struct SpillGroup {
    pub(super) zone: Zone,
    /// The share of unkeyed requests sent there.
    pub(super) share: f64,
    pub(super) group: Group,
}

/// A planned subset: the frontend's own (its zone's, when zone-aware), and the subsets
/// of the zones its requests spill to.
pub(super) struct Subset {
    pub(super) group: Group,
    /// Empty while every request stays in the zone (and without zones).
    pub(super) spill: Vec<SpillGroup>,
    /// The share of unkeyed requests `group` takes (1 without spill).
    pub(super) local_share: f64,
}

impl Subset {
    /// Every task wanted: the frontend's subset, then each spill zone's.
    pub(super) fn wanted(&self) -> Vec<usize> {
        let mut wanted = self.group.tasks.clone();
        for spill in &self.spill {
            wanted.extend(&spill.group.tasks);
        }
        wanted
    }

    /// The members of the pools that carry requests, and how many of them are out: the
    /// panic threshold's measure. The frontend's own subset counts unless everything
    /// spills (a zone that is down does not put the zones it spills to in panic).
    pub(super) fn carrying(&self) -> (usize, usize) {
        let own = (self.local_share > 0.0).then_some(&self.group);
        own.into_iter()
            .chain(self.spill.iter().map(|s| &s.group))
            .fold((0, 0), |(primary, out), g| (primary + g.primary, out + g.out))
    }
}

/// The connections of one balancer, from the attempt to the close.
pub(super) struct Membership<T, C, S> {
    attempts: Attempts<T, C, S>,
    slots: Slots<T, S>,
    draining: Draining<S>,
    affinity: AffinitySet,
    /// The last connection attempt's id (also the id of the connection it makes).
    last_attempt: u64,
    /// Connections leaving rotation, retired once a table without them is published (so
    /// that no published table names a retired connection).
    retiring: Vec<(Arc<Endpoint<S>>, &'static str)>,
}

impl<T, C, S> Membership<T, C, S>
where
    T: Address,
    C: Connector<T, S>,
    S: Send + Sync + 'static,
{
    pub(super) fn new(config: &BalanceConfig, connector: C) -> Self {
        Self {
            attempts: Attempts::new(connector, config.connect_timeout),
            // Jitter seeded per process (not by the frontend index, which frontends of other
            // client jobs share): their retries do not fall in step.
            slots: Slots::new(config.backoff, fresh_rng()),
            draining: Draining::new(),
            affinity: AffinitySet::new(config.max_affinity, config.affinity_idle),
            last_attempt: 0,
            retiring: Vec::new(),
        }
    }

    /// Forgets the bookkeeping a panic may have left half changed, keeping the
    /// connections that work: a connection known broken is retired, attempts under way
    /// are dropped with their slots, and affinity connections are forgotten.
    pub(super) fn recover(&mut self, config: &BalanceConfig) {
        // A failure may have been half handled: a connection known broken is retired now.
        for endpoint in self.slots.take_broken() {
            self.retiring.push((endpoint, "failed"));
        }
        self.slots.retain_settled();
        self.affinity = AffinitySet::new(config.max_affinity, config.affinity_idle);
    }

    /// When [`Membership::on_timer`] is next due: the earliest backoff's end or
    /// affinity sweep.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        [self.slots.next_retry(), self.affinity.next_sweep()].into_iter().flatten().min()
    }

    /// Whether connection attempts are waiting or under way.
    pub(super) fn is_connecting(&self) -> bool {
        !self.attempts.is_idle()
    }

    /// The next attempt's outcome (see `Attempts::poll_outcome`); attempts whose slot
    /// waits for them no more are dropped.
    pub(super) fn poll_attempts(&mut self, cx: &mut Context<'_>) -> Poll<Outcome<S>> {
        let slots = &self.slots;
        self.attempts.poll_outcome(cx, |task, attempt| slots.get(task).is_some_and(|s| s.awaits(attempt)))
    }

    /// The timer work: reconnects the tasks whose backoff ended, and forgets affinity
    /// connections idle too long (if a sweep is due). Returns whether it forgot any.
    pub(super) fn on_timer(&mut self, now: Instant) -> bool {
        for (task, address) in self.slots.due(now) {
            let attempt = self.connect(task, address);
            self.slots.set_state(task, SlotState::Connecting { attempt });
        }
        self.affinity.sweep(&self.slots, now)
    }

    /// Where connection attempt `attempt` to `task` goes, if its slot still waits for
    /// it (else the attempt is stale: the task left, or a newer attempt replaced it).
    pub(super) fn awaiting(&self, task: usize, attempt: u64) -> Option<T> {
        self.slots.get(task).filter(|s| s.awaits(attempt)).map(|s| s.address.clone())
    }

    /// Whether `task` (at `address`) failed before and has not served since: a new
    /// connection to it is a return from failure.
    pub(super) fn has_failed(&self, task: usize, address: &T) -> bool {
        self.slots.has_failed(task, address)
    }

    /// Whether `task` is kept for keyed requests only (an affinity connection).
    pub(super) fn is_affinity(&self, task: usize) -> bool {
        self.affinity.contains(task)
    }

    /// `task`'s connection is up: in rotation from the next table.
    pub(super) fn connected(&mut self, task: usize, endpoint: Arc<Endpoint<S>>) {
        self.slots.set_state(task, SlotState::Ready(endpoint));
    }

    /// `task`'s connection attempt (to `address`) failed: it backs off. Returns its
    /// consecutive failures and when it is retried.
    pub(super) fn connect_failed(&mut self, task: usize, address: &T) -> (u32, Instant) {
        let (failures, until) = self.slots.record_failure(task, address, false);
        self.slots.set_state(task, SlotState::Backoff { until });
        (failures, until)
    }

    /// Connection `id` to `task` failed a call at the transport: it leaves rotation
    /// (retired with the next table) and the task backs off. Returns the task's
    /// consecutive failures and when it is retried; `None` when `id` is not `task`'s
    /// connection any more (already handled, or about an older connection).
    pub(super) fn transport_failed(&mut self, task: usize, id: u64) -> Option<(u32, Instant)> {
        let slot = self.slots.get(task)?;
        let endpoint = slot.endpoint().filter(|e| e.id == id)?.clone();
        let address = slot.address.clone();
        // A connection that served requests before failing starts the count afresh; one
        // that never did makes the backoff grow.
        let served =
            endpoint.calls.requests.load(Ordering::Relaxed) > endpoint.calls.failures.load(Ordering::Relaxed);
        let (failures, until) = self.slots.record_failure(task, &address, served);
        self.slots.set_state(task, SlotState::Backoff { until });
        self.retiring.push((endpoint, "failed"));
        Some((failures, until))
    }

    /// Connection `id` reported its last request done: close it if it is still idle.
    pub(super) fn drained(&mut self, id: u64, shared: &Shared<S>) {
        self.draining.drained(id, shared);
    }

    /// The connection of `task`, when it is in rotation.
    pub(super) fn endpoint(&self, task: usize) -> Option<&Arc<Endpoint<S>>> {
        self.slots.endpoint(task)
    }

    /// The connection in rotation whose id is `id`.
    pub(super) fn endpoint_by_id(&self, id: u64) -> Option<&Arc<Endpoint<S>>> {
        self.slots.iter().find_map(|(_, s)| s.endpoint().filter(|e| e.id == id))
    }

    /// Every connection in rotation, by ascending task.
    pub(super) fn ready(&self) -> Vec<(usize, Arc<Endpoint<S>>)> {
        self.slots.iter().filter_map(|(t, s)| Some((t, s.endpoint()?.clone()))).collect()
    }

    /// Whether `task` has a slot (connected, connecting or backing off).
    pub(super) fn has_slot(&self, task: usize) -> bool {
        self.slots.contains(task)
    }

    /// A keyed request needs `tasks`: keep affinity connections to those reachable
    /// outside `subset` (see `AffinitySet::request`).
    pub(super) fn request_affinity(
        &mut self,
        tasks: Vec<u32>,
        subset: &[usize],
        view: &JobView<T>,
        config: &BalanceConfig,
        now: Instant,
    ) {
        let draining_too = config.keyed_to_draining;
        let address_of = |t| keyed_address(view, draining_too, t);
        self.affinity.request(tasks, subset, address_of, &self.slots, now);
    }

    /// Plans the subset from `inputs`: the first `k` serving tasks of the frontend's
    /// order, then as many stand-ins as there are failed or ejected members among
    /// those `k` (at most `max_stand_ins`). Stand-ins already connected are kept (so a
    /// recovering candidate never displaces a healthy one); the rest come next in
    /// order, skipping failed and ejected tasks. Old failures are forgotten first.
    ///
    /// Zone-aware (`inputs.zones`), the order is the frontend's over its own zone (its
    /// zone index against the zone's size), and the zones its requests spill to get a
    /// subset each, planned alike over theirs (see [`super::spill`]).
    ///
    /// `None` when no subset can be computed for the view (more tasks than subsetting
    /// allows): the subset in force stays.
    pub(super) fn plan(
        &mut self,
        inputs: Inputs<'_, T, S>,
        config: &BalanceConfig,
        now: Instant,
    ) -> Option<Subset> {
        let Inputs { view, health, frontend, zones } = inputs;
        self.slots.forget_old_failures(now);
        if view.size > steady_subset::MAX_BACKENDS {
            return None;
        }
        let slots = &self.slots;
        let is_out =
            |task: usize, address: &T| slots.is_failed(task, address, now) || health.is_ejected(task, now);
        let Some(ZoneInputs { routing, zones, spilling }) = zones else {
            let k = config.subset_size.min(view.size);
            let order = candidate_order(&config.algorithm, frontend, view.size, k);
            let group = self.plan_group(order, view.size, view, &is_out, &|_| true, config);
            return Some(Subset { group, spill: Vec::new(), local_share: 1.0 });
        };
        let empty = ZoneView::default();
        let local_zone = zones.get(&routing.zone).unwrap_or(&empty);
        let local = |task: usize| view.zone_of(task) == Some(&routing.zone);
        let order = zone_order(config, config.frontend, local_zone);
        let group = self.plan_group(order, local_zone.size, view, &is_out, &local, config);
        // What each zone can take: its serving backends, as the view says (the same for
        // every frontend, so that the zones' shares add up across them). Members known
        // to fail are the stand-ins' business, not the spill's, unless so many of the
        // subset are out that the zone counts as down.
        let mut capacity: BTreeMap<Zone, usize> = zones
            .iter()
            .map(|(zone, z)| {
                (zone.clone(), z.tasks.values().filter(|&&t| view.serving_task(t).is_some()).count())
            })
            .collect();
        if self.zone_is_down(&group, view, &is_out, routing.min_healthy_share, spilling) {
            capacity.insert(routing.zone.clone(), 0);
        }
        let local_frontends = routing.local_frontends(config.frontend);
        let shares = spill::shares(&routing.zone, local_frontends, &routing.frontends, &capacity);
        // Spill subsets are drawn with the frontend's index in the whole frontend job, so
        // that the frontends of several zones spilling into one spread over it.
        let job_index = routing.job_index(config.frontend);
        let mut spill = Vec::with_capacity(shares.remote.len());
        for (zone, share) in shares.remote {
            let Some(z) = zones.get(&zone) else { continue };
            let in_zone = |task: usize| view.zone_of(task) == Some(&zone);
            let group =
                self.plan_group(zone_order(config, job_index, z), z.size, view, &is_out, &in_zone, config);
            spill.push(SpillGroup { zone, share, group });
        }
        Some(Subset { group, spill, local_share: shares.local })
    }

    /// Whether the frontend's zone counts as down, so that every request spills: no
    /// local backend serves; or fewer than `min_healthy_share` of the subset's `k` have a
    /// usable member (a primary not out, or a stand-in connected and not out); or the
    /// frontend spills now (`spilling`) and no local member is connected yet, so that
    /// requests keep going where connections are until the zone's are ready (make
    /// before break).
    fn zone_is_down(
        &self,
        group: &Group,
        view: &JobView<T>,
        is_out: &dyn Fn(usize, &T) -> bool,
        min_healthy_share: f64,
        spilling: bool,
    ) -> bool {
        if group.primary == 0 {
            return true;
        }
        let usable = |task: usize| view.serving_task(task).is_some_and(|address| !is_out(task, address));
        let (primaries, stand_ins) = group.tasks.split_at(group.primary);
        let ready_stand_ins =
            stand_ins.iter().filter(|&&t| self.slots.endpoint(t).is_some() && usable(t)).count();
        let healthy = primaries.iter().filter(|&&t| usable(t)).count() + ready_stand_ins;
        let connected = group.tasks.iter().any(|&t| self.slots.endpoint(t).is_some());
        (healthy as f64) < min_healthy_share * group.primary as f64 || (spilling && !connected)
    }

    /// Plans one group's subset from `order` (job indices) over a pool of `size` tasks:
    /// the first `k` serving ones, then stand-ins for those out, preferring stand-ins
    /// already connected (`in_pool` says which connections belong to this pool).
    fn plan_group(
        &self,
        mut order: impl Iterator<Item = usize>,
        size: usize,
        view: &JobView<T>,
        is_out: &dyn Fn(usize, &T) -> bool,
        in_pool: &dyn Fn(usize) -> bool,
        config: &BalanceConfig,
    ) -> Group {
        // A subset larger than the pool is the whole pool.
        let k = config.subset_size.min(size);
        let mut primary = Vec::with_capacity(k);
        let mut failed = 0;
        if k > 0 {
            for task in order.by_ref() {
                let Some(address) = view.serving_task(task) else { continue };
                primary.push(task);
                failed += usize::from(is_out(task, address));
                if primary.len() == k {
                    break;
                }
            }
        }
        let needed = failed.min(config.max_stand_ins);
        let mut stand_ins: Vec<usize> = self
            .slots
            .iter()
            .filter(|(task, slot)| {
                slot.endpoint().is_some()
                    && in_pool(*task)
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
            if !primary.contains(&task) && !stand_ins.contains(&task) && !is_out(task, address) {
                stand_ins.push(task);
            }
        }
        debug_assert!(primary.len() <= k && failed <= primary.len() && stand_ins.len() <= needed);
        let (primary_len, out) = (primary.len(), failed);
        primary.extend(stand_ins);
        Group { tasks: primary, primary: primary_len, out }
    }

    /// Brings the connections in line with `subset` and the affinity connections still
    /// worth keeping: closes what is no longer wanted (or whose task moved to another
    /// address: retired with the next table) and opens what is newly wanted.
    pub(super) fn follow(
        &mut self,
        subset: &[usize],
        view: &JobView<T>,
        config: &BalanceConfig,
        counters: &Counters,
        now: Instant,
    ) {
        let draining_too = config.keyed_to_draining;
        // Subset members serve; affinity connections reach a draining owner too when
        // configured (subset members are serving, so one lookup does for both).
        let affinity =
            self.affinity.wanted(subset, |t| keyed_address(view, draining_too, t), &self.slots, now);
        let wanted: Vec<usize> = subset.iter().chain(&affinity).copied().collect();
        let keep: HashSet<usize> = wanted.iter().copied().collect();
        // Close what is no longer wanted, or whose task moved to another address.
        let gone: Vec<usize> = self
            .slots
            .iter()
            .filter(|(task, slot)| {
                !keep.contains(task) || keyed_address(view, draining_too, *task) != Some(&slot.address)
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
                let Some(address) = keyed_address(view, draining_too, task).cloned() else { continue };
                let attempt = self.connect(task, address.clone());
                self.slots.insert_connecting(task, address, attempt);
                if affinity.contains(&task) {
                    Counters::add(&counters.affinity_opened, 1);
                }
            }
        }
    }

    /// Every connection in rotation but those of the `kept_out` tasks (ascending), by
    /// task.
    pub(super) fn in_rotation(&self, kept_out: &[usize]) -> HashMap<usize, Arc<Endpoint<S>>> {
        let mut connected = self.slots.connected();
        connected.retain(|task, _| kept_out.binary_search(task).is_err());
        connected
    }

    /// Whether requests can reach replica `task` now or soon: not kept out (`kept_out`,
    /// ascending), where keyed requests may go, and connected, connecting, or
    /// connectable through an affinity connection (if any is allowed, and the task is
    /// not backing off).
    pub(super) fn reachable(
        &self,
        task: usize,
        kept_out: &[usize],
        view: &JobView<T>,
        config: &BalanceConfig,
        now: Instant,
    ) -> bool {
        if kept_out.binary_search(&task).is_ok() {
            return false;
        }
        keyed_address(view, config.keyed_to_draining, task).is_some_and(|address| {
            match self.slots.get(task).map(|s| &s.state) {
                Some(SlotState::Ready(_) | SlotState::Connecting { .. }) => true,
                Some(SlotState::Backoff { .. }) => false,
                // Not connected: an affinity connection would be asked for, if any is allowed.
                None => config.max_affinity > 0 && !self.slots.is_failed(task, address, now),
            }
        })
    }

    /// Retires the connections leaving rotation, once the published table no longer
    /// names them (each closes once its requests have finished).
    pub(super) fn retire(&mut self, shared: &Shared<S>) {
        for (endpoint, why) in self.retiring.drain(..) {
            self.draining.retire(endpoint, why, shared);
        }
    }

    /// Starts a connection attempt; returns its id. It comes to an outcome (see
    /// [`super::attempts`]) within the connect timeout, without holding up the control
    /// task.
    fn connect(&mut self, task: usize, address: T) -> u64 {
        self.last_attempt += 1;
        let attempt = self.last_attempt;
        tracing::debug!(task, ?address, attempt, "connecting");
        self.attempts.start(task, attempt, address);
        attempt
    }
}

/// Frontend `frontend`'s order over `zone` (against the zone's size), read as job
/// indices; zone indices without a task are skipped.
fn zone_order<'z>(
    config: &BalanceConfig,
    frontend: usize,
    zone: &'z ZoneView,
) -> impl Iterator<Item = usize> + 'z {
    let k = config.subset_size.min(zone.size);
    candidate_order(&config.algorithm, frontend, zone.size, k).filter_map(|i| zone.tasks.get(&i).copied())
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
