//! One connection to one backend task, shared by the routing table and the requests
//! in flight on it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

// tokio's clock: the same as std's, except that tests can pause and advance it.
use tokio::time::Instant;

use steady_slice::SliceKey;
use tokio::sync::mpsc;

use super::calls::Calls;
use super::gate::{Gate, GateState, Share};
use super::load::{Load, LoadSignal};
use crate::classify::{Outcome, OutcomeSink};
use crate::config::Waits;

/// A member picked for a request that had none (the slow path) or had to move: the
/// endpoint, and whether the request still routes by its key there (false once it fell
/// back to the subset, so that it may then move to any member like an unkeyed request).
#[derive(Debug)]
pub(crate) struct Picked<S> {
    pub(crate) endpoint: Arc<Endpoint<S>>,
    pub(crate) keyed: bool,
}

/// The balancer an endpoint belongs to, as a request on it sees it: where the request
/// goes when this endpoint cannot take it, and how long it may wait.
///
/// Implemented by the state the request side shares with the control task
/// (`table::Shared`); an endpoint holds it weakly (the table holds the endpoints, so a
/// strong reference would be a cycle), and only the slow path calls it.
pub(crate) trait Rotation<S>: Send + Sync {
    /// Another ready member than `failed`, for a request `failed` could not take: for
    /// a keyed request (`key`), another ready replica of its slice, or when there is
    /// none and the policy falls back, a member of the subset (the pick then says the
    /// request is no longer keyed).
    fn another(&self, failed: &Endpoint<S>, key: Option<SliceKey>) -> Option<Picked<S>>;

    /// The configured waits.
    fn waits(&self) -> Waits;

    /// A call failed on one of the balancer's connections: counted in the balancer's
    /// total at once, whatever becomes of the connection.
    fn call_failed(&self);
}

/// What requests tell the control task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Feedback {
    /// Connection `id` to `task` failed at the transport: take it out of rotation.
    Failed { task: usize, id: u64 },
    /// Connection `id` to `task` failed its configured number of calls in a row (server
    /// faults or timeouts): consider ejecting it.
    Consecutive { task: usize, id: u64 },
    /// Connection `id`, on probation, served its probe: start its slow start.
    Probed { id: u64 },
    /// Connection `id`, draining, has no request in flight any more: close it.
    Drained { id: u64 },
}

/// How an endpoint reacts to the outcomes of its calls (from the configuration).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reactions {
    /// Failed calls in a row that make the endpoint report itself (0: never).
    pub(crate) consecutive: u32,
    /// The gate a probation endpoint opens to once its probe succeeded (its slow
    /// start's first share).
    pub(crate) after_probe: GateState,
}

impl Reactions {
    #[cfg(test)]
    pub(crate) const NONE: Reactions = Reactions { consecutive: 0, after_probe: GateState::OPEN };
}

/// How a new connection opens: the picks its gate lets through at first, how its load
/// is measured, and how it reacts to the outcomes of its calls.
#[derive(Debug)]
pub(crate) struct Opening {
    pub(crate) gate: GateState,
    pub(crate) load: LoadSignal,
    pub(crate) reactions: Reactions,
}

/// An endpoint's ties to its balancer: the control task it reports to, and the state
/// the request side shares (held weakly: the table holds the endpoints, so a strong
/// reference would be a cycle).
#[derive(Debug)]
pub(crate) struct Link<S> {
    pub(crate) feedback: mpsc::UnboundedSender<Feedback>,
    pub(crate) rotation: Weak<dyn Rotation<S>>,
}

/// A connected backend: the service to call, which picks may choose it, its load and
/// its counters.
///
/// `repr(C)` keeps the fields in the order written: what the pick reads of a member
/// (its gate, its requests in flight, its load signal) first and together, so that a
/// pick touches as few cache lines per member as it can; then what requests write.
#[derive(Debug)]
#[repr(C)]
pub(crate) struct Endpoint<S> {
    /// Which picks may choose the endpoint: all, a share (slow start: picks that draw
    /// it take it with that chance), probation, or none (broken, set by the first
    /// transport failure so that requests avoid the endpoint at once, before the control
    /// task has published a table without it). Written by the control task (the slow
    /// start) and by calls' outcomes. One word, so that the pick's fast path reads one
    /// value per member to know it may take it.
    gate: Gate,
    /// Set when the endpoint leaves rotation; the last request out reports `Drained`.
    draining: AtomicBool,
    pub(crate) calls: Calls,
    load: LoadSignal,
    reactions: Reactions,
    /// The backend task's index.
    pub(crate) task: usize,
    /// Unique per connection, so stale feedback about an old connection is ignored.
    pub(crate) id: u64,
    link: Link<S>,
    /// The connection; each request calls a clone.
    pub(crate) service: S,
}

impl<S> Endpoint<S> {
    /// Connection `id` to backend task `task`, calling `service`.
    pub(crate) fn new(task: usize, id: u64, service: S, opening: Opening, link: Link<S>) -> Self {
        let Opening { gate, load, reactions } = opening;
        debug_assert!(reactions.after_probe.serves(), "probation opens to a share: {reactions:?}");
        Self {
            gate: Gate::new(gate),
            draining: AtomicBool::new(false),
            calls: Calls::default(),
            load,
            reactions,
            task,
            id,
            link,
            service,
        }
    }

    /// An endpoint of no balancer, for unit tests: open, counting requests in flight,
    /// reacting to nothing; feedback goes nowhere.
    #[cfg(test)]
    pub(crate) fn detached(task: usize, id: u64, service: S) -> Self {
        let (feedback, _) = mpsc::unbounded_channel();
        Self::new(task, id, service, Opening::plain(), Link { feedback, rotation: nowhere() })
    }

    /// The load estimate, lower is better: what its load signal (see [`Load`]) makes of
    /// its requests in flight. Whether the endpoint may be picked at all (broken, held
    /// back) is its gate's to say, read first.
    #[inline]
    pub(crate) fn load(&self) -> f64 {
        self.load.load(self.calls.in_flight.load(Ordering::Relaxed))
    }

    /// Whether its connection failed.
    #[inline]
    pub(crate) fn is_broken(&self) -> bool {
        self.gate().is_broken()
    }

    /// Which picks may choose the endpoint (see the field's doc): one atomic load.
    #[inline]
    pub(crate) fn gate(&self) -> GateState {
        self.gate.read()
    }

    /// Sets the share of picks that may choose the endpoint (the control task's slow
    /// start). A probation endpoint keeps its probation: the slow start starts after
    /// the probe.
    pub(crate) fn set_share(&self, share: Share) {
        self.gate.set_share(share);
    }

    /// Claims the probe of an endpoint on probation: true for the one request that
    /// then goes.
    #[inline]
    pub(crate) fn try_probe(&self) -> bool {
        self.gate.try_probe()
    }

    /// The balancer, while it lives.
    pub(crate) fn rotation(&self) -> Option<Arc<dyn Rotation<S>>> {
        self.link.rotation.upgrade()
    }

    /// Records what a call on this connection came to: counts failures, reports a run
    /// of them and transport failures to the control task, ends probation.
    #[inline]
    pub(crate) fn record(&self, outcome: Outcome) {
        match outcome {
            Outcome::Success => {
                self.calls.succeeded();
                // A probe's success may come after its guard freed the probe (a gRPC
                // call's outcome is in its trailers, read after the head): a success on
                // a member on probation is its probe's either way, for only the probe is
                // ever sent there.
                let gate = self.gate();
                if gate == GateState::PROBE_SENT || gate == GateState::PROBE_WAITING {
                    self.probe_succeeded();
                }
            }
            Outcome::Fault | Outcome::Timeout => self.faulted(),
            Outcome::Transport => self.transport_failed(),
        }
    }

    #[cold]
    fn probe_succeeded(&self) {
        if self.gate.probe_served(self.reactions.after_probe) {
            let _ = self.link.feedback.send(Feedback::Probed { id: self.id });
        }
    }

    /// A call failed over a working connection (a server fault, a timeout).
    #[cold]
    fn faulted(&self) {
        self.count_failure();
        if let Some(ewma) = self.load.latency() {
            ewma.penalize();
        }
        // A failed probe: the next pick that draws the endpoint probes again.
        self.gate.free_probe();
        let run = self.calls.extend_run();
        // Reported when the run reaches the limit, and again at each multiple of it (the
        // control task may have kept the member then: the others were failing too).
        let limit = self.reactions.consecutive;
        if limit != 0 && run % limit == 0 {
            let _ = self.link.feedback.send(Feedback::Consecutive { task: self.task, id: self.id });
        }
    }

    /// The connection failed: count it, and take the endpoint out of rotation.
    #[cold]
    fn transport_failed(&self) {
        self.count_failure();
        self.eject();
    }

    fn count_failure(&self) {
        self.calls.failed();
        // The failure path only: an upgrade costs little next to a failed call.
        if let Some(rotation) = self.rotation() {
            rotation.call_failed();
        }
    }

    /// The endpoint cannot take requests (its connection failed, or its readiness
    /// did): requests avoid it from now on, and the control task retires it and backs
    /// off.
    pub(crate) fn eject(&self) {
        self.gate.set_broken();
        let _ = self.link.feedback.send(Feedback::Failed { task: self.task, id: self.id });
    }

    /// Ages the latency estimate (Peak EWMA) if no timed response came for `idle`: it
    /// decays as if one with no latency had arrived now. Without this a member that gets
    /// no requests (its estimate once looked high) would keep its estimate, and so get
    /// no requests, for ever; tower's `PeakEwma` decays on every read, which needs a
    /// clock read per pick. The control task calls this once per `idle`.
    pub(crate) fn age_latency(&self, now: Instant, idle: Duration) {
        if let Some(ewma) = self.load.latency() {
            ewma.age(now, idle);
        }
    }

    /// Takes the endpoint out of rotation; true when nothing is in flight (close now).
    pub(crate) fn start_draining(&self) -> bool {
        self.draining.store(true, Ordering::SeqCst);
        self.calls.in_flight.load(Ordering::SeqCst) == 0
    }
}

#[cfg(test)]
impl Opening {
    /// Open at once, counting requests in flight, reacting to nothing (unit tests).
    pub(crate) fn plain() -> Self {
        Opening {
            gate: GateState::OPEN,
            load: LoadSignal::new(crate::config::Load::InFlight),
            reactions: Reactions::NONE,
        }
    }
}

/// A request in flight on an endpoint: counted from the pick until the response or
/// the request is dropped, whichever comes first.
#[derive(Debug)]
pub(crate) struct InFlight<S> {
    endpoint: Arc<Endpoint<S>>,
    start: Option<Instant>,
    /// Routed by its slice key to one of its slice's replicas.
    keyed: bool,
}

impl<S> InFlight<S> {
    /// The request is headed for `endpoint`: it counts in the endpoint's load from now
    /// (requests and keyed requests count once sent, see [`InFlight::sent`]).
    #[inline]
    pub(crate) fn start(endpoint: Arc<Endpoint<S>>) -> Self {
        endpoint.calls.in_flight.fetch_add(1, Ordering::SeqCst);
        Self { endpoint, start: None, keyed: false }
    }

    /// Marks the request as routed by its slice key.
    #[inline]
    pub(crate) fn keyed(mut self) -> Self {
        self.keyed = true;
        self
    }

    /// The request is handed to the backend's service: count it (a request that moved
    /// before this counts only on the member that got it), and with Peak EWMA, time it
    /// if it is one of the sampled requests (see [`LoadSignal::times`]).
    #[inline]
    pub(crate) fn sent(mut self) -> Self {
        let n = self.endpoint.calls.requests.fetch_add(1, Ordering::Relaxed);
        if self.endpoint.load.times(n) {
            self.start = Some(Instant::now());
        }
        if self.keyed {
            self.endpoint.calls.keyed.fetch_add(1, Ordering::Relaxed);
        }
        self
    }

    pub(crate) fn endpoint(&self) -> &Arc<Endpoint<S>> {
        &self.endpoint
    }

    /// The response's head arrived: feed the latency estimate (timed requests only).
    #[inline]
    pub(crate) fn answered(&self) {
        if let (Some(ewma), Some(start)) = (self.endpoint.load.latency(), self.start) {
            ewma.observe(start, Instant::now());
        }
    }
}

impl<S> Drop for InFlight<S> {
    #[inline]
    fn drop(&mut self) {
        // SeqCst pairs with `start_draining`: either it sees our decrement, or we see
        // its flag, so a draining connection is always closed once it is idle.
        let before = self.endpoint.calls.in_flight.fetch_sub(1, Ordering::SeqCst);
        if before == 1 {
            if self.endpoint.draining.load(Ordering::SeqCst) {
                let _ = self.endpoint.link.feedback.send(Feedback::Drained { id: self.endpoint.id });
            }
            // A probe given up on before its outcome (or whose outcome is deferred to
            // its body): free the probe, so that probation cannot stick. A deferred
            // success still ends probation when it comes (see `record`).
            self.endpoint.gate.free_probe();
        }
    }
}

impl<S: Send + Sync> OutcomeSink for Endpoint<S> {
    fn record(&self, outcome: Outcome) {
        Endpoint::record(self, outcome);
    }
}

/// A rotation that does not exist (for endpoints of no balancer, in unit tests).
#[cfg(test)]
pub(crate) fn nowhere<S>() -> Weak<dyn Rotation<S>> {
    struct Nowhere;
    impl<S> Rotation<S> for Nowhere {
        fn another(&self, _: &Endpoint<S>, _: Option<SliceKey>) -> Option<Picked<S>> {
            None
        }
        fn waits(&self) -> Waits {
            unreachable!("never upgraded")
        }
        fn call_failed(&self) {}
    }
    Weak::<Nowhere>::new()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Load as LoadConfig;

    /// An open endpoint of no balancer with `load`, reporting to `feedback`.
    fn endpoint(
        task: usize,
        id: u64,
        load: LoadConfig,
        feedback: mpsc::UnboundedSender<Feedback>,
    ) -> Endpoint<()> {
        let opening = Opening { load: LoadSignal::new(load), ..Opening::plain() };
        Endpoint::new(task, id, (), opening, Link { feedback, rotation: nowhere() })
    }

    #[test]
    fn in_flight_counts_until_dropped_and_a_draining_endpoint_reports_idle() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let ep = Arc::new(endpoint(3, 9, LoadConfig::InFlight, tx));
        let a = InFlight::start(ep.clone()).sent();
        let b = InFlight::start(ep.clone());
        // Picked but not sent (it moved elsewhere, say): in the load, not in the count.
        assert_eq!(ep.calls.requests.load(Ordering::Relaxed), 1);
        let b = b.sent();
        assert_eq!(ep.load(), 2.0);
        assert!(!ep.start_draining());
        drop(a);
        assert!(rx.try_recv().is_err());
        drop(b);
        assert_eq!(rx.try_recv().unwrap(), Feedback::Drained { id: 9 });
        assert_eq!(ep.calls.requests.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn a_probe_whose_success_comes_after_its_guard_still_ends_probation() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let opening = Opening {
            gate: GateState::PROBE_WAITING,
            reactions: Reactions { consecutive: 0, after_probe: GateState::OPEN },
            ..Opening::plain()
        };
        let ep = Arc::new(Endpoint::new(0, 4, (), opening, Link { feedback: tx, rotation: nowhere() }));
        assert!(ep.try_probe());
        // The response's head arrived and the request's guard dropped; its outcome (a
        // gRPC status in the trailers) is reported after.
        drop(InFlight::start(ep.clone()).sent());
        assert_eq!(ep.gate(), GateState::PROBE_WAITING);
        ep.record(Outcome::Success);
        assert_eq!(ep.gate(), GateState::OPEN);
        assert_eq!(rx.try_recv().unwrap(), Feedback::Probed { id: 4 });
    }

    #[test]
    fn with_peak_ewma_the_first_requests_and_one_in_sixteen_after_are_timed() {
        let timed = |load| {
            let (tx, _rx) = mpsc::unbounded_channel();
            let ep = Arc::new(endpoint(0, 1, load, tx));
            (0..64).map(|_| InFlight::start(ep.clone()).sent().start.is_some()).collect::<Vec<bool>>()
        };
        let ewma = timed(LoadConfig::peak_ewma());
        assert!(ewma[..16].iter().all(|t| *t));
        let later: Vec<usize> = (16..64).filter(|&n| ewma[n]).collect();
        assert_eq!(later, vec![16, 32, 48]);
        assert!(timed(LoadConfig::InFlight).iter().all(|t| !t), "in-flight counting reads no clock");
    }
}
