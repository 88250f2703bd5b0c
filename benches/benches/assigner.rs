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
//!
//! The same job under placement constraints, the tasks in three zones (task `t` in zone
//! `t % 3`), from a previous assignment that meets them (each source's own first run,
//! under uniform load), against unconstrained weighted-move from its own first run:
//! * `weighted_move_free_2` — 2 replicas, no constraint (the baseline of the next two);
//! * `weighted_move_spread_2` — 2 replicas spread over zones;
//! * `weighted_move_per_zone_3` — 3 replicas, one in every zone (against
//!   `weighted_move_free_3`);
//! * `weighted_move_capacity` — 1 to 2 replicas, half the tasks with capacity 2.
//!
//! Target: a constrained run at most 2x the unconstrained one's time.
//!
//! Group `assign_100k_1000_3z`: 1,000 tasks in three zones, 100,000 slices (weighted-move's
//! first run at 100 slices per task), 2 replicas spread over zones: a load run
//! (`spread_2`), and the run after zone 2's tasks are gone (`spread_2_zone_down`: a third
//! of the replicas replaced under the constraint), beside the unconstrained ones.
//! Target: under a second each.
//! `cargo bench -p steady-benches --bench assigner`; the figures are in
//! `docs/benchmarks.md#one-assigner-run`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use steady_assigner::{
    Assigner, Assignment, Load, Lpt, Placement, ReplicaLimits, RunInput, SliceKey, Spread, TaskProfile,
    TaskState, Tasks, WeightedMove,
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

/// Tasks `0..n`, task `t` in zone `t % 3` (gone when its zone is `down`), capacity 2 for
/// even tasks when `mixed`.
fn zoned(n: u32, down: Option<u32>, mixed: bool) -> Tasks {
    let state = |t: u32| if Some(t % 3) == down { TaskState::Gone } else { TaskState::Serving };
    let mut tasks = Tasks::new((0..n).map(|t| (t, state(t)))).unwrap();
    for t in 0..n {
        let capacity = if mixed && t % 2 == 0 { 2.0 } else { 1.0 };
        tasks.set_profile(t, TaskProfile::in_zone(format!("z{}", t % 3)).capacity(capacity)).unwrap();
    }
    tasks
}

/// The first run of `placement` over `tasks` under uniform load: a previous assignment
/// that meets it.
fn first_run(tasks: &Tasks, replicas: ReplicaLimits, placement: &Placement) -> Assignment {
    let uniform = Load::none().with_uniform(1.0).unwrap();
    let input = RunInput { previous: None, tasks, load: &uniform, replicas, placement };
    WeightedMove::default().assign(&input).unwrap().assignment
}

fn assign_under_constraints(c: &mut Criterion) {
    let load = load();
    let tasks = zoned(TASKS, None, false);
    let mixed = zoned(TASKS, None, true);
    let spread = Placement { spread: Spread::Zones, ..Placement::default() };
    let per_zone = Placement { spread: Spread::Zones, replica_per_zone: true, zones: Vec::new() };
    let (two, three, one_two) = (
        ReplicaLimits::new(2, 2).unwrap(),
        ReplicaLimits::new(3, 3).unwrap(),
        ReplicaLimits::new(1, 2).unwrap(),
    );
    let cases: [(&str, &Tasks, ReplicaLimits, &Placement); 5] = [
        ("weighted_move_free_2", &tasks, two, Placement::none()),
        ("weighted_move_spread_2", &tasks, two, &spread),
        ("weighted_move_free_3", &tasks, three, Placement::none()),
        ("weighted_move_per_zone_3", &tasks, three, &per_zone),
        ("weighted_move_capacity", &mixed, one_two, Placement::none()),
    ];
    let mut group = c.benchmark_group("assign_15k_100");
    group.sample_size(20).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    for (name, tasks, replicas, placement) in cases {
        let previous = first_run(tasks, replicas, placement);
        let input = RunInput { previous: Some(&previous), tasks, load: &load, replicas, placement };
        let assigner = WeightedMove::default();
        group.bench_function(name, |b| b.iter(|| black_box(assigner.assign(black_box(&input)).unwrap())));
    }
    group.finish();

    let tasks = zoned(1000, None, false);
    let down = zoned(1000, Some(2), false);
    let load =
        Load::from_points((1..=200_000u64).map(|k| (SliceKey::of(k.to_le_bytes()), 1000.0 / k as f64)))
            .unwrap();
    let mut group = c.benchmark_group("assign_100k_1000_3z");
    group.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(5));
    for (name, placement) in [("free_2", Placement::none()), ("spread_2", &spread)] {
        let previous = first_run(&tasks, two, placement);
        let assigner = WeightedMove::default();
        for (suffix, tasks) in [("", &tasks), ("_zone_down", &down)] {
            let input = RunInput { previous: Some(&previous), tasks, load: &load, replicas: two, placement };
            group.bench_function(format!("{name}{suffix}"), |b| {
                b.iter(|| black_box(assigner.assign(black_box(&input)).unwrap()))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, assign, assign_under_constraints);
criterion_main!(benches);
