//! The control task's status, on a paused clock: what it shows of a job changes when the
//! job changes, not at the next health check.

use std::sync::Arc;

use steady_slicer::fleet::Instance;
use steady_slicer::load::LoadBook;
use steady_slicer::specs::{JobConfig, TaskSource};
use steady_slicer::{Distributor, MemoryStore};
use tokio::time::Instant;

use super::{Fleet, FleetStatus, HEALTH_EVERY};

fn solo(jobs: Vec<JobConfig>) -> super::FleetHandle {
    let me = Instance { address: "127.0.0.1:1".into(), pages: None };
    Fleet::new("solo", me, Arc::new(MemoryStore::new()), Distributor::new(), LoadBook::new())
        .jobs(jobs)
        .on_event(|_| {})
        .spawn()
}

/// Waits (on the paused clock) until the status shows `job`'s Assigner here with its
/// task set; returns how long that took.
async fn until_shown(fleet: &super::FleetHandle, job: &str) -> std::time::Duration {
    let started = Instant::now();
    let shown =
        |s: &Arc<FleetStatus>| s.jobs.get(job).is_some_and(|j| j.assigner.is_some() && j.tasks.is_some());
    let mut status = fleet.status();
    tokio::time::timeout(HEALTH_EVERY * 30, status.wait_for(shown))
        .await
        .expect("the Assigner shown within 30 health checks")
        .expect("the control task runs");
    started.elapsed()
}

/// An Assigner that starts here is on the status (and so on the pages) as soon as it
/// runs: a page read between its start and the next health check once showed the job as
/// not run here at all, while it led and published. On this current-thread runtime the
/// control task's first passes (the specs listed, then the health check's first tick,
/// which is due at once) run before the Assigner's task does; without a wake from it, the
/// status would show it at the next tick, a second later.
#[tokio::test(start_paused = true)]
async fn an_assigner_started_here_is_shown_before_the_next_health_check() {
    let fleet = solo(vec![JobConfig::new("users", TaskSource::Count(3))]);
    let took = until_shown(&fleet, "users").await;
    assert!(took < HEALTH_EVERY, "shown {took:?} after the start; health checks are {HEALTH_EVERY:?} apart");
    fleet.stop().await;
}

/// A job removed while its Assigner here was writing a run: what that run published
/// after the removal is taken back once the Assigner has stopped, not before (the job
/// would otherwise stay in the Distributor and the book for good).
#[tokio::test]
async fn what_a_removed_job_s_assigner_published_while_stopping_is_taken_back_once_it_stopped() {
    use steady_assigner::Assignment;

    let shared = super::job::test_shared(Arc::new(MemoryStore::new()));
    let mut control = super::Control {
        shared: shared.clone(),
        jobs: Default::default(),
        instances: None,
        listed: true,
        spread: None,
        retired: Default::default(),
        resigning: Default::default(),
    };
    // The job is gone from the control task; its Assigner, stopping, published once more.
    let late = Assignment::single(3, vec![0]).unwrap();
    shared.distributor.publish("users", late.clone());
    shared.book.published("users", Arc::new(late), [0]);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let stopping = tokio::spawn(async move {
        let _ = stopped.await;
    });
    control.resigning.insert("users".into(), stopping);
    control.restart_ended();
    assert!(shared.distributor.current("users").is_some(), "taken back before its Assigner stopped");
    stop.send(()).unwrap();
    steady_testing::wait::eventually("the Assigner's task to end", || {
        control.resigning["users"].is_finished()
    })
    .await;
    control.restart_ended();
    assert!(control.resigning.is_empty());
    assert!(shared.distributor.current("users").is_none(), "the removed job is still served");
    let probe = steady_proto::autosharding::ranges::RangeRates { ranges: Vec::new(), interval: HEALTH_EVERY };
    let kept = shared.book.accept_client("users", "probe", probe);
    assert_eq!(kept, Err(steady_slicer::load::Dropped::UnknownJob), "the book still knows the removed job");
}
