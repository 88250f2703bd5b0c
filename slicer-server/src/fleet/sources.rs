//! Where a job's tasks come from, followed: a spec's [`TaskSource`] as the task set its
//! Assigner runs on, with the spec's drained tasks draining; and as the names A119
//! clients get for its tasks ([`name_tasks`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use steady_assigner::{TaskState, Tasks};
use steady_core::JobView;
use steady_discovery::{dns, registry, Discovery};
use steady_slicer::assigner_service::follow_job;
use steady_slicer::autosharding::EndpointNames;
use steady_slicer::specs::TaskSource;
use steady_slicer::store::EtcdAccess;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

use super::gate::Gate;
use super::{FIRST_RESTART, MAX_RESTART};

type Failure = Box<dyn std::error::Error + Send + Sync>;

/// The registries jobs' tasks are followed in: one connection per set of endpoints,
/// shared by every job that names it (a thousand jobs on one registry make one
/// connection, not a thousand, even when they all start at once: the first to ask
/// connects, the others wait for it).
#[derive(Clone, Default)]
pub(super) struct Registries {
    access: EtcdAccess,
    connected: Arc<Mutex<BTreeMap<Vec<String>, Connection>>>,
}

/// One set of endpoints' connection, made once (again after a failure).
type Connection = Arc<tokio::sync::OnceCell<registry::Registry>>;

impl std::fmt::Debug for Registries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registries").field("connected", &self.lock().keys().collect::<Vec<_>>()).finish()
    }
}

impl Registries {
    /// Registries reached with `access` (the binary's `--etcd-*` settings).
    pub(super) fn new(access: EtcdAccess) -> Self {
        Self { access, connected: Arc::default() }
    }

    async fn connect(&self, endpoints: &[String]) -> Result<registry::Registry, Failure> {
        let connection = self.lock().entry(endpoints.to_vec()).or_default().clone();
        let registry = connection
            .get_or_try_init(|| {
                let config = registry::RegistryConfig::new(endpoints.to_vec()).access(self.access.clone());
                registry::Registry::connect(config)
            })
            .await?;
        Ok(registry.clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<Vec<String>, Connection>> {
        self.connected.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A job's task set, followed: the source's view (kept alive by `_discovery`).
pub(super) struct Followed {
    pub(super) tasks: watch::Receiver<Tasks>,
    _discovery: Option<Discovery>,
    _fixed: Option<watch::Sender<Tasks>>,
}

impl Followed {
    /// A task set the program keeps itself.
    pub(super) fn given(tasks: watch::Receiver<Tasks>) -> Self {
        Self { tasks, _discovery: None, _fixed: None }
    }
}

/// Names `job`'s tasks in `names` by the addresses its registry gives, for as long as the
/// returned [`Naming`] lives (then they are named by their index again): on every
/// instance that serves the job, so that an A119 client gets addresses whichever
/// instance it follows. A source without addresses leaves them named by their index
/// (`None`): a count, and a DNS name (the spec names no port, so its answers are not the
/// tasks' endpoints; clients following the same name number the tasks alike).
///
/// The registry is followed on its own watch (on the connection every job of those
/// endpoints shares), made again with backoff (half a second, doubling to 30 s; the first
/// failure of a run of them logged) while it cannot be. The names are said to be coming
/// ([`EndpointNames::expect`]) at once: until the registry answers (or a bounded wait
/// ends), A119 clients wait for them rather than get the tasks' indices.
pub(super) fn name_tasks(
    job: &str,
    source: &TaskSource,
    registries: &Registries,
    names: &EndpointNames,
) -> Option<Naming> {
    let TaskSource::Registry { endpoints } = source else { return None };
    let (job, names, gate) = (job.to_owned(), names.clone(), Gate::default());
    names.expect(&job);
    let task = tokio::spawn({
        let (job, names, gate, endpoints, registries) =
            (job.clone(), names.clone(), gate.clone(), endpoints.clone(), registries.clone());
        async move {
            let mut delay = None;
            loop {
                if let Some(delay) = delay {
                    tokio::time::sleep(delay).await;
                }
                let discovery = async {
                    let registry = registries.connect(&endpoints).await?;
                    Ok::<_, Failure>(registry::watch_job(&registry, &job).await?)
                };
                let discovery = match discovery.await {
                    Ok(discovery) => discovery,
                    Err(error) => {
                        if delay.is_none() {
                            tracing::warn!(job, %error, "fleet: cannot follow the job's registry to name its tasks; retrying");
                        }
                        delay = Some(delay.map_or(FIRST_RESTART, |d: Duration| (d * 2).min(MAX_RESTART)));
                        continue;
                    }
                };
                let mut views = discovery.views();
                loop {
                    let Some(open) = gate.enter() else { return };
                    names.set(&job, addresses(&views.borrow_and_update()));
                    drop(open);
                    if views.changed().await.is_err() {
                        break;
                    }
                }
                // The discovery's view ended (it does not while it is held): follow anew,
                // after the first backoff.
                delay = Some(FIRST_RESTART);
            }
        }
    });
    Some(Naming { job, names, gate, task })
}

/// The task that keeps a job's endpoint names ([`name_tasks`]); the names go with it.
pub(super) struct Naming {
    job: String,
    names: EndpointNames,
    /// What the task names under: closed on drop, so no name is set after the removal.
    gate: Gate,
    task: JoinHandle<()>,
}

impl Drop for Naming {
    fn drop(&mut self) {
        self.gate.close();
        self.task.abort();
        self.names.remove(&self.job);
    }
}

/// Each task of `view` (within its size) with its address.
fn addresses(view: &JobView<String>) -> Vec<(u32, String)> {
    view.tasks
        .iter()
        .filter(|(&index, _)| index < view.size)
        .filter_map(|(&index, task)| Some((u32::try_from(index).ok()?, task.address.clone())))
        .collect()
}

/// Starts following `source` for `job`.
///
/// # Errors
///
/// The source cannot be read (a registry or a DNS name that does not answer): one line.
pub(super) async fn follow(
    job: &str,
    source: &TaskSource,
    registries: &Registries,
) -> Result<Followed, Failure> {
    let discovery = match source {
        TaskSource::Count(n) => {
            let (fixed, tasks) = watch::channel(Tasks::serving(0..*n)?);
            return Ok(Followed { tasks, _discovery: None, _fixed: Some(fixed) });
        }
        // The port is a placeholder: the Assigner needs the indices only.
        TaskSource::Dns(name) => dns::discover(dns::DnsConfig::new(name.clone(), 1))
            .await
            .map_err(|e| format!("tasks.dns {name}: {e}"))?,
        TaskSource::Registry { endpoints } => {
            let registry = registries.connect(endpoints).await.map_err(|e| format!("tasks.registry: {e}"))?;
            registry::watch_job(&registry, job).await.map_err(|e| format!("tasks.registry: {e}"))?
        }
    };
    let tasks = follow_job(discovery.views());
    Ok(Followed { tasks, _discovery: Some(discovery), _fixed: None })
}

/// `source`'s task set with every task in `drained` draining, kept current by a task
/// that ends with the returned receiver; each notification of `run_now` sends the set
/// again unchanged (an Assigner runs at once on every send).
pub(super) fn with_drained(
    mut source: watch::Receiver<Tasks>,
    mut drained: watch::Receiver<BTreeSet<u32>>,
    run_now: Arc<Notify>,
) -> watch::Receiver<Tasks> {
    let (tx, rx) = watch::channel(overlay(&source.borrow_and_update(), &drained.borrow_and_update()));
    tokio::spawn(async move {
        loop {
            tokio::select! {
                changed = source.changed() => if changed.is_err() { return },
                changed = drained.changed() => if changed.is_err() { return },
                () = run_now.notified() => {
                    tx.send_modify(|_| {});
                    continue;
                }
                () = tx.closed() => return,
            }
            let tasks = overlay(&source.borrow_and_update(), &drained.borrow_and_update());
            if tx.send(tasks).is_err() {
                return;
            }
        }
    });
    rx
}

/// `tasks` with every serving task of `drained` draining (profiles kept).
fn overlay(tasks: &Tasks, drained: &BTreeSet<u32>) -> Tasks {
    if drained.is_empty() {
        return tasks.clone();
    }
    let states = tasks.iter().map(|(task, state)| match state {
        TaskState::Serving if drained.contains(&task) => (task, TaskState::Draining),
        state => (task, state),
    });
    let mut out = Tasks::new(states).expect("the same indices as a valid task set");
    if tasks.has_profiles() {
        for (task, _) in tasks.iter() {
            out.set_profile(task, tasks.profile(task).clone()).expect("a profile the task set took");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drained_tasks_drain_and_the_others_keep_their_state() {
        let tasks =
            Tasks::new([(0, TaskState::Serving), (1, TaskState::Serving), (2, TaskState::Gone)]).unwrap();
        let drained = overlay(&tasks, &BTreeSet::from([1, 2, 7]));
        let states: Vec<_> = drained.iter().collect();
        assert_eq!(states, vec![(0, TaskState::Serving), (1, TaskState::Draining), (2, TaskState::Gone)]);
        assert_eq!(
            overlay(&tasks, &BTreeSet::new()).iter().collect::<Vec<_>>(),
            tasks.iter().collect::<Vec<_>>()
        );
    }

    #[test]
    fn tasks_are_named_by_their_address_within_the_job_s_size() {
        let mut view =
            JobView::serving(["10.0.0.1:80".to_owned(), "10.0.0.2:80".to_owned(), "10.0.0.3:80".to_owned()]);
        view.size = 2;
        assert_eq!(addresses(&view), vec![(0, "10.0.0.1:80".to_owned()), (1, "10.0.0.2:80".to_owned())]);
    }

    #[tokio::test]
    async fn a_drain_and_a_run_request_each_reach_the_assigner_s_task_set() {
        let (_source_tx, source) = watch::channel(Tasks::serving(0..3).unwrap());
        let (drained_tx, drained) = watch::channel(BTreeSet::new());
        let run_now = Arc::new(Notify::new());
        let mut tasks = with_drained(source, drained, run_now.clone());
        assert_eq!(tasks.borrow_and_update().serving_ids(), vec![0, 1, 2]);
        drained_tx.send_replace(BTreeSet::from([1]));
        tasks.changed().await.unwrap();
        assert_eq!(tasks.borrow_and_update().serving_ids(), vec![0, 2]);
        run_now.notify_one();
        tasks.changed().await.unwrap();
        assert_eq!(tasks.borrow_and_update().serving_ids(), vec![0, 2]);
    }
}
