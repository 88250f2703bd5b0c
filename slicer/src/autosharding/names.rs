//! [`EndpointNames`]: what A119 clients call each task of a job.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::watch;

/// The longest endpoint name kept, in bytes: a longer one (no address is) is sent as the
/// task's index instead, so that every name fits in the smallest chunk.
pub const MAX_ENDPOINT_NAME_BYTES: usize = 256;

/// How long a generation's encoding waits for a job's names that are coming
/// ([`EndpointNames::expect`]); past it, the tasks are named by their index in it.
pub const NAMES_WAIT: Duration = Duration::from_secs(5);

/// The names A119 clients get for each job's tasks: the task's address as discovery gives
/// it (`"10.0.0.7:8080"`) where the program sets one, else the task index in decimal
/// (`"7"`). A client maps a name back to a task by its own view of the job.
///
/// Clone it freely: clones share one table, which the program keeps current (the fleet
/// sets each job's names from the discovery it follows) and every [`Autosharding`]
/// service reads.
///
/// # When a change reaches clients
///
/// Names are read when a generation is encoded (once per job, generation and set of
/// names, for every client): a client that connects after a change gets the generation
/// encoded anew with the new names, and a client already connected gets them with the
/// job's next generation (A119 sends each generation once). So a task that comes back at
/// another address under the same index, with the task set otherwise unchanged (which
/// gives the Assigner nothing to publish), keeps its old address for the clients
/// connected before, until the job's next generation (steady's own channel routes by
/// index and is not affected). Registering tasks under stable names avoids it.
///
/// [`Autosharding`]: super::Autosharding
#[derive(Debug, Clone)]
pub struct EndpointNames {
    by_job: Arc<RwLock<ByJob>>,
    /// Bumped on every change of `by_job`: what [`EndpointNames::settled`] waits on.
    changes: Arc<watch::Sender<u64>>,
}

impl Default for EndpointNames {
    fn default() -> Self {
        Self { by_job: Arc::default(), changes: Arc::new(watch::channel(0).0) }
    }
}

/// Each job's names by task, and the jobs whose names are coming.
#[derive(Debug, Default)]
struct ByJob {
    names: HashMap<String, Arc<HashMap<u32, String>>>,
    /// Jobs [`EndpointNames::expect`] named, until their names are set or removed.
    pending: HashSet<String>,
}

/// One job's names as read at one moment.
#[derive(Debug, Clone, Default)]
pub(crate) struct JobNames(Option<Arc<HashMap<u32, String>>>);

impl JobNames {
    /// Task `task`'s name: the one set, else its index in decimal.
    pub(crate) fn name(&self, task: u32) -> String {
        self.0.as_ref().and_then(|names| names.get(&task)).cloned().unwrap_or_else(|| task.to_string())
    }

    /// Whether `other` is this very snapshot: read while no [`EndpointNames::set`] that
    /// changed a name came between (both unset counts as the same).
    pub(crate) fn same(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        }
    }
}

impl EndpointNames {
    /// An empty table: every task is named by its index.
    pub fn new() -> Self {
        Self::default()
    }

    /// Names `job`'s tasks from now on as `names` says (task index, name), replacing what
    /// was set before; a task not listed is named by its index, as is one whose name is
    /// empty or longer than [`MAX_ENDPOINT_NAME_BYTES`]. Names equal to those set already
    /// change nothing (no generation is encoded anew for them).
    pub fn set(&self, job: &str, names: impl IntoIterator<Item = (u32, String)>) {
        let names: HashMap<u32, String> = names
            .into_iter()
            .filter(|(_, name)| !name.is_empty() && name.len() <= MAX_ENDPOINT_NAME_BYTES)
            .collect();
        let mut by_job = self.write();
        let settled = by_job.pending.remove(job);
        if by_job.names.get(job).is_some_and(|held| **held == names) {
            if settled {
                self.changed();
            }
            return;
        }
        by_job.names.insert(job.to_owned(), Arc::new(names));
        self.changed();
    }

    /// Says that `job`'s names are coming (its discovery is being asked): until they are
    /// [`set`](Self::set) (or [`remove`](Self::remove)d), a generation is encoded for its
    /// clients only after a wait for them (at most [`NAMES_WAIT`]), so that clients
    /// connecting meanwhile (right after an instance starts) do not get
    /// the tasks' indices for names until the job's next generation.
    pub fn expect(&self, job: &str) {
        self.write().pending.insert(job.to_owned());
    }

    /// Forgets `job`'s names: its tasks are named by their index again.
    pub fn remove(&self, job: &str) {
        let mut by_job = self.write();
        let pending = by_job.pending.remove(job);
        if by_job.names.remove(job).is_some() || pending {
            self.changed();
        }
    }

    /// Returns once `job`'s names are not coming any more (set, removed, or never
    /// expected), or after `within`, whichever is first.
    pub(crate) async fn settled(&self, job: &str, within: Duration) {
        let mut changes = self.changes.subscribe();
        let pending = || self.by_job.read().unwrap_or_else(|p| p.into_inner()).pending.contains(job);
        let wait = async {
            while pending() {
                if changes.changed().await.is_err() {
                    return;
                }
            }
        };
        let _ = tokio::time::timeout(within, wait).await;
    }

    fn changed(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// What task `task` of `job` is called now.
    pub fn name(&self, job: &str, task: u32) -> String {
        self.of(job).name(task)
    }

    /// How many jobs have names set.
    pub fn jobs(&self) -> usize {
        self.by_job.read().unwrap_or_else(|p| p.into_inner()).names.len()
    }

    /// `job`'s names now (a snapshot: later changes do not reach it).
    pub(crate) fn of(&self, job: &str) -> JobNames {
        JobNames(self.by_job.read().unwrap_or_else(|p| p.into_inner()).names.get(job).cloned())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, ByJob> {
        self.by_job.write().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_without_a_usable_name_is_named_by_its_index() {
        let names = EndpointNames::new();
        assert_eq!(names.name("users", 7), "7");
        names.set(
            "users",
            vec![
                (0, "10.0.0.1:80".to_owned()),
                (1, String::new()),
                (2, "x".repeat(MAX_ENDPOINT_NAME_BYTES + 1)),
            ],
        );
        let got: Vec<String> = (0..4).map(|t| names.name("users", t)).collect();
        assert_eq!(got, ["10.0.0.1:80", "1", "2", "3"]);
        assert_eq!(names.name("other", 0), "0", "names are per job");
    }

    #[test]
    fn a_snapshot_keeps_the_names_it_was_taken_with() {
        let names = EndpointNames::new();
        names.set("users", vec![(0, "a:1".to_owned())]);
        let before = names.of("users");
        names.set("users", vec![(0, "b:1".to_owned())]);
        assert_eq!((before.name(0), names.name("users", 0)), ("a:1".to_owned(), "b:1".to_owned()));
        names.remove("users");
        assert_eq!((names.name("users", 0), names.jobs()), ("0".to_owned(), 0));
    }

    /// Names said to be coming are waited for until they are set, or removed, or the
    /// bound passes; a job whose names are not coming is not waited for.
    #[tokio::test(start_paused = true)]
    async fn names_that_are_coming_are_waited_for_within_a_bound() {
        let names = EndpointNames::new();
        let start = tokio::time::Instant::now();
        names.settled("users", NAMES_WAIT).await;
        assert_eq!(start.elapsed(), Duration::ZERO, "nothing expected: no wait");

        names.expect("users");
        let setter = names.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            setter.set("users", vec![(0, "10.0.0.1:80".to_owned())]);
        });
        names.settled("users", NAMES_WAIT).await;
        assert_eq!(start.elapsed(), Duration::from_secs(1), "until set");
        assert_eq!(names.name("users", 0), "10.0.0.1:80");

        names.expect("orders");
        let remover = names.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(2)).await;
            remover.remove("orders");
        });
        let start = tokio::time::Instant::now();
        names.settled("orders", NAMES_WAIT).await;
        assert_eq!(start.elapsed(), Duration::from_secs(2), "until removed");

        names.expect("carts");
        let start = tokio::time::Instant::now();
        names.settled("carts", NAMES_WAIT).await;
        assert_eq!(start.elapsed(), NAMES_WAIT, "never set: the bound");
        // Names equal to none set yet still settle a pending job.
        names.set("carts", Vec::new());
        let start = tokio::time::Instant::now();
        names.settled("carts", NAMES_WAIT).await;
        assert_eq!(start.elapsed(), Duration::ZERO);
    }

    #[test]
    fn a_snapshot_is_the_same_until_a_name_changes() {
        let names = EndpointNames::new();
        let unset = names.of("users");
        assert!(unset.same(&names.of("users")), "both unset");
        names.set("users", vec![(0, "a:1".to_owned())]);
        let set = names.of("users");
        assert!(!set.same(&unset));
        names.set("users", vec![(0, "a:1".to_owned())]);
        assert!(set.same(&names.of("users")), "the same names set again change nothing");
        names.set("users", vec![(0, "a:1".to_owned()), (1, "b:1".to_owned())]);
        assert!(!set.same(&names.of("users")));
        names.remove("users");
        assert!(unset.same(&names.of("users")));
    }
}
