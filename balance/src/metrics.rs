//! The balancer's OpenTelemetry instruments (feature `metrics`): see
//! [`Balance::observe_metrics`].

use std::sync::Arc;

use opentelemetry::metrics::Meter;
use opentelemetry::KeyValue;
use steady_core::metrics::Observed;

use crate::stats::{BalanceStats, MemberState};
use crate::Balance;

/// The label of every instrument: the channel's target, as gRPC's `grpc.target`.
pub(crate) const TARGET: &str = "grpc.target";

impl<S: Send + Sync + 'static, K, C> Balance<S, K, C> {
    /// Registers the balancer's instruments in `meter`, labelled `grpc.target = target`
    /// (the backend job, or the URI the application calls it by).
    ///
    /// Every instrument is observable: it reads [`Balance::stats`] when the application's
    /// reader collects, and nothing is added to the request path. Once every handle is
    /// dropped and the control task has ended (soon after), they report nothing.
    ///
    /// Names follow gRPC where it has one (gRFC A94's `grpc.subchannel.*`, A91's
    /// `grpc.lb.outlier_detection.*`); the rest are under `steady.lb.`. Per-member series
    /// are labelled by the backend's task index (`steady.task`), which the job's size
    /// bounds; no address and no key is a label. The table of every instrument is in the
    /// repository's `docs/observability.md`.
    ///
    /// Call it once per balancer (each call registers the instruments again).
    pub fn observe_metrics(&self, meter: &Meter, target: &str) {
        let shared = Arc::downgrade(&self.shared);
        let source = move || shared.upgrade().map(|shared| BalanceStats::read(&shared));
        register(&Observed::new(meter, vec![KeyValue::new(TARGET, target.to_owned())], source));
    }
}

/// Every instrument of a balancer, over its snapshots.
pub(crate) fn register(o: &Observed<BalanceStats>) {
    o.counter(
        "grpc.subchannel.connection_attempts_succeeded",
        "{attempt}",
        "Connections to backends opened",
        |s| s.connections_opened,
    )
    .counter(
        "grpc.subchannel.connection_attempts_failed",
        "{attempt}",
        "Connection attempts to backends that failed",
        |s| s.connect_failures,
    )
    .counter(
        "grpc.subchannel.disconnections",
        "{disconnection}",
        "Connections closed: drained after leaving the subset, or taken out when their transport failed",
        |s| s.connections_closed + s.ejections,
    )
    .gauge("grpc.subchannel.open_connections", "{connection}", "Connections open now, draining ones included", |s| {
        s.connections_open as f64
    })
    .counter(
        "grpc.lb.outlier_detection.ejections_enforced_total",
        "{ejection}",
        "Members ejected as outliers, by either detector",
        |s| s.outlier_ejections_consecutive + s.outlier_ejections_failure_rate,
    )
    .counter(
        "grpc.lb.outlier_detection.ejections_enforced_failure_percentage",
        "{ejection}",
        "Members ejected by the failure-rate detector",
        |s| s.outlier_ejections_failure_rate,
    )
    .counter(
        "steady.lb.outlier_detection.ejections_enforced_consecutive_failures",
        "{ejection}",
        "Members ejected by the consecutive-failure detector",
        |s| s.outlier_ejections_consecutive,
    )
    .gauge(
        "steady.lb.subset.size",
        "{backend}",
        "Backends the subset wants (k, or fewer in a smaller job), with the subsets of the zones requests spill to",
        |s| s.subset.len() as f64,
    )
    .gauge(
        "steady.lb.zone.local_share",
        "1",
        "The share of unkeyed requests kept in the balancer's zone (1 unless a zone-aware balancer spills)",
        |s| f64::from(s.local_share_ppm) / 1e6,
    )
    .gauges(
        "steady.lb.zone.spill_share",
        "1",
        "The share of unkeyed requests spilled to each other zone (at most 8 zones at a time)",
        |s| {
            s.spill
                .iter()
                .map(|z| (vec![KeyValue::new("steady.zone", z.zone.to_string())], f64::from(z.share_ppm) / 1e6))
                .collect()
        },
    )
    .gauges(
        "steady.lb.members",
        "{backend}",
        "Backends by state, each in one: ejected, stand_in (a member outside the subset), ready, slow_start, probation; not_connected (in the subset, connecting or backing off); draining",
        |s| members_by_state(s).into_iter().map(|(state, n)| (vec![KeyValue::new("steady.state", state)], n as f64)).collect(),
    )
    .gauge("steady.lb.panic", "1", "1 while the subset is in panic (ejected members serve again)", |s| {
        f64::from(u8::from(s.panic))
    })
    .counter("steady.lb.panics", "{panic}", "Times the subset entered panic", |s| s.panics)
    .counter("steady.lb.requests", "{request}", "Requests sent to backends", |s| s.requests)
    .counter("steady.lb.failures", "{request}", "Calls backends failed", |s| s.failures)
    .counter("steady.lb.no_backend", "{request}", "Requests failed for want of a ready backend", |s| s.no_backend)
    .counters(
        "steady.lb.member.requests",
        "{request}",
        "Requests sent to each member on its current connection (restarts at a reconnection)",
        |s| s.members.iter().map(|m| (vec![task(m.task)], m.requests)).collect(),
    )
    .counters(
        "steady.lb.member.failures",
        "{request}",
        "Calls each member failed on its current connection (restarts at a reconnection)",
        |s| s.members.iter().map(|m| (vec![task(m.task)], m.failures)).collect(),
    )
    .gauges("steady.lb.member.in_flight", "{request}", "Requests in flight to each member", |s| {
        s.members.iter().map(|m| (vec![task(m.task)], m.in_flight as f64)).collect()
    })
    .gauge("steady.lb.affinity.connections", "{connection}", "Affinity connections open (replicas outside the subset)", |s| {
        s.affinity.len() as f64
    })
    .counter("steady.lb.affinity.opened", "{connection}", "Affinity connections opened", |s| s.affinity_opened)
    .counter("steady.lb.keyed.requests", "{request}", "Requests routed by their slice key to a replica", |s| {
        s.keyed_requests
    })
    .counter("steady.lb.keyed.fallbacks", "{request}", "Keyed requests sent to the subset: no replica was usable", |s| {
        s.keyed_fallbacks
    })
    .counter("steady.lb.keyed.no_replica", "{request}", "Keyed requests failed with NoReplica", |s| s.no_replica)
    .gauges("steady.lb.assignment.generation", "1", "The generation of the assignment in force", |s| {
        s.assignment_generation.map(|g| (Vec::new(), g as f64)).into_iter().collect()
    })
    .gauges("steady.lb.assignment.age", "s", "Time since the assignment in force was received", |s| {
        s.assignment_age.map(|age| (Vec::new(), age.as_secs_f64())).into_iter().collect()
    })
    .counters("steady.lb.assignments", "{assignment}", "Assignments received, by outcome: accepted, stale, rejected", |s| {
        vec![
            (vec![KeyValue::new("steady.outcome", "accepted")], s.assignments_accepted),
            (vec![KeyValue::new("steady.outcome", "stale")], s.assignments_stale),
            (vec![KeyValue::new("steady.outcome", "rejected")], s.assignments_rejected),
        ]
    })
    .counter(
        "steady.lb.assignment_source.restarts",
        "{restart}",
        "Panics of the assignment source, each followed by polling it again",
        |s| s.assignment_source_restarts,
    )
    .counter("steady.lb.control.restarts", "{restart}", "Panics the control task survived", |s| s.control_restarts);
}

fn task(index: usize) -> KeyValue {
    KeyValue::new("steady.task", index as i64)
}

/// How many backends are in each state, every state listed (zeros included).
pub(crate) fn members_by_state(s: &BalanceStats) -> [(&'static str, usize); 7] {
    let (mut ready, mut slow_start, mut probation, mut ejected, mut stand_in) = (0, 0, 0, 0, 0);
    // Each member in one state: ejected first, then stand-in (outside the subset).
    for m in &s.members {
        if s.ejected.contains(&m.task) {
            ejected += 1;
        } else if !s.subset.contains(&m.task) {
            stand_in += 1;
        } else {
            match m.state {
                MemberState::Serving => ready += 1,
                MemberState::SlowStart { .. } => slow_start += 1,
                MemberState::Probation { .. } | MemberState::Failed => probation += 1,
            }
        }
    }
    let not_connected = s.subset.iter().filter(|t| !s.members.iter().any(|m| m.task == **t)).count();
    let in_table = s.members.len() + s.affinity.len();
    let draining = (s.connections_open as usize).saturating_sub(in_table);
    [
        ("ready", ready),
        ("slow_start", slow_start),
        ("probation", probation),
        ("ejected", ejected),
        ("not_connected", not_connected),
        ("stand_in", stand_in),
        ("draining", draining),
    ]
}
