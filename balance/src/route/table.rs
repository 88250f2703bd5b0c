//! The immutable routing table the control task publishes and requests read, and the
//! state the two sides share.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use steady_slice::SliceKey;
use steady_subset::prng::SplitMix64;
use tokio::sync::watch;

use super::endpoint::{Endpoint, Picked, Rotation};
use super::pick::{fresh_rng, p2c, p2c_other};
use super::slices::SliceTable;
use super::spill::Spill;
use crate::config::{NoReplicaPolicy, Waits};

/// What requests route over: the ready members of the subset in preference order, the
/// affinity connections, and the assignment in force.
///
/// Built by the control task and swapped in whole; a request reads whichever table is
/// current when it starts and never waits for the control task.
#[derive(Debug)]
pub(crate) struct RoutingTable<S> {
    /// Bumped on every publication.
    pub(crate) version: u64,
    /// Connected, healthy members, in the frontend's preference order (a zone-aware
    /// frontend's: those in its zone).
    pub(crate) members: Vec<Arc<Endpoint<S>>>,
    /// Where unkeyed requests go when some leave the frontend's zone; `None` while all
    /// stay in `members` (always, without zones).
    pub(crate) spill: Option<Spill<S>>,
    /// The subset the control task wants (members and stand-ins, ready or not).
    pub(crate) wanted: Vec<usize>,
    /// Connections outside the subset (affinity connections for keyed requests).
    pub(crate) affinity: Vec<Arc<Endpoint<S>>>,
    /// The assignment in force, as this frontend routes it; `None` before the first.
    pub(crate) slices: Option<SliceTable<S>>,
    /// Tasks ejected as outliers, ascending (still connected; members again in panic).
    pub(crate) ejected: Vec<usize>,
    /// Whether the subset is in panic: too much of it is out, ejected members serve.
    pub(crate) panic: bool,
}

impl<S> RoutingTable<S> {
    /// The table of a balancer with nothing connected, at `version`.
    pub(crate) fn empty(version: u64) -> Self {
        Self {
            version,
            members: Vec::new(),
            spill: None,
            wanted: Vec::new(),
            affinity: Vec::new(),
            slices: None,
            ejected: Vec::new(),
            panic: false,
        }
    }

    /// Power of two choices over the subset's ready members (over those of the zone
    /// the request's draw falls in, while requests spill).
    #[inline]
    pub(crate) fn pick(&self, rng: &mut SplitMix64) -> Option<&Arc<Endpoint<S>>> {
        match &self.spill {
            None => p2c(&self.members, rng),
            Some(spill) => spill.pick(&self.members, rng),
        }
    }

    /// Every member unkeyed requests may go to: the subset's, then each spill zone's.
    pub(crate) fn unkeyed(&self) -> impl Iterator<Item = &Arc<Endpoint<S>>> {
        let spilled = self.spill.iter().flat_map(|s| s.zones().iter().flat_map(|z| &z.members));
        self.members.iter().chain(spilled)
    }
}

/// Counters that outlive connections.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) opened: AtomicU64,
    pub(crate) closed: AtomicU64,
    pub(crate) connect_failures: AtomicU64,
    pub(crate) ejections: AtomicU64,
    /// Outlier ejections by the consecutive-failure detector.
    pub(crate) ejected_consecutive: AtomicU64,
    /// Outlier ejections by the failure-rate detector.
    pub(crate) ejected_failure_rate: AtomicU64,
    /// Times the subset entered panic.
    pub(crate) panics: AtomicU64,
    pub(crate) no_backend: AtomicU64,
    pub(crate) assignments_accepted: AtomicU64,
    pub(crate) assignments_stale: AtomicU64,
    pub(crate) assignments_rejected: AtomicU64,
    /// Panics of the assignment source, each followed by polling it again.
    pub(crate) assignment_source_restarts: AtomicU64,
    pub(crate) keyed_fallbacks: AtomicU64,
    pub(crate) no_replica: AtomicU64,
    pub(crate) affinity_opened: AtomicU64,
    /// Panics the control task survived.
    pub(crate) control_restarts: AtomicU64,
    /// Requests of connections out of rotation, draining or closed (those in the
    /// published table count on their endpoint).
    pub(crate) closed_requests: AtomicU64,
    /// Calls failed on any connection, counted when they fail (a failure ends in
    /// retiring its connection, so counting it on the connection alone would race with
    /// the retirement).
    pub(crate) call_failures: AtomicU64,
    pub(crate) closed_keyed: AtomicU64,
    /// When the assignment in force was accepted (its age is reported).
    pub(crate) assignment_accepted_at: std::sync::Mutex<Option<std::time::Instant>>,
}

impl Counters {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// What the request side and the control task share.
#[derive(Debug)]
pub(crate) struct Shared<S> {
    pub(crate) table: ArcSwap<RoutingTable<S>>,
    /// The current table's version, for requests waiting for a ready backend.
    pub(crate) versions: watch::Sender<u64>,
    pub(crate) counters: Counters,
    /// Connections open, including draining ones (maintained by the control task).
    pub(crate) open: AtomicU64,
    /// How long requests wait, and what keyed ones do without a replica: the one copy
    /// the request side reads.
    pub(crate) waits: Waits,
    /// Keyed requests per bin, once someone asked for them (`Balance::count_keys`).
    pub(crate) key_counts: std::sync::OnceLock<super::key_counts::KeyCounts>,
    /// Keyed requests a load bound sent off their slice's replicas (shared with every
    /// slice table built, so the count outlives them).
    pub(crate) keyed_spilled: Arc<AtomicU64>,
}

impl<S> Shared<S> {
    pub(crate) fn new(waits: Waits) -> Self {
        Self {
            waits,
            table: ArcSwap::from_pointee(RoutingTable::empty(0)),
            versions: watch::Sender::new(0),
            counters: Counters::default(),
            open: AtomicU64::new(0),
            key_counts: std::sync::OnceLock::new(),
            keyed_spilled: Arc::default(),
        }
    }

    /// Swaps in a new table and wakes requests waiting for one.
    pub(crate) fn publish(&self, table: RoutingTable<S>) {
        let version = table.version;
        self.table.store(Arc::new(table));
        self.versions.send_replace(version);
    }
}

impl<S: Send + Sync> Rotation<S> for Shared<S> {
    fn another(&self, failed: &Endpoint<S>, key: Option<SliceKey>) -> Option<Picked<S>> {
        let table = self.table.load();
        let mut rng = fresh_rng();
        if let (Some(key), Some(slices)) = (key, table.slices.as_ref()) {
            if let Some(endpoint) = p2c_other(slices.ready(slices.index(key)), failed.id, &mut rng) {
                return Some(Picked { endpoint, keyed: true });
            }
            if self.waits.no_replica == NoReplicaPolicy::Fail {
                return None;
            }
            // No other replica: the policy falls back to the subset.
            Counters::add(&self.counters.keyed_fallbacks, 1);
        }
        let endpoint = match &table.spill {
            None => p2c_other(&table.members, failed.id, &mut rng)?,
            Some(spill) => spill.pick_other(&table.members, failed.id, &mut rng)?,
        };
        Some(Picked { endpoint, keyed: false })
    }

    fn waits(&self) -> Waits {
        self.waits
    }

    fn call_failed(&self) {
        Counters::add(&self.counters.call_failures, 1);
    }
}
