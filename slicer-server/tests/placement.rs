//! An Assigner service under a placement, seen through the pages as the binary serves
//! them (in process, one job of a one-instance fleet): while a zone outage makes the spec infeasible, `/metrics` counts the
//! slices that miss each constraint and names the one the tasks cannot meet, and the
//! status page shows it, marked; once the tasks return both say the placement is met.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use steady_assigner::{by_name, JobSpec, Placement, ReplicaLimits, Spread};
use steady_core::{JobView, Locality, Task, TaskState, Zone};
use steady_slicer::assigner_service::{follow_job, AssignerConfig, AssignerService};
use steady_slicer::fleet::Instance;
use steady_slicer::load::{LoadBook, LoadCollector};
use steady_slicer::specs::{JobConfig, TaskSource};
use steady_slicer::store::MemoryStore;
use steady_slicer::Distributor;
use steady_slicer_server::fleet::FleetStatus;
use steady_slicer_server::status::{observe_fleet, MetricsRegistry, StatusServer, StatusSources};
use steady_testing::wait::eventually;
use tokio::sync::watch;

const JOB: &str = "users";

/// Tasks `tasks` of six, serving; task `t` in zone a, b or c (`t / 2`).
fn view(tasks: impl IntoIterator<Item = u32>) -> JobView<String> {
    let tasks: BTreeMap<usize, Task<String>> = tasks
        .into_iter()
        .map(|t| {
            let zone = Zone::new(["a", "b", "c"][t as usize / 2]).unwrap();
            let task = Task::new(format!("10.0.0.{t}:50051"), TaskState::Serving);
            (t as usize, task.in_zone(Locality::new(zone, t as usize % 2)))
        })
        .collect();
    JobView { size: 6, tasks: Arc::new(tasks) }
}

/// The value of the sample `name{...steady_constraint="constraint"...}` in Prometheus text.
fn sample(text: &str, name: &str, constraint: &str) -> Option<f64> {
    let label = format!("steady_constraint=\"{constraint}\"");
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(&label))
        .find_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse().ok()))
}

#[tokio::test]
async fn metrics_and_the_page_show_a_missed_placement_and_its_repair() {
    let distributor = Distributor::new();
    let book = LoadBook::new();
    let spec = JobSpec {
        replicas: ReplicaLimits::new(2, 2).unwrap(),
        placement: Placement { spread: Spread::Zones, ..Placement::default() },
        ..JobSpec::default()
    };
    let config = AssignerConfig {
        cadence: Duration::from_millis(50),
        min_interval: Duration::from_millis(20),
        ..AssignerConfig::default()
    }
    .with_spec(&spec);
    let (views, rx) = watch::channel(view(0..6));
    let tasks = follow_job(rx);
    let service = AssignerService::new(
        JOB,
        "a",
        Arc::from(by_name("weighted-move").unwrap()),
        Arc::new(MemoryStore::new()),
        distributor.clone(),
        book.clone(),
    )
    .config(config)
    .unwrap()
    .spawn(tasks.clone());
    let registry = MetricsRegistry::new();
    let record = Instance { address: "127.0.0.1:50070".into(), pages: None };
    let job = JobConfig::new(JOB, TaskSource::Count(6));
    let fleet =
        watch::channel(Arc::new(FleetStatus::one_job("a", record, job, service.shared_stats(), tasks))).1;
    observe_fleet(&registry.meter(), fleet.clone(), "a");
    let pages = StatusServer::new(
        StatusSources {
            instance: "a".into(),
            store: "memory".into(),
            distributor: distributor.clone(),
            collector: LoadCollector::new(book),
            fleet,
            autosharding: None,
        },
        registry,
    );
    let page = || pages.job_page(JOB).expect("the job's page");
    let violations = "steady_assigner_placement_violations";
    let infeasible = "steady_assigner_placement_infeasible";
    let met = |text: &str| {
        ["min-replicas", "spread-zones", "spread-racks", "replica-per-zone"]
            .into_iter()
            .all(|c| sample(text, violations, c) == Some(0.0) && sample(text, infeasible, c) == Some(0.0))
    };
    eventually("the first generation, its placement met", || {
        distributor.current(JOB).is_some() && met(&pages.metrics())
    })
    .await;
    assert!(page().contains("id=\"placement\">met</b>"));

    // Zones b and c go: spread-zones cannot be met, and some slices miss a constraint
    // (two replicas in zone a, or one replica).
    views.send_replace(view(0..2));
    eventually("spread-zones infeasible in /metrics", || {
        sample(&pages.metrics(), infeasible, "spread-zones") == Some(1.0)
    })
    .await;
    let text = pages.metrics();
    let missed = sample(&text, violations, "spread-zones").unwrap()
        + sample(&text, violations, "min-replicas").unwrap();
    assert!(missed >= 1.0, "{text}");
    assert_eq!(sample(&text, violations, "replica-per-zone"), Some(0.0), "{text}");
    assert!(text.contains(&format!("{violations}{{")) && text.contains("steady_job=\"users\""), "{text}");
    let page_now = page();
    assert!(page_now.contains("id=\"placement\">VIOLATED (below)</b>"), "{page_now}");
    assert!(
        page_now.contains(
            "Infeasible: constraint spread-zones cannot be met: 2 replicas per slice need as many zones, 1 have serving tasks."
        ),
        "{page_now}"
    );

    // They come back: repaired, and both pages say so.
    views.send_replace(view(0..6));
    eventually("the placement met again in /metrics", || met(&pages.metrics())).await;
    let page_now = page();
    assert!(
        page_now.contains("id=\"placement\">met</b>") && !page_now.contains("id=\"violations\""),
        "{page_now}"
    );
    service.stop().await;
}
