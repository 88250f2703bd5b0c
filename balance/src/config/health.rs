//! How the balancer reacts to backends that fail calls over working connections
//! (outlier ejection, the panic threshold) and to members that join or come back
//! (slow start, probation).

use std::time::Duration;

use super::{check, MAX_WAIT};
use steady_core::ConfigError;

/// Outlier ejection: a member that fails markedly more calls than the rest of the
/// subset leaves rotation for a while, and the next backends in the frontend's order
/// stand in for it (as for a broken connection, but its connection stays open).
///
/// Which calls are failures is the classifier's decision (see [`crate::Classify`]):
/// server faults and timeouts count; transport failures are handled apart (the
/// connection is retired at once). Two detectors, both on by default:
///
/// * **Consecutive failures** (`consecutive_failures`, default 5): a member whose last
///   calls all failed is ejected at once, *if that run stands out*: a member failing
///   as often as the others (their share of failed calls over the last one to two
///   intervals, read at its plausible upper end `(failed + 3) / (calls + 3)` so that a
///   few good calls prove little) would show such a run in its calls with a chance
///   below 1%. So a backend answering `UNAVAILABLE` to everything goes within one or
///   two runs, while in a fleet where every backend fails 30% of calls (a shared
///   database down) runs of five are expected and eject nobody. A run that does not
///   stand out is looked at again when it reaches the next multiple of the limit.
/// * **Failure rate** (`failure_rate`, default 30% with at least 50 calls): every
///   `interval`, a member with at least `min_requests` calls in that interval, whose
///   share of failed calls is at least `threshold` *and* at least twice the share of
///   the other members together, is ejected.
///
/// Ejection lasts `base_ejection` times the number of times the member was ejected
/// (that count falls by one for every `base_ejection` the member then stays in
/// rotation), at most `max_ejection`. Then the member comes back through slow start.
///
/// **Panic threshold** (`max_ejected_share`, default ½): ejection never takes out more
/// than that share of the subset's members (at least one member may always go); and
/// when more than that share of the subset is out anyway (ejected, or disconnected and
/// backing off), the balancer is in *panic*: ejected members return to rotation, and
/// requests spread over every connected member rather than pile onto the last few.
/// `BalanceStats::panic` shows it.
///
/// Defaults, and why: gRPC's outlier detection (gRFC A50) uses 10 s intervals and
/// success-rate statistics that need five or more endpoints; a frontend here often keeps
/// four, and a backend that errors at once fails thousands of calls in 10 s. So the
/// consecutive detector (Envoy's and Finagle's default of 5) reacts within calls, and
/// the one-second interval bounds the damage of a backend that fails only some of them.
/// A50's 30 s base and 300 s cap on ejection time are kept.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct OutlierDetection {
    /// Failed calls in a row that eject a member that stands out (`None`: off).
    pub consecutive_failures: Option<u32>,
    /// The failure-rate detector (`None`: off).
    pub failure_rate: Option<FailureRate>,
    /// How often the failure-rate detector looks, and the window its rates cover.
    pub interval: Duration,
    /// How long a first ejection lasts.
    pub base_ejection: Duration,
    /// The longest ejection.
    pub max_ejection: Duration,
    /// The panic threshold: the largest share of the subset ejection takes out, and past
    /// which (ejected and unhealthy members together) the balancer spreads requests over
    /// every connected member.
    pub max_ejected_share: f64,
}

/// The failure-rate detector's thresholds (see [`OutlierDetection`]).
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct FailureRate {
    /// The share of failed calls, in `(0, 1]`, at or above which a member may be ejected.
    pub threshold: f64,
    /// The fewest calls in an interval for a member's rate to count.
    pub min_requests: u64,
}

impl FailureRate {
    /// A detector ejecting members that fail at least `threshold` of at least
    /// `min_requests` calls in an interval (and twice the others' share).
    pub fn new(threshold: f64, min_requests: u64) -> Self {
        Self { threshold, min_requests }
    }
}

impl Default for FailureRate {
    fn default() -> Self {
        Self { threshold: 0.3, min_requests: 50 }
    }
}

impl Default for OutlierDetection {
    fn default() -> Self {
        Self {
            consecutive_failures: Some(5),
            failure_rate: Some(FailureRate::default()),
            interval: Duration::from_secs(1),
            base_ejection: Duration::from_secs(30),
            max_ejection: Duration::from_secs(300),
            max_ejected_share: 0.5,
        }
    }
}

impl OutlierDetection {
    /// No outlier ejection: only transport failures take members out of rotation.
    pub fn disabled() -> Self {
        Self { consecutive_failures: None, failure_rate: None, ..Self::default() }
    }

    /// Sets the consecutive-failure detector (`None`: off).
    pub fn with_consecutive_failures(mut self, failures: Option<u32>) -> Self {
        self.consecutive_failures = failures;
        self
    }

    /// Sets the failure-rate detector (`None`: off).
    pub fn with_failure_rate(mut self, rate: Option<FailureRate>) -> Self {
        self.failure_rate = rate;
        self
    }

    /// Sets the detection interval.
    pub fn with_interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// Sets the first ejection's length and the longest.
    pub fn with_ejection(mut self, base: Duration, max: Duration) -> Self {
        self.base_ejection = base;
        self.max_ejection = max;
        self
    }

    /// Sets the panic threshold.
    pub fn with_max_ejected_share(mut self, share: f64) -> Self {
        self.max_ejected_share = share;
        self
    }

    /// Whether either detector is on.
    pub(crate) fn enabled(&self) -> bool {
        self.consecutive_failures.is_some() || self.failure_rate.is_some()
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        const MS: Duration = Duration::from_millis(1);
        if let Some(n) = self.consecutive_failures {
            check("outliers.consecutive_failures", n, 1, 1_000_000, "1..=1000000 (None: off)")?;
        }
        if let Some(rate) = self.failure_rate {
            if !(rate.threshold > 0.0 && rate.threshold <= 1.0) {
                return Err(ConfigError::new(
                    "outliers.failure_rate.threshold",
                    rate.threshold,
                    "(0.0, 1.0]",
                ));
            }
            check(
                "outliers.failure_rate.min_requests",
                rate.min_requests,
                1,
                u64::from(u32::MAX),
                "1..=2^32-1",
            )?;
        }
        check("outliers.interval", self.interval, 10 * MS, MAX_WAIT, "10 ms..=1 h")?;
        check("outliers.base_ejection", self.base_ejection, MS, MAX_WAIT, "1 ms..=1 h")?;
        check(
            "outliers.max_ejection",
            self.max_ejection,
            self.base_ejection,
            MAX_WAIT,
            "outliers.base_ejection..=1 h",
        )?;
        if !(0.0..=1.0).contains(&self.max_ejected_share) {
            return Err(ConfigError::new("outliers.max_ejected_share", self.max_ejected_share, "0.0..=1.0"));
        }
        Ok(())
    }
}

/// How a member that joins or comes back takes up load.
///
/// * **Slow start** (`window`, default 5 s; zero: off): a member that comes back from
///   ejection or from a broken connection, or joins while requests flow, is chosen at
///   first for only `min_share` (default 10%) of the picks that draw it, rising evenly
///   to all of them over the window, so that a cold backend (empty caches, a JIT
///   warming up) is not handed a full share at once. The members of a balancer that
///   has not sent a request yet start at full share, and so do affinity connections (a
///   replica that keyed requests are waiting for).
/// * **Probation** (`probation`, on by default): a member reconnected after its
///   connection broke gets one request, and the rest only once that one succeeded
///   (then slow start). A listener that accepts connections and resets them then
///   costs one request per reconnection instead of every request sent meanwhile. A
///   probation member still takes requests when no other member can.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct SlowStart {
    /// How long the ramp from `min_share` to a full share takes (zero: no ramp).
    pub window: Duration,
    /// The share a ramping member starts at, in `(0, 1]`.
    pub min_share: f64,
    /// Whether a member reconnected after a broken connection first gets one request.
    pub probation: bool,
}

impl Default for SlowStart {
    fn default() -> Self {
        Self { window: Duration::from_secs(5), min_share: 0.1, probation: true }
    }
}

impl SlowStart {
    /// No ramp and no probation: every member takes a full share at once.
    pub fn disabled() -> Self {
        Self { window: Duration::ZERO, min_share: 1.0, probation: false }
    }

    /// Sets the ramp's window and starting share.
    pub fn with_window(mut self, window: Duration, min_share: f64) -> Self {
        self.window = window;
        self.min_share = min_share;
        self
    }

    /// Sets probation on or off.
    pub fn with_probation(mut self, probation: bool) -> Self {
        self.probation = probation;
        self
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        check("slow_start.window", self.window, Duration::ZERO, MAX_WAIT, "0..=1 h")?;
        if !(self.min_share > 0.0 && self.min_share <= 1.0) {
            return Err(ConfigError::new("slow_start.min_share", self.min_share, "(0.0, 1.0]"));
        }
        Ok(())
    }
}
