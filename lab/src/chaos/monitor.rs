//! The monitors that watch the soak while the schedule runs, each on a thread of its own:
//!
//! * the **sampler** (every 50 ms): which slices of the newest assignment have no serving
//!   replica (the newest as the lab follows the store on etcd, serving as the schedule
//!   left each backend: up, not stalled, not drained); how long each publication took to
//!   reach every frontend and each running instance's Distributor; whether each running
//!   backend keeps beating and reporting load;
//! * the **prober** (every second, [`super::prober`]): each running steady-slicer
//!   instance's `/metrics` page, and every process's resident memory.
//!
//! What they see is folded into [`Observations`] as it happens (longest gaps, one lag per
//! publication): memory stays bounded over a run of any length but for one sample a
//! second per process.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use steady_core::Backoff;
use steady_proto::tls::ClientTlsSource;
use steady_proto::WatchEndpoint;
use steady_slice::Assignment;
use steady_slicer::store::{AssignmentStore, EtcdConfig, EtcdStore};
use tonic::transport::Endpoint;

use super::prober::probe;
use super::roster::{lock, Life, Roster, GRACE};
use super::Observations;

/// The assignments the store holds, as the lab follows them on etcd: the newest, and the
/// publications not yet seen by every frontend.
#[derive(Debug, Default)]
pub(super) struct Published {
    pub(super) newest: Option<Assignment>,
    /// (generation, when the lab saw it), oldest first.
    pending: VecDeque<(u64, Instant)>,
    pub(super) count: u64,
}

/// The newest assignment, shared.
pub(super) type SharedPublished = Arc<Mutex<Published>>;

/// Follows `job`'s assignment in the store on `etcd` (the backup distribution path, the
/// truth the Distributors serve) on a task of its own.
pub(super) async fn follow_store(
    etcd: &[String],
    job: &str,
) -> Result<(SharedPublished, tokio::task::JoinHandle<()>), Box<dyn std::error::Error>> {
    let store = EtcdStore::connect(EtcdConfig::new(etcd.to_vec())).await?;
    let mut watch = store.watch(job, 0)?;
    let published = SharedPublished::default();
    let shared = published.clone();
    let task = tokio::spawn(async move {
        let _store = store;
        while let Some(item) = watch.next().await {
            let Ok(assignment) = item else { continue };
            let mut p = lock(&shared);
            if p.newest.as_ref().is_none_or(|n| n.generation() < assignment.generation()) {
                p.pending.push_back((assignment.generation(), Instant::now()));
                p.count += 1;
                p.newest = Some(assignment);
            }
        }
    });
    Ok((published, task))
}

/// A task of the lab's that follows something (dropping the handle leaves it running).
pub(super) type Watcher = tokio::task::JoinHandle<()>;

/// The generation each instance's Distributor serves, as the lab watches it (0: none
/// seen yet), by instance.
pub(super) type Served = Arc<Vec<AtomicU64>>;

/// Watches each instance's Distributor at `slicers` (`http://host:port`) for `job`, as a
/// frontend would but one instance at a time, reconnecting within half a second of a
/// failure (a restarted instance is watched again at once).
pub(super) fn watch_distributors(
    slicers: &[String],
    job: &str,
    tls: Option<&ClientTlsSource>,
) -> Result<(Served, Vec<Watcher>), Box<dyn std::error::Error>> {
    let served: Served = Arc::new(slicers.iter().map(|_| AtomicU64::new(0)).collect());
    let backoff = Backoff { base: Duration::from_millis(50), max: Duration::from_millis(500), jitter: 0.5 };
    let mut tasks = Vec::new();
    for (i, slicer) in slicers.iter().enumerate() {
        let mut target = WatchEndpoint::new(Endpoint::from_shared(slicer.clone())?);
        if let Some(tls) = tls {
            target = target.tls(tls.clone());
        }
        let mut watch = Box::pin(steady_proto::watch_assignments(target, job, backoff)?);
        let served = served.clone();
        tasks.push(tokio::spawn(async move {
            while let Some(item) = watch.next().await {
                if let Ok(assignment) = item {
                    served[i].fetch_max(assignment.generation(), Ordering::Relaxed);
                }
            }
        }));
    }
    Ok((served, tasks))
}

/// What the sampler reads besides the roster: the frontends' generations.
pub(super) type Generations = Box<dyn Fn() -> Vec<u64> + Send>;

/// The running monitors; [`Monitors::stop`] ends them.
pub(super) struct Monitors {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Monitors {
    /// Starts the sampler and the prober, folding what they see into `observations`.
    pub(super) fn start(
        roster: Roster,
        published: SharedPublished,
        generations: Generations,
        served: Served,
        metrics: Vec<SocketAddr>,
        observations: Arc<Mutex<Observations>>,
        began: Instant,
    ) -> Self {
        lock(&observations).began = Some(began);
        let stop = Arc::new(AtomicBool::new(false));
        let (r, o, flag) = (roster.clone(), observations.clone(), stop.clone());
        let sampler = std::thread::spawn(move || sample(&r, &published, &generations, &served, &o, &flag));
        let flag = stop.clone();
        let prober = std::thread::spawn(move || probe(&roster, &metrics, &observations, &flag, began));
        Self { stop, threads: vec![sampler, prober] }
    }

    /// Stops the monitors and waits for them (a probe in progress ends within its
    /// timeouts).
    pub(super) fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads {
            let _ = thread.join();
        }
    }
}

/// The sampler's loop: coverage, the frontends' generations, the backends' beats and
/// reports.
fn sample(
    roster: &Roster,
    published: &SharedPublished,
    generations: &Generations,
    served: &Served,
    observations: &Mutex<Observations>,
    stop: &AtomicBool,
) {
    // Per backend: its pid, its reports count and when it last grew.
    let mut reports: BTreeMap<usize, (u32, u64, Instant)> = BTreeMap::new();
    // Per instance: since when its Distributor is behind the store.
    let mut behind: Vec<Option<Instant>> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(50));
        let now = Instant::now();
        let (members, slicers) = {
            let roster = roster.lock();
            (roster.backends.clone(), roster.slicers.clone())
        };
        let serving: Vec<u32> =
            members.iter().enumerate().filter(|(_, m)| m.serving()).map(|(i, _)| i as u32).collect();
        // The slices of the newest assignment with no serving replica, as a share of
        // the key space; the publications every frontend now routes by.
        let (uncovered, newest, resolved, waiting) = {
            let mut p = lock(published);
            let uncovered = p.newest.as_ref().map_or(0.0, |a| uncovered_share(a, &serving));
            let newest = p.newest.as_ref().map_or(0, Assignment::generation);
            let reached = generations().into_iter().min().unwrap_or(0);
            let mut resolved = Vec::new();
            while p.pending.front().is_some_and(|(g, _)| *g <= reached) {
                let (_, seen) = p.pending.pop_front().expect("checked");
                resolved.push(now - seen);
            }
            let waiting = p.pending.front().map(|(_, seen)| now - *seen);
            (uncovered, newest, resolved, waiting)
        };
        // Each running instance's Distributor (as the lab watches it) against the
        // store's newest; its status line (once a second) as its heartbeat.
        behind.resize(slicers.len(), None);
        for (i, m) in slicers.iter().enumerate() {
            if m.life != Life::Up || now - m.since < GRACE {
                behind[i] = None;
                continue;
            }
            let status_at = m.beat.map_or(m.since, |b| b.at.max(m.since));
            lock(observations).status_gap.observe(now - status_at, &m.name);
            if served.get(i).map_or(0, |g| g.load(Ordering::Relaxed)) >= newest {
                behind[i] = None;
            } else {
                let since = *behind[i].get_or_insert(now);
                lock(observations).distributor_gap.observe(now - since, &m.name);
            }
        }
        let mut o = lock(observations);
        o.uncovered.observe(uncovered > 0.0, now);
        o.uncovered_share = o.uncovered_share.max(uncovered);
        for lag in resolved {
            o.lag.push(lag);
        }
        // A publication not yet everywhere counts as late as it is now.
        if let Some(waiting) = waiting {
            o.lag_waiting = o.lag_waiting.max(waiting);
        }
        for (i, m) in members.iter().enumerate() {
            let Some(pid) = m.pid else { continue };
            if m.life != Life::Up || now - m.since < GRACE {
                continue;
            }
            let beat_at = m.beat.map_or(m.since, |b| b.at.max(m.since));
            o.beat_gap.observe(now - beat_at, &m.name);
            let count = m.beat.map_or(0, |b| b.reports);
            let entry = reports.entry(i).or_insert((pid, count, now));
            if entry.0 != pid || count > entry.1 {
                *entry = (pid, count, now);
            }
            o.report_gap.observe(now - entry.2.max(m.since), &m.name);
        }
    }
}

/// The share of the key space whose slices have no replica in `serving`.
fn uncovered_share(assignment: &Assignment, serving: &[u32]) -> f64 {
    let slices = assignment.slices();
    let mut share = 0.0;
    for (i, slice) in slices.iter().enumerate() {
        if slice.replicas().iter().any(|r| serving.contains(r)) {
            continue;
        }
        let end = slices.get(i + 1).map_or(u64::MAX as f64 + 1.0, |next| next.start.0 as f64);
        share += (end - slice.start.0 as f64) / (u64::MAX as f64 + 1.0);
    }
    share
}

#[cfg(test)]
mod tests {
    use steady_slice::{Slice, SliceKey};

    use super::*;

    #[test]
    fn a_slice_is_uncovered_when_none_of_its_replicas_serves() {
        let half = 1u64 << 63;
        let quarter = 1u64 << 62;
        let assignment = Assignment::new(
            3,
            vec![
                Slice::new(SliceKey(0), vec![0, 1]),
                Slice::new(SliceKey(half), vec![1, 2]),
                Slice::new(SliceKey(half + quarter), vec![2, 3]),
            ],
        )
        .unwrap();
        assert_eq!(uncovered_share(&assignment, &[0, 1, 2, 3]), 0.0);
        assert_eq!(uncovered_share(&assignment, &[1, 3]), 0.0);
        assert_eq!(uncovered_share(&assignment, &[0, 3]), 0.25);
        assert_eq!(uncovered_share(&assignment, &[3]), 0.75);
        assert_eq!(uncovered_share(&assignment, &[]), 1.0);
    }
}
