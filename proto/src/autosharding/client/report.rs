//! The client's load reports: the server's reporting rules, read with bounds, and the
//! per-key load drained from the caller's source into one report per interval.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use steady_slice::SliceKey;
use tokio::time::Instant;

use super::super::ranges::{aggregate, report};
use super::super::v1::{LoadReport, LoadReportingConfig, RangeLoad};

/// Where a client's per-key load comes from: what it sent since the last report.
///
/// A closure `Fn() -> Vec<(SliceKey, f64)>` is one. `steady_tonic::SteadyChannel` has
/// its own (the keyed requests it sent, counted in bounded memory).
pub trait KeyLoadSource: Send + Sync {
    /// The load per key since the previous call (since the source began, for the first),
    /// the counts then starting again from zero. A key may appear more than once (its
    /// loads add up); loads that are not finite and positive are ignored.
    fn drain(&self) -> Vec<(SliceKey, f64)>;
}

impl<F> KeyLoadSource for F
where
    F: Fn() -> Vec<(SliceKey, f64)> + Send + Sync,
{
    fn drain(&self) -> Vec<(SliceKey, f64)> {
        self()
    }
}

/// The shortest interval between two reports a client keeps to, whatever the server asks.
pub const MIN_REPORT_INTERVAL: Duration = Duration::from_secs(1);

/// The longest interval between two reports a client keeps to, whatever the server asks.
pub const MAX_REPORT_INTERVAL: Duration = Duration::from_secs(300);

/// The interval a client reports at when the server names none.
pub const DEFAULT_REPORT_INTERVAL: Duration = Duration::from_secs(10);

/// How far back a report may start when the server names no threshold (and at most,
/// whatever it names): a report over a longer span (the client was disconnected that
/// long) is dropped, its load with it.
pub const MAX_REPORT_SPAN: Duration = Duration::from_secs(300);

/// The quantum a client reports under when the server's is unset (zero), negative or
/// not a number: a range holds at most 1% of a report's load. Taking such a value as it
/// is would give every key a range of its own.
pub const DEFAULT_REPORT_QUANTUM: f64 = 0.01;

/// The most ranges one report holds (what steady's server takes): a report the
/// aggregation makes longer is aggregated again under twice the quantum until it fits.
pub const MAX_REPORT_RANGES: usize = 4096;

/// A server's [`LoadReportingConfig`], with every value brought inside the bounds a
/// client keeps to.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct ReportingRules {
    /// The share of a report's load one range may hold, in `0.0..=1.0`.
    pub(super) quantum: f64,
    /// The longest start key, in `0..=8` bytes (steady's keys are 8 bytes).
    pub(super) resolution: usize,
    /// The time between two reports.
    pub(super) interval: Duration,
    /// The longest span one report may cover.
    pub(super) span: Duration,
}

impl ReportingRules {
    /// The rules `config` gives: a quantum above 1 is taken as 1, and one that is not
    /// above 0 (unset, negative) or not a number as [`DEFAULT_REPORT_QUANTUM`]; the
    /// resolution to `0..=8` bytes; the interval to
    /// [`MIN_REPORT_INTERVAL`]`..=`[`MAX_REPORT_INTERVAL`] (none: 10 s) and at most half
    /// the span, so that a report late by a little still starts inside it; the span to
    /// the server's start threshold, at most [`MAX_REPORT_SPAN`].
    pub(super) fn of(config: &LoadReportingConfig) -> Self {
        let duration = |d: &Option<prost_types::Duration>| d.and_then(|d| Duration::try_from(d).ok());
        let quantum = config.load_quantum_fraction;
        let quantum = if quantum > 0.0 { quantum.min(1.0) } else { DEFAULT_REPORT_QUANTUM };
        let resolution = usize::try_from(config.max_load_balancing_resolution_bytes.clamp(0, 8)).unwrap_or(8);
        let span = duration(&config.load_report_start_threshold)
            .filter(|d| !d.is_zero())
            .map_or(MAX_REPORT_SPAN, |d| d.min(MAX_REPORT_SPAN))
            .max(2 * MIN_REPORT_INTERVAL);
        let interval = duration(&config.load_reporting_interval)
            .unwrap_or(DEFAULT_REPORT_INTERVAL)
            .clamp(MIN_REPORT_INTERVAL, MAX_REPORT_INTERVAL)
            .min(span / 2);
        Self { quantum, resolution, interval, span }
    }
}

/// The load reported so far: where the next report starts, and the source it drains.
pub(super) struct Reporter {
    source: Arc<dyn KeyLoadSource>,
    metric: String,
    /// Where the next report starts (the previous one's end), on the wall clock the
    /// server compares reports with.
    since: SystemTime,
    /// The same moment on the monotonic clock, which schedules reports.
    since_instant: Instant,
}

impl Reporter {
    pub(super) fn new(source: Arc<dyn KeyLoadSource>, metric: String) -> Self {
        Self { source, metric, since: SystemTime::now(), since_instant: Instant::now() }
    }

    /// When the next report is due under `rules`.
    pub(super) fn due(&self, rules: &ReportingRules) -> Instant {
        self.since_instant + rules.interval
    }

    /// The load since the previous report as a report under `rules`, ending now; the
    /// next starts here. `None` when the span since the previous one is longer than the
    /// rules allow (the client was disconnected that long): the load is dropped, as the
    /// server would drop it, and reporting starts again from now.
    pub(super) fn report(&mut self, rules: &ReportingRules) -> Option<LoadReport> {
        let loads = self.source.drain();
        let (end, end_instant) = (SystemTime::now(), Instant::now());
        let elapsed = end_instant - self.since_instant;
        // The wall clock stepped back since the last report: the span is taken from the
        // monotonic clock instead.
        let start = match end.duration_since(self.since) {
            Ok(span) if !span.is_zero() => self.since,
            _ => end - elapsed.max(Duration::from_millis(1)),
        };
        self.since = end;
        self.since_instant = end_instant;
        if end.duration_since(start).unwrap_or_default() > rules.span || elapsed > rules.span {
            tracing::warn!(
                elapsed = ?elapsed,
                span = ?rules.span,
                keys = loads.len(),
                "load since the last report is older than the server takes: dropped"
            );
            return None;
        }
        Some(report(&self.metric, bounded_ranges(loads, rules), start, end))
    }
}

/// `loads` aggregated under `rules`, in at most [`MAX_REPORT_RANGES`] ranges: when the
/// rules' quantum gives more, the quantum is doubled until they fit (at a quantum of 1
/// a report has at most two ranges).
fn bounded_ranges(loads: Vec<(SliceKey, f64)>, rules: &ReportingRules) -> Vec<RangeLoad> {
    let mut quantum = rules.quantum;
    loop {
        let ranges = aggregate(loads.iter().copied(), quantum, rules.resolution);
        if ranges.len() <= MAX_REPORT_RANGES || quantum >= 1.0 {
            return ranges;
        }
        tracing::debug!(ranges = ranges.len(), quantum, "a report over its bound: aggregated coarser");
        quantum = (quantum * 2.0).min(1.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(
        quantum: f64,
        resolution: i32,
        interval: Option<u64>,
        threshold: Option<u64>,
    ) -> LoadReportingConfig {
        let seconds = |s: u64| prost_types::Duration { seconds: s as i64, nanos: 0 };
        LoadReportingConfig {
            load_quantum_fraction: quantum,
            max_load_balancing_resolution_bytes: resolution,
            load_reporting_interval: interval.map(seconds),
            load_report_start_threshold: threshold.map(seconds),
        }
    }

    #[test]
    fn the_servers_values_are_kept_inside_the_clients_bounds() {
        let s = Duration::from_secs;
        let rules = ReportingRules::of(&config(0.01, 8, Some(10), Some(300)));
        assert_eq!(rules, ReportingRules { quantum: 0.01, resolution: 8, interval: s(10), span: s(300) });
        let wild = ReportingRules::of(&config(7.0, 40, Some(0), None));
        assert_eq!(wild, ReportingRules { quantum: 1.0, resolution: 8, interval: s(1), span: s(300) });
        let wild = ReportingRules::of(&config(-1.0, -3, Some(100_000), Some(100_000)));
        assert_eq!(
            wild,
            ReportingRules { quantum: DEFAULT_REPORT_QUANTUM, resolution: 0, interval: s(150), span: s(300) }
        );
        let short = ReportingRules::of(&config(0.1, 8, Some(50), Some(60)));
        assert_eq!((short.interval, short.span), (s(30), s(60)), "two reports per span at least");
        let tiny = ReportingRules::of(&config(0.1, 8, Some(50), Some(1)));
        assert_eq!((tiny.interval, tiny.span), (s(1), s(2)));
        let negative = LoadReportingConfig {
            load_reporting_interval: Some(prost_types::Duration { seconds: -5, nanos: 0 }),
            ..config(0.1, 8, None, None)
        };
        assert_eq!(ReportingRules::of(&negative).interval, DEFAULT_REPORT_INTERVAL);
    }

    #[test]
    fn a_quantum_that_is_unset_or_not_a_number_is_the_default_not_a_range_per_key() {
        for quantum in [0.0, -0.0, -1.0, f64::NAN, f64::NEG_INFINITY] {
            assert_eq!(
                ReportingRules::of(&config(quantum, 8, None, None)).quantum,
                DEFAULT_REPORT_QUANTUM,
                "{quantum}"
            );
        }
        assert_eq!(ReportingRules::of(&config(f64::INFINITY, 8, None, None)).quantum, 1.0);
    }

    #[test]
    fn a_report_holds_at_most_its_bound_of_ranges_whatever_the_quantum() {
        // 100,000 keys of equal load: at a quantum of 1/100,000 each would be a range.
        let loads: Vec<(SliceKey, f64)> = (0..100_000u64).map(|i| (SliceKey(i << 40), 1.0)).collect();
        let rules = ReportingRules { quantum: 1e-5, ..ReportingRules::of(&config(0.01, 8, None, None)) };
        let ranges = bounded_ranges(loads.clone(), &rules);
        assert!(
            ranges.len() <= MAX_REPORT_RANGES && ranges.len() > MAX_REPORT_RANGES / 4,
            "{}",
            ranges.len()
        );
        assert_eq!(ranges.iter().map(|r| r.load).sum::<f64>(), 100_000.0, "no load lost");
        // Within the bound, the rules' quantum is kept.
        let coarse = ReportingRules { quantum: 0.01, ..rules };
        assert_eq!(bounded_ranges(loads.clone(), &coarse), aggregate(loads, 0.01, 8));
    }

    #[tokio::test]
    async fn a_report_covers_the_time_since_the_previous_one_and_drains_the_source() {
        let calls = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counted = calls.clone();
        let source = move || {
            let n = counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            vec![(SliceKey(n), 2.0), (SliceKey(n), 1.0)]
        };
        let mut reporter = Reporter::new(Arc::new(source), "requests".to_owned());
        let rules = ReportingRules::of(&config(1.0, 8, Some(1), Some(300)));
        let first = reporter.report(&rules).unwrap();
        let second = reporter.report(&rules).unwrap();
        assert_eq!(first.end_time, second.start_time, "each starts where the previous ended");
        let load = &second.metric_loads["requests"].range_loads;
        assert_eq!(load[0].start_key, 1u64.to_be_bytes().to_vec());
        assert_eq!(load[0].load, 3.0);
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn load_older_than_the_server_takes_is_dropped_and_reporting_starts_again() {
        let source = || vec![(SliceKey(9), 1.0)];
        let mut reporter = Reporter::new(Arc::new(source), "requests".to_owned());
        let rules = ReportingRules::of(&config(1.0, 8, Some(10), Some(60)));
        assert_eq!(reporter.due(&rules), Instant::now() + Duration::from_secs(10));
        // Disconnected for longer than the server's start threshold.
        tokio::time::advance(Duration::from_secs(61)).await;
        assert!(reporter.report(&rules).is_none(), "dropped");
        assert_eq!(reporter.due(&rules), Instant::now() + Duration::from_secs(10), "from now on");
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(reporter.report(&rules).is_some());
    }
}
