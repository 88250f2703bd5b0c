//! How a [`crate::Balance`] behaves: which frontend it is, how many backends it keeps,
//! how it measures load, and how it reacts to failures.

use std::time::Duration;

use steady_subset::Algorithm;

use crate::backoff::Backoff;

/// The load estimate power of two choices compares.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Load {
    /// Requests in flight on the endpoint (as tower's `PendingRequests`).
    InFlight,
    /// Peak EWMA of response latency times (in flight + 1), as tower's `PeakEwma`:
    /// a slow response raises the estimate at once, fast ones lower it gradually
    /// with the given decay time.
    PeakEwma {
        /// The time constant of the decay.
        decay: Duration,
        /// The estimate of an endpoint with no response yet.
        default_rtt: Duration,
    },
}

/// The configuration of a [`crate::Balance`].
///
/// ```
/// use std::time::Duration;
/// use steady_balance::BalanceConfig;
///
/// let config = BalanceConfig::new(7, 20)          // frontend task 7, 20 connections
///     .with_max_stand_ins(5)                        // at most 5 extra for failed members
///     .with_no_backend_wait(Duration::from_millis(200));
/// assert_eq!(config.subset_size, 20);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct BalanceConfig {
    /// This frontend task's index `m` in its job.
    pub frontend: usize,
    /// `k`, the number of backends to keep connections to (changeable at run time with
    /// [`crate::Balance::set_subset_size`]).
    pub subset_size: usize,
    /// The subsetting algorithm (default: Rocksteadier).
    pub algorithm: Algorithm,
    /// How many backends beyond `k` may stand in for members whose connection failed
    /// (default 3). Draining or missing tasks are skipped without counting here.
    pub max_stand_ins: usize,
    /// The load estimate (default: in-flight requests).
    pub load: Load,
    /// Reconnection delays after a failure.
    pub backoff: Backoff,
    /// How long a request waits for a ready backend before failing with
    /// [`crate::BalanceError::NoReadyBackends`] (default 1 s).
    pub no_backend_wait: Duration,
}

impl BalanceConfig {
    /// Frontend `frontend` keeping `subset_size` connections, with the defaults.
    pub fn new(frontend: usize, subset_size: usize) -> Self {
        Self {
            frontend,
            subset_size,
            algorithm: Algorithm::default(),
            max_stand_ins: 3,
            load: Load::InFlight,
            backoff: Backoff::default(),
            no_backend_wait: Duration::from_secs(1),
        }
    }

    /// Sets the subsetting algorithm.
    pub fn with_algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = algorithm;
        self
    }

    /// Sets the most stand-ins for failed members.
    pub fn with_max_stand_ins(mut self, max: usize) -> Self {
        self.max_stand_ins = max;
        self
    }

    /// Sets the load estimate.
    pub fn with_load(mut self, load: Load) -> Self {
        self.load = load;
        self
    }

    /// Sets the reconnection backoff.
    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Sets how long a request waits for a ready backend.
    pub fn with_no_backend_wait(mut self, wait: Duration) -> Self {
        self.no_backend_wait = wait;
        self
    }
}
