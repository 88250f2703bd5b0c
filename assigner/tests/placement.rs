//! Placement under constraints: wherever a task set can meet a placement, weighted-move
//! and LPT meet it (no violation), from scratch and after tasks come and go; where it
//! cannot, the run names the constraint and still returns an assignment; capacities are
//! honoured; weighted-move's churn stays within its budgets plus forced moves.

mod common;

use proptest::prelude::*;
use steady_assigner::{
    Assigner, Constraint, Infeasible, Load, Lpt, Placement, ReplicaLimits, Rotation, RunInput, SliceKey,
    Spread, TaskProfile, TaskState, Tasks, WeightedMove, WeightedMoveConfig,
};

/// A task set: each task's zone (one of `zones`), rack (one of 3 per zone, or none),
/// capacity (1, 2 or 4) and state.
#[derive(Debug, Clone)]
struct Fleet {
    tasks: Vec<(usize, Option<usize>, f64, TaskState)>,
}

impl Fleet {
    fn tasks(&self, zones: bool) -> Tasks {
        let mut states: Vec<TaskState> = self.tasks.iter().map(|t| t.3).collect();
        if !states.contains(&TaskState::Serving) {
            states[0] = TaskState::Serving;
        }
        let mut tasks = Tasks::new(states.into_iter().enumerate().map(|(t, s)| (t as u32, s))).unwrap();
        for (t, &(zone, rack, capacity, _)) in self.tasks.iter().enumerate() {
            let mut profile = TaskProfile::default().capacity(capacity);
            if zones {
                profile.zone = Some(format!("z{zone}"));
            }
            profile.rack = rack.map(|r| format!("r{r}"));
            tasks = tasks.with_profile(t as u32, profile).unwrap();
        }
        tasks
    }
}

fn fleet_strategy() -> impl Strategy<Value = Fleet> {
    let task = (
        0..4usize,
        prop::option::of(0..3usize),
        prop_oneof![Just(1.0), Just(2.0), Just(4.0)],
        prop_oneof![8 => Just(TaskState::Serving), 1 => Just(TaskState::Draining), 1 => Just(TaskState::Gone)],
    );
    prop::collection::vec(task, 1..16).prop_map(|tasks| Fleet { tasks })
}

fn placement_strategy() -> impl Strategy<Value = Placement> {
    (
        prop_oneof![Just(Spread::None), Just(Spread::Zones), Just(Spread::Racks)],
        any::<bool>(),
        prop::collection::vec(0..5usize, 0..3),
    )
        .prop_map(|(spread, replica_per_zone, zones)| {
            let mut zones: Vec<String> = zones.into_iter().map(|z| format!("z{z}")).collect();
            zones.sort();
            zones.dedup();
            Placement { spread, replica_per_zone, zones }
        })
}

fn load_strategy() -> impl Strategy<Value = Load> {
    // No uniform part at times: bins with no load take LPT's other path.
    let uniform = prop_oneof![Just(0.0), 0.0..50.0f64];
    (prop::collection::vec((any::<u64>(), 0.0..100.0f64), 0..100), uniform).prop_map(|(points, uniform)| {
        Load::from_points(points.into_iter().map(|(k, l)| (SliceKey(k), l)))
            .unwrap()
            .with_uniform(uniform)
            .unwrap()
    })
}

fn limits_strategy() -> impl Strategy<Value = ReplicaLimits> {
    (1..4usize, 0..3usize).prop_map(|(min, extra)| ReplicaLimits::new(min, min + extra).unwrap())
}

/// The constraints an outcome misses, as the report gives them and as an independent
/// check finds them, which must agree.
fn misses(
    placement: &Placement,
    tasks: &Tasks,
    limits: ReplicaLimits,
    run: &steady_assigner::Outcome,
) -> Vec<Constraint> {
    let check = placement.check(tasks, limits, &run.assignment);
    assert_eq!(check.violations, run.report.violations, "the report and the check disagree");
    assert_eq!(check.infeasible, run.report.infeasible);
    check.violations.iter().map(|v| v.constraint).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn weighted_move_and_lpt_meet_every_feasible_placement(
        first in fleet_strategy(),
        next in fleet_strategy(),
        placement in placement_strategy(),
        limits in limits_strategy(),
        loads in prop::collection::vec(load_strategy(), 2..4),
        zones in any::<bool>(),
    ) {
        let wm = WeightedMove::default();
        let assigners: [&dyn Assigner; 2] = [&wm, &Lpt::default()];
        let first_tasks = first.tasks(zones);
        // The next task set: the first one's tasks in the next fleet's states and
        // profiles where it has them (tasks come, go, drain and change zone).
        let next_tasks = next.tasks(zones);
        for assigner in assigners {
            let mut previous = None;
            for (step, load) in loads.iter().enumerate() {
                let tasks = if step == 0 { &first_tasks } else { &next_tasks };
                let input = RunInput { previous: previous.as_ref(), tasks, load, replicas: limits, placement: &placement };
                let run = assigner.assign(&input).unwrap();
                common::check_serving(&run.assignment, tasks);
                let missed = misses(&placement, tasks, limits, &run);
                match placement.feasibility(tasks, limits) {
                    Ok(()) => prop_assert!(
                        missed.is_empty(),
                        "{} step {step}: a feasible placement missed: {:?}\n{}", assigner.name(), run.report.violations, run.report
                    ),
                    Err(why) => {
                        // Named, and the assignment is the best the run could make: never empty.
                        prop_assert_eq!(run.report.infeasible.as_ref(), Some(&why));
                        prop_assert!(!run.assignment.slices().is_empty());
                    }
                }
                previous = Some(run.assignment);
            }
        }
    }

    #[test]
    fn weighted_move_under_a_placement_churns_within_its_budgets(
        fleet in fleet_strategy(),
        placement in placement_strategy(),
        limits in limits_strategy(),
        first_load in load_strategy(),
        loads in prop::collection::vec(load_strategy(), 1..4),
    ) {
        let config = WeightedMoveConfig::default();
        let wm = WeightedMove::new(config.clone()).unwrap();
        let tasks = fleet.tasks(true);
        let input = RunInput { previous: None, tasks: &tasks, load: &first_load, replicas: limits, placement: &placement };
        let mut current = wm.assign(&input).unwrap().assignment;
        for load in &loads {
            let run = wm.assign(&RunInput { previous: Some(&current), load, ..input }).unwrap();
            let r = &run.report;
            let measured = current.diff(&run.assignment).key_churn();
            prop_assert!(
                measured <= r.forced_churn + config.merge_budget + config.move_budget + 1e-9,
                "churn {} over the budget: {}", measured, r
            );
            // Once met, a placement stays met by load moves: nothing here is forced.
            if placement.feasibility(&tasks, limits).is_ok() {
                prop_assert!(r.violations.is_empty(), "{}", r);
                prop_assert_eq!(r.forced_churn, 0.0, "{}", r);
            }
            current = run.assignment;
        }
    }
}

/// `n` tasks in `zones` zones round-robin (task t in zone t % zones), capacity 1.
fn zoned(n: u32, zones: u32) -> Tasks {
    let mut tasks = Tasks::serving(0..n).unwrap();
    for t in 0..n {
        tasks = tasks.with_profile(t, TaskProfile::in_zone(format!("z{}", t % zones))).unwrap();
    }
    tasks
}

fn spread_zones() -> Placement {
    Placement { spread: Spread::Zones, ..Placement::default() }
}

#[test]
fn an_unconstrained_assignment_is_repaired_to_a_spread_one_as_forced_moves() {
    let tasks = zoned(12, 3);
    let limits = ReplicaLimits::new(2, 2).unwrap();
    let load = Load::none().with_uniform(1000.0).unwrap();
    let free = RunInput {
        previous: None,
        tasks: &tasks,
        load: &load,
        replicas: limits,
        placement: Placement::none(),
    };
    let wm = WeightedMove::default();
    let first = wm.assign(&free).unwrap();
    let placement = spread_zones();
    // Round-robin over tasks in index order puts tasks t and t+1 together: zones differ
    // (t % 3), so make a deliberately clustered start instead: every slice on two tasks
    // of zone z0.
    let clustered = steady_assigner::Assignment::new(
        first.assignment.generation(),
        first
            .assignment
            .slices()
            .iter()
            .enumerate()
            .map(|(i, s)| steady_slice::Slice::new(s.start, vec![[0, 3, 6, 9][i % 4], [3, 6, 9, 0][i % 4]]))
            .collect(),
    )
    .unwrap();
    assert_eq!(placement.check(&tasks, limits, &clustered).violations.len(), 1);
    let run = wm.assign(&RunInput { previous: Some(&clustered), placement: &placement, ..free }).unwrap();
    assert!(run.report.violations.is_empty(), "{}", run.report);
    assert!(run.report.forced_churn > 0.99, "every slice moved one replica: {}", run.report);
    assert_eq!(run.report.moves.forced, clustered.slices().len());
    // Then load moves within the budget balance it, and the spread holds throughout.
    let mut current = run;
    for _ in 0..10 {
        current = wm
            .assign(&RunInput { previous: Some(&current.assignment), placement: &placement, ..free })
            .unwrap();
        assert!(current.report.violations.is_empty(), "{}", current.report);
        assert_eq!(current.report.forced_churn, 0.0);
    }
    assert!(current.report.imbalance_after <= 1.10, "{}", current.report);
}

#[test]
fn a_zone_without_tasks_is_named_and_the_best_assignment_still_comes_out() {
    let tasks = zoned(6, 2);
    let limits = ReplicaLimits::new(2, 3).unwrap();
    let load = Load::none().with_uniform(100.0).unwrap();
    let placement = Placement {
        replica_per_zone: true,
        zones: vec!["z0".into(), "z1".into(), "z2".into()],
        ..Placement::default()
    };
    let input =
        RunInput { previous: None, tasks: &tasks, load: &load, replicas: limits, placement: &placement };
    let run = WeightedMove::default().assign(&input).unwrap();
    assert_eq!(run.report.infeasible, Some(Infeasible::ZoneWithoutTasks { zone: "z2".into() }));
    assert_eq!(run.report.infeasible.as_ref().unwrap().constraint(), Constraint::ReplicaPerZone);
    assert_eq!(
        run.report.infeasible.as_ref().unwrap().to_string(),
        "constraint replica-per-zone cannot be met: zone z2 has no serving task"
    );
    // Every slice misses z2, and has z0 and z1.
    assert_eq!(run.report.violations.len(), 1);
    assert_eq!(run.report.violations[0].slices, run.assignment.slices().len());
    let zone = |t: u32| t % 2;
    for s in run.assignment.slices() {
        assert!(
            s.replicas().iter().any(|&t| zone(t) == 0) && s.replicas().iter().any(|&t| zone(t) == 1),
            "{s:?}"
        );
    }
    // Tasks come back in z2: the next run repairs.
    let mut back = Tasks::serving(0..9).unwrap();
    for t in 0..9 {
        let z = if t < 6 { t % 2 } else { 2 };
        back = back.with_profile(t, TaskProfile::in_zone(format!("z{z}"))).unwrap();
    }
    let repaired = WeightedMove::default()
        .assign(&RunInput { previous: Some(&run.assignment), tasks: &back, ..input })
        .unwrap();
    assert_eq!(repaired.report.infeasible, None);
    assert!(repaired.report.violations.is_empty(), "{}", repaired.report);
}

#[test]
fn spread_over_more_replicas_than_zones_is_infeasible_by_name() {
    let tasks = zoned(8, 2);
    let limits = ReplicaLimits::new(3, 3).unwrap();
    let placement = spread_zones();
    assert_eq!(
        placement.feasibility(&tasks, limits),
        Err(Infeasible::Spread { constraint: Constraint::SpreadZones, replicas: 3, domains: 2 })
    );
    let load = Load::none().with_uniform(10.0).unwrap();
    let run = WeightedMove::default()
        .assign(&RunInput {
            previous: None,
            tasks: &tasks,
            load: &load,
            replicas: limits,
            placement: &placement,
        })
        .unwrap();
    // Three replicas each (the minimum holds), over both zones.
    for s in run.assignment.slices() {
        assert_eq!(s.replicas().len(), 3);
        assert!(s.replicas().iter().any(|t| t % 2 == 0) && s.replicas().iter().any(|t| t % 2 == 1));
    }
    assert_eq!(
        run.report.violations.iter().map(|v| v.constraint).collect::<Vec<_>>(),
        [Constraint::SpreadZones]
    );
}

#[test]
fn a_task_with_capacity_two_takes_twice_the_load() {
    let mut tasks = Tasks::serving(0..8).unwrap();
    for t in 0..4 {
        tasks = tasks.with_profile(t, TaskProfile::default().capacity(2.0)).unwrap();
    }
    let points: Vec<(SliceKey, f64)> =
        (0..4000u64).map(|i| (SliceKey(i.wrapping_mul(0x9E37_79B9_7F4A_7C15)), 1.0)).collect();
    let load = Load::from_points(points).unwrap();
    let wm = WeightedMove::default();
    let input = RunInput {
        previous: None,
        tasks: &tasks,
        load: &load,
        replicas: ReplicaLimits::default(),
        placement: Placement::none(),
    };
    let mut current = wm.assign(&input).unwrap();
    for _ in 0..20 {
        current = wm.assign(&RunInput { previous: Some(&current.assignment), ..input }).unwrap();
    }
    assert!(current.report.imbalance_after <= 1.10, "{}", current.report);
    let mut per_task = [0.0f64; 8];
    for (i, s) in current.assignment.slices().iter().enumerate() {
        let end = current.assignment.slices().get(i + 1).map(|n| n.start);
        let l = load.of_range(steady_slice::KeyRange::new(s.start, end));
        per_task[s.replicas()[0] as usize] += l;
    }
    let big: f64 = per_task[..4].iter().sum::<f64>() / 4.0;
    let small: f64 = per_task[4..].iter().sum::<f64>() / 4.0;
    assert!((big / small - 2.0).abs() < 0.25, "capacity 2 tasks carry {big}, capacity 1 tasks {small}");
}

#[test]
fn a_replica_per_zone_keeps_one_replica_in_each_zone_through_a_zone_outage_and_back() {
    let tasks = zoned(9, 3);
    let limits = ReplicaLimits::new(1, 3).unwrap();
    let placement = Placement { spread: Spread::Zones, replica_per_zone: true, zones: Vec::new() };
    let points: Vec<(SliceKey, f64)> = (0..2000u64)
        .map(|i| (SliceKey(i.wrapping_mul(0x9E37_79B9_7F4A_7C15)), 1.0 + (i % 7) as f64))
        .collect();
    let load = Load::from_points(points).unwrap();
    let input =
        RunInput { previous: None, tasks: &tasks, load: &load, replicas: limits, placement: &placement };
    let wm = WeightedMove::default();
    let first = wm.assign(&input).unwrap();
    assert!(first.report.violations.is_empty());
    for s in first.assignment.slices() {
        let mut zones: Vec<u32> = s.replicas().iter().map(|t| t % 3).collect();
        zones.sort_unstable();
        assert_eq!(zones, [0, 1, 2], "{s:?}");
    }
    // Zone z2 goes down: its tasks are gone. The zones of the serving tasks are z0 and z1:
    // one replica in each, none lost beyond z2's.
    let down = Tasks::new((0..9).map(|t| (t, if t % 3 == 2 { TaskState::Gone } else { TaskState::Serving })))
        .unwrap();
    let mut down_tasks = down;
    for t in 0..9 {
        down_tasks = down_tasks.with_profile(t, TaskProfile::in_zone(format!("z{}", t % 3))).unwrap();
    }
    let during =
        wm.assign(&RunInput { previous: Some(&first.assignment), tasks: &down_tasks, ..input }).unwrap();
    assert!(during.report.violations.is_empty(), "{}", during.report);
    for s in during.assignment.slices() {
        assert_eq!(s.replicas().len(), 2, "{s:?}");
    }
    // Back: every slice regains its z2 replica.
    let back = wm.assign(&RunInput { previous: Some(&during.assignment), ..input }).unwrap();
    assert!(back.report.violations.is_empty(), "{}", back.report);
    for s in back.assignment.slices() {
        assert_eq!(s.replicas().len(), 3, "{s:?}");
    }
}

#[test]
fn rotation_spreads_consecutive_replicas_over_zones() {
    // Tasks numbered so that index order clusters zones: 0-3 in z0, 4-7 in z1.
    let mut tasks = Tasks::serving(0..8).unwrap();
    for t in 0..8 {
        tasks = tasks.with_profile(t, TaskProfile::in_zone(if t < 4 { "z0" } else { "z1" })).unwrap();
    }
    let limits = ReplicaLimits::new(2, 2).unwrap();
    let load = Load::none().with_uniform(10.0).unwrap();
    let run = Rotation::default()
        .assign(&RunInput {
            previous: None,
            tasks: &tasks,
            load: &load,
            replicas: limits,
            placement: &spread_zones(),
        })
        .unwrap();
    assert!(run.report.violations.is_empty(), "{}", run.report);
    let unconstrained = Rotation::default()
        .assign(&RunInput {
            previous: None,
            tasks: &tasks,
            load: &load,
            replicas: limits,
            placement: Placement::none(),
        })
        .unwrap();
    assert!(!spread_zones().check(&tasks, limits, &unconstrained.assignment).is_met());
}

#[test]
fn lpt_and_rotation_meet_a_spread_where_the_zone_order_wraps() {
    // Ten tasks in three zones: an order round-robin over zones ends in zone z0 and starts
    // in it again, so "the next task in order" would put two replicas in z0 at the wrap.
    let tasks = zoned(10, 3);
    let load = Load::from_points([(SliceKey(1 << 40), 5.0), (SliceKey(1 << 62), 1.0)]).unwrap();
    let cases = [
        (ReplicaLimits::new(2, 2).unwrap(), spread_zones()),
        (
            ReplicaLimits::new(3, 3).unwrap(),
            Placement { spread: Spread::Zones, replica_per_zone: true, zones: Vec::new() },
        ),
    ];
    for (limits, placement) in cases {
        let assigners: [&dyn Assigner; 2] = [&Lpt::default(), &Rotation::default()];
        for assigner in assigners {
            let input = RunInput {
                previous: None,
                tasks: &tasks,
                load: &load,
                replicas: limits,
                placement: &placement,
            };
            let run = assigner.assign(&input).unwrap();
            assert!(run.report.violations.is_empty(), "{}: {}", assigner.name(), run.report);
            let again = assigner.assign(&RunInput { previous: Some(&run.assignment), ..input }).unwrap();
            assert!(again.report.violations.is_empty(), "{}: {}", assigner.name(), again.report);
        }
    }
}
