//! Load per key range: what a client reports ([`aggregate`]) and what a server makes of
//! a report ([`validate`]).
//!
//! A report's ranges are an ordered list of start keys, each range ending where the next
//! one starts. Load is a cost summed over the report's interval; the server turns it into
//! a rate (per second) by the interval's length.

use std::time::{Duration, SystemTime};

use steady_slice::SliceKey;

use super::keys::{key_bytes, slice_key_at};
use super::v1::{Load, LoadReport, RangeLoad};

/// Per-key load as ranges under the server's rules: start keys cut to
/// `resolution_bytes` (at most 8: steady's keys are 8 bytes), strictly increasing; each
/// range at most `quantum` of the total unless it holds a single key; as few ranges as
/// the greedy walk from the lowest key makes. A range a key of its own ends right after
/// that key, and a last range of no load closes the report right after its last key, so
/// that a server does not spread the last range's load to the end of the key space (a
/// range's load is otherwise taken as spread evenly over its keys, which hashed keys
/// are). Keys without load are left out; no load gives no range.
pub fn aggregate(
    loads: impl IntoIterator<Item = (SliceKey, f64)>,
    quantum: f64,
    resolution_bytes: usize,
) -> Vec<RangeLoad> {
    let width = resolution_bytes.min(8);
    let mut keyed: Vec<(Vec<u8>, f64)> = loads
        .into_iter()
        .filter(|(_, load)| load.is_finite() && *load > 0.0)
        .map(|(key, load)| (key_bytes(key)[..width].to_vec(), load))
        .collect();
    keyed.sort_by(|a, b| a.0.cmp(&b.0));
    keyed.dedup_by(|later, earlier| {
        let same = later.0 == earlier.0;
        if same {
            earlier.1 += later.1;
        }
        same
    });
    let total: f64 = keyed.iter().map(|k| k.1).sum();
    let limit = quantum.clamp(0.0, 1.0) * total;
    let mut out: Vec<RangeLoad> = Vec::new();
    // The open range and the largest key in it (`None`: no key yet, as after a key of
    // its own, when the open range starts at that key's successor).
    let mut open: Option<(RangeLoad, Option<Vec<u8>>)> = None;
    for (key, load) in keyed {
        if let Some((range, last)) = open.as_mut() {
            if range.load + load <= limit {
                range.load += load;
                *last = Some(key);
                continue;
            }
            let (range, _) = open.take().expect("open");
            if range.start_key != key {
                out.push(range);
            }
        }
        if load > limit {
            // A key of its own: a single-key range, and the next range starts right after.
            let next = successor(&key);
            out.push(RangeLoad { start_key: key, load });
            open = next.map(|start_key| (RangeLoad { start_key, load: 0.0 }, None));
        } else {
            open = Some((RangeLoad { start_key: key.clone(), load }, Some(key)));
        }
    }
    match open {
        // Closes the open range right after its last key.
        Some((range, Some(last))) => {
            out.push(range);
            out.extend(successor(&last).map(|start_key| RangeLoad { start_key, load: 0.0 }));
        }
        // Already the closing range, after a key of its own.
        Some((range, None)) => out.push(range),
        None => {}
    }
    out
}

/// The next byte string of the same length in byte order (`None` after all `0xFF`).
fn successor(key: &[u8]) -> Option<Vec<u8>> {
    let mut next = key.to_vec();
    for byte in next.iter_mut().rev() {
        if *byte == 0xFF {
            *byte = 0;
        } else {
            *byte += 1;
            return Some(next);
        }
    }
    None
}

/// What a server accepts of a client's load report.
#[derive(Debug, Clone, PartialEq)]
pub struct ReportRules {
    /// The metric the server balances; other metrics are ignored.
    pub metric: String,
    /// The longest start key (the `max_load_balancing_resolution_bytes` it sent), at most 8.
    pub resolution_bytes: usize,
    /// The most ranges one metric's load may have.
    pub max_ranges: usize,
    /// The most metrics one report may carry.
    pub max_metrics: usize,
    /// The longest interval one report may cover.
    pub max_interval: Duration,
    /// How far in the past a report's start may be (the `load_report_start_threshold` it
    /// sent) and how far in the future its end, beyond [`ReportRules::max_skew`].
    pub start_threshold: Duration,
    /// The clock difference tolerated between a client and the server.
    pub max_skew: Duration,
}

impl Default for ReportRules {
    /// Metric `requests`, 8-byte keys, 4,096 ranges, 16 metrics, intervals up to 5
    /// minutes starting at most 5 minutes back, 30 s of clock skew.
    fn default() -> Self {
        Self {
            metric: DEFAULT_METRIC.to_owned(),
            resolution_bytes: 8,
            max_ranges: 4096,
            max_metrics: 16,
            max_interval: Duration::from_secs(300),
            start_threshold: Duration::from_secs(300),
            max_skew: Duration::from_secs(30),
        }
    }
}

/// The highest rate (load per second) one range may come to: 10^12, beyond any fleet.
pub const MAX_RATE: f64 = 1e12;

/// The metric steady balances by default: requests, one per keyed request.
pub const DEFAULT_METRIC: &str = "requests";

/// A valid report's load for the balanced metric: per range, a rate (load per second of
/// the report's interval). Ranges are sorted and contiguous: each ends where the next
/// starts; the last one, at the end of the key space.
#[derive(Debug, Clone, PartialEq)]
pub struct RangeRates {
    /// `(start, end, rate)`; `end` `None`: through the largest key.
    pub ranges: Vec<(SliceKey, Option<SliceKey>, f64)>,
    /// The interval the report covers.
    pub interval: Duration,
}

/// Why a report was refused: the client broke one of the protocol's rules or one of the
/// server's bounds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReportError {
    /// No start or end time, or one that is not a valid timestamp.
    MissingTimes,
    /// The end is not after the start.
    EndNotAfterStart,
    /// The interval is longer than [`ReportRules::max_interval`].
    IntervalTooLong,
    /// The end is later than the server's clock allows (skew included).
    InTheFuture,
    /// The start is older than the threshold allows (skew included).
    TooOld,
    /// More metrics than [`ReportRules::max_metrics`].
    TooManyMetrics(usize),
    /// More ranges than [`ReportRules::max_ranges`].
    TooManyRanges(usize),
    /// A range's start key is longer than the resolution.
    KeyTooLong(usize),
    /// Start keys that do not strictly increase.
    NotIncreasing,
    /// A load that is negative, infinite or not a number, or a rate over [`MAX_RATE`].
    BadLoad,
}

impl std::fmt::Display for ReportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::MissingTimes => f.write_str("load report without a valid start and end time"),
            Self::EndNotAfterStart => f.write_str("load report whose end is not after its start"),
            Self::IntervalTooLong => f.write_str("load report over a longer interval than allowed"),
            Self::InTheFuture => f.write_str("load report ending in the future (clock skew?)"),
            Self::TooOld => f.write_str("load report starting before the start threshold"),
            Self::TooManyMetrics(n) => write!(f, "load report with {n} metrics"),
            Self::TooManyRanges(n) => write!(f, "load with {n} ranges"),
            Self::KeyTooLong(n) => write!(f, "range start key of {n} bytes, above the resolution"),
            Self::NotIncreasing => f.write_str("range start keys not strictly increasing"),
            Self::BadLoad => f.write_str("range load negative, not finite, or a rate over 10^12 per second"),
        }
    }
}

impl std::error::Error for ReportError {}

/// Checks `report` against the protocol and `rules`, at the server's time `now`, and
/// returns the balanced metric's load as rates (no ranges when the report does not carry
/// that metric).
///
/// # Errors
///
/// The first rule broken ([`ReportError`]); nothing of the report is used then.
pub fn validate(
    report: &LoadReport,
    rules: &ReportRules,
    now: SystemTime,
) -> Result<RangeRates, ReportError> {
    let time = |t: &Option<prost_types::Timestamp>| {
        t.as_ref().and_then(|t| SystemTime::try_from(*t).ok()).ok_or(ReportError::MissingTimes)
    };
    let (start, end) = (time(&report.start_time)?, time(&report.end_time)?);
    let interval = end.duration_since(start).map_err(|_| ReportError::EndNotAfterStart)?;
    if interval.is_zero() {
        return Err(ReportError::EndNotAfterStart);
    }
    if interval > rules.max_interval {
        return Err(ReportError::IntervalTooLong);
    }
    if end.duration_since(now).is_ok_and(|ahead| ahead > rules.max_skew) {
        return Err(ReportError::InTheFuture);
    }
    if now.duration_since(start).is_ok_and(|behind| behind > rules.start_threshold + rules.max_skew) {
        return Err(ReportError::TooOld);
    }
    if report.metric_loads.len() > rules.max_metrics {
        return Err(ReportError::TooManyMetrics(report.metric_loads.len()));
    }
    let Some(Load { range_loads }) = report.metric_loads.get(&rules.metric) else {
        return Ok(RangeRates { ranges: Vec::new(), interval });
    };
    if range_loads.len() > rules.max_ranges {
        return Err(ReportError::TooManyRanges(range_loads.len()));
    }
    let resolution = rules.resolution_bytes.min(8);
    let seconds = interval.as_secs_f64();
    let mut ranges: Vec<(SliceKey, Option<SliceKey>, f64)> = Vec::with_capacity(range_loads.len());
    let mut previous: Option<&[u8]> = None;
    for range in range_loads {
        if range.start_key.len() > resolution {
            return Err(ReportError::KeyTooLong(range.start_key.len()));
        }
        if previous.is_some_and(|p| p >= range.start_key.as_slice()) {
            return Err(ReportError::NotIncreasing);
        }
        previous = Some(&range.start_key);
        if !range.load.is_finite() || range.load < 0.0 {
            return Err(ReportError::BadLoad);
        }
        let start = slice_key_at(&range.start_key).expect("at most 8 bytes");
        let rate = range.load / seconds;
        if rate > MAX_RATE {
            // A finite load over a tiny interval: a rate no fleet serves, which summed
            // over clients could reach infinity.
            return Err(ReportError::BadLoad);
        }
        match ranges.last_mut() {
            // "ab" and "ab\0" are one place in steady's key space: the first is empty.
            Some(last) if last.0 == start => last.2 += rate,
            Some(last) => {
                last.1 = Some(start);
                ranges.push((start, None, rate));
            }
            None => ranges.push((start, None, rate)),
        }
    }
    Ok(RangeRates { ranges, interval })
}

/// A [`LoadReport`] of `ranges` for `metric` over `[start, end)`: what a client sends.
pub fn report(metric: &str, ranges: Vec<RangeLoad>, start: SystemTime, end: SystemTime) -> LoadReport {
    LoadReport {
        metric_loads: [(metric.to_owned(), Load { range_loads: ranges })].into_iter().collect(),
        start_time: Some(start.into()),
        end_time: Some(end.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn starts(ranges: &[RangeLoad]) -> Vec<(Vec<u8>, f64)> {
        ranges.iter().map(|r| (r.start_key.clone(), r.load)).collect()
    }

    fn k(value: u64) -> SliceKey {
        SliceKey(value)
    }

    #[test]
    fn light_keys_share_ranges_up_to_the_quantum_and_a_heavy_key_gets_its_own() {
        // Total 100, quantum 0.25: at most 25 per range unless a single key.
        let loads = [(k(10), 10.0), (k(20), 10.0), (k(30), 10.0), (k(40), 50.0), (k(50), 20.0)];
        let ranges = aggregate(loads, 0.25, 8);
        let b = |v: u64| v.to_be_bytes().to_vec();
        assert_eq!(
            starts(&ranges),
            [(b(10), 20.0), (b(30), 10.0), (b(40), 50.0), (b(41), 20.0), (b(51), 0.0)],
            "10+20 share a range, 30 cannot join them, 40 is a key of its own, 50 closes at 51"
        );
        for r in &ranges[..ranges.len() - 1] {
            assert!(r.load <= 25.0 || r.start_key == b(40));
        }
    }

    #[test]
    fn keys_are_cut_to_the_resolution_and_summed() {
        let loads = [
            (k(0x0102_0000_0000_0000), 1.0),
            (k(0x0102_FFFF_0000_0000), 2.0),
            (k(0x0300_0000_0000_0000), 3.0),
        ];
        let ranges = aggregate(loads, 1.0, 2);
        assert_eq!(starts(&ranges), [(vec![1, 2], 6.0), (vec![3, 1], 0.0)]);
        assert!(aggregate([(k(1), 0.0)], 0.5, 8).is_empty(), "no load, no range");
    }

    fn rules() -> ReportRules {
        ReportRules::default()
    }

    #[test]
    fn a_report_becomes_rates_over_contiguous_ranges() {
        let now = SystemTime::now();
        let ranges = aggregate([(k(10), 20.0), (k(1 << 63), 40.0)], 0.5, 8);
        let r = report(DEFAULT_METRIC, ranges, now - Duration::from_secs(2), now);
        let rates = validate(&r, &rules(), now).unwrap();
        assert_eq!(rates.interval, Duration::from_secs(2));
        assert_eq!(
            rates.ranges,
            [
                (k(10), Some(k(1 << 63)), 10.0),
                (k(1 << 63), Some(k((1 << 63) + 1)), 20.0),
                (k((1 << 63) + 1), None, 0.0),
            ]
        );
        let other = report(
            "cpu",
            vec![RangeLoad { start_key: vec![], load: 5.0 }],
            now - Duration::from_secs(1),
            now,
        );
        assert!(validate(&other, &rules(), now).unwrap().ranges.is_empty(), "another metric is ignored");
    }

    #[test]
    fn reports_that_break_a_rule_are_refused_by_name() {
        let now = SystemTime::now();
        let s = Duration::from_secs;
        let one = |start: &[u8], load: f64| RangeLoad { start_key: start.to_vec(), load };
        let cases: Vec<(LoadReport, ReportError)> = vec![
            (LoadReport::default(), ReportError::MissingTimes),
            (report("requests", vec![], now, now - s(1)), ReportError::EndNotAfterStart),
            (report("requests", vec![], now - s(600), now), ReportError::IntervalTooLong),
            (report("requests", vec![], now + s(60), now + s(61)), ReportError::InTheFuture),
            (report("requests", vec![], now - s(400), now - s(390)), ReportError::TooOld),
            (report("requests", vec![one(&[0; 9], 1.0)], now - s(1), now), ReportError::KeyTooLong(9)),
            (
                report("requests", vec![one(&[2], 1.0), one(&[1], 1.0)], now - s(1), now),
                ReportError::NotIncreasing,
            ),
            (
                report("requests", vec![one(&[2], 1.0), one(&[2], 1.0)], now - s(1), now),
                ReportError::NotIncreasing,
            ),
            (report("requests", vec![one(&[2], f64::NAN)], now - s(1), now), ReportError::BadLoad),
            (report("requests", vec![one(&[2], -1.0)], now - s(1), now), ReportError::BadLoad),
            // Finite, but over a nanosecond: a rate that summed over clients overflows.
            (
                report("requests", vec![one(&[2], 1e300)], now - Duration::from_nanos(1), now),
                ReportError::BadLoad,
            ),
            (
                report(
                    "requests",
                    (0..5000u32).map(|i| one(&i.to_be_bytes(), 1.0)).collect(),
                    now - s(1),
                    now,
                ),
                ReportError::TooManyRanges(5000),
            ),
        ];
        for (r, error) in cases {
            assert_eq!(validate(&r, &rules(), now), Err(error));
        }
        let mut many = report("requests", vec![], now - s(1), now);
        for i in 0..17 {
            many.metric_loads.insert(format!("m{i}"), Load::default());
        }
        assert_eq!(validate(&many, &rules(), now), Err(ReportError::TooManyMetrics(18)));
    }

    #[test]
    fn what_a_client_aggregates_a_server_reads_back_with_the_same_total() {
        let now = SystemTime::now();
        let mut rng = steady_subset::prng::SplitMix64::new(7);
        let loads: Vec<(SliceKey, f64)> =
            (0..2000).map(|i| (k(rng.next()), 1.0 + f64::from(i % 13))).collect();
        let total: f64 = loads.iter().map(|l| l.1).sum();
        for quantum in [0.0, 0.01, 0.1, 1.0] {
            let ranges = aggregate(loads.iter().copied(), quantum, 8);
            let r = report(DEFAULT_METRIC, ranges, now - Duration::from_secs(1), now);
            let rates = validate(&r, &ReportRules { max_ranges: 10_000, ..rules() }, now).unwrap();
            let sum: f64 = rates.ranges.iter().map(|r| r.2).sum();
            assert!((sum - total).abs() < 1e-6 * total, "quantum {quantum}: {sum} != {total}");
        }
    }
}
