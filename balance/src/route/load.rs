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
/// under contention, which only blurs an estimate). Its load is the estimate times
/// (requests in flight + 1).
///
/// `repr(C)`: the estimate first, as near as can be to the other fields the pick reads
/// (see `Endpoint`).
#[derive(Debug)]
#[repr(C)]
pub(crate) struct PeakEwma {
    /// The estimate in nanoseconds, as f64 bits.
    rtt_ns: AtomicU64,
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
        self.rtt_ns() * (in_flight as f64 + 1.0)
    }
}

impl PeakEwma {
    fn new(decay: Duration, default_rtt: Duration) -> Self {
        Self {
            // Untimed: as good as idle (see `Load::PeakEwma`).
            rtt_ns: AtomicU64::new(0f64.to_bits()),
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

    /// A call failed: the estimate doubles (from at least the default), up to
    /// [`MAX_PENALTY`]. A backend that fails at once would otherwise look like the fastest
    /// (its failures are never timed) and draw more requests, the more it fails; doubled
    /// per failure, it is avoided after a few, and its estimate decays back as any does.
    pub(crate) fn penalize(&self) {
        let estimate = (self.rtt_ns().max(self.default_ns) * 2.0).min(MAX_PENALTY.as_nanos() as f64);
        self.rtt_ns.store(estimate.to_bits(), Ordering::Relaxed);
    }

    /// Decays the estimate toward zero for the time since its last update, if that is
    /// at least `idle` (see `Endpoint::age_latency`).
    pub(crate) fn age(&self, now: Instant, idle: Duration) {
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
    pub(crate) fn observe(&self, sent: Instant, now: Instant) {
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
