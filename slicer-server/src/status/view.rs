//! What the pages read from a [`FleetStatus`] and the Distributor: where a job's
//! Assigner is ([`Here`]), its task states, and each task's row (the job's page and its
//! JSON show the same rows).

use std::collections::BTreeMap;
use std::sync::Arc;

use steady_assigner::{Assignment, TaskState, Tasks};
use steady_slicer::assigner_service::AssignerStats;
use steady_slicer::fleet::Instance;
use steady_slicer::specs::JobConfig;
use tokio::sync::watch;

use crate::fleet::{FleetStatus, JobStatus};

/// Where a job's Assigner is, as this instance sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Here {
    /// It runs here and leads the job.
    Leading,
    /// It runs here and campaigns (another instance's leads, or none yet).
    Campaigning,
    /// It does not run here.
    None,
}

impl Here {
    pub(crate) fn of(job: &JobStatus) -> Self {
        match &job.assigner {
            Some(stats) if stats.is_leading() => Self::Leading,
            Some(_) => Self::Campaigning,
            None => Self::None,
        }
    }

    /// Its name in the JSON (`leading`, `campaigning`, `none`).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Leading => "leading",
            Self::Campaigning => "campaigning",
            Self::None => "none",
        }
    }
}

/// One task's row.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Row {
    /// `None`: the assignment names it, the task set does not (gone).
    pub(crate) state: Option<TaskState>,
    /// Slices it holds a replica of.
    pub(crate) slices: usize,
    /// Of those, slices with more than one replica.
    pub(crate) replicas_shared: usize,
    /// Its share of the key space (a slice's range split evenly over its replicas).
    pub(crate) share: f64,
    /// Its latest fresh report's load (requests per second), if any.
    pub(crate) load: Option<f64>,
}

/// The task states a job's page shows: the task set its Assigner follows when it runs
/// here, else every task the assignment in force names (serving) and the spec's drained
/// tasks (draining).
pub(crate) fn task_states(job: &JobStatus, assignment: Option<&Assignment>) -> Vec<(u32, TaskState)> {
    if let Some(tasks) = &job.tasks {
        return tasks.borrow().iter().collect();
    }
    let mut states: BTreeMap<u32, TaskState> = BTreeMap::new();
    for slice in assignment.map(Assignment::slices).unwrap_or_default() {
        for &task in slice.replicas() {
            states.insert(task, TaskState::Serving);
        }
    }
    for &task in &job.config.drained {
        states.insert(task, TaskState::Draining);
    }
    states.into_iter().collect()
}

/// A row per task: every task of `tasks`, every task `assignment` names, with `loads`.
pub(crate) fn rows(
    tasks: &[(u32, TaskState)],
    assignment: Option<&Assignment>,
    loads: &[(u32, f64)],
) -> BTreeMap<u32, Row> {
    let mut rows: BTreeMap<u32, Row> = BTreeMap::new();
    for &(task, state) in tasks {
        rows.entry(task).or_default().state = Some(state);
    }
    if let Some(a) = assignment {
        for (i, slice) in a.slices().iter().enumerate() {
            let share = a.range(i).fraction() / slice.replicas().len() as f64;
            for &task in slice.replicas() {
                let row = rows.entry(task).or_default();
                row.slices += 1;
                row.share += share;
                if slice.replicas().len() > 1 {
                    row.replicas_shared += 1;
                }
            }
        }
    }
    for &(task, load) in loads {
        rows.entry(task).or_default().load = Some(load);
    }
    rows
}

/// How many tasks the overview counts for a job: the task set its Assigner follows when
/// it runs here, else the tasks the assignment in force names.
pub(crate) fn task_count(job: &JobStatus, assignment: Option<&Assignment>) -> Option<usize> {
    if let Some(tasks) = &job.tasks {
        return Some(tasks.borrow().iter().count());
    }
    let a = assignment?;
    let mut named: Vec<u32> = a.slices().iter().flat_map(|s| s.replicas().iter().copied()).collect();
    named.sort_unstable();
    named.dedup();
    Some(named.len())
}

impl FleetStatus {
    /// A fleet of one instance serving one job whose Assigner runs here: what a program
    /// that runs one job's Assigner (no fleet) shows on its pages.
    ///
    /// `name` is this instance's (the Assigner's candidate name), `record` where it
    /// serves; the job's owner is this instance.
    pub fn one_job(
        name: &str,
        record: Instance,
        config: JobConfig,
        assigner: Arc<AssignerStats>,
        tasks: watch::Receiver<Tasks>,
    ) -> Self {
        let job = JobStatus {
            config: Arc::new(config),
            owner: Some(name.to_owned()),
            assigner: Some(assigner),
            tasks: Some(tasks),
        };
        Self {
            instances: BTreeMap::from([(name.to_owned(), record)]),
            jobs: BTreeMap::from([(job.config.job.clone(), job)]),
        }
    }
}
