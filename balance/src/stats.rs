//! A snapshot of what the balancer is doing, for dashboards and tests.

use std::sync::atomic::Ordering;

use crate::route::table::Shared;

/// One member of the routing table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberStats {
    /// The backend task's index.
    pub task: usize,
    /// Requests sent on the current connection.
    pub requests: u64,
    /// Calls the backend failed on the current connection.
    pub failures: u64,
    /// Requests in flight now.
    pub in_flight: usize,
}

/// Counters since the balancer started, and its current membership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BalanceStats {
    /// Connections open now, including draining ones.
    pub connections_open: u64,
    /// Connections opened successfully so far.
    pub connections_opened: u64,
    /// Connections closed so far (after draining).
    pub connections_closed: u64,
    /// Connection attempts that failed.
    pub connect_failures: u64,
    /// Connections taken out of rotation because a call failed.
    pub ejections: u64,
    /// Requests sent to backends (all connections, open and closed).
    pub requests: u64,
    /// Calls backends failed (all connections).
    pub failures: u64,
    /// Requests that failed for want of a ready backend.
    pub no_backend: u64,
    /// The backends the control task wants, in preference order (ready or not).
    pub subset: Vec<usize>,
    /// The members requests are routed over now, in preference order.
    pub members: Vec<MemberStats>,
    /// The routing table's version (bumped on every change).
    pub version: u64,
    /// The generation of the assignment in force (`None` before the first).
    pub assignment_generation: Option<u64>,
    /// Assignments accepted (newer than the one in force).
    pub assignments_accepted: u64,
    /// Assignments ignored because they were not newer.
    pub assignments_stale: u64,
    /// Assignments rejected as invalid (the last good one stayed).
    pub assignments_rejected: u64,
    /// Panics of the assignment source: each time the source was kept and polled again
    /// after a backoff (growing with panics in a row, up to 10 s); the assignment in
    /// force stayed meanwhile.
    pub assignment_source_restarts: u64,
    /// Requests routed by their slice key to one of their slice's replicas (on a
    /// connection still open, or closed since).
    pub keyed_requests: u64,
    /// Keyed requests sent to the subset because no replica was usable.
    pub keyed_fallbacks: u64,
    /// Keyed requests failed with `NoReplica`.
    pub no_replica: u64,
    /// Affinity connections (to replicas outside the subset) open now, by task.
    pub affinity: Vec<usize>,
    /// Affinity connections opened so far.
    pub affinity_opened: u64,
    /// Panics the control task survived (each rebuilt its membership from the last view).
    pub control_restarts: u64,
}

impl BalanceStats {
    pub(crate) fn read<S>(shared: &Shared<S>) -> Self {
        let table = shared.table.load();
        let c = &shared.counters;
        let members: Vec<MemberStats> = table
            .members
            .iter()
            .map(|e| MemberStats {
                task: e.task,
                requests: e.requests.load(Ordering::Relaxed),
                failures: e.failures.load(Ordering::Relaxed),
                in_flight: e.in_flight.load(Ordering::Relaxed),
            })
            .collect();
        Self {
            connections_open: shared.open.load(Ordering::Relaxed),
            connections_opened: c.opened.load(Ordering::Relaxed),
            connections_closed: c.closed.load(Ordering::Relaxed),
            connect_failures: c.connect_failures.load(Ordering::Relaxed),
            ejections: c.ejections.load(Ordering::Relaxed),
            requests: c.closed_requests.load(Ordering::Relaxed)
                + members.iter().map(|m| m.requests).sum::<u64>()
                + table.affinity.iter().map(|e| e.requests.load(Ordering::Relaxed)).sum::<u64>(),
            failures: c.call_failures.load(Ordering::Relaxed),
            no_backend: c.no_backend.load(Ordering::Relaxed),
            subset: table.wanted.clone(),
            members,
            version: table.version,
            assignment_generation: table.slices.as_ref().map(|s| s.generation),
            assignments_accepted: c.assignments_accepted.load(Ordering::Relaxed),
            assignments_stale: c.assignments_stale.load(Ordering::Relaxed),
            assignments_rejected: c.assignments_rejected.load(Ordering::Relaxed),
            assignment_source_restarts: c.assignment_source_restarts.load(Ordering::Relaxed),
            keyed_fallbacks: c.keyed_fallbacks.load(Ordering::Relaxed),
            no_replica: c.no_replica.load(Ordering::Relaxed),
            keyed_requests: c.closed_keyed.load(Ordering::Relaxed)
                + table
                    .members
                    .iter()
                    .chain(&table.affinity)
                    .map(|e| e.keyed.load(Ordering::Relaxed))
                    .sum::<u64>(),
            affinity: table.affinity.iter().map(|e| e.task).collect(),
            affinity_opened: c.affinity_opened.load(Ordering::Relaxed),
            control_restarts: c.control_restarts.load(Ordering::Relaxed),
        }
    }
}
