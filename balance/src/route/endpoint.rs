//! One connection to one backend task, shared by the routing table and the requests
//! in flight on it.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

// tokio's clock: the same as std's, except that tests can pause and advance it.
use tokio::time::Instant;

use steady_slice::SliceKey;
use tokio::sync::mpsc;

use crate::classify::{Outcome, OutcomeSink};
use crate::config::{Load, Waits};

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

/// The gate of an endpoint open to every pick (see [`Endpoint::gate`]).
pub(crate) const OPEN: u32 = 1 << 16;
/// The gate of an endpoint on probation whose one request has not been sent.
pub(crate) const PROBE_WAITING: u32 = OPEN + 1;
/// The gate of an endpoint on probation whose one request is in flight.
pub(crate) const PROBE_SENT: u32 = OPEN + 2;
/// The gate of an endpoint whose connection failed: no pick takes it, unless nothing else
/// is there.
pub(crate) const BROKEN: u32 = OPEN + 3;

/// How an endpoint reacts to the outcomes of its calls (from the configuration).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reactions {
    /// Failed calls in a row that make the endpoint report itself (0: never).
    pub(crate) consecutive: u32,
    /// The gate a probation endpoint opens to once its probe succeeded (its slow
    /// start's first share).
    pub(crate) after_probe: u32,
}

impl Reactions {
    #[cfg(test)]
    pub(crate) const NONE: Reactions = Reactions { consecutive: 0, after_probe: OPEN };
}

/// A connected backend: the service to call and its counters.
#[derive(Debug)]
pub(crate) struct Endpoint<S> {
    /// The backend task's index.
    pub(crate) task: usize,
    /// Unique per connection, so stale feedback about an old connection is ignored.
    pub(crate) id: u64,
    /// The connection; each request calls a clone.
    pub(crate) service: S,
    pub(crate) in_flight: AtomicUsize,
    pub(crate) requests: AtomicU64,
    /// Requests routed here by their slice key (a subset of `requests`).
    pub(crate) keyed: AtomicU64,
    pub(crate) failures: AtomicU64,
    /// Failed calls since the last success.
    consecutive: AtomicU32,
    /// Set when the endpoint leaves rotation; the last request out reports `Drained`.
    pub(crate) draining: AtomicBool,
    /// Which picks may choose the endpoint: [`OPEN`] (all), a share of [`OPEN`] (slow
    /// start: picks that draw it take it with that chance), probation
    /// ([`PROBE_WAITING`], [`PROBE_SENT`]), or none ([`BROKEN`], set by the first
    /// transport failure so that requests avoid the endpoint at once, before the control
    /// task has published a table without it). Written by the control task (the ramp) and
    /// by calls' outcomes. One word, so that the pick's fast path reads one value per
    /// member to know it may take it.
    gate: AtomicU32,
    reactions: Reactions,
    ewma: Option<PeakEwma>,
    feedback: mpsc::UnboundedSender<Feedback>,
    /// The balancer, to pick another endpoint when this one cannot take a request.
    pub(crate) rotation: Weak<dyn Rotation<S>>,
}

impl<S> Endpoint<S> {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        task: usize,
        id: u64,
        service: S,
        load: Load,
        reactions: Reactions,
        gate: u32,
        feedback: mpsc::UnboundedSender<Feedback>,
        rotation: Weak<dyn Rotation<S>>,
    ) -> Self {
        let ewma = match load {
            Load::InFlight => None,
            Load::PeakEwma { decay, default_rtt } => Some(PeakEwma::new(decay, default_rtt)),
        };
        Self {
            task,
            id,
            service,
            in_flight: AtomicUsize::new(0),
            requests: AtomicU64::new(0),
            keyed: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            consecutive: AtomicU32::new(0),
            draining: AtomicBool::new(false),
            gate: AtomicU32::new(gate),
            reactions,
            ewma,
            feedback,
            rotation,
        }
    }

    /// An endpoint of no balancer, for unit tests: feedback goes nowhere.
    #[cfg(test)]
    pub(crate) fn detached(task: usize, id: u64, service: S) -> Self {
        let (feedback, _) = mpsc::unbounded_channel();
        Self::new(task, id, service, Load::InFlight, Reactions::NONE, OPEN, feedback, nowhere())
    }

    /// The load estimate: lower is better. Whether the endpoint may be picked at all
    /// (broken, held back) is its gate's to say, read first.
    #[inline]
    pub(crate) fn load(&self) -> f64 {
        let pending = self.in_flight.load(Ordering::Relaxed) as f64;
        match &self.ewma {
            None => pending,
            Some(e) => e.rtt_ns() * (pending + 1.0),
        }
    }

    /// Whether its connection failed.
    #[inline]
    pub(crate) fn is_broken(&self) -> bool {
        self.gate() == BROKEN
    }

    /// Whether latency is measured (Peak EWMA).
    #[inline]
    pub(crate) fn measures_latency(&self) -> bool {
        self.ewma.is_some()
    }

    /// Which picks may choose the endpoint (see the field's doc).
    #[inline]
    pub(crate) fn gate(&self) -> u32 {
        self.gate.load(Ordering::Relaxed)
    }

    /// Sets the share of picks that may choose the endpoint (the control task's ramp).
    /// A probation endpoint keeps its probation: the ramp starts after the probe.
    pub(crate) fn set_share(&self, share: u32) {
        let share = share.min(OPEN);
        let _ =
            self.gate.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |g| (g <= OPEN).then_some(share));
    }

    /// Claims the probe of an endpoint on probation: true for the one request that
    /// then goes.
    #[inline]
    pub(crate) fn try_probe(&self) -> bool {
        self.gate.compare_exchange(PROBE_WAITING, PROBE_SENT, Ordering::Relaxed, Ordering::Relaxed).is_ok()
    }

    /// Failed calls since the last success.
    pub(crate) fn consecutive_failures(&self) -> u32 {
        self.consecutive.load(Ordering::Relaxed)
    }

    /// Starts the count of consecutive failures afresh (the member was ejected for it).
    pub(crate) fn reset_run(&self) {
        self.consecutive.store(0, Ordering::Relaxed);
    }

    /// Records what a call on this connection came to: counts failures, reports a run
    /// of them and transport failures to the control task, ends probation.
    #[inline]
    pub(crate) fn record(&self, outcome: Outcome) {
        match outcome {
            Outcome::Success => {
                // Read first: a store on every success would bounce the cache line.
                if self.consecutive.load(Ordering::Relaxed) != 0 {
                    self.consecutive.store(0, Ordering::Relaxed);
                }
                if self.gate() == PROBE_SENT {
                    self.probe_succeeded();
                }
            }
            Outcome::Fault | Outcome::Timeout => self.faulted(),
            Outcome::Transport => self.transport_failed(),
        }
    }

    #[cold]
    fn probe_succeeded(&self) {
        let opened = self.reactions.after_probe;
        if self.gate.compare_exchange(PROBE_SENT, opened, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
            let _ = self.feedback.send(Feedback::Probed { id: self.id });
        }
    }

    /// A call failed over a working connection (a server fault, a timeout).
    #[cold]
    fn faulted(&self) {
        self.count_failure();
        if let Some(ewma) = &self.ewma {
            ewma.penalize();
        }
        // A failed probe: the next pick that draws the endpoint probes again.
        let _ = self.gate.compare_exchange(PROBE_SENT, PROBE_WAITING, Ordering::Relaxed, Ordering::Relaxed);
        let run = self.consecutive.fetch_add(1, Ordering::Relaxed).saturating_add(1);
        // Reported when the run reaches the limit, and again at each multiple of it (the
        // control task may have kept the member then: the others were failing too).
        let limit = self.reactions.consecutive;
        if limit != 0 && run % limit == 0 {
            let _ = self.feedback.send(Feedback::Consecutive { task: self.task, id: self.id });
        }
    }

    /// The connection failed: count it, and take the endpoint out of rotation.
    #[cold]
    fn transport_failed(&self) {
        self.count_failure();
        self.eject();
    }

    fn count_failure(&self) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        // The failure path only: an upgrade costs little next to a failed call.
        if let Some(rotation) = self.rotation.upgrade() {
            rotation.call_failed();
        }
    }

    /// The endpoint cannot take requests (its connection failed, or its readiness
    /// did): requests avoid it from now on, and the control task retires it and backs
    /// off.
    pub(crate) fn eject(&self) {
        self.gate.store(BROKEN, Ordering::Relaxed);
        let _ = self.feedback.send(Feedback::Failed { task: self.task, id: self.id });
    }

    /// Ages the latency estimate (Peak EWMA) if no timed response came for `idle`: it
    /// decays as if one with no latency had arrived now. Without this a member that gets
    /// no requests (its estimate once looked high) would keep its estimate, and so get
    /// no requests, for ever; tower's `PeakEwma` decays on every read, which needs a
    /// clock read per pick. The control task calls this once per `idle`.
    pub(crate) fn age_latency(&self, now: Instant, idle: Duration) {
        if let Some(ewma) = &self.ewma {
            ewma.age(now, idle);
        }
    }

    /// Takes the endpoint out of rotation; true when nothing is in flight (close now).
    pub(crate) fn start_draining(&self) -> bool {
        self.draining.store(true, Ordering::SeqCst);
        self.in_flight.load(Ordering::SeqCst) == 0
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
        endpoint.in_flight.fetch_add(1, Ordering::SeqCst);
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
    /// if it is one of the sampled requests (see [`LATENCY_SAMPLE`]).
    #[inline]
    pub(crate) fn sent(mut self) -> Self {
        let n = self.endpoint.requests.fetch_add(1, Ordering::Relaxed);
        if self.endpoint.measures_latency() && (n < LATENCY_SAMPLE || n % LATENCY_SAMPLE == 0) {
            self.start = Some(Instant::now());
        }
        if self.keyed {
            self.endpoint.keyed.fetch_add(1, Ordering::Relaxed);
        }
        self
    }

    pub(crate) fn endpoint(&self) -> &Arc<Endpoint<S>> {
        &self.endpoint
    }

    /// The response's head arrived: feed the latency estimate (timed requests only).
    #[inline]
    pub(crate) fn answered(&self) {
        if let (Some(ewma), Some(start)) = (&self.endpoint.ewma, self.start) {
            ewma.observe(start, Instant::now());
        }
    }
}

/// With Peak EWMA, the first `LATENCY_SAMPLE` requests of a connection and one in
/// `LATENCY_SAMPLE` after them are timed. Reading the clock twice and updating the
/// estimate cost about three times the rest of a pick (the `pick` bench); one request in
/// sixteen still gives a busy member hundreds of samples a second, and a slow member
/// (which gets few requests) is timed on its first ones. The price: a member that turns
/// slow is noticed up to sixteen requests later (its requests in flight rise at once).
const LATENCY_SAMPLE: u64 = 16;

impl<S> Drop for InFlight<S> {
    #[inline]
    fn drop(&mut self) {
        // SeqCst pairs with `start_draining`: either it sees our decrement, or we see
        // its flag, so a draining connection is always closed once it is idle.
        let before = self.endpoint.in_flight.fetch_sub(1, Ordering::SeqCst);
        if before == 1 {
            if self.endpoint.draining.load(Ordering::SeqCst) {
                let _ = self.endpoint.feedback.send(Feedback::Drained { id: self.endpoint.id });
            }
            // A probe given up on before its outcome (or whose outcome is deferred to
            // its body): free the probe, so that probation cannot stick.
            let _ = self.endpoint.gate.compare_exchange(
                PROBE_SENT,
                PROBE_WAITING,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
    }
}

impl<S: Send + Sync> OutcomeSink for Endpoint<S> {
    fn record(&self, outcome: Outcome) {
        Endpoint::record(self, outcome);
    }
}

/// The highest latency estimate failures raise a member's to (see `PeakEwma::penalize`).
const MAX_PENALTY: Duration = Duration::from_secs(10);

/// Peak-EWMA latency, updated without locks (last writer wins under contention,
/// which only blurs an estimate).
#[derive(Debug)]
struct PeakEwma {
    decay_ns: f64,
    /// The estimate before the first response, in nanoseconds.
    default_ns: f64,
    base: Instant,
    /// The estimate in nanoseconds, as f64 bits.
    rtt_ns: AtomicU64,
    /// When it was last updated, in nanoseconds since `base`.
    stamp_ns: AtomicU64,
}

impl PeakEwma {
    fn new(decay: Duration, default_rtt: Duration) -> Self {
        Self {
            decay_ns: decay.as_nanos().max(1) as f64,
            default_ns: default_rtt.as_nanos() as f64,
            base: Instant::now(),
            // Untimed: as good as idle (see `Load::PeakEwma`).
            rtt_ns: AtomicU64::new(0f64.to_bits()),
            stamp_ns: AtomicU64::new(0),
        }
    }

    fn rtt_ns(&self) -> f64 {
        f64::from_bits(self.rtt_ns.load(Ordering::Relaxed))
    }

    /// A call failed: the estimate doubles (from at least the default), up to
    /// [`MAX_PENALTY`]. A backend that fails at once would otherwise look like the fastest
    /// (its failures are never timed) and draw more requests, the more it fails; doubled
    /// per failure, it is avoided after a few, and its estimate decays back as any does.
    fn penalize(&self) {
        let estimate = (self.rtt_ns().max(self.default_ns) * 2.0).min(MAX_PENALTY.as_nanos() as f64);
        self.rtt_ns.store(estimate.to_bits(), Ordering::Relaxed);
    }

    /// Decays the estimate toward zero for the time since its last update, if that is
    /// at least `idle` (see `Endpoint::age_latency`).
    fn age(&self, now: Instant, idle: Duration) {
        let now = now.saturating_duration_since(self.base).as_nanos() as u64;
        let stamp = self.stamp_ns.load(Ordering::Relaxed);
        let elapsed = now.saturating_sub(stamp);
        if elapsed < idle.as_nanos() as u64 {
            return;
        }
        // Last writer wins against a response arriving now: either keeps the estimate sane.
        self.stamp_ns.store(now, Ordering::Relaxed);
        let decayed = self.rtt_ns() * (-(elapsed as f64) / self.decay_ns).exp();
        self.rtt_ns.store(decayed.to_bits(), Ordering::Relaxed);
    }

    /// A response to a request sent at `sent` arrived at `now`.
    fn observe(&self, sent: Instant, now: Instant) {
        let rtt = now.saturating_duration_since(sent).as_nanos() as f64;
        let now = now.saturating_duration_since(self.base).as_nanos() as u64;
        let elapsed = now.saturating_sub(self.stamp_ns.swap(now, Ordering::Relaxed)) as f64;
        let old = self.rtt_ns();
        let estimate = if rtt > old {
            // Peak: a slow response counts in full at once.
            rtt
        } else {
            let decay = (-elapsed / self.decay_ns).exp();
            old * decay + rtt * (1.0 - decay)
        };
        self.rtt_ns.store(estimate.to_bits(), Ordering::Relaxed);
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

    #[test]
    fn in_flight_counts_until_dropped_and_a_draining_endpoint_reports_idle() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let ep = Arc::new(Endpoint::new(3, 9, (), Load::InFlight, Reactions::NONE, OPEN, tx, nowhere()));
        let a = InFlight::start(ep.clone()).sent();
        let b = InFlight::start(ep.clone());
        // Picked but not sent (it moved elsewhere, say): in the load, not in the count.
        assert_eq!(ep.requests.load(Ordering::Relaxed), 1);
        let b = b.sent();
        assert_eq!(ep.load(), 2.0);
        assert!(!ep.start_draining());
        drop(a);
        assert!(rx.try_recv().is_err());
        drop(b);
        assert_eq!(rx.try_recv().unwrap(), Feedback::Drained { id: 9 });
        assert_eq!(ep.requests.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn with_peak_ewma_the_first_requests_and_one_in_sixteen_after_are_timed() {
        let timed = |load| {
            let (tx, _rx) = mpsc::unbounded_channel();
            let ep = Arc::new(Endpoint::new(0, 1, (), load, Reactions::NONE, OPEN, tx, nowhere()));
            (0..64).map(|_| InFlight::start(ep.clone()).sent().start.is_some()).collect::<Vec<bool>>()
        };
        let ewma = timed(Load::peak_ewma());
        assert!(ewma[..16].iter().all(|t| *t));
        let later: Vec<usize> = (16..64).filter(|&n| ewma[n]).collect();
        assert_eq!(later, vec![16, 32, 48]);
        assert!(timed(Load::InFlight).iter().all(|t| !t), "in-flight counting reads no clock");
    }

    #[test]
    fn each_failure_doubles_the_estimate_up_to_the_cap() {
        let e = PeakEwma::new(Duration::from_secs(1), Duration::from_millis(1));
        assert_eq!(e.rtt_ns(), 0.0, "untimed: as good as idle");
        e.penalize();
        assert_eq!(e.rtt_ns(), 2e6, "from the default");
        e.penalize();
        assert_eq!(e.rtt_ns(), 4e6);
        for _ in 0..30 {
            e.penalize();
        }
        assert_eq!(e.rtt_ns(), MAX_PENALTY.as_nanos() as f64);
    }

    #[test]
    fn an_idle_estimate_is_aged_toward_zero_and_a_fresh_one_is_left() {
        let e = PeakEwma::new(Duration::from_secs(1), Duration::from_millis(1));
        let t = Instant::now();
        e.observe(t, t + Duration::from_millis(20));
        let idle = Duration::from_secs(1);
        e.age(t + Duration::from_millis(500), idle);
        assert_eq!(e.rtt_ns(), 20e6, "updated half a second ago: left as it is");
        e.age(t + Duration::from_millis(2020), idle);
        let aged = e.rtt_ns();
        // Two seconds at a 1 s decay: e^-2 of it.
        assert!((aged - 20e6 * (-2.0f64).exp()).abs() < 1e3, "{aged}");
    }

    #[test]
    fn peak_ewma_jumps_up_and_decays_down() {
        let e = PeakEwma::new(Duration::from_millis(10), Duration::from_millis(1));
        let t = Instant::now();
        e.observe(t, t + Duration::from_millis(50));
        assert_eq!(e.rtt_ns(), 50e6);
        let later = t + Duration::from_millis(80);
        e.observe(later - Duration::from_millis(1), later);
        let after = e.rtt_ns();
        assert!(after < 10e6 && after > 1e6, "{after}");
    }
}
