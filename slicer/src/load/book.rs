//! [`LoadBook`]: the latest load report of every known task of every job an Assigner
//! runs, and the assignments those reports refer to.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use steady_slice::Assignment;

use steady_slicelet::LoadReport;

/// How many of a job's latest generations reports may refer to. A report for an older
/// generation is dropped: its slices are too stale to say where load is now.
const KEPT_GENERATIONS: usize = 4;

/// Why [`LoadBook::accept`] dropped a report. Every drop is counted
/// ([`LoadBook::dropped`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dropped {
    /// No Assigner here runs this job.
    UnknownJob,
    /// The job has no such task (it left, or never was).
    UnknownTask,
    /// Not one of the job's last 4 generations (too old, or never published): an older
    /// generation's slices are too stale to say where load is now.
    UnknownGeneration,
}

impl fmt::Display for Dropped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::UnknownJob => "load report for a job this Assigner does not run",
            Self::UnknownTask => "load report from a task the job does not have",
            Self::UnknownGeneration => "load report for a generation that is unknown or too old",
        })
    }
}

impl std::error::Error for Dropped {}

/// A report with when it arrived and the assignment it refers to.
#[derive(Debug, Clone)]
pub struct Received {
    /// The report.
    pub report: LoadReport,
    /// When it was accepted (tokio's clock, so that tests on a paused clock can age it).
    pub at: Instant,
    /// The assignment of the report's generation.
    pub assignment: Arc<Assignment>,
}

#[derive(Debug, Default)]
struct JobBook {
    /// The latest generations, newest last.
    published: VecDeque<Arc<Assignment>>,
    tasks: BTreeSet<u32>,
    reports: HashMap<u32, Received>,
}

/// The load reports an Assigner bases its runs on.
///
/// Shared (clone it; clones share state) between the report collector, which calls
/// [`LoadBook::accept`] for every report received, and the Assigner, which tells it
/// what it published ([`LoadBook::published`]) and reads the fresh reports back
/// ([`LoadBook::fresh`]).
///
/// **Bounded**: only the Assigner creates jobs and names their tasks; remote peers can
/// only replace the one report kept per known task, so nothing a peer sends grows it.
#[derive(Debug, Clone, Default)]
pub struct LoadBook {
    jobs: Arc<Mutex<HashMap<String, JobBook>>>,
    accepted: Arc<AtomicU64>,
    dropped: Arc<AtomicU64>,
}

impl LoadBook {
    /// An empty book.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records that `assignment` is `job`'s newest generation and `tasks` its tasks:
    /// reports for it (and the few generations before) are accepted from those tasks;
    /// kept reports of tasks no longer listed are forgotten.
    pub fn published(&self, job: &str, assignment: Arc<Assignment>, tasks: impl IntoIterator<Item = u32>) {
        let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        let book = jobs.entry(job.to_owned()).or_default();
        if book.published.back().is_none_or(|a| a.generation() < assignment.generation()) {
            book.published.push_back(assignment);
            while book.published.len() > KEPT_GENERATIONS {
                book.published.pop_front();
            }
        }
        book.tasks = tasks.into_iter().collect();
        let known = &book.tasks;
        book.reports.retain(|t, _| known.contains(t));
    }

    /// Sets `job`'s known tasks (no effect on a job not yet [`published`]): reports from
    /// tasks that joined are accepted from now on, kept reports of tasks that left are
    /// forgotten. The Assigner calls it when the task set changes without a new
    /// generation.
    ///
    /// [`published`]: LoadBook::published
    pub fn set_tasks(&self, job: &str, tasks: impl IntoIterator<Item = u32>) {
        let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(book) = jobs.get_mut(job) {
            book.tasks = tasks.into_iter().collect();
            let known = &book.tasks;
            book.reports.retain(|t, _| known.contains(t));
        }
    }

    /// Keeps `report` as its task's latest, unless it is older than the one kept.
    ///
    /// # Errors
    ///
    /// [`Dropped`] for an unknown job, task or generation (counted).
    pub fn accept(&self, report: LoadReport) -> Result<(), Dropped> {
        let result = self.try_accept(report);
        let counter = if result.is_ok() { &self.accepted } else { &self.dropped };
        counter.fetch_add(1, Ordering::Relaxed);
        result
    }

    fn try_accept(&self, report: LoadReport) -> Result<(), Dropped> {
        let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        let book = jobs.get_mut(report.job()).ok_or(Dropped::UnknownJob)?;
        if !book.tasks.contains(&report.task()) {
            return Err(Dropped::UnknownTask);
        }
        let assignment = book
            .published
            .iter()
            .find(|a| a.generation() == report.generation())
            .cloned()
            .ok_or(Dropped::UnknownGeneration)?;
        let newer =
            book.reports.get(&report.task()).is_none_or(|r| r.report.generation() <= report.generation());
        if newer {
            book.reports.insert(report.task(), Received { report, at: Instant::now(), assignment });
        }
        Ok(())
    }

    /// The reports of `job` received within `max_age`, one per task, by task.
    pub fn fresh(&self, job: &str, max_age: Duration) -> Vec<Received> {
        let jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        let Some(book) = jobs.get(job) else { return Vec::new() };
        let mut fresh: Vec<Received> =
            book.reports.values().filter(|r| r.at.elapsed() <= max_age).cloned().collect();
        fresh.sort_by_key(|r| r.report.task());
        fresh
    }

    /// Stops accepting reports for `job` and forgets it.
    pub fn forget(&self, job: &str) {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner()).remove(job);
    }

    /// Reports accepted so far.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    /// Reports dropped so far (unknown job, task or generation).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use steady_slice::SliceKey;

    use super::*;

    fn report(task: u32, generation: u64) -> LoadReport {
        LoadReport::new("job", task, generation, vec![(SliceKey(0), 5.0)], vec![]).unwrap()
    }

    #[test]
    fn reports_from_unknown_jobs_tasks_and_generations_are_dropped_and_counted() {
        let book = LoadBook::new();
        assert_eq!(book.accept(report(0, 1)), Err(Dropped::UnknownJob));
        book.published("job", Arc::new(Assignment::single(1, vec![0, 1]).unwrap()), [0, 1]);
        assert_eq!(book.accept(report(0, 1)), Ok(()));
        assert_eq!(book.accept(report(7, 1)), Err(Dropped::UnknownTask));
        assert_eq!(book.accept(report(1, 2)), Err(Dropped::UnknownGeneration));
        for g in 2..=1 + KEPT_GENERATIONS as u64 {
            book.published("job", Arc::new(Assignment::single(g, vec![0, 1]).unwrap()), [0, 1]);
        }
        // Generation 1 is now one too many back.
        assert_eq!(book.accept(report(1, 1)), Err(Dropped::UnknownGeneration));
        assert_eq!((book.accepted(), book.dropped()), (1, 4));
    }

    #[test]
    fn the_latest_report_per_task_is_kept_and_departed_tasks_are_forgotten() {
        let book = LoadBook::new();
        book.published("job", Arc::new(Assignment::single(1, vec![0, 1]).unwrap()), [0, 1]);
        book.published("job", Arc::new(Assignment::single(2, vec![0, 1]).unwrap()), [0, 1]);
        book.accept(report(0, 2)).unwrap();
        book.accept(report(0, 1)).unwrap();
        book.accept(report(1, 1)).unwrap();
        let fresh = book.fresh("job", Duration::from_secs(60));
        assert_eq!(
            fresh.iter().map(|r| (r.report.task(), r.report.generation())).collect::<Vec<_>>(),
            [(0, 2), (1, 1)]
        );
        assert_eq!(fresh[1].assignment.generation(), 1);
        book.published("job", Arc::new(Assignment::single(3, vec![0]).unwrap()), [0]);
        assert_eq!(book.fresh("job", Duration::from_secs(60)).len(), 1);
        // A task that joins without a new generation is accepted once it is known.
        assert_eq!(book.accept(report(5, 3)), Err(Dropped::UnknownTask));
        book.set_tasks("job", [0, 5]);
        assert_eq!(book.accept(report(5, 3)), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn reports_older_than_the_age_asked_for_are_not_fresh() {
        let book = LoadBook::new();
        book.published("job", Arc::new(Assignment::single(1, vec![0, 1]).unwrap()), [0, 1]);
        book.accept(report(0, 1)).unwrap();
        tokio::time::advance(Duration::from_secs(20)).await;
        book.accept(report(1, 1)).unwrap();
        tokio::time::advance(Duration::from_secs(15)).await;
        let fresh: Vec<u32> =
            book.fresh("job", Duration::from_secs(30)).iter().map(|r| r.report.task()).collect();
        assert_eq!(fresh, [1]);
    }
}
