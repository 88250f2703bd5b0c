//! Property tests: any input gives a valid assignment on serving tasks within the
//! replica limits; weighted-move keeps its churn within its budgets plus forced moves,
//! and never makes imbalance worse unless a move was forced.

mod common;

use proptest::prelude::*;
use steady_assigner::{
    by_name, Assigner, Load, ReplicaLimits, RunInput, SliceKey, TaskState, Tasks, WeightedMove,
    WeightedMoveConfig, NAMES,
};

/// Random per-key loads, plus a hot key carrying `hot` (up to 90%) of the total, plus
/// range loads as Slicelets report them (possibly overlapping, as replicas' reports do).
fn load_strategy() -> impl Strategy<Value = Load> {
    (
        prop::collection::vec((any::<u64>(), 0.0..100.0f64), 0..200),
        any::<u64>(),
        0.0..0.9f64,
        prop::collection::vec((any::<u64>(), any::<u64>(), 0.0..1000.0f64), 0..20),
    )
        .prop_map(|(mut points, hot_key, hot, ranges)| {
            let rest: f64 = points.iter().map(|p| p.1).sum();
            if rest > 0.0 && hot > 0.0 {
                points.push((hot_key, rest * hot / (1.0 - hot)));
            }
            let ranges = ranges.into_iter().filter(|(a, b, _)| a != b).map(|(a, b, load)| {
                let (lo, hi) = (a.min(b), a.max(b));
                (steady_slice::KeyRange::new(SliceKey(lo), Some(SliceKey(hi))), load)
            });
            Load::from_points(points.into_iter().map(|(k, l)| (SliceKey(k), l)))
                .unwrap()
                .with_ranges(ranges)
                .unwrap()
        })
}

/// A job of `before` serving tasks, then each task (and up to 4 new ones) serving,
/// draining or gone.
fn tasks_strategy() -> impl Strategy<Value = (u32, Vec<TaskState>)> {
    (1..12u32).prop_flat_map(|before| {
        let state = prop_oneof![
            6 => Just(TaskState::Serving),
            1 => Just(TaskState::Draining),
            1 => Just(TaskState::Gone),
        ];
        (Just(before), prop::collection::vec(state, before as usize..before as usize + 4))
    })
}

fn limits_strategy() -> impl Strategy<Value = ReplicaLimits> {
    (1..4usize, 0..3usize).prop_map(|(min, extra)| ReplicaLimits::new(min, min + extra).unwrap())
}

/// The next task set, with at least one task serving.
fn next_tasks(states: &[TaskState]) -> Tasks {
    let mut states = states.to_vec();
    if !states.contains(&TaskState::Serving) {
        states[0] = TaskState::Serving;
    }
    Tasks::new(states.into_iter().enumerate().map(|(t, s)| (t as u32, s))).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn every_assigner_keeps_every_slice_on_serving_tasks_within_the_limits(
        (before, states) in tasks_strategy(),
        first_load in load_strategy(),
        load in load_strategy(),
        limits in limits_strategy(),
    ) {
        let first_tasks = Tasks::serving(0..before).unwrap();
        let tasks = next_tasks(&states);
        for name in NAMES {
            let assigner = by_name(name).unwrap();
            let first = assigner
                .assign(&RunInput { previous: None, tasks: &first_tasks, load: &first_load, replicas: limits, placement: steady_assigner::Placement::none() })
                .unwrap();
            common::check_placement(&first.assignment, &first_tasks, limits);
            let next = assigner
                .assign(&RunInput { previous: Some(&first.assignment), tasks: &tasks, load: &load, replicas: limits, placement: steady_assigner::Placement::none() })
                .unwrap();
            common::check_placement(&next.assignment, &tasks, limits);
            prop_assert!(next.assignment.generation() >= first.assignment.generation());
            prop_assert_eq!(next.report.unchanged, next.assignment.generation() == first.assignment.generation());
        }
    }

    #[test]
    fn weighted_move_churns_within_its_budgets_and_never_worsens_imbalance_unforced(
        (before, states) in tasks_strategy(),
        first_load in load_strategy(),
        loads in prop::collection::vec(load_strategy(), 1..4),
        limits in limits_strategy(),
    ) {
        let config = WeightedMoveConfig::default();
        let wm = WeightedMove::new(config.clone()).unwrap();
        let first_tasks = Tasks::serving(0..before).unwrap();
        let mut current = wm
            .assign(&RunInput { previous: None, tasks: &first_tasks, load: &first_load, replicas: limits, placement: steady_assigner::Placement::none() })
            .unwrap()
            .assignment;
        let tasks = next_tasks(&states);
        for load in &loads {
            let run = wm
                .assign(&RunInput { previous: Some(&current), tasks: &tasks, load, replicas: limits, placement: steady_assigner::Placement::none() })
                .unwrap();
            let r = &run.report;
            common::check_placement(&run.assignment, &tasks, limits);
            let measured = current.diff(&run.assignment).key_churn();
            prop_assert!((measured - r.key_churn).abs() < 1e-12);
            prop_assert!(
                measured <= r.forced_churn + config.merge_budget + config.move_budget + 1e-9,
                "churn {} over the budget: {}", measured, r
            );
            if r.forced_churn == 0.0 {
                let before = r.imbalance_before.unwrap();
                prop_assert!(r.imbalance_after <= before * (1.0 + 1e-9), "worse: {}", r);
            }
            current = run.assignment;
        }
    }
}

proptest! {
    #[test]
    fn range_loads_add_up_whatever_their_widths_and_overlaps(
        ranges in prop::collection::vec((any::<u64>(), 0u32..64, 0.0..1e6f64), 1..40),
    ) {
        let ranges: Vec<(steady_slice::KeyRange, f64)> = ranges
            .into_iter()
            .map(|(start, width_bits, load)| {
                let start = start.min(u64::MAX - 1);
                let end = start.saturating_add((1u64 << width_bits).max(1)).max(start + 1);
                (steady_slice::KeyRange::new(SliceKey(start), Some(SliceKey(end))), load)
            })
            .collect();
        let sum: f64 = ranges.iter().map(|r| r.1).sum();
        let load = Load::none().with_ranges(ranges.clone()).unwrap();
        prop_assert!((load.total() - sum).abs() <= 1e-9 * sum.max(1.0), "{} vs {}", load.total(), sum);
        for (range, l) in &ranges {
            prop_assert!(load.of_range(*range) >= l * (1.0 - 1e-9) - 1e-9);
        }
    }
}
