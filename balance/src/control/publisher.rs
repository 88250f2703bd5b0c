//! Publishing the routing table: built from the control task's pieces, swapped in
//! whole, and only when something it is built from changed.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use steady_slice::Assignment;

use super::membership::SpillGroup;
use crate::route::endpoint::Endpoint;
use crate::route::slices::{SliceTable, ZonePreference};
use crate::route::spill::Spill;
use crate::route::table::{RoutingTable, Shared};

/// The control task's side of the shared state: the table's version, and what the last
/// published table was built from.
pub(super) struct Publisher<S> {
    shared: Arc<Shared<S>>,
    version: u64,
    /// What the last published table was built from, to skip needless publications.
    published: Vec<u64>,
}

/// What one table is built from.
pub(super) struct TableInputs<'a, S> {
    /// Every task wanted for unkeyed requests: the subset in preference order, then
    /// the spill zones' subsets.
    pub(super) subset: Vec<usize>,
    /// The zones requests spill to, with their shares and subsets (empty: none spill).
    pub(super) spill: Vec<SpillGroup>,
    /// The share of unkeyed requests that stays with the subset.
    pub(super) local_share: f64,
    /// For a zone-aware frontend: how keyed requests prefer its zone's replicas, and a
    /// digest of it (which replica tasks are local, the demand share).
    pub(super) preference: Option<ZonePreference<'a>>,
    pub(super) preference_digest: u64,
    /// Every connection in rotation (subset and affinity), by task.
    pub(super) connected: HashMap<usize, Arc<Endpoint<S>>>,
    /// Tasks ejected as outliers now (in rotation anyway during a panic), ascending.
    pub(super) ejected: Vec<usize>,
    /// Whether the subset is in panic (see `OutlierDetection::max_ejected_share`).
    pub(super) panic: bool,
    pub(super) assignment: Option<&'a Assignment>,
    pub(super) frontend: usize,
    pub(super) fan_out: usize,
    /// Whether a replica task not connected may become so (serving, and connecting or
    /// connectable), and a digest of that for every replica task of the assignment.
    pub(super) reachable: &'a dyn Fn(u32) -> bool,
    pub(super) reachability: u64,
    /// Bounded-load routing for keyed requests, when configured.
    pub(super) load_bound: Option<crate::config::KeyedLoadBound>,
}

impl<S> Publisher<S> {
    pub(super) fn new(shared: Arc<Shared<S>>) -> Self {
        Self { shared, version: 0, published: Vec::new() }
    }

    /// The state shared with the request side.
    pub(super) fn shared(&self) -> &Arc<Shared<S>> {
        &self.shared
    }

    /// Forgets what the last table was built from, so that the next `publish` publishes.
    pub(super) fn forget_published(&mut self) {
        self.published.clear();
    }

    /// Publishes the ready members of the subset, the affinity connections and the
    /// slice table, if anything they are built from changed.
    pub(super) fn publish(&mut self, inputs: TableInputs<'_, S>) {
        let TableInputs {
            subset,
            spill,
            local_share,
            preference,
            preference_digest,
            connected,
            ejected,
            panic,
            assignment,
            frontend,
            fan_out,
            reachable,
            reachability,
            load_bound,
        } = inputs;
        // The subset proper: the wanted tasks that no spill zone holds. (Sets: a spilling
        // frontend wants thousands of tasks in a large job, and a table is built per
        // connection that opens.)
        let spilled: HashSet<usize> = spill.iter().flat_map(|g| g.group.tasks.iter().copied()).collect();
        let members: Vec<Arc<Endpoint<S>>> = subset
            .iter()
            .filter(|t| !spilled.contains(t))
            .filter_map(|t| connected.get(t).cloned())
            .collect();
        let ready_of = |tasks: &[usize]| -> Vec<Arc<Endpoint<S>>> {
            tasks.iter().filter_map(|t| connected.get(t).cloned()).collect()
        };
        // What the table depends on: the subset, its ready members, every connection,
        // the assignment's generation, and which of its replicas can be reached.
        let mut signature: Vec<u64> = subset.iter().map(|&t| t as u64).collect();
        signature.push(u64::MAX);
        signature.extend(members.iter().map(|e| e.id));
        signature.push(u64::MAX);
        let mut ids: Vec<u64> = connected.values().map(|e| e.id).collect();
        ids.sort_unstable();
        signature.extend(ids);
        signature.push(assignment.map_or(u64::MAX, Assignment::generation));
        signature.push(reachability);
        signature.push(preference_digest);
        signature.push(u64::from(panic));
        signature.extend(ejected.iter().map(|&t| t as u64));
        // Where requests spill: the shares and each zone's ready members.
        signature.push(local_share.to_bits());
        for group in &spill {
            signature.push(u64::MAX);
            signature.push(group.share.to_bits());
            signature.extend(ready_of(&group.group.tasks).iter().map(|e| e.id));
        }
        if signature == self.published {
            return;
        }
        self.published = signature;
        let bound = load_bound.map(|b| (b, self.shared.keyed_spilled.clone()));
        let slices = assignment.map(|a| {
            SliceTable::build(a, frontend, fan_out, &connected, reachable, preference.as_ref(), bound)
        });
        let spill = Spill::new(
            local_share,
            spill.iter().map(|g| (g.zone.clone(), g.share, ready_of(&g.group.tasks))).collect(),
        );
        let wanted: HashSet<usize> = subset.iter().copied().collect();
        let mut affinity: Vec<Arc<Endpoint<S>>> =
            connected.iter().filter(|(t, _)| !wanted.contains(t)).map(|(_, e)| e.clone()).collect();
        affinity.sort_unstable_by_key(|e| e.task);
        self.version += 1;
        tracing::info!(
            version = self.version,
            ready = members.len(),
            wanted = subset.len(),
            affinity = affinity.len(),
            generation = ?slices.as_ref().map(|s| s.generation),
            local_share,
            spill = ?spill.as_ref().map(|s| s.zones().iter().map(|z| (z.zone.as_str(), z.members.len())).collect::<Vec<_>>()),
            subset = ?subset,
            ejected = ?ejected,
            panic,
            "routing table updated"
        );
        self.shared.publish(RoutingTable {
            version: self.version,
            members,
            spill,
            wanted: subset,
            affinity,
            slices,
            ejected,
            panic,
        });
    }
}

impl<S> Drop for Publisher<S> {
    fn drop(&mut self) {
        // The control task is the only owner of the slot connections; requests still
        // in flight keep theirs until they finish. An empty table lets requests that
        // outlive the task fail fast instead of using connections nobody tends.
        self.shared.publish(RoutingTable::empty(self.version + 1));
    }
}
