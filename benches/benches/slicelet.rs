//! The Slicelet's cost per request, against the misroute check alone, in the same run.
//!
//! A backend task's `SliceletService` calls `Slicelet::record` for every keyed request.
//! Before load reporting that was the misroute check only: a keyed-request counter and
//! "does the assignment in force give this key to me". Now it also counts the request
//! against its slice and samples it into the hot-key sketch.
//!
//! * `slicelet_record` (single thread): 15,000 slices, 3 of 300 tasks each;
//!   requests with Zipf(1.0) popularity over 10,000 keys that task 0 holds (a backend
//!   serves what is routed to it). `misroute_check` (baseline, the old `record`:
//!   counter + `holds`), `record` (default `MeterConfig`: one request in 8 into the
//!   sketch), `record_sample_all` (every request into the sketch), `record_sample_64`.
//! * `slicelet_record_2_threads`: the same from two threads at once (the shared
//!   counters contended; each thread feeds its own sketch shard): `misroute_check` and
//!   `record`. Time per request of the pair (wall time / requests).
//!
//! Ratios: `cargo bench -p steady-benches --bench slicelet`, then
//! `cargo run --release -p steady-benches --bin bench-ratios -- slicelet_record misroute_check`.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use steady_slice::{Assignment, Slice, SliceKey};
use steady_slicelet::{MeterConfig, Slicelet};
use steady_subset::prng::SplitMix64;

const SLICES: usize = 15_000;
const TASKS: usize = 300;
const KEYS: usize = 10_000;
/// Pre-drawn requests, cycled through (a power of two).
const REQUESTS: usize = 1 << 16;

/// 15,000 evenly spaced slices, 3 of the 300 tasks each.
fn assignment() -> Assignment {
    let step = u64::MAX / SLICES as u64;
    let slices = (0..SLICES)
        .map(|i| {
            Slice::new(
                SliceKey(i as u64 * step),
                (0..3).map(|r| ((i * 7 + r * 101) % TASKS) as u32).collect::<Vec<_>>(),
            )
        })
        .collect();
    Assignment::new(1, slices).unwrap()
}

/// `REQUESTS` keys drawn with Zipf(1.0) popularity from `KEYS` named keys that task 0
/// holds: a backend serves the keys routed to it (no misroutes).
fn zipf_requests(assignment: &Assignment) -> Vec<SliceKey> {
    let names: Vec<SliceKey> = (0..)
        .map(|k| SliceKey::of(format!("user-{k}")))
        .filter(|&key| assignment.slice_for(key).replicas().contains(&0))
        .take(KEYS)
        .collect();
    let weights: Vec<f64> = (1..=KEYS).map(|r| 1.0 / r as f64).collect();
    let total: f64 = weights.iter().sum();
    let mut cdf = Vec::with_capacity(KEYS);
    let mut acc = 0.0;
    for w in weights {
        acc += w / total;
        cdf.push(acc);
    }
    let mut rng = SplitMix64::new(11);
    (0..REQUESTS)
        .map(|_| {
            let u = (rng.next() >> 11) as f64 / (1u64 << 53) as f64;
            names[cdf.partition_point(|&c| c < u).min(KEYS - 1)]
        })
        .collect()
}

fn slicelet(sample_one_in: u32) -> Slicelet {
    let s = Slicelet::with_meter(0, MeterConfig { sample_one_in, ..MeterConfig::default() }).unwrap();
    s.set_assignment(assignment());
    s
}

/// The old `Slicelet::record`: a keyed-request counter and the misroute check (with
/// its counter).
fn misroute_check(keyed: &AtomicU64, misrouted: &AtomicU64, slicelet: &Slicelet, key: SliceKey) -> bool {
    keyed.fetch_add(1, Ordering::Relaxed);
    let is_misrouted = slicelet.holds(key) == Some(false);
    if is_misrouted {
        misrouted.fetch_add(1, Ordering::Relaxed);
    }
    is_misrouted
}

fn single_thread(c: &mut Criterion) {
    let requests = zipf_requests(&assignment());
    let mut group = c.benchmark_group("slicelet_record");
    group.warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    let (keyed, misrouted) = (AtomicU64::new(0), AtomicU64::new(0));
    let baseline = slicelet(8);
    let mut i = 0;
    group.bench_with_input(BenchmarkId::new("misroute_check", SLICES), &(), |b, _| {
        b.iter(|| {
            i = (i + 1) & (REQUESTS - 1);
            black_box(misroute_check(&keyed, &misrouted, &baseline, requests[i]))
        })
    });
    for (name, sample_one_in) in
        [("record", MeterConfig::default().sample_one_in), ("record_sample_all", 1), ("record_sample_64", 64)]
    {
        let s = slicelet(sample_one_in);
        group.bench_with_input(BenchmarkId::new(name, SLICES), &(), |b, _| {
            b.iter(|| {
                i = (i + 1) & (REQUESTS - 1);
                black_box(s.record(requests[i]))
            })
        });
        // The meter saw what it was given: a report has rates (read side works).
        assert!(s.load_report("bench").is_some_and(|r| !r.slices().is_empty()));
    }
    group.finish();
}

/// `iters` calls of `f` split over two threads; the wall time.
fn on_two_threads(iters: u64, requests: &[SliceKey], f: impl Fn(SliceKey) -> bool + Sync) -> Duration {
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..2 {
            let f = &f;
            s.spawn(move || {
                let mut i = t * REQUESTS / 2;
                for _ in 0..iters / 2 {
                    i = (i + 1) & (REQUESTS - 1);
                    black_box(f(requests[i]));
                }
            });
        }
    });
    start.elapsed()
}

fn two_threads(c: &mut Criterion) {
    let requests = zipf_requests(&assignment());
    let mut group = c.benchmark_group("slicelet_record_2_threads");
    group.warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    let (keyed, misrouted) = (AtomicU64::new(0), AtomicU64::new(0));
    let baseline = slicelet(8);
    group.bench_with_input(BenchmarkId::new("misroute_check", SLICES), &(), |b, _| {
        b.iter_custom(|iters| {
            on_two_threads(iters, &requests, |k| misroute_check(&keyed, &misrouted, &baseline, k))
        })
    });
    let s = slicelet(MeterConfig::default().sample_one_in);
    group.bench_with_input(BenchmarkId::new("record", SLICES), &(), |b, _| {
        b.iter_custom(|iters| on_two_threads(iters, &requests, |k| s.record(k)))
    });
    group.finish();
}

criterion_group!(benches, single_thread, two_threads);
criterion_main!(benches);
