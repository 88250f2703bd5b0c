//! Keyed routing costs, each against a baseline in the same run.
//!
//! * `keyed_pick` (15,000 slices, 3 replicas each, all connected): `steady_keyed` is
//!   `Balance::route(Some(key))` (table read, slice lookup, power of two choices);
//!   `steady_keyed_bounded` the same with a load bound (`KeyedLoadBound::default()`,
//!   nothing in flight: its fast path, one more load); baselines: `steady_unkeyed` (`route(None)`) and `linear_scan` (finding the slice by
//!   scanning the assignment). Target: a keyed pick under 50 ns (the figures and their
//!   command: `docs/benchmarks.md#keyed-routing`).
//! * `keyed_call` (same assignment): a keyed call through the balancer with its keys
//!   counted for an in-process assigner (`Balance::count_keys`) against the same without.
//! * `key_tally`: counting a keyed request for an A119 server's load report
//!   (`steady_tonic::KeyTally::record`, what `SteadyChannel::follow_autosharding` adds to
//!   a keyed call) over 4,096 keys and over a tail of distinct keys past its 65,536
//!   slots; baseline `key_counts`: the balancer's per-bin count (`KeyCounts::record`,
//!   one relaxed add).
//! * `slice_key`: `SliceKey::of` (XXH3-64) of 16- and 64-byte keys against std's
//!   `DefaultHasher` (SipHash-1-3) of the same bytes.
//! * `assignment_swap`: a new 15,000-slice generation sent to a running balancer until
//!   its routing table uses it; baseline `decode`: decoding the same assignment.
//!
//! Ratios: `cargo run --release -p steady-benches --bin bench-ratios -- keyed_pick linear_scan`
//! (and `keyed_call steady_keyed`, `key_tally key_counts`, `slice_key default_hasher`,
//! `assignment_swap decode`).

use std::convert::Infallible;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use steady_balance::{Balance, BalanceConfig, KeyCounts, KeyedLoadBound};
use steady_benches::{hold_assignment, spread_assignment};
use steady_slice::{Assignment, AssignmentError, SliceKey};
use steady_subset::prng::SplitMix64;
use steady_tonic::KeyTally;
use tokio::runtime::Runtime;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tower::{service_fn, Service, ServiceExt};

const SLICES: usize = 15_000;
const TASKS: usize = 300;

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// 15,000 evenly spaced slices, 3 of the 300 tasks each.
fn assignment(generation: u64) -> Assignment {
    spread_assignment(generation, SLICES, TASKS, 3)
}

fn keyed_pick(c: &mut Criterion) {
    let rt = runtime();
    let start = |config: BalanceConfig| {
        rt.block_on(async {
            let connect = service_fn(|task: usize| async move {
                Ok::<_, Infallible>(service_fn(move |_: ()| async move { Ok::<_, Infallible>(task) }))
            });
            // k = N: every replica is a connected subset member.
            let balance = Balance::from_addresses(config, connect, (0..TASKS).collect()).unwrap();
            assert!(balance.wait_for_members(TASKS, Duration::from_secs(10)).await);
            let tx = hold_assignment(&balance, assignment(1)).await;
            (balance, tx)
        })
    };
    let (balance, tx) = start(BalanceConfig::new(0, TASKS));
    let (bounded, bounded_tx) =
        start(BalanceConfig::new(0, TASKS).with_keyed_load_bound(KeyedLoadBound::default()));
    let reference = assignment(1);
    let mut rng = SplitMix64::new(7);
    let keys: Vec<SliceKey> = (0..4096).map(|_| SliceKey(rng.next())).collect();
    let mut group = c.benchmark_group("keyed_pick");
    group.warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    let mut b1 = balance.clone();
    let mut i = 0;
    group.bench_with_input(BenchmarkId::new("steady_keyed", SLICES), &(), |b, _| {
        b.iter(|| {
            i = (i + 1) & 4095;
            black_box(b1.route(Some(keys[i])))
        })
    });
    let mut b2 = bounded.clone();
    group.bench_with_input(BenchmarkId::new("steady_keyed_bounded", SLICES), &(), |b, _| {
        b.iter(|| {
            i = (i + 1) & 4095;
            black_box(b2.route(Some(keys[i])))
        })
    });
    group.bench_with_input(BenchmarkId::new("steady_unkeyed", SLICES), &(), |b, _| {
        b.iter(|| black_box(b1.route(None)))
    });
    group.bench_with_input(BenchmarkId::new("linear_scan", SLICES), &(), |b, _| {
        b.iter(|| {
            i = (i + 1) & 4095;
            let key = keys[i];
            black_box(reference.slices().iter().rposition(|s| s.start <= key))
        })
    });
    group.finish();
    drop((tx, bounded_tx));
}

/// A keyed call through the balancer (`ready().call(key)` with an answer at once), with
/// its keyed requests counted per bin for an in-process assigner (`Balance::count_keys`,
/// Rudolph's mode in `steady-local`) and without.
fn keyed_call(c: &mut Criterion) {
    let rt = runtime();
    let mut rng = SplitMix64::new(7);
    let keys: Vec<SliceKey> = (0..4096).map(|_| SliceKey(rng.next())).collect();
    let mut group = c.benchmark_group("keyed_call");
    group.warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    for (name, counted) in [("steady_keyed_counted", true), ("steady_keyed", false)] {
        group.bench_with_input(BenchmarkId::new(name, SLICES), &(), |b, _| {
            let (mut balance, _tx) = rt.block_on(async {
                let connect = service_fn(|_task: usize| async {
                    Ok::<_, Infallible>(service_fn(|key: SliceKey| {
                        std::future::ready(Ok::<_, Infallible>(key.0))
                    }))
                });
                let balance =
                    Balance::from_addresses(BalanceConfig::new(0, TASKS), connect, (0..TASKS).collect())
                        .unwrap()
                        .with_key_extractor(
                            (|key: &SliceKey| Some(*key)) as fn(&SliceKey) -> Option<SliceKey>,
                        );
                assert!(balance.wait_for_members(TASKS, Duration::from_secs(10)).await);
                let tx = hold_assignment(&balance, assignment(1)).await;
                (balance, tx)
            });
            if counted {
                balance.count_keys(12).unwrap();
            }
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let start = Instant::now();
                    for i in 0..iters {
                        let key = keys[(i & 4095) as usize];
                        black_box(balance.ready().await.unwrap().call(key).await.unwrap());
                    }
                    start.elapsed()
                })
            });
        });
    }
    group.finish();
}

/// Counting one keyed request: a [`KeyTally`] (a slot per key) against the balancer's
/// [`KeyCounts`] (a bin per range of keys). The tally is drained now and then, as a
/// report interval does, so that its slots turn over.
fn key_tally(c: &mut Criterion) {
    let mut rng = SplitMix64::new(7);
    let keys: Vec<SliceKey> = (0..4096).map(|_| SliceKey(rng.next())).collect();
    let mut group = c.benchmark_group("key_tally");
    group.warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    let tally = KeyTally::default();
    let mut i = 0usize;
    group.bench_with_input(BenchmarkId::new("key_tally", "4096_keys"), &(), |b, _| {
        b.iter(|| {
            i = (i + 1) & 4095;
            tally.record(black_box(keys[i]));
        })
    });
    tally.drain();
    let mut n = 0u64;
    group.bench_with_input(BenchmarkId::new("key_tally", "distinct_keys"), &(), |b, _| {
        b.iter(|| {
            n += 1;
            if n % (1 << 20) == 0 {
                tally.drain();
            }
            tally.record(black_box(SliceKey(steady_subset::hash::mix64(n))));
        })
    });
    let counts = KeyCounts::new(12).unwrap();
    group.bench_with_input(BenchmarkId::new("key_counts", "4096_keys"), &(), |b, _| {
        b.iter(|| {
            i = (i + 1) & 4095;
            counts.record(black_box(keys[i]));
        })
    });
    group.finish();
}

fn slice_key(c: &mut Criterion) {
    let mut group = c.benchmark_group("slice_key");
    for len in [16usize, 64] {
        let bytes: Vec<u8> = (0..len as u8).collect();
        group.bench_with_input(BenchmarkId::new("xxh3", len), &bytes, |b, bytes| {
            b.iter(|| black_box(SliceKey::of(black_box(bytes))))
        });
        group.bench_with_input(BenchmarkId::new("default_hasher", len), &bytes, |b, bytes| {
            b.iter(|| {
                let mut h = DefaultHasher::new();
                black_box(bytes).hash(&mut h);
                black_box(h.finish())
            })
        });
    }
    group.finish();
}

fn assignment_swap(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("assignment_swap");
    group.warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3)).sample_size(20);
    let encoded = assignment(1).encode();
    group.bench_with_input(BenchmarkId::new("decode", SLICES), &(), |b, _| {
        b.iter(|| black_box(Assignment::decode(black_box(&encoded)).unwrap()))
    });
    let (balance, tx) = rt.block_on(async {
        let connect = service_fn(|_task: usize| async {
            Ok::<_, Infallible>(service_fn(|_: ()| async { Ok::<_, Infallible>(()) }))
        });
        let balance =
            Balance::from_addresses(BalanceConfig::new(0, TASKS), connect, (0..TASKS).collect()).unwrap();
        assert!(balance.wait_for_members(TASKS, Duration::from_secs(10)).await);
        let (tx, rx) = mpsc::unbounded_channel::<Result<Assignment, AssignmentError>>();
        balance.follow_assignments(UnboundedReceiverStream::new(rx));
        (balance, tx)
    });
    // Pre-built generations, so the measurement is the balancer's work only.
    let generations: Vec<Assignment> = (1..=64).map(assignment).collect();
    let mut next = 0usize;
    let mut generation_offset = 0u64;
    group.bench_with_input(BenchmarkId::new("steady", SLICES), &(), |b, _| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    // Generations must grow: rebuild the assignment with a higher number.
                    let template = &generations[next % generations.len()];
                    next += 1;
                    generation_offset += 1;
                    let fresh = Assignment::new(generation_offset, template.slices().to_vec()).unwrap();
                    let start = Instant::now();
                    tx.send(Ok(fresh)).unwrap();
                    while balance.stats().assignment_generation != Some(generation_offset) {
                        let v = balance.stats().version;
                        balance.wait_for_version(v + 1).await;
                    }
                    total += start.elapsed();
                }
                total
            })
        });
    });
    group.finish();
}

criterion_group!(benches, keyed_pick, keyed_call, key_tally, slice_key, assignment_swap);
criterion_main!(benches);
