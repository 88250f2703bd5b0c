//! The Assigner service under a placement (a job spec's constraints): replicas spread over
//! the zones the job view gives, a zone outage that makes the spec infeasible (the service
//! keeps every slice on the tasks left and names the constraint it misses), and the repair
//! when the tasks return.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use steady_assigner::{
    by_name, Assignment, Constraint, JobSpec, Placement, ReplicaLimits, Spread, TaskRule, Tasks,
};
use steady_core::{JobView, Locality, Task, TaskState, Zone};
use steady_slicer::assigner_service::{follow_job, AssignerConfig, AssignerService, AssignerStats};
use steady_slicer::load::LoadBook;
use steady_slicer::store::MemoryStore;
use steady_slicer::Distributor;
use steady_testing::wait::PATIENCE;
use steady_testing::{eventually, holds_within};
use tokio::sync::watch;

const JOB: &str = "users";
/// Task `t` is in zone `ZONES[t / 2]`: tasks 0-1 in a, 2-3 in b, 4-5 in c.
const ZONES: [&str; 3] = ["a", "b", "c"];

fn zone_of(task: u32) -> &'static str {
    ZONES[task as usize / 2]
}

/// The job view with `tasks` listed (serving, each in its zone); the others absent.
fn view(tasks: impl IntoIterator<Item = u32>) -> JobView<String> {
    let tasks: BTreeMap<usize, Task<String>> = tasks
        .into_iter()
        .map(|t| {
            let locality = Locality::new(Zone::new(zone_of(t)).unwrap(), t as usize % 2);
            (t as usize, Task::new(format!("10.0.0.{t}:50051"), TaskState::Serving).in_zone(locality))
        })
        .collect();
    JobView { size: 6, tasks: Arc::new(tasks) }
}

fn config() -> AssignerConfig {
    AssignerConfig {
        cadence: Duration::from_millis(50),
        min_interval: Duration::from_millis(20),
        backoff: Duration::from_millis(20),
        ..AssignerConfig::default()
    }
}

/// Two replicas per slice, in distinct zones.
fn spread_spec() -> JobSpec {
    JobSpec {
        replicas: ReplicaLimits::new(2, 2).unwrap(),
        placement: Placement { spread: Spread::Zones, ..Placement::default() },
        ..JobSpec::default()
    }
}

/// Whether every slice has two replicas in two zones.
fn spread_over_zones(a: &Assignment) -> bool {
    a.slices().iter().all(|s| s.replicas().len() == 2 && zone_of(s.replicas()[0]) != zone_of(s.replicas()[1]))
}

/// Waits (bounded) until the Distributor holds an assignment that satisfies `test`.
async fn until(distributor: &Distributor, what: &str, test: impl Fn(&Assignment) -> bool) -> Assignment {
    let mut found = None;
    let held = holds_within(PATIENCE, || {
        found = distributor.current(JOB).filter(|a| test(a));
        found.is_some()
    })
    .await;
    assert!(held, "timed out waiting for {what}: {:?}", distributor.current(JOB));
    found.expect("held")
}

fn met(stats: &AssignerStats) -> bool {
    let p = stats.placement();
    stats.runs() > 0 && p.violations.is_empty() && p.infeasible.is_none()
}

#[tokio::test]
async fn replicas_spread_over_the_view_s_zones_a_zone_outage_is_named_and_repaired_when_tasks_return() {
    let distributor = Distributor::new();
    let (views, rx) = watch::channel(view(0..6));
    let assigner = AssignerService::new(
        JOB,
        "a",
        Arc::from(by_name("weighted-move").unwrap()),
        Arc::new(MemoryStore::new()),
        distributor.clone(),
        LoadBook::new(),
    )
    .config(config().with_spec(&spread_spec()))
    .unwrap()
    .spawn(follow_job(rx));

    // The first generation already meets the spec: the zones come from the view alone.
    let first = until(&distributor, "the first generation", |_| true).await;
    assert!(spread_over_zones(&first), "{first:?}");
    eventually("the placement met", || met(assigner.stats())).await;

    // Zones b and c go: one zone cannot hold two replicas in distinct zones. Every slice
    // stays on the tasks left, and the service names the constraint it cannot meet.
    views.send_replace(view(0..2));
    let outage = until(&distributor, "every slice on tasks 0 and 1", |a| {
        a.slices().iter().all(|s| s.replicas().iter().all(|&t| t < 2))
    })
    .await;
    assert!(outage.generation() > first.generation());
    assert!(outage.slices().iter().all(|s| !s.replicas().is_empty()));
    eventually("spread-zones named infeasible", || {
        assigner.stats().placement().infeasible.is_some_and(|why| why.constraint() == Constraint::SpreadZones)
    })
    .await;
    let during = assigner.stats().placement();
    assert!(!during.violations.is_empty(), "{during:?}");
    let why = during.infeasible.unwrap().to_string();
    assert!(why.starts_with("constraint spread-zones cannot be met"), "{why}");
    // Whatever the run chose (two replicas in zone a, or one), the slices it counts are
    // the slices there are.
    for v in &during.violations {
        assert!(v.slices <= outage.slices().len() && v.key_share > 0.0, "{v:?}");
    }

    // Every task goes: the assignment in force stays, and the placement says no task
    // serves (not the last run's state).
    views.send_replace(view(0..0));
    eventually("no serving task named", || {
        assigner.stats().placement().infeasible
            == Some(steady_assigner::Infeasible::MinReplicas { min: 2, serving: 0 })
    })
    .await;
    let kept = distributor.current(JOB).expect("the assignment in force stays");
    assert!(kept.slices().iter().all(|s| !s.replicas().is_empty() && s.replicas().iter().all(|&t| t < 2)));

    // They come back: the next runs repair the spread, and the violations go.
    views.send_replace(view(0..6));
    let repaired = until(&distributor, "the spread repaired", spread_over_zones).await;
    assert!(repaired.generation() > outage.generation());
    eventually("the placement met again", || met(assigner.stats())).await;
    assigner.stop().await;
}

/// A static task list (no zones from discovery): the spec's task rules put the tasks in
/// zones, and the service spreads over them.
#[tokio::test]
async fn the_spec_s_task_rules_give_zones_to_tasks_discovery_puts_in_none() {
    let distributor = Distributor::new();
    let rule = |first, last, zone: &str| TaskRule {
        first,
        last,
        zone: Some(zone.to_owned()),
        rack: None,
        capacity: None,
    };
    let spec = JobSpec { tasks: vec![rule(0, 1, "a"), rule(2, 3, "b"), rule(4, 5, "c")], ..spread_spec() };
    let (_tasks, rx) = watch::channel(Tasks::serving(0..6).unwrap());
    let assigner = AssignerService::new(
        JOB,
        "a",
        Arc::from(by_name("weighted-move").unwrap()),
        Arc::new(MemoryStore::new()),
        distributor.clone(),
        LoadBook::new(),
    )
    .config(config().with_spec(&spec))
    .unwrap()
    .spawn(rx);
    let first = until(&distributor, "the first generation", |_| true).await;
    assert!(spread_over_zones(&first), "{first:?}");
    eventually("the placement met", || met(assigner.stats())).await;

    // Without the rules the same tasks are in one unlabelled domain: the spec cannot be
    // met (the control: the rules, not luck, spread the first generation).
    let blind = AssignerService::new(
        "blind",
        "a",
        Arc::from(by_name("weighted-move").unwrap()),
        Arc::new(MemoryStore::new()),
        distributor.clone(),
        LoadBook::new(),
    )
    .config(config().with_spec(&spread_spec()))
    .unwrap()
    .spawn(watch::channel(Tasks::serving(0..6).unwrap()).1);
    eventually("spread-zones infeasible without zones", || {
        blind.stats().placement().infeasible.is_some_and(|why| why.constraint() == Constraint::SpreadZones)
    })
    .await;
    assigner.stop().await;
    blind.stop().await;
}
