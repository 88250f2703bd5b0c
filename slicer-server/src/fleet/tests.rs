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
