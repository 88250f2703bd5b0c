//! The Assigner service: publishes, rebalances on reports, reacts to task-set changes at
//! once within its rate limit, publishes nothing unchanged, and hands over to a standby
//! (in memory and on a real etcd).

use std::sync::Arc;
use std::time::{Duration, Instant};

use steady_assigner::{by_name, Assigner, Assignment, SliceKey, TaskState, Tasks};
use steady_slicelet::LoadReport;
use steady_slicer::assigner_service::{AssignerConfig, AssignerConfigError, AssignerHandle, AssignerService};
use steady_slicer::load::LoadBook;
use steady_slicer::store::{AssignmentStore, EtcdConfig, EtcdStore, MemoryStore};
use steady_slicer::Distributor;
use steady_testing::wait::PATIENCE;
use steady_testing::{eventually_within, holds_within, Etcd};
use tokio::sync::watch;

const JOB: &str = "users";

fn config() -> AssignerConfig {
    AssignerConfig {
        cadence: Duration::from_millis(50),
        min_interval: Duration::from_millis(20),
        backoff: Duration::from_millis(20),
        ..AssignerConfig::default()
    }
}

fn weighted_move() -> Arc<dyn Assigner + Send + Sync> {
    Arc::from(by_name("weighted-move").unwrap())
}

struct Job {
    store: Arc<dyn AssignmentStore>,
    distributor: Distributor,
    book: LoadBook,
    tasks: watch::Sender<Tasks>,
}

impl Job {
    fn new(store: Arc<dyn AssignmentStore>, tasks: u32) -> Self {
        let (tx, _) = watch::channel(Tasks::serving(0..tasks).unwrap());
        Self { store, distributor: Distributor::new(), book: LoadBook::new(), tasks: tx }
    }

    /// This job's Assigner named `candidate`, configured (not yet running).
    fn service(
        &self,
        candidate: &str,
        config: AssignerConfig,
    ) -> Result<AssignerService, AssignerConfigError> {
        AssignerService::new(
            JOB,
            candidate,
            weighted_move(),
            self.store.clone(),
            self.distributor.clone(),
            self.book.clone(),
        )
        .config(config)
    }

    fn spawn(&self, candidate: &str, config: AssignerConfig) -> AssignerHandle {
        self.service(candidate, config).unwrap().spawn(self.tasks.subscribe())
    }

    /// Waits (bounded) until the Distributor holds an assignment that satisfies `test`.
    async fn until(&self, what: &str, test: impl Fn(&Assignment) -> bool) -> Assignment {
        let mut found = None;
        let held = holds_within(PATIENCE, || {
            found = self.distributor.current(JOB).filter(|a| test(a));
            found.is_some()
        })
        .await;
        assert!(
            held,
            "timed out waiting for {what}: {:?}",
            self.distributor.current(JOB).map(|a| a.generation())
        );
        found.expect("held")
    }

    /// Each task reports its slices with `rate(task)` requests per second in total.
    fn report(&self, a: &Assignment, rate: impl Fn(u32) -> f64) {
        for task in 0..64u32 {
            let mine: Vec<SliceKey> =
                a.slices().iter().filter(|s| s.replicas().contains(&task)).map(|s| s.start).collect();
            if mine.is_empty() {
                continue;
            }
            let each = rate(task) / mine.len() as f64;
            let report = LoadReport::new(
                JOB,
                task,
                a.generation(),
                mine.into_iter().map(|s| (s, each)).collect(),
                vec![],
            )
            .unwrap();
            self.book.accept(report).unwrap();
        }
    }
}

fn share_of(a: &Assignment, task: u32) -> f64 {
    (0..a.slices().len())
        .filter(|&i| a.slices()[i].replicas().contains(&task))
        .map(|i| a.range(i).fraction())
        .sum()
}

#[tokio::test]
async fn the_first_generation_is_published_and_a_hot_task_is_relieved() {
    let job = Job::new(Arc::new(MemoryStore::new()), 4);
    let _assigner = job.spawn("a", config());
    let first = job.until("the first generation", |_| true).await;
    assert_eq!(job.store.read(JOB).await.unwrap().generation(), first.generation());
    let before = share_of(&first, 0);
    // Task 0 reports four times the load of the others: keys move off it.
    job.report(&first, |t| if t == 0 { 400.0 } else { 100.0 });
    let later = job.until("a rebalanced generation", |a| a.generation() > first.generation()).await;
    assert!(share_of(&later, 0) < before, "{} !< {before}", share_of(&later, 0));
    // Reports for an unknown generation or task are dropped and counted.
    let stale = LoadReport::new(JOB, 1, later.generation() + 100, vec![], vec![]).unwrap();
    assert!(job.book.accept(stale).is_err());
    assert!(job.book.dropped() >= 1);
}

#[tokio::test]
async fn a_draining_task_loses_its_slices_at_once_and_publications_are_rate_limited() {
    let job = Job::new(Arc::new(MemoryStore::new()), 4);
    let slow = AssignerConfig {
        cadence: Duration::from_secs(3600),
        min_interval: Duration::from_millis(200),
        ..config()
    };
    let assigner = job.spawn("a", slow);
    let first = job.until("the first generation", |_| true).await;
    let changed = Instant::now();
    job.tasks.send_replace(
        Tasks::new((0..4).map(|t| (t, if t == 3 { TaskState::Draining } else { TaskState::Serving })))
            .unwrap(),
    );
    // The cadence is an hour: only the task-set change can have caused this run.
    let drained =
        job.until("task 3 drained", |a| a.slices().iter().all(|s| !s.replicas().contains(&3))).await;
    assert!(drained.generation() > first.generation());
    assert!(changed.elapsed() < Duration::from_secs(2), "{:?}", changed.elapsed());
    // Ten changes in quick succession: at most one publication per 200 ms.
    let (published, started) = (assigner.stats().published(), Instant::now());
    for round in 0..10u32 {
        let gone = round % 3;
        job.tasks.send_replace(
            Tasks::new((0..4).map(|t| (t, if t == gone { TaskState::Gone } else { TaskState::Serving })))
                .unwrap(),
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let more = assigner.stats().published() - published;
    let allowed = (started.elapsed().as_millis() / 200 + 1) as u64;
    assert!(more >= 1 && more <= allowed, "{more} publications, at most {allowed} allowed");
}

#[tokio::test]
async fn with_handover_a_drained_task_keeps_its_slices_while_their_new_owners_warm_then_switches() {
    let job = Job::new(Arc::new(MemoryStore::new()), 4);
    let warm_up = Duration::from_secs(1);
    let config = AssignerConfig { cadence: Duration::from_secs(3600), handover: Some(warm_up), ..config() };
    let assigner = job.spawn("a", config);
    let first = job.until("the first generation", |_| true).await;
    assert!(!first.has_warming(), "the first generation has nothing to hand over from");
    let changed = Instant::now();
    job.tasks.send_replace(
        Tasks::new((0..4).map(|t| (t, if t == 3 { TaskState::Draining } else { TaskState::Serving })))
            .unwrap(),
    );
    let warming = job.until("the warming step", |a| a.has_warming()).await;
    assert_eq!(warming.generation(), first.generation() + 1);
    assert_eq!(assigner.stats().handovers(), 1);
    // Every key task 3 served is still served by it, and warms on another task; keys
    // it did not serve are as they were.
    let probes: Vec<SliceKey> =
        (0..4096u64).map(|i| SliceKey(i.wrapping_mul(0x9E37_79B9_7F4A_7C15))).collect();
    for &key in &probes {
        let (before, now) = (first.slice_for(key), warming.slice_for(key));
        assert_eq!(now.replicas(), before.replicas(), "key {key}: the old owners serve until the switch");
        assert_eq!(now.warming().is_empty(), !before.replicas().contains(&3), "key {key}");
        assert!(!now.warming().contains(&3));
    }
    // The switch waits for the warm-up, which starts after the change was sent: it is
    // seen no sooner than the warm-up after that.
    let switched = job.until("the switch", |a| a.generation() > warming.generation()).await;
    assert!(
        changed.elapsed() >= warm_up,
        "switched {:?} after the change, before its {warm_up:?} warm-up",
        changed.elapsed()
    );
    assert_eq!(switched.generation(), warming.generation() + 1);
    assert!(!switched.has_warming());
    for &key in &probes {
        let (step, now) = (warming.slice_for(key), switched.slice_for(key));
        if !step.warming().is_empty() {
            assert_eq!(now.replicas(), step.warming(), "key {key}: the warmed owner takes over");
        }
        assert!(!now.replicas().contains(&3));
    }
}

#[tokio::test]
async fn a_task_set_change_during_a_warm_up_is_acted_on_right_after_the_switch() {
    let job = Job::new(Arc::new(MemoryStore::new()), 4);
    let config = AssignerConfig {
        cadence: Duration::from_secs(3600),
        handover: Some(Duration::from_millis(300)),
        ..config()
    };
    let _assigner = job.spawn("a", config);
    let first = job.until("the first generation", |_| true).await;
    let draining = |tasks: &[u32]| {
        Tasks::new(
            (0..4).map(|t| (t, if tasks.contains(&t) { TaskState::Draining } else { TaskState::Serving })),
        )
        .unwrap()
    };
    job.tasks.send_replace(draining(&[3]));
    job.until("the warming step", |a| a.generation() > first.generation() && a.has_warming()).await;
    // Task 2 drains too while task 3's slices warm: the cadence is an hour, so only the
    // change itself can move task 2's slices.
    job.tasks.send_replace(draining(&[2, 3]));
    job.until("tasks 2 and 3 moved off", |a| {
        !a.has_warming()
            && a.slices().iter().all(|s| !s.replicas().contains(&2) && !s.replicas().contains(&3))
    })
    .await;
}

#[tokio::test]
async fn a_quiet_job_publishes_nothing_new_and_a_killed_assigner_leaves_the_last_assignment() {
    let job = Job::new(Arc::new(MemoryStore::new()), 3);
    let assigner = job.spawn("a", config());
    job.until("the first generation", |_| true).await;
    // Without reports the load is uniform: after the first few runs nothing changes.
    let runs_at_least = |n: u64| {
        let stats = &assigner;
        async move {
            let ran = holds_within(PATIENCE, || stats.stats().runs() >= n).await;
            assert!(ran, "runs stopped at {}", stats.stats().runs());
        }
    };
    runs_at_least(8).await;
    let settled = assigner.stats().published();
    let runs = assigner.stats().runs();
    runs_at_least(runs + 4).await;
    assert_eq!(assigner.stats().published(), settled, "runs go on but publish nothing");
    let last = job.distributor.current(JOB).unwrap();
    assigner.kill().await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(job.distributor.current(JOB).unwrap(), last);
    assert_eq!(job.store.read(JOB).await.unwrap().generation(), last.generation());
}

#[tokio::test]
async fn a_standby_takes_over_when_the_leader_dies() {
    let job = Job::new(Arc::new(MemoryStore::new()), 4);
    let leader = job.spawn("a", config());
    let first = job.until("the first generation", |_| true).await;
    let standby = job.spawn("b", config());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!((leader.stats().terms(), standby.stats().terms()), (1, 0));
    leader.kill().await;
    // The standby leads and carries on from the stored generation.
    job.tasks.send_replace(Tasks::serving(0..5).unwrap());
    let next =
        job.until("the standby's generation", |a| a.slices().iter().any(|s| s.replicas().contains(&4))).await;
    assert!(next.generation() > first.generation());
    assert_eq!(standby.stats().terms(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_etcd_a_standby_takes_over_within_the_lease() {
    let Some(etcd) = Etcd::start() else { return };
    let ttl = Duration::from_secs(2);
    let connect = || async {
        let config =
            EtcdConfig::new([etcd.endpoint()]).lease_ttl(ttl).request_timeout(Duration::from_secs(3));
        Arc::new(EtcdStore::connect(config).await.unwrap()) as Arc<dyn AssignmentStore>
    };
    let job = Job::new(connect().await, 4);
    let leader = job.spawn("a", config());
    let first = job.until("the first generation", |_| true).await;
    // The standby runs on its own connection, as on another machine.
    let other = Job {
        store: connect().await,
        distributor: job.distributor.clone(),
        book: LoadBook::new(),
        tasks: job.tasks.clone(),
    };
    let standby = other.spawn("b", config());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(standby.stats().terms(), 0);
    let killed = Instant::now();
    leader.kill().await;
    job.tasks.send_replace(Tasks::serving(0..5).unwrap());
    let next =
        job.until("the standby's generation", |a| a.slices().iter().any(|s| s.replicas().contains(&4))).await;
    let failover = killed.elapsed();
    println!("etcd failover: the standby published {failover:?} after the leader was killed (lease {ttl:?})");
    assert!(next.generation() > first.generation());
    // The lease must lapse first (the term was not resigned), then one run. The upper
    // bound is loose (the figure printed above is the measurement): a loaded machine
    // delays the campaign, the run and the write after the lapse.
    assert!(failover >= ttl / 2 && failover < ttl + Duration::from_secs(3), "{failover:?}");
}

#[test]
fn a_configuration_that_would_spin_is_refused() {
    let job = Job::new(Arc::new(MemoryStore::new()), 2);
    let service = |config| job.service("a", config);
    let zero = AssignerConfig { cadence: Duration::ZERO, ..config() };
    assert_eq!(service(zero).unwrap_err().field, "cadence");
    let no_backoff = AssignerConfig { backoff: Duration::ZERO, ..config() };
    assert_eq!(service(no_backoff).unwrap_err().field, "backoff");
    assert!(service(config()).is_ok());
}

#[tokio::test]
async fn a_stopped_assigner_resigns_and_its_standby_leads_at_once() {
    let job = Job::new(Arc::new(MemoryStore::new()), 3);
    let leader = job.spawn("a", config());
    job.until("the first generation", |_| true).await;
    let standby = job.spawn("b", config());
    // `ended` completes when the service's task ends, not before: a supervisor awaits it.
    let (leader_ended, standby_ended) = (leader.ended(), standby.ended());
    let mut leader_ended = std::pin::pin!(leader_ended);
    assert!(
        tokio::time::timeout(Duration::from_millis(50), &mut leader_ended).await.is_err(),
        "ended while it ran"
    );
    leader.stop().await;
    tokio::time::timeout(Duration::from_secs(5), leader_ended).await.expect("ended once stopped");
    eventually_within(Duration::from_secs(5), "the standby to lead", || standby.stats().terms() > 0).await;
    assert!(standby.is_running());
    // Dropping a handle aborts its task: that ends it too.
    drop(standby);
    tokio::time::timeout(Duration::from_secs(5), standby_ended).await.expect("ended once aborted");
}

#[tokio::test]
async fn a_backend_that_drains_in_its_job_view_loses_its_slices() {
    use steady_core::{JobView, TaskState as Seen};
    let job = Job::new(Arc::new(MemoryStore::new()), 4);
    let (views, view_rx) = watch::channel(JobView::serving((0..4).map(|i| format!("10.0.0.{i}:80"))));
    let assigner =
        job.service("a", config()).unwrap().spawn(steady_slicer::assigner_service::follow_job(view_rx));
    job.until("task 2 holding slices", |a| a.slices().iter().any(|s| s.replicas().contains(&2))).await;
    views.send_modify(|v| *v = v.clone().with_state(2, Seen::Draining));
    job.until("task 2 drained", |a| a.slices().iter().all(|s| !s.replicas().contains(&2))).await;
    assert!(assigner.is_running());
}
