//! [`LoadMeter`]: a Slicelet's measure of its keyed load. The request side counts (one
//! atomic add per request, and one request in `sample_one_in` into a heavy-hitters
//! sketch); the reader side turns counts into decayed rates when a report is made.

use std::cell::Cell;
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use steady_slice::{Assignment, SliceKey};
use tokio::time::Instant;

use super::sketch::HeavyHitters;
use crate::report::{LoadReport, MAX_REPORTED_KEYS, MAX_REPORTED_SLICES};

/// How a Slicelet measures its load (see [`crate::Slicelet::with_meter`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MeterConfig {
    /// The half-life of the reported rates: a request counts half as much this long
    /// after it was served. Longer is smoother and slower to follow a shift of load.
    /// Default 10 s; at least 1 ms.
    pub half_life: Duration,
    /// One request in this many (at random) feeds the hot-key sketch, whose rates are
    /// scaled back up. 1 feeds every request; more makes the request path cheaper and
    /// the hot-key rates noisier. Default 8; at least 1.
    pub sample_one_in: u32,
}

impl Default for MeterConfig {
    fn default() -> Self {
        Self { half_life: Duration::from_secs(10), sample_one_in: 8 }
    }
}

/// A [`MeterConfig`] value that cannot be used, named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MeterConfigError {
    /// `half_life` under 1 ms.
    HalfLife(Duration),
    /// `sample_one_in` of 0.
    SampleOneIn(u32),
}

impl fmt::Display for MeterConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::HalfLife(d) => write!(f, "meter config: half_life {d:?} is under 1 ms"),
            Self::SampleOneIn(n) => write!(f, "meter config: sample_one_in {n} must be at least 1"),
        }
    }
}

impl std::error::Error for MeterConfigError {}

impl MeterConfig {
    fn validate(self) -> Result<Self, MeterConfigError> {
        if self.half_life < Duration::from_millis(1) {
            return Err(MeterConfigError::HalfLife(self.half_life));
        }
        if self.sample_one_in == 0 {
            return Err(MeterConfigError::SampleOneIn(self.sample_one_in));
        }
        Ok(self)
    }
}

/// An assignment in force with a request counter per slice: the two are installed and
/// replaced together, so a request is always counted against a slice of the generation
/// it was checked against.
///
/// Memory: 8 bytes per slice for the counters (8 MiB at `steady_slice::MAX_SLICES`), and
/// 4 per slice held.
#[derive(Debug)]
pub(crate) struct MeteredAssignment {
    pub(crate) assignment: Assignment,
    /// Requests counted per slice of `assignment`, held or not (a misrouted request
    /// counts against its slice too, but only held slices are reported).
    counts: Box<[AtomicU64]>,
    /// The positions of the slices the task holds, ascending.
    held: Box<[u32]>,
    installed_at: Instant,
}

impl MeteredAssignment {
    pub(crate) fn new(assignment: Assignment, task: u32) -> Self {
        let counts = (0..assignment.slices().len()).map(|_| AtomicU64::new(0)).collect();
        let held = (0..assignment.slices().len() as u32)
            .filter(|&i| assignment.slices()[i as usize].replicas().contains(&task))
            .collect();
        Self { assignment, counts, held, installed_at: Instant::now() }
    }

    /// Requests counted in this generation, over all its slices.
    #[cfg(test)]
    pub(crate) fn counted(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    /// Counts a request for `key`; returns whether `task` holds its slice.
    #[inline]
    pub(crate) fn count(&self, key: SliceKey, task: u32) -> bool {
        let i = self.assignment.slice_index(key);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.assignment.slices()[i].replicas().contains(&task)
    }
}

/// How many hot-key sketches a meter keeps: each thread feeds one (threads are dealt
/// to them round-robin), so that threads sampling at once rarely wait for each other's
/// lock. The report merges them.
const SKETCH_SHARDS: usize = 8;

thread_local! {
    /// This thread's sampling state: its random stream (xorshift64*) and its sketch
    /// shard. Per thread, so sampling shares nothing between threads.
    static SAMPLER: (Cell<u64>, usize) = {
        // Each thread its own stream: SplitMix64's finaliser over a global counter.
        static THREADS: AtomicU64 = AtomicU64::new(0);
        let n = THREADS.fetch_add(1, Ordering::Relaxed);
        let mut z = n.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (Cell::new((z ^ (z >> 31)) | 1), n as usize % SKETCH_SHARDS)
    };
}

/// A draw from this thread's random stream, and this thread's sketch shard.
fn next_random() -> (u64, usize) {
    SAMPLER.with(|(state, shard)| {
        let mut x = state.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        state.set(x);
        (x.wrapping_mul(0x2545_F491_4F6C_DD1D), *shard)
    })
}

/// Exponentially decayed rates: a decayed count over a decayed time, both decayed alike
/// at every tick, so that a steady rate reads exactly from the first tick on (no warm-up
/// bias towards 0) and ticks may come at any intervals.
#[derive(Debug, Clone, Default)]
struct DecayedRates {
    /// Per tracked item: decayed requests.
    counts: Vec<f64>,
    /// Decayed seconds.
    time: f64,
}

impl DecayedRates {
    /// The rate of item `i`, requests per second (0 before any time has passed).
    fn rate(&self, i: usize) -> f64 {
        if self.time > 0.0 {
            self.counts[i] / self.time
        } else {
            0.0
        }
    }
}

/// The reader side's state: what the last tick saw.
#[derive(Debug)]
struct Ticks {
    /// The generation the slice rates are for.
    tracked: Option<Arc<MeteredAssignment>>,
    /// The counts of its held slices at the last tick.
    last_counts: Vec<u64>,
    slices: DecayedRates,
    last_slice_tick: Instant,
    /// The sketch's decayed time (its counts decay inside the sketch).
    key_time: f64,
    last_key_tick: Instant,
}

/// A Slicelet's load meter: the hot-key sketch, and the reader side's decay state. The
/// per-slice counters live with the assignment ([`MeteredAssignment`]).
#[derive(Debug)]
pub(crate) struct LoadMeter {
    config: MeterConfig,
    /// A request is sampled when a random u64 is below this (`u64::MAX`: all).
    sample_below: u64,
    /// Hot-key sketches, one per group of threads (see [`SKETCH_SHARDS`]).
    sketches: Box<[Mutex<HeavyHitters>]>,
    ticks: Mutex<Ticks>,
}

/// Locks `m`, recovering from poisoning: every critical section here leaves its state
/// consistent between statements that can panic (none should).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl LoadMeter {
    pub(crate) fn new(config: MeterConfig) -> Result<Self, MeterConfigError> {
        let config = config.validate()?;
        let sample_below =
            if config.sample_one_in == 1 { u64::MAX } else { u64::MAX / u64::from(config.sample_one_in) };
        let now = Instant::now();
        Ok(Self {
            config,
            sample_below,
            sketches: (0..SKETCH_SHARDS)
                .map(|_| Mutex::new(HeavyHitters::new(2 * MAX_REPORTED_KEYS)))
                .collect(),
            ticks: Mutex::new(Ticks {
                tracked: None,
                last_counts: Vec::new(),
                slices: DecayedRates::default(),
                last_slice_tick: now,
                key_time: 0.0,
                last_key_tick: now,
            }),
        })
    }

    pub(crate) fn config(&self) -> MeterConfig {
        self.config
    }

    /// The request side: feeds `key` to the sketch with probability `1/sample_one_in`.
    #[inline]
    pub(crate) fn sample(&self, key: SliceKey) {
        let (draw, shard) = next_random();
        if draw < self.sample_below || self.sample_below == u64::MAX {
            lock(&self.sketches[shard]).add(key.get(), 1.0);
        }
    }

    /// Over a tick of `elapsed`: the factor `2^(-elapsed / half_life)` by which older
    /// counts decay, and the mean weight, at the tick's end, of a request served at a
    /// uniformly random time within it (`(1 - factor) / ln 2 * half_life / elapsed`; 1
    /// for an empty tick).
    fn decay(&self, elapsed: Duration) -> (f64, f64) {
        let halves = elapsed.as_secs_f64() / self.config.half_life.as_secs_f64();
        if halves <= 0.0 {
            return (1.0, 1.0);
        }
        let factor = (-halves).exp2();
        // -expm1 keeps precision for ticks much shorter than the half-life.
        let mean = -(-halves * std::f64::consts::LN_2).exp_m1() / (halves * std::f64::consts::LN_2);
        (factor, mean)
    }

    /// Decays every sketch by `factor` and returns the heaviest keys over all of them,
    /// heaviest first: a key's count is the sum of its counts in the sketches that hold
    /// it. Each shard's counts are upper bounds of its part of the stream, so the sums
    /// are upper bounds too, within `W / capacity` overall; a key a shard dropped loses
    /// at most that shard's `W_s / capacity` from its sum.
    fn merged_top(&self, factor: f64) -> Vec<(u64, f64)> {
        let mut sums: HashMap<u64, f64> = HashMap::new();
        for sketch in self.sketches.iter() {
            let mut sketch = lock(sketch);
            sketch.decay(factor);
            for (key, count) in sketch.top(usize::MAX) {
                *sums.entry(key).or_default() += count;
            }
        }
        let mut top: Vec<(u64, f64)> = sums.into_iter().collect();
        top.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        top.truncate(MAX_REPORTED_KEYS);
        top
    }

    /// The reader side: brings the decayed rates up to `now` for `current` (the
    /// generation in force) and returns the report of `task` for `job`.
    ///
    /// `None` when `job` or `task` cannot be in a report (see `LoadReport::new`).
    pub(crate) fn report_at(
        &self,
        current: &Arc<MeteredAssignment>,
        job: &str,
        task: u32,
        now: Instant,
    ) -> Option<LoadReport> {
        let mut ticks = lock(&self.ticks);
        let ticks = &mut *ticks;
        if !ticks.tracked.as_ref().is_some_and(|t| Arc::ptr_eq(t, current)) {
            // A new generation: its rates start from its own counters, which started at
            // its install. The old generation's rates are not carried over: its slices
            // may not be this one's.
            ticks.tracked = Some(current.clone());
            ticks.last_counts = vec![0; current.held.len()];
            ticks.slices = DecayedRates { counts: vec![0.0; current.held.len()], time: 0.0 };
            ticks.last_slice_tick = current.installed_at;
        }
        // Slices: decay the past, add what was counted since the last tick at its mean
        // weight (requests are taken as spread evenly over the tick). Time is weighted
        // the same way, so their ratio is the rate.
        let elapsed = now.saturating_duration_since(ticks.last_slice_tick);
        let (factor, mean) = self.decay(elapsed);
        for (k, &i) in current.held.iter().enumerate() {
            let count = current.counts[i as usize].load(Ordering::Relaxed);
            let delta = count.wrapping_sub(ticks.last_counts[k]);
            ticks.last_counts[k] = count;
            ticks.slices.counts[k] = ticks.slices.counts[k] * factor + delta as f64 * mean;
        }
        ticks.slices.time = ticks.slices.time * factor + elapsed.as_secs_f64() * mean;
        ticks.last_slice_tick = ticks.last_slice_tick.max(now);

        // Hot keys: the same over the sketch, whose counts are in sampled requests. The
        // sketch's counts since the last tick were added at weight 1: decaying them by
        // the whole tick's factor, and time by the same, keeps the ratio a rate (it
        // weighs the last tick a little less than the slices do).
        let elapsed = now.saturating_duration_since(ticks.last_key_tick);
        let (factor, _) = self.decay(elapsed);
        ticks.key_time = (ticks.key_time + elapsed.as_secs_f64()) * factor;
        ticks.last_key_tick = ticks.last_key_tick.max(now);
        let top = self.merged_top(factor);
        let scale = f64::from(self.config.sample_one_in);
        let hot_keys: Vec<(SliceKey, f64)> = if ticks.key_time > 0.0 {
            top.into_iter()
                .map(|(key, count)| (SliceKey(key), count * scale / ticks.key_time))
                .filter(|&(_, rate)| rate > 0.0)
                .collect()
        } else {
            Vec::new()
        };

        let starts = current.assignment.slices();
        let mut slices: Vec<(SliceKey, f64)> = current
            .held
            .iter()
            .enumerate()
            .map(|(k, &i)| (starts[i as usize].start, ticks.slices.rate(k)))
            .collect();
        if slices.len() > MAX_REPORTED_SLICES {
            // Keep the heaviest, then back to key order.
            slices.select_nth_unstable_by(MAX_REPORTED_SLICES - 1, |a, b| b.1.total_cmp(&a.1));
            slices.truncate(MAX_REPORTED_SLICES);
            slices.sort_unstable_by_key(|s| s.0);
        }
        LoadReport::new(job, task, current.assignment.generation(), slices, hot_keys).ok()
    }
}

#[cfg(test)]
mod tests {
    use steady_slice::Slice;

    use super::*;

    /// Four equal slices; task 0 holds slices 0 and 2, task 1 slices 1 and 3.
    fn four_slices(generation: u64) -> Assignment {
        let step = 1u64 << 62;
        Assignment::new(
            generation,
            (0..4).map(|i| Slice::new(SliceKey(i * step), vec![(i % 2) as u32])).collect(),
        )
        .unwrap()
    }

    fn key_in_slice(i: u64) -> SliceKey {
        SliceKey((i << 62) + 12345)
    }

    #[test]
    fn bad_configurations_are_named() {
        let config = |half_life, sample_one_in| LoadMeter::new(MeterConfig { half_life, sample_one_in });
        assert_eq!(config(Duration::ZERO, 1).err(), Some(MeterConfigError::HalfLife(Duration::ZERO)));
        assert_eq!(config(Duration::from_secs(1), 0).err(), Some(MeterConfigError::SampleOneIn(0)));
        assert!(config(Duration::from_millis(1), 1).is_ok());
    }

    #[test]
    fn a_steady_rate_reads_exactly_from_the_first_tick_and_a_shift_halves_per_half_life() {
        let meter =
            LoadMeter::new(MeterConfig { half_life: Duration::from_secs(10), sample_one_in: 1 }).unwrap();
        let current = Arc::new(MeteredAssignment::new(four_slices(1), 0));
        let t0 = current.installed_at;
        let offer = |slice: u64, n: usize| {
            for _ in 0..n {
                assert_eq!(current.count(key_in_slice(slice), 0), slice % 2 == 0);
            }
        };
        // 100/s on slice 0, 30/s on slice 2 (and misroutes to slice 1), for 60 ticks of
        // 1 s: six half-lives.
        for s in 1..=60 {
            offer(0, 100);
            offer(2, 30);
            offer(1, 7);
            let report = meter.report_at(&current, "job", 0, t0 + Duration::from_secs(s)).unwrap();
            assert_eq!(report.generation(), 1);
            assert_eq!(report.slices().len(), 2, "only the held slices: {:?}", report.slices());
            assert!((report.slices()[0].1 - 100.0).abs() < 1e-9, "tick {s}: {:?}", report.slices());
            assert!((report.slices()[1].1 - 30.0).abs() < 1e-9, "tick {s}: {:?}", report.slices());
        }
        // The traffic stops: after one half-life of silence the rates read half (a
        // little less: the first 1/64 of the weight is time before the install, when
        // nothing was counted), and after ten, nearly nothing.
        let report = meter.report_at(&current, "job", 0, t0 + Duration::from_secs(70)).unwrap();
        let rate = report.slices()[0].1;
        assert!((48.0..50.0).contains(&rate), "rate {rate} after one half-life of silence");
        let report = meter.report_at(&current, "job", 0, t0 + Duration::from_secs(160)).unwrap();
        assert!(report.slices()[0].1 < 0.2, "{:?}", report.slices());
    }

    #[test]
    fn a_new_generation_starts_from_its_own_counters() {
        let meter = LoadMeter::new(MeterConfig::default()).unwrap();
        let first = Arc::new(MeteredAssignment::new(four_slices(1), 1));
        for _ in 0..50 {
            first.count(key_in_slice(1), 1);
        }
        let t0 = first.installed_at;
        let r1 = meter.report_at(&first, "job", 1, t0 + Duration::from_secs(1)).unwrap();
        assert!((r1.slices()[0].1 - 50.0).abs() < 1e-9);
        let second = Arc::new(MeteredAssignment::new(four_slices(2), 1));
        let t1 = second.installed_at;
        for _ in 0..20 {
            second.count(key_in_slice(3), 1);
        }
        let r2 = meter.report_at(&second, "job", 1, t1 + Duration::from_secs(2)).unwrap();
        assert_eq!(r2.generation(), 2);
        assert_eq!(r2.slices().iter().map(|s| s.1).collect::<Vec<_>>(), [0.0, 10.0]);
    }

    #[test]
    fn a_report_keeps_the_heaviest_slices_when_the_task_holds_too_many() {
        let n = MAX_REPORTED_SLICES as u64 + 10;
        let step = u64::MAX / n;
        let a =
            Assignment::new(1, (0..n).map(|i| Slice::new(SliceKey(i * step), vec![0])).collect()).unwrap();
        let current = Arc::new(MeteredAssignment::new(a, 0));
        // Slices 0..10 get no requests; every other slice one.
        for i in 10..n {
            current.count(SliceKey(i * step), 0);
        }
        let meter = LoadMeter::new(MeterConfig::default()).unwrap();
        let report =
            meter.report_at(&current, "job", 0, current.installed_at + Duration::from_secs(1)).unwrap();
        assert_eq!(report.slices().len(), MAX_REPORTED_SLICES);
        assert_eq!(report.slices()[0].0, SliceKey(10 * step), "the idle slices are left out");
        assert!(report.slices().iter().all(|s| s.1 > 0.0));
    }
}
