//! The load signals the pick compares: requests in flight, or Peak EWMA of response
//! latency (see [`crate::Load`], which chooses one per balancer).
//!
//! As tower's `load` module makes load a trait over its `PendingRequests` and
//! `PeakEwma`, [`Load`] is what the pick asks; here the in-flight count is kept by the
//! endpoint for every signal (draining and the statistics need it too), and a signal
//! turns it into a load.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

// tokio's clock: the same as std's, except that tests can pause and advance it.
use tokio::time::Instant;

use crate::config;

/// A load signal: how busy a member looks, lower is better.
pub(crate) trait Load {
    /// The member's load with `in_flight` requests in flight on it.
    fn load(&self, in_flight: usize) -> f64;
}

/// Requests in flight, as they are (tower's `PendingRequests`; [`crate::Load::InFlight`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct PendingRequests;

impl Load for PendingRequests {
    #[inline]
    fn load(&self, in_flight: usize) -> f64 {
        in_flight as f64
    }
}

/// The load signal of one member, as its balancer's configuration chose.
#[derive(Debug)]
pub(crate) enum LoadSignal {
    InFlight(PendingRequests),
    PeakEwma(PeakEwma),
}

impl LoadSignal {
    pub(crate) fn new(config: config::Load) -> Self {
        match config {
            config::Load::InFlight => Self::InFlight(PendingRequests),
            config::Load::PeakEwma { decay, default_rtt } => {
                Self::PeakEwma(PeakEwma::new(decay, default_rtt))
            }
        }
    }

    /// The latency estimate, when the signal measures latency (Peak EWMA).
    #[inline]
    pub(crate) fn latency(&self) -> Option<&PeakEwma> {
        match self {
            Self::InFlight(_) => None,
            Self::PeakEwma(ewma) => Some(ewma),
        }
    }

    /// Whether the member's request number `n` (from 0) is timed: with Peak EWMA, the
    /// first [`LATENCY_SAMPLE`] and one in [`LATENCY_SAMPLE`] after them; none without.
    #[inline]
    pub(crate) fn times(&self, n: u64) -> bool {
        self.latency().is_some() && (n < LATENCY_SAMPLE || n % LATENCY_SAMPLE == 0)
    }
}

impl Load for LoadSignal {
    #[inline]
    fn load(&self, in_flight: usize) -> f64 {
        match self {
            Self::InFlight(pending) => pending.load(in_flight),
            Self::PeakEwma(ewma) => ewma.load(in_flight),
        }
    }
}

/// With Peak EWMA, the first `LATENCY_SAMPLE` requests of a connection and one in
/// `LATENCY_SAMPLE` after them are timed. Timing every request would put two clock reads
/// and an estimate update on every request's path (what that cost:
/// `docs/benchmarks.md#the-load-signal`); one request in
/// sixteen still gives a busy member hundreds of samples a second, and a slow member
/// (which gets few requests) is timed on its first ones. The price: a member that turns
/// slow is noticed up to sixteen requests later (its requests in flight rise at once).
const LATENCY_SAMPLE: u64 = 16;

/// The highest latency estimate failures raise a member's to (see `PeakEwma::penalize`).
const MAX_PENALTY: Duration = Duration::from_secs(10);

/// Peak-EWMA latency (tower's `PeakEwma`), updated without locks (last writer wins
/// under contention, which only blurs an estimate), scaled by the concurrency it was
/// measured at.
///
/// Its load is the estimate per request in flight times (requests in flight + 1): the
/// latency a new request may expect. tower's (and Finagle's) signal multiplies the
/// latency by the requests in flight as they are, as if a server answered one request
/// at a time; but a server answers many at once, and the latency it shows under load
/// already holds its queueing. So a busy fast server (5 ms with 85 requests in flight)
/// looked 21 times worse than an idle server that always takes 20 ms, and the slow one
/// drew every pick until it held a fifth of the requests. Here each timed response
/// also records how many requests were in flight on the member when it was sent, and
/// the estimate is divided by the EWMA of those counts: the fast server's load is then
/// about 5 ms, the slow one's 20 ms, and the slow one gets nearly nothing. With one
/// request at a time (a count of 1) the load is tower's.
///
/// `repr(C)`: the estimate first, as near as can be to the other fields the pick reads
/// (see `Endpoint`).
#[derive(Debug)]
#[repr(C)]
pub(crate) struct PeakEwma {
    /// The estimate divided by the concurrency estimate, in nanoseconds, as f64 bits:
    /// what the pick reads.
    per_request_ns: AtomicU64,
    /// The estimate in nanoseconds, as f64 bits.
    rtt_ns: AtomicU64,
    /// The EWMA of the requests in flight (the timed one included, so at least 1) when
    /// timed requests were sent, as f64 bits.
    concurrency: AtomicU64,
    /// When it was last updated, in nanoseconds since `base`.
    stamp_ns: AtomicU64,
    base: Instant,
    decay_ns: f64,
    /// The estimate before the first response, in nanoseconds.
    default_ns: f64,
}

impl Load for PeakEwma {
    #[inline]
    fn load(&self, in_flight: usize) -> f64 {
        f64::from_bits(self.per_request_ns.load(Ordering::Relaxed)) * (in_flight as f64 + 1.0)
    }
}

impl PeakEwma {
    fn new(decay: Duration, default_rtt: Duration) -> Self {
        Self {
            // Untimed: as good as idle (see `Load::PeakEwma`).
            per_request_ns: AtomicU64::new(0f64.to_bits()),
            rtt_ns: AtomicU64::new(0f64.to_bits()),
            concurrency: AtomicU64::new(1f64.to_bits()),
            stamp_ns: AtomicU64::new(0),
            base: Instant::now(),
            decay_ns: decay.as_nanos().max(1) as f64,
            default_ns: default_rtt.as_nanos() as f64,
        }
    }

    #[inline]
    fn rtt_ns(&self) -> f64 {
        f64::from_bits(self.rtt_ns.load(Ordering::Relaxed))
    }

    fn concurrency(&self) -> f64 {
        f64::from_bits(self.concurrency.load(Ordering::Relaxed))
    }

    /// Stores a new estimate, and with it the load per request in flight.
    fn set_rtt(&self, rtt_ns: f64, concurrency: f64) {
        self.rtt_ns.store(rtt_ns.to_bits(), Ordering::Relaxed);
        self.per_request_ns.store((rtt_ns / concurrency).to_bits(), Ordering::Relaxed);
    }

    /// A call failed: doubles the estimate (from at least the default), up to
    /// [`MAX_PENALTY`], so that a failing member loses picks before outlier detection
    /// ejects it.
    pub(crate) fn penalize(&self) {
        let estimate = (self.rtt_ns().max(self.default_ns) * 2.0).min(MAX_PENALTY.as_nanos() as f64);
        self.set_rtt(estimate, self.concurrency());
    }

    /// Decays an estimate that no response updated for `idle` toward zero, as if the
    /// time since had been spent idle: without it a member whose latency spiked once
    /// would keep its estimate (and lose every pick) until a response came, and none
    /// would come. The control task calls it on a timer.
    pub(crate) fn age(&self, now: Instant, idle: Duration) {
        let now = now.saturating_duration_since(self.base).as_nanos() as u64;
        let stamp = self.stamp_ns.load(Ordering::Relaxed);
        let elapsed = now.saturating_sub(stamp);
        if elapsed < idle.as_nanos() as u64 {
            return;
        }
        self.stamp_ns.store(now, Ordering::Relaxed);
        let decayed = self.rtt_ns() * (-(elapsed as f64) / self.decay_ns).exp();
        self.set_rtt(decayed, self.concurrency());
    }

    /// A response to a request sent at `sent` with `in_flight` requests in flight on the
    /// member (itself included) came at `now`: a higher latency replaces the estimate at
    /// once (the peak), a lower one is blended in by the time since the last update;
    /// the concurrency estimate is blended in the same way.
    pub(crate) fn observe(&self, sent: Instant, in_flight: usize, now: Instant) {
        let rtt = now.saturating_duration_since(sent).as_nanos() as f64;
        let now = now.saturating_duration_since(self.base).as_nanos() as u64;
        let elapsed = now.saturating_sub(self.stamp_ns.swap(now, Ordering::Relaxed)) as f64;
        let decay = (-elapsed / self.decay_ns).exp();
        let old = self.rtt_ns();
        let estimate = if rtt > old { rtt } else { old * decay + rtt * (1.0 - decay) };
        let sampled = in_flight.max(1) as f64;
        // The first response sets the concurrency estimate (as it sets the latency's).
        let concurrency =
            if old == 0.0 { sampled } else { self.concurrency() * decay + sampled * (1.0 - decay) };
        self.concurrency.store(concurrency.to_bits(), Ordering::Relaxed);
        self.set_rtt(estimate, concurrency);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        e.observe(t, 1, t + Duration::from_millis(20));
        let idle = Duration::from_secs(1);
        e.age(t + Duration::from_millis(500), idle);
        assert_eq!(e.rtt_ns(), 20e6, "updated half a second ago: left as it is");
        e.age(t + Duration::from_millis(2020), idle);
        let aged = e.rtt_ns();
        // Two seconds at a 1 s decay: e^-2 of it.
        assert!((aged - 20e6 * (-2.0f64).exp()).abs() < 1e3, "{aged}");
    }

    #[test]
    fn a_busy_fast_member_looks_better_than_an_idle_slow_one() {
        let (fast, slow) = (
            PeakEwma::new(Duration::from_secs(1), Duration::from_millis(1)),
            PeakEwma::new(Duration::from_secs(1), Duration::from_millis(1)),
        );
        let t = Instant::now();
        // The fast one answers in 5 ms with 86 requests in flight (the timed one
        // included); the slow one takes 20 ms with one.
        fast.observe(t, 86, t + Duration::from_millis(5));
        slow.observe(t, 1, t + Duration::from_millis(20));
        assert!((fast.load(85) - 5e6).abs() < 1e3, "{}", fast.load(85));
        assert_eq!(slow.load(0), 20e6);
        assert!(fast.load(85) < slow.load(0) * 0.75, "beyond the tie band: the fast one wins");
        // Load still grows with the requests in flight: twice as many, twice the load.
        assert!((fast.load(171) - 10e6).abs() < 1e3, "{}", fast.load(171));
        // One request at a time: tower's signal, the latency times (in flight + 1).
        assert_eq!(slow.load(3), 80e6);
        // A failure doubles the latency at the same concurrency.
        slow.penalize();
        assert_eq!(slow.load(0), 40e6);
    }

    #[test]
    fn peak_ewma_jumps_up_and_decays_down() {
        let e = PeakEwma::new(Duration::from_millis(10), Duration::from_millis(1));
        let t = Instant::now();
        e.observe(t, 1, t + Duration::from_millis(50));
        assert_eq!(e.rtt_ns(), 50e6);
        let later = t + Duration::from_millis(80);
        e.observe(later - Duration::from_millis(1), 1, later);
        let after = e.rtt_ns();
        assert!(after < 10e6 && after > 1e6, "{after}");
    }
}
