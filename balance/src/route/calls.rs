//! A member's counts of its calls, kept by the requests on it and read by the control
//! task (outlier detection, draining, affinity) and the statistics.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// The counters of one connection. Written by the requests on it; a reader sees each
/// counter on its own (they are not a consistent snapshot of one another).
///
/// `in_flight` is also the input of the member's load, and pairs with its draining
/// flag (see `Endpoint::start_draining`): it is written `SeqCst` there, by the
/// endpoint. The others are statistics, `Relaxed` throughout.
///
/// `repr(C)`: `in_flight` first, next to the endpoint's gate (see `Endpoint`).
#[derive(Debug, Default)]
#[repr(C)]
pub(crate) struct Calls {
    /// Requests picked for the member and not finished (sent or not).
    pub(crate) in_flight: AtomicUsize,
    /// Requests sent.
    pub(crate) requests: AtomicU64,
    /// Requests routed here by their slice key (a subset of `requests`).
    pub(crate) keyed: AtomicU64,
    /// Calls that failed (server faults, timeouts, transport failures).
    pub(crate) failures: AtomicU64,
    /// Failed calls since the last success.
    consecutive: AtomicU32,
}

impl Calls {
    /// Failed calls since the last success.
    pub(crate) fn consecutive_failures(&self) -> u32 {
        self.consecutive.load(Ordering::Relaxed)
    }

    /// Starts the count of consecutive failures afresh (the member was ejected for it).
    pub(crate) fn reset_run(&self) {
        self.consecutive.store(0, Ordering::Relaxed);
    }

    /// A call succeeded: the run of failures, if any, ends.
    #[inline]
    pub(crate) fn succeeded(&self) {
        // Read first: a store on every success would bounce the cache line.
        if self.consecutive.load(Ordering::Relaxed) != 0 {
            self.consecutive.store(0, Ordering::Relaxed);
        }
    }

    /// A call failed, whatever the failure.
    pub(crate) fn failed(&self) {
        self.failures.fetch_add(1, Ordering::Relaxed);
    }

    /// A call failed over a working connection: the run of failures grows. Returns its
    /// length now.
    pub(crate) fn extend_run(&self) -> u32 {
        self.consecutive.fetch_add(1, Ordering::Relaxed).saturating_add(1)
    }
}
