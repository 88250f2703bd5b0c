//! One assigner run at Slicer's production scale: 15,000 slices over 100 tasks.
//!
//! Group `assign_15k_100`: the previous assignment has 15,000 equal slices, one replica
//! each, dealt round-robin to tasks 0..100; the load is 100,000 keys with Zipf(1.0)
//! popularity (a key's load is 1000 / rank). Each iteration runs one run from that same
//! input:
//! * `weighted_move` — Slicer's weighted-move algorithm (`docs/slicer.md`) with its
//!   default configuration;
//! * `lpt` — the greedy baseline over fixed bins, measured in the same run.
//!
//! Target: one weighted-move run under 17 ms, single-threaded (the median production run
//! that "Slicer: Auto-Sharding for Datacenter Applications", OSDI 2016, reports).
//! `cargo bench -p steady-benches --bench assigner`; the figures are in
//! `docs/benchmarks.md#one-assigner-run`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use steady_assigner::{
    Assigner, Assignment, Load, Lpt, ReplicaLimits, RunInput, SliceKey, Tasks, WeightedMove,
};
use steady_slice::Slice;

const SLICES: u64 = 15_000;
const TASKS: u32 = 100;

fn previous() -> Assignment {
    let width = u64::MAX / SLICES;
    let slices =
        (0..SLICES).map(|i| Slice::new(SliceKey(i * width), vec![(i % u64::from(TASKS)) as u32])).collect();
    Assignment::new(1, slices).expect("valid by construction")
}

fn load() -> Load {
    Load::from_points((1..=100_000u64).map(|k| (SliceKey::of(k.to_le_bytes()), 1000.0 / k as f64))).unwrap()
}

fn assign(c: &mut Criterion) {
    let (previous, load, tasks) = (previous(), load(), Tasks::serving(0..TASKS).unwrap());
    let input = RunInput {
        previous: Some(&previous),
        tasks: &tasks,
        load: &load,
        replicas: ReplicaLimits::new(1, 2).unwrap(),
        placement: steady_assigner::Placement::none(),
    };
    let mut group = c.benchmark_group("assign_15k_100");
    group.sample_size(20).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    group.bench_function("weighted_move", |b| {
        let assigner = WeightedMove::default();
        b.iter(|| black_box(assigner.assign(black_box(&input)).unwrap()))
    });
    group.bench_function("lpt", |b| {
        let assigner = Lpt::default();
        b.iter(|| black_box(assigner.assign(black_box(&input)).unwrap()))
    });
    group.finish();
}

criterion_group!(benches, assign);
criterion_main!(benches);
