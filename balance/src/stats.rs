//! A snapshot of what the balancer is doing, for dashboards and tests.

use std::sync::atomic::Ordering;

use crate::route::gate::GateState;
use crate::route::table::Shared;
use steady_core::Zone;

/// How freely a member of the routing table takes requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemberState {
    /// A full share of the picks that draw it.
    Serving,
    /// Slow start: this percentage of the picks that draw it, rising.
    SlowStart {
        /// The share now, in percent (0 to 99).
        percent: u8,
    },
    /// Reconnected after a broken connection: one request (the probe) goes first.
    Probation {
        /// Whether the probe is in flight.
        probe_sent: bool,
    },
    /// Its connection just failed: it leaves the table at the control task's next turn.
    Failed,
}

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
    /// Failed calls since its last success (server faults and timeouts).
    pub consecutive_failures: u32,
    /// Whether it takes a full share of requests, is in slow start, or is on probation.
    pub state: MemberState,
}

/// A zone that some of a zone-aware balancer's unkeyed requests spill to (see
/// [`crate::ZoneRouting`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZoneSpill {
    /// The zone.
    pub zone: Zone,
    /// Its share of the unkeyed requests, in millionths.
    pub share_ppm: u32,
    /// The tasks of its subset that are connected and in rotation.
    pub members: Vec<usize>,
}

/// A share in `0.0..=1.0` in millionths.
fn ppm(share: f64) -> u32 {
    (share.clamp(0.0, 1.0) * 1e6).round() as u32
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
    /// Connections taken out of rotation because their transport failed (a call, or
    /// readiness).
    pub ejections: u64,
    /// Members ejected as outliers by the consecutive-failure detector.
    pub outlier_ejections_consecutive: u64,
    /// Members ejected as outliers by the failure-rate detector.
    pub outlier_ejections_failure_rate: u64,
    /// The tasks ejected as outliers now (connected, out of rotation unless in panic).
    pub ejected: Vec<usize>,
    /// Whether the subset is in panic: more than the configured share of it is out
    /// (ejected or unhealthy), so ejected members serve again.
    pub panic: bool,
    /// Times the subset entered panic.
    pub panics: u64,
    /// Requests sent to backends (all connections, open and closed).
    pub requests: u64,
    /// Calls backends failed (all connections).
    pub failures: u64,
    /// Requests that failed for want of a ready backend.
    pub no_backend: u64,
    /// The backends the control task wants, in preference order (ready or not): the
    /// subset, then the subsets of the zones requests spill to.
    pub subset: Vec<usize>,
    /// The share of unkeyed requests that stays in the balancer's own subset, in
    /// millionths: 1,000,000 unless a zone-aware balancer spills.
    pub local_share_ppm: u32,
    /// The zones unkeyed requests spill to now (empty unless a zone-aware balancer's zone
    /// cannot take them all).
    pub spill: Vec<ZoneSpill>,
    /// The members unkeyed requests are routed over now, in preference order (the
    /// spill zones' after the subset's).
    pub members: Vec<MemberStats>,
    /// The routing table's version (bumped on every change).
    pub version: u64,
    /// The generation of the assignment in force (`None` before the first).
    pub assignment_generation: Option<u64>,
    /// How long ago the assignment in force was accepted (`None` before the first).
    pub assignment_age: Option<std::time::Duration>,
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
    /// Keyed requests a load bound ([`crate::KeyedLoadBound`]) sent off their slice's
    /// replicas, to a neighbour's or the subset's, because every replica was over it.
    pub keyed_spilled: u64,
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
            .unkeyed()
            .map(|e| MemberStats {
                task: e.task,
                requests: e.calls.requests.load(Ordering::Relaxed),
                failures: e.calls.failures.load(Ordering::Relaxed),
                in_flight: e.calls.in_flight.load(Ordering::Relaxed),
                consecutive_failures: e.calls.consecutive_failures(),
                state: match e.gate() {
                    GateState::OPEN => MemberState::Serving,
                    GateState::PROBE_WAITING => MemberState::Probation { probe_sent: false },
                    GateState::PROBE_SENT => MemberState::Probation { probe_sent: true },
                    gate => match gate.slow_start_share() {
                        Some(share) => MemberState::SlowStart { percent: share.percent() },
                        None => MemberState::Failed,
                    },
                },
            })
            .collect();
        Self {
            connections_open: shared.open.load(Ordering::Relaxed),
            connections_opened: c.opened.load(Ordering::Relaxed),
            connections_closed: c.closed.load(Ordering::Relaxed),
            connect_failures: c.connect_failures.load(Ordering::Relaxed),
            ejections: c.ejections.load(Ordering::Relaxed),
            outlier_ejections_consecutive: c.ejected_consecutive.load(Ordering::Relaxed),
            outlier_ejections_failure_rate: c.ejected_failure_rate.load(Ordering::Relaxed),
            ejected: table.ejected.clone(),
            panic: table.panic,
            panics: c.panics.load(Ordering::Relaxed),
            requests: c.closed_requests.load(Ordering::Relaxed)
                + members.iter().map(|m| m.requests).sum::<u64>()
                + table.affinity.iter().map(|e| e.calls.requests.load(Ordering::Relaxed)).sum::<u64>(),
            failures: c.call_failures.load(Ordering::Relaxed),
            no_backend: c.no_backend.load(Ordering::Relaxed),
            subset: table.wanted.clone(),
            local_share_ppm: table.spill.as_ref().map_or(1_000_000, |s| ppm(s.local_share())),
            spill: table
                .spill
                .iter()
                .flat_map(|s| s.zones())
                .map(|z| ZoneSpill {
                    zone: z.zone.clone(),
                    share_ppm: ppm(z.share),
                    members: z.members.iter().map(|e| e.task).collect(),
                })
                .collect(),
            members,
            version: table.version,
            assignment_generation: table.slices.as_ref().map(|s| s.generation),
            assignment_age: c.assignment_accepted_at.lock().ok().and_then(|at| at.map(|at| at.elapsed())),
            assignments_accepted: c.assignments_accepted.load(Ordering::Relaxed),
            assignments_stale: c.assignments_stale.load(Ordering::Relaxed),
            assignments_rejected: c.assignments_rejected.load(Ordering::Relaxed),
            assignment_source_restarts: c.assignment_source_restarts.load(Ordering::Relaxed),
            keyed_fallbacks: c.keyed_fallbacks.load(Ordering::Relaxed),
            no_replica: c.no_replica.load(Ordering::Relaxed),
            keyed_spilled: shared.keyed_spilled.load(Ordering::Relaxed),
            keyed_requests: c.closed_keyed.load(Ordering::Relaxed)
                + table
                    .unkeyed()
                    .chain(&table.affinity)
                    .map(|e| e.calls.keyed.load(Ordering::Relaxed))
                    .sum::<u64>(),
            affinity: table.affinity.iter().map(|e| e.task).collect(),
            affinity_opened: c.affinity_opened.load(Ordering::Relaxed),
            control_restarts: c.control_restarts.load(Ordering::Relaxed),
        }
    }
}
