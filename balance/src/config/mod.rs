//! How a [`crate::Balance`] behaves: which frontend it is, how many backends it keeps,
//! how it measures load, and how it reacts to failures.

use std::time::Duration;

use steady_subset::Algorithm;

use steady_core::{Backoff, ConfigError};

mod health;
mod load_bound;
mod zones;

pub use health::{FailureRate, OutlierDetection, SlowStart};
pub use load_bound::{KeyedLoadBound, KeyedSpill, MAX_NEIGHBOUR_STEPS};
pub use zones::ZoneRouting;

/// The largest subset size `k` (the most backends subsetting handles). A `k` above the
/// job's size means every task of the job.
pub const MAX_SUBSET_SIZE: usize = steady_subset::MAX_BACKENDS;

/// The longest wait, timeout or backoff delay accepted: an hour. Longer ones are almost
/// certainly mistakes (a request that waits an hour for a backend has long been given
/// up on), and bounding them keeps every deadline computable.
pub const MAX_WAIT: Duration = steady_core::MAX_BACKOFF;

/// The longest idle timeout accepted for affinity connections: a day.
pub const MAX_IDLE: Duration = Duration::from_secs(86_400);

/// The load estimate power of two choices compares.
///
/// The default is [`Load::peak_ewma`]: unlike requests in flight, it tells a slow backend
/// from a busy one, so a backend that answers late gets fewer requests even while it has
/// as many in flight as the others. Its cost is on the request path: one request in
/// sixteen (and each of a connection's first sixteen) reads the clock twice.
/// `docs/benchmarks.md#the-load-signal` has what each signal measured, with the commands.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Load {
    /// Requests in flight on the endpoint (as tower's `PendingRequests`).
    InFlight,
    /// Peak EWMA of response latency times (in flight + 1), as tower's `PeakEwma`:
    /// a slow response raises the estimate at once, fast ones lower it gradually
    /// with the given decay time. A member with no timed response yet counts as idle
    /// (slow start, not its estimate, limits a newcomer's share; its first sixteen
    /// responses are timed); each failed call doubles the estimate, from at least
    /// `default_rtt`.
    PeakEwma {
        /// The time constant of the decay.
        decay: Duration,
        /// The estimate a first failure doubles from.
        default_rtt: Duration,
    },
}

impl Load {
    /// Peak EWMA with a 1 s decay and a 1 ms estimate before the first response: the
    /// settings the throughput benchmark measures (`rpc-throughput`, client
    /// `steady_ewma`).
    pub fn peak_ewma() -> Self {
        Load::PeakEwma { decay: Duration::from_secs(1), default_rtt: Duration::from_millis(1) }
    }
}

/// What a keyed request does when none of its slice's replicas is usable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NoReplicaPolicy {
    /// Send it to the subset like an unkeyed request (eventually consistent mode:
    /// a misrouted request is tolerated). Counted as a fallback.
    #[default]
    FallBackToSubset,
    /// Fail it with [`crate::BalanceError::NoReplica`].
    Fail,
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
///
/// The subsetting algorithm is decimal Rocksteadier unless set. A fleet that runs
/// Rocksteadier pins it (every frontend of a fleet must use the same algorithm):
///
/// ```
/// use steady_balance::BalanceConfig;
/// use steady_subset::{Algorithm, Rocksteadier};
///
/// assert_eq!(BalanceConfig::new(7, 20).algorithm.to_string(), "rocksteadier-decimal");
/// let pinned = BalanceConfig::new(7, 20).with_algorithm(Algorithm::Rocksteadier(Rocksteadier::default()));
/// assert_eq!(pinned.algorithm.to_string(), "rocksteadier");
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct BalanceConfig {
    /// This frontend task's index `m` in its job (in its zone, with [`BalanceConfig::zones`]).
    pub frontend: usize,
    /// `k`, the number of backends to keep connections to (changeable at run time with
    /// [`crate::Balance::set_subset_size`]).
    pub subset_size: usize,
    /// The subsetting algorithm (default: [`Algorithm::default()`], decimal Rocksteadier,
    /// `rocksteadier-decimal`). To keep Rocksteadier, set
    /// `Algorithm::Rocksteadier(Rocksteadier::default())` with [`BalanceConfig::with_algorithm`]:
    /// each algorithm's subsets are a separate frozen contract, and switching moves most of them.
    pub algorithm: Algorithm,
    /// How many backends beyond `k` may stand in for members whose connection failed
    /// (default 3). Draining or missing tasks are skipped without counting here.
    pub max_stand_ins: usize,
    /// The load estimate (default: Peak EWMA latency times requests in flight,
    /// [`Load::peak_ewma`]; see [`Load`] for why).
    pub load: Load,
    /// Reconnection delays after a failure.
    pub backoff: Backoff,
    /// How long a connection attempt may take before it counts as failed (default 5 s);
    /// waiting for the connector to be ready counts against it too. With a connector
    /// that connects one at a time, make it longer than `k` connects take, or the last
    /// attempts of a fresh subset fail (and back off) while they wait their turn.
    pub connect_timeout: Duration,
    /// How long a request waits for a ready backend before failing with
    /// [`crate::BalanceError::NoReadyBackends`] (default 1 s).
    pub no_backend_wait: Duration,
    /// The most replicas of one slice this frontend uses (default 3): a slice with more
    /// is served by this frontend's own Ringsteady subset of its replica list.
    pub fan_out: usize,
    /// What keyed requests do when no chosen replica is usable (default: fall back).
    pub no_replica: NoReplicaPolicy,
    /// The most on-demand (affinity) connections to replicas outside the subset
    /// (default 16); the least recently active is closed to make room.
    pub max_affinity: usize,
    /// An affinity connection idle this long is closed (default 60 s).
    pub affinity_idle: Duration,
    /// How long a keyed request waits for an affinity connection (default 250 ms).
    /// With [`NoReplicaPolicy::FallBackToSubset`], a keyed request that finds no replica
    /// then waits up to `no_backend_wait` more for the subset: `affinity_wait +
    /// no_backend_wait` in all before [`crate::BalanceError::NoReadyBackends`].
    pub affinity_wait: Duration,
    /// Whether keyed requests still go to a draining task that the assignment in force
    /// names as a replica (default `false`: a draining task gets no new request at all).
    /// Turn it on with a handover (the Assigner's `handover` and the Slicelet's grace):
    /// a draining owner keeps answering for its slices, warm, until the Assigner has
    /// moved them, instead of its keys falling back to other members cold. The task must
    /// then wait until it is released (`Slicelet::wait_until_released`) before it stops.
    /// Unkeyed requests never go to a draining task.
    pub keyed_to_draining: bool,
    /// Bounded-load routing for keyed requests (default: none, a keyed request always
    /// goes to its slice's replicas): a replica with many more requests in flight than
    /// the others hands them to a neighbour until the Assigner moves the hot keys. See
    /// [`KeyedLoadBound`] for what it trades.
    pub keyed_load_bound: Option<KeyedLoadBound>,
    /// Ejection of members that fail markedly more calls than the rest (on by default).
    pub outliers: OutlierDetection,
    /// How members that join or come back take up load (on by default).
    pub slow_start: SlowStart,
    /// Zone-aware routing (default: none, the job is one pool). See [`ZoneRouting`].
    pub zones: Option<ZoneRouting>,
}

/// The request side's share of the configuration: how long requests wait, and what a
/// keyed request does without a replica. Kept once, in the state both sides share.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Waits {
    pub(crate) no_backend: Duration,
    pub(crate) affinity: Duration,
    pub(crate) no_replica: NoReplicaPolicy,
}

impl BalanceConfig {
    /// The request side's waits.
    pub(crate) fn waits(&self) -> Waits {
        Waits { no_backend: self.no_backend_wait, affinity: self.affinity_wait, no_replica: self.no_replica }
    }

    /// Frontend `frontend` keeping `subset_size` connections, with the defaults.
    pub fn new(frontend: usize, subset_size: usize) -> Self {
        Self {
            frontend,
            subset_size,
            algorithm: Algorithm::default(),
            max_stand_ins: 3,
            load: Load::peak_ewma(),
            backoff: Backoff::default(),
            connect_timeout: Duration::from_secs(5),
            no_backend_wait: Duration::from_secs(1),
            fan_out: 3,
            no_replica: NoReplicaPolicy::FallBackToSubset,
            max_affinity: 16,
            keyed_to_draining: false,
            keyed_load_bound: None,
            affinity_idle: Duration::from_secs(60),
            affinity_wait: Duration::from_millis(250),
            outliers: OutlierDetection::default(),
            slow_start: SlowStart::default(),
            zones: None,
        }
    }

    /// Sets the most replicas used per slice.
    pub fn with_fan_out(mut self, fan_out: usize) -> Self {
        self.fan_out = fan_out;
        self
    }

    /// Checks every value; the first out of its range is the error. Building a balancer
    /// or channel does this, so an invalid value never reaches the control task.
    ///
    /// | field | accepted |
    /// |---|---|
    /// | `subset_size` | `1..=MAX_SUBSET_SIZE` (above the job's size: the whole job) |
    /// | `max_stand_ins`, `max_affinity` | `0..=MAX_SUBSET_SIZE` |
    /// | `fan_out` | `1..=steady_slice::MAX_REPLICAS` |
    /// | `connect_timeout` | `1 ms..=MAX_WAIT` |
    /// | `no_backend_wait`, `affinity_wait` | `0..=MAX_WAIT` |
    /// | `affinity_idle` | `1 ms..=MAX_IDLE` |
    /// | `backoff.base` | `1 ms..=MAX_WAIT`; `backoff.max`: `backoff.base..=MAX_WAIT` |
    /// | `backoff.jitter` | a number in `0.0..=1.0` |
    /// | `load` (Peak EWMA) | `decay` `1 ms..=MAX_WAIT`, `default_rtt` `0..=MAX_WAIT` |
    /// | `outliers.consecutive_failures` | `1..=1000000` or `None` |
    /// | `outliers.failure_rate` | `threshold` in `(0, 1]`, `min_requests` `1..=2^32-1`, or `None` |
    /// | `outliers.interval` | `10 ms..=MAX_WAIT` |
    /// | `outliers.base_ejection` | `1 ms..=MAX_WAIT`; `outliers.max_ejection`: `base_ejection..=MAX_WAIT` |
    /// | `outliers.max_ejected_share` | `0.0..=1.0` |
    /// | `slow_start.window` | `0..=MAX_WAIT`; `slow_start.min_share` in `(0, 1]` |
    /// | `zones.min_healthy_share` | `0.0..=1.0` |
    /// | `keyed_load_bound.factor` | a number in `1.0..=100.0`; `keyed_load_bound.floor`: `0..=1000000` |
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field, its value and the accepted range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        const MS: Duration = Duration::from_millis(1);
        validate_subset_size(self.subset_size)?;
        check("max_stand_ins", self.max_stand_ins, 0, MAX_SUBSET_SIZE, "0..=MAX_SUBSET_SIZE (2^24)")?;
        check("max_affinity", self.max_affinity, 0, MAX_SUBSET_SIZE, "0..=MAX_SUBSET_SIZE (2^24)")?;
        check("fan_out", self.fan_out, 1, steady_slice::MAX_REPLICAS, "1..=MAX_REPLICAS (1024)")?;
        check("connect_timeout", self.connect_timeout, MS, MAX_WAIT, "1 ms..=1 h")?;
        check("no_backend_wait", self.no_backend_wait, Duration::ZERO, MAX_WAIT, "0..=1 h")?;
        check("affinity_wait", self.affinity_wait, Duration::ZERO, MAX_WAIT, "0..=1 h")?;
        check("affinity_idle", self.affinity_idle, MS, MAX_IDLE, "1 ms..=24 h")?;
        self.backoff.validate()?;
        if let Load::PeakEwma { decay, default_rtt } = self.load {
            check("load.decay", decay, MS, MAX_WAIT, "1 ms..=1 h")?;
            check("load.default_rtt", default_rtt, Duration::ZERO, MAX_WAIT, "0..=1 h")?;
        }
        self.outliers.validate()?;
        self.slow_start.validate()?;
        if let Some(zones) = &self.zones {
            zones.validate()?;
        }
        if let Some(bound) = &self.keyed_load_bound {
            bound.validate()?;
        }
        Ok(())
    }

    /// Sets what keyed requests do when no replica is usable.
    pub fn with_no_replica(mut self, policy: NoReplicaPolicy) -> Self {
        self.no_replica = policy;
        self
    }

    /// Sets the bound on affinity connections and their idle timeout.
    pub fn with_affinity(mut self, max: usize, idle: Duration) -> Self {
        self.max_affinity = max;
        self.affinity_idle = idle;
        self
    }

    /// Sets how long a keyed request waits for an affinity connection.
    pub fn with_affinity_wait(mut self, wait: Duration) -> Self {
        self.affinity_wait = wait;
        self
    }

    /// With keyed requests still sent to a draining owner (see
    /// [`BalanceConfig::keyed_to_draining`]).
    pub fn with_keyed_to_draining(mut self, on: bool) -> Self {
        self.keyed_to_draining = on;
        self
    }

    /// With bounded-load routing for keyed requests (see [`KeyedLoadBound`]).
    pub fn with_keyed_load_bound(mut self, bound: KeyedLoadBound) -> Self {
        self.keyed_load_bound = Some(bound);
        self
    }

    /// Sets the subsetting algorithm, e.g. `Algorithm::Rocksteadier(Rocksteadier::default())`
    /// to pin Rocksteadier instead of the default, decimal Rocksteadier.
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

    /// Sets how long a connection attempt may take.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets outlier ejection (see [`OutlierDetection`]).
    pub fn with_outliers(mut self, outliers: OutlierDetection) -> Self {
        self.outliers = outliers;
        self
    }

    /// Sets slow start and probation (see [`SlowStart`]).
    pub fn with_slow_start(mut self, slow_start: SlowStart) -> Self {
        self.slow_start = slow_start;
        self
    }

    /// Sets how long a request waits for a ready backend.
    pub fn with_no_backend_wait(mut self, wait: Duration) -> Self {
        self.no_backend_wait = wait;
        self
    }

    /// Routes zone-aware (see [`ZoneRouting`]): `frontend` is then the index in the zone.
    pub fn with_zones(mut self, zones: ZoneRouting) -> Self {
        self.zones = Some(zones);
        self
    }
}

/// Checks a subset size `k` (at build time and when it is changed at run time).
pub(crate) fn validate_subset_size(k: usize) -> Result<(), ConfigError> {
    check("subset_size", k, 1, MAX_SUBSET_SIZE, "1..=MAX_SUBSET_SIZE (2^24)")
}

pub(crate) fn check<V: PartialOrd + std::fmt::Debug>(
    field: &'static str,
    value: V,
    min: V,
    max: V,
    accepted: &'static str,
) -> Result<(), ConfigError> {
    if value < min || value > max {
        return Err(ConfigError::new(field, value, accepted));
    }
    Ok(())
}
