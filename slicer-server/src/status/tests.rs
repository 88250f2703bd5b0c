//! The pages over a fleet: the overview, a job's page and JSON, the fleet's metrics, the
//! event log, and their bounds at `MAX_JOBS` jobs.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use steady_assigner::{Assignment, TaskState, Tasks};
use steady_slice::{Slice, SliceKey};
use steady_slicelet::LoadReport;
use steady_slicer::assigner_service::{AssignerConfig, AssignerHandle, AssignerService, AssignerStats};
use steady_slicer::fleet::Instance;
use steady_slicer::load::{LoadBook, LoadCollector};
use steady_slicer::specs::{JobConfig, TaskSource, MAX_JOBS};
use steady_slicer::store::MemoryStore;
use steady_slicer::Distributor;
use tokio::sync::watch;

use super::*;
use crate::fleet::{FleetStatus, JobStatus};

/// `slices` equal slices over the key space, slice `i` on task `i % tasks`.
fn assignment(generation: u64, tasks: u32, slices: u64) -> Assignment {
    let step = u64::MAX / slices + 1;
    let slices =
        (0..slices).map(|i| Slice::new(SliceKey(i * step), vec![(i % u64::from(tasks)) as u32])).collect();
    Assignment::new(generation, slices).unwrap()
}

fn instance(pages: Option<&str>) -> Instance {
    Instance { address: "10.0.0.1:50070".into(), pages: pages.map(Into::into) }
}

/// A job of `tasks` counted tasks, owned by `owner`, its Assigner not here.
fn elsewhere(job: &str, owner: Option<&str>) -> JobStatus {
    JobStatus {
        config: Arc::new(JobConfig::new(job, TaskSource::Count(2))),
        owner: owner.map(Into::into),
        assigner: None,
        tasks: None,
    }
}

/// A job whose Assigner runs here and campaigns (a service's statistics before it leads).
fn campaigning(job: &str) -> JobStatus {
    JobStatus {
        config: Arc::new(JobConfig::new(job, TaskSource::Count(3))),
        owner: Some("a".into()),
        assigner: Some(Arc::new(AssignerStats::default())),
        tasks: Some(watch::channel(Tasks::serving(0..3).unwrap()).1),
    }
}

struct Fixture {
    server: StatusServer,
    fleet: watch::Sender<Arc<FleetStatus>>,
    distributor: Distributor,
    book: LoadBook,
}

/// Instance `a` of a fleet of `a`, `b` (pages on 127.0.0.1:9999) and `evil` (a record
/// whose pages are a script), serving `jobs`.
fn fixture(jobs: Vec<JobStatus>) -> Fixture {
    let fleet = FleetStatus {
        instances: BTreeMap::from([
            ("a".to_owned(), instance(None)),
            ("b".to_owned(), instance(Some("127.0.0.1:9999"))),
            ("evil".to_owned(), instance(Some("javascript:alert(1)"))),
        ]),
        jobs: jobs.into_iter().map(|j| (j.config.job.clone(), j)).collect(),
    };
    let (fleet, rx) = watch::channel(Arc::new(fleet));
    let (distributor, book) = (Distributor::new(), LoadBook::new());
    let sources = StatusSources {
        instance: "a".into(),
        store: "memory".into(),
        distributor: distributor.clone(),
        collector: LoadCollector::new(book.clone()),
        fleet: rx,
        autosharding: None,
    };
    Fixture { server: StatusServer::new(sources, MetricsRegistry::new()), fleet, distributor, book }
}

/// A service of `job` on a memory store (it leads at once), its tasks `tasks`.
async fn leading(f: &Fixture, job: &str, tasks: Tasks) -> (AssignerHandle, watch::Receiver<Tasks>) {
    let config = AssignerConfig {
        cadence: Duration::from_millis(50),
        min_interval: Duration::from_millis(20),
        ..AssignerConfig::default()
    };
    let tasks = watch::channel(tasks).1;
    let service = AssignerService::new(
        job,
        "a",
        Arc::from(steady_assigner::by_name("weighted-move").unwrap()),
        Arc::new(MemoryStore::new()),
        f.distributor.clone(),
        f.book.clone(),
    )
    .config(config)
    .unwrap()
    .spawn(tasks.clone());
    let stats = service.shared_stats();
    steady_testing::wait::eventually("the service leads and publishes", || {
        stats.is_leading() && f.distributor.current(job).is_some()
    })
    .await;
    (service, tasks)
}

#[test]
fn a_job_led_elsewhere_is_the_documented_json_to_the_byte() {
    let mut orders = elsewhere("orders", Some("b"));
    Arc::make_mut(&mut orders.config).drained = BTreeSet::from([1]);
    let f = fixture(vec![orders, elsewhere("lost", None), campaigning("pay")]);
    f.distributor.publish("orders", assignment(7, 2, 2));
    assert_eq!(
        f.server.job_json("orders").unwrap(),
        "{\"job\":\"orders\",\"generation\":7,\"owner\":\"b\",\"here\":\"none\",\"tasks\":[\
         {\"task\":0,\"state\":\"serving\",\"slices\":1,\"key_share\":0.5,\"load\":null},\
         {\"task\":1,\"state\":\"draining\",\"slices\":1,\"key_share\":0.5,\"load\":null}]}"
    );
    // No owner, no assignment: no task known yet.
    assert_eq!(
        f.server.job_json("lost").unwrap(),
        "{\"job\":\"lost\",\"generation\":0,\"owner\":null,\"here\":\"none\",\"tasks\":[]}"
    );
    let pay: serde_json::Value = serde_json::from_str(&f.server.job_json("pay").unwrap()).unwrap();
    assert_eq!(pay["here"], "campaigning");
    assert_eq!(pay["tasks"].as_array().unwrap().len(), 3, "{pay}");
    assert!(f.server.job_json("users").is_none() && f.server.job_page("users").is_none());
}

#[tokio::test]
async fn the_job_json_is_the_documented_contract() {
    let f = fixture(Vec::new());
    let tasks =
        Tasks::new([(0, TaskState::Serving), (1, TaskState::Serving), (2, TaskState::Draining)]).unwrap();
    let (service, tasks) = leading(&f, "users \"1\"", tasks).await;
    let users = JobStatus {
        config: Arc::new(JobConfig::new("users \"1\"", TaskSource::Count(3))),
        owner: Some("a".into()),
        assigner: Some(service.shared_stats()),
        tasks: Some(tasks),
    };
    f.fleet.send_replace(Arc::new(FleetStatus {
        instances: BTreeMap::from([("a".to_owned(), instance(None))]),
        jobs: BTreeMap::from([(users.config.job.clone(), users)]),
    }));
    let generation = f.distributor.current("users \"1\"").unwrap().generation();
    f.book
        .accept(LoadReport::new("users \"1\"", 0, generation, vec![(SliceKey(0), 12.5)], Vec::new()).unwrap())
        .unwrap();

    let text = f.server.job_json("users \"1\"").unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let keys = |v: &serde_json::Value| v.as_object().unwrap().keys().cloned().collect::<BTreeSet<_>>();
    assert_eq!(
        keys(&json),
        ["generation", "here", "job", "owner", "tasks"].map(String::from).into(),
        "{text}"
    );
    assert_eq!(json["job"], "users \"1\"");
    assert!(json["generation"].as_u64().unwrap() >= generation, "{text}");
    assert_eq!((&json["owner"], &json["here"]), (&"a".into(), &"leading".into()), "{text}");
    let tasks = json["tasks"].as_array().unwrap();
    assert_eq!(tasks.iter().map(|t| t["task"].as_u64().unwrap()).collect::<Vec<_>>(), [0, 1, 2]);
    for t in tasks {
        assert_eq!(keys(t), ["key_share", "load", "slices", "state", "task"].map(String::from).into(), "{t}");
    }
    let states: Vec<&str> = tasks.iter().map(|t| t["state"].as_str().unwrap()).collect();
    assert_eq!(states, ["serving", "serving", "draining"]);
    // Every key is someone's: the shares sum to 1; only the report's task has a load.
    let share: f64 = tasks.iter().map(|t| t["key_share"].as_f64().unwrap()).sum();
    assert!((share - 1.0).abs() < 1e-9, "{text}");
    assert_eq!(tasks[0]["load"], 12.5, "{text}");
    assert!(tasks[1]["load"].is_null() && tasks[2]["load"].is_null(), "{text}");
    // The draining task holds nothing after the first run.
    assert_eq!(tasks[2]["slices"], 0, "{text}");
    service.stop().await;
}

#[test]
fn the_overview_lists_every_job_its_owner_and_where_its_assigner_runs() {
    let mut orders = elsewhere("orders", Some("b"));
    Arc::make_mut(&mut orders.config).drained = (0..9).collect();
    let f = fixture(vec![orders, elsewhere("lost", None), campaigning("pay <&> x")]);
    f.distributor.publish("orders", assignment(7, 2, 4));
    let page = f.server.overview();
    assert!(page.contains("<span id=\"instance\">a</span>") && page.contains("<b id=\"jobs-count\">3</b>"));
    // Instances: a link for b's pages, none for a script.
    assert!(page.contains("<a href=\"http://127.0.0.1:9999/\">"), "{page}");
    assert!(!page.contains("javascript:") && !page.contains("<script"), "{page}");
    // Each job links to its page, its name encoded in the link and escaped in the text.
    assert!(page.contains("<a href=\"/jobs/pay%20%3C%26%3E%20x\">pay &lt;&amp;&gt; x</a>"), "{page}");
    let row = |job: &str| {
        let start = page.find(&format!("<a href=\"/jobs/{job}\">")).unwrap_or_else(|| panic!("no {job}"));
        page[start..].split("</tr>").next().unwrap().to_owned()
    };
    let orders = row("orders");
    // Owned by b, linked to b's page of the job; not here; generation 7; 2 tasks; 9 drained.
    assert!(orders.contains("<a href=\"http://127.0.0.1:9999/jobs/orders\">b</a>"), "{orders}");
    let cells = "<td class=\"here\">–</td><td>7</td><td>2</td><td>9 tasks</td><td>–</td>";
    assert!(orders.contains(cells), "{orders}");
    let pay = row("pay%20%3C%26%3E%20x");
    assert!(
        pay.contains(
            "<td class=\"here\">campaigning</td><td>–</td><td>3</td><td>–</td><td>0</td><td>0</td><td>0</td>"
        ),
        "{pay}"
    );
    assert!(row("lost").contains("none alive"));
}

#[test]
fn a_job_page_derives_tasks_from_the_assignment_when_its_assigner_runs_elsewhere() {
    let mut orders = elsewhere("orders", Some("b"));
    Arc::make_mut(&mut orders.config).drained = BTreeSet::from([1, 5]);
    let f = fixture(vec![orders]);
    f.distributor.publish("orders", assignment(7, 3, 6));
    let page = f.server.job_page("orders").unwrap();
    assert!(
        page.contains("the Assigner runs on <a href=\"http://127.0.0.1:9999/jobs/orders\">b</a>"),
        "{page}"
    );
    let state = |task: u32| {
        let start = page.find(&format!(" task {task}</td>")).unwrap_or_else(|| panic!("no task {task}"));
        page[start..].split("</td>").nth(1).unwrap().trim_start_matches("<td>").to_owned()
    };
    // The assignment's tasks serve, the spec's drained ones drain (5 holds nothing).
    assert_eq!([state(0), state(1), state(2), state(5)], ["serving", "draining", "serving", "draining"]);
    assert!(page.contains("<b id=\"generation\">7</b>") && page.contains("id=\"keyspace\""), "{page}");
}

#[test]
fn requests_route_to_the_overview_job_pages_json_and_404() {
    let f = fixture(vec![elsewhere("a.json", Some("b")), elsewhere("a", Some("b"))]);
    let get = |path: &str| {
        let request = Request::get(path).body(http_body_util::Empty::<Bytes>::new()).unwrap();
        let response = f.server.respond(&request);
        let content_type = response.headers()[hyper::header::CONTENT_TYPE].to_str().unwrap().to_owned();
        (response.status(), content_type)
    };
    assert_eq!(get("/"), (StatusCode::OK, "text/html; charset=utf-8".into()));
    assert_eq!(get("/jobs/a"), (StatusCode::OK, "text/html; charset=utf-8".into()));
    assert_eq!(get("/jobs/a.json"), (StatusCode::OK, "application/json".into()));
    assert_eq!(get("/jobs/a%2Ejson"), (StatusCode::OK, "text/html; charset=utf-8".into()));
    assert_eq!(get("/jobs/a.json.json").0, StatusCode::OK);
    assert_eq!(get("/jobs/b").0, StatusCode::NOT_FOUND);
    assert_eq!(get("/jobs/b.json").0, StatusCode::NOT_FOUND);
    assert_eq!(get("/elsewhere").0, StatusCode::NOT_FOUND);
    assert_eq!(get("/metrics").0, StatusCode::OK);
}

/// 10,000 jobs (`MAX_JOBS`) of 20 tasks and 40 slices each, half of them campaigning here.
fn ten_thousand() -> Fixture {
    let jobs = (0..MAX_JOBS)
        .map(|i| {
            let name = format!("job-{i:05}");
            if i % 2 == 0 {
                campaigning(&name)
            } else {
                elsewhere(&name, Some("b"))
            }
        })
        .collect();
    let f = fixture(jobs);
    for i in 0..MAX_JOBS {
        f.distributor.publish(&format!("job-{i:05}"), assignment(3, 20, 40));
    }
    f
}

#[test]
fn ten_thousand_jobs_render_a_bounded_overview() {
    let f = ten_thousand();
    let start = Instant::now();
    let page = f.server.overview();
    let took = start.elapsed();
    eprintln!("overview of {MAX_JOBS} jobs: {} bytes in {took:?}", page.len());
    assert_eq!(page.matches("<tr").count(), MAX_JOBS + 1 + 3 + 1, "a row per job and instance");
    // About 290 bytes a row with these names: bounded by the jobs, whatever they hold.
    assert!(page.len() < 400 * MAX_JOBS, "{} bytes", page.len());
    // Debug build, on a shared 2-core machine: the bound is loose; the figure is above.
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert!(f.server.job_page("job-09999").is_some());
}

/// The value of the series `name{labels...}` in Prometheus text.
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .filter(|l| labels.iter().all(|(k, v)| l.contains(&format!("{k}=\"{v}\""))))
        .find_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse().ok()))
}

#[test]
fn fleet_metrics_label_the_assigners_running_here_and_end_with_them() {
    let f = fixture(vec![campaigning("pay"), campaigning("users"), elsewhere("orders", Some("b"))]);
    let registry = MetricsRegistry::new();
    observe_fleet(&registry.meter(), f.fleet.subscribe(), "a");
    let text = registry.render();
    for job in ["pay", "users"] {
        let labels = [("steady_job", job), ("steady_candidate", "a")];
        assert_eq!(sample(&text, "steady_assigner_runs_total", &labels), Some(0.0), "{text}");
        assert_eq!(sample(&text, "steady_assigner_leader", &labels), Some(0.0), "{text}");
        let moves = [("steady_job", job), ("steady_kind", "swapped")];
        assert_eq!(sample(&text, "steady_assigner_moves_total", &moves), Some(0.0), "{text}");
    }
    assert!(!text.contains("steady_job=\"orders\""), "no Assigner of orders here: {text}");
    assert_eq!(sample(&text, "steady_fleet_jobs", &[]), Some(3.0), "{text}");
    assert_eq!(sample(&text, "steady_fleet_instances", &[]), Some(3.0), "{text}");
    assert_eq!(sample(&text, "steady_fleet_assigners", &[("steady_state", "campaigning")]), Some(2.0));
    assert_eq!(sample(&text, "steady_fleet_assigners", &[("steady_state", "leading")]), Some(0.0));

    // users' Assigner stops here: its series end; nothing else was registered.
    f.fleet.send_modify(|fleet| {
        Arc::make_mut(fleet).jobs.get_mut("users").unwrap().assigner = None;
    });
    let text = registry.render();
    assert!(!text.contains("steady_job=\"users\""), "{text}");
    assert_eq!(sample(&text, "steady_assigner_runs_total", &[("steady_job", "pay")]), Some(0.0));
    assert_eq!(sample(&text, "steady_fleet_assigners", &[("steady_state", "campaigning")]), Some(1.0));
    assert_eq!(text.matches("# TYPE steady_assigner_runs_total counter").count(), 1);
}

#[test]
fn the_assigner_s_instruments_keep_a_fleet_s_series() {
    let registry = MetricsRegistry::new();
    let f = ten_thousand();
    observe_fleet(&registry.meter(), f.fleet.subscribe(), "a");
    let start = Instant::now();
    let text = registry.render();
    eprintln!("{MAX_JOBS} jobs, half here: a scrape of {} bytes in {:?}", text.len(), start.elapsed());
    // Half the jobs run here: every one of their series is kept, none overflows.
    assert!(!text.contains("otel_metric_overflow"), "series overflowed");
    let series = |name: &str| text.lines().filter(|l| l.starts_with(&format!("{name}{{"))).count();
    assert_eq!(series("steady_assigner_runs_total"), MAX_JOBS / 2);
    assert_eq!(series("steady_assigner_moves_total"), 7 * MAX_JOBS / 2);
    assert_eq!(series("steady_assigner_placement_violations"), 4 * MAX_JOBS / 2);
    assert_eq!(sample(&text, "steady_fleet_jobs", &[]), Some(MAX_JOBS as f64));
}

#[test]
fn the_event_log_names_each_job_and_folds_a_change_of_many_into_one() {
    let f = fixture(vec![elsewhere("orders", Some("b"))]);
    let sources = &f.server.sources;
    let look = |before: &Seen| {
        let now = Seen::read(sources);
        let changes = before.changes(&now, "a");
        (now, changes)
    };
    let seen = Seen::read(sources);
    f.fleet.send_modify(|fleet| {
        let fleet = Arc::make_mut(fleet);
        fleet.jobs.insert("users".into(), elsewhere("users", Some("a")));
        fleet.instances.remove("evil");
        fleet.instances.insert("c".into(), instance(None));
        Arc::make_mut(&mut fleet.jobs.get_mut("orders").unwrap().config).drained = BTreeSet::from([3]);
    });
    let (seen, changes) = look(&seen);
    let has = |job: Option<&str>, text: &str| changes.iter().any(|(j, t)| j.as_deref() == job && t == text);
    assert!(has(Some("users"), "job created (weighted-move, eventual)"), "{changes:?}");
    assert!(has(None, "instance c joined (gRPC at 10.0.0.1:50070)"), "{changes:?}");
    assert!(has(None, "instance evil is gone"), "{changes:?}");
    assert!(has(Some("orders"), "tasks drained: 3"), "{changes:?}");
    assert_eq!(changes.len(), 4, "{changes:?}");

    // Twelve jobs at once: one event.
    f.fleet.send_modify(|fleet| {
        let fleet = Arc::make_mut(fleet);
        for i in 0..12 {
            fleet.jobs.insert(format!("j{i:02}"), elsewhere(&format!("j{i:02}"), None));
        }
    });
    let (seen, changes) = look(&seen);
    assert_eq!(changes, [(None, "12 jobs created: j00, j01, j02, j03, j04 and 7 more".to_owned())]);
    // Nothing changed: nothing to say.
    let (_, changes) = look(&seen);
    assert!(changes.is_empty(), "{changes:?}");

    // The log keeps its last 100, and a job's page shows its own.
    for i in 0..150 {
        f.server.events.push(Some(format!("j{:02}", i % 3)), format!("event {i}"));
    }
    let all = f.server.events.all();
    assert_eq!(all.len(), 100);
    assert_eq!(all.last().unwrap().text, "event 149");
    let own = f.server.events.of("j01");
    assert_eq!(own.len(), all.iter().filter(|e| e.job.as_deref() == Some("j01")).count());
    assert!(!own.is_empty() && own.iter().all(|(_, t)| t[6..].parse::<u32>().unwrap() % 3 == 1), "{own:?}");
}
