//! The backend job as its followers see it (the balancer, the Assigner service): its
//! size and each task's address and state; and the bound on a job's name.

use std::collections::BTreeMap;
use std::sync::Arc;

/// The longest job name any interface of steady accepts, in bytes: the Watch RPC, load
/// reports and the stores refuse longer (or empty) names, so a peer cannot make them
/// hold arbitrarily large keys.
pub const MAX_JOB_NAME_LEN: usize = 256;

/// Whether `job` is a name steady accepts: 1 to [`MAX_JOB_NAME_LEN`] bytes.
pub fn valid_job_name(job: &str) -> bool {
    (1..=MAX_JOB_NAME_LEN).contains(&job.len())
}

/// Whether a backend task should get new requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TaskState {
    /// Up and taking requests.
    Serving,
    /// Going away (planned): no new requests; requests in flight finish, then the
    /// connection closes.
    Draining,
    /// Gone: treated as draining, and it will not come back at this address.
    Gone,
}

/// One backend task: where it is and whether it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Task<T> {
    /// Where to connect (a socket address, a URI, a tonic `Endpoint`, ...).
    pub address: T,
    /// Its state.
    pub state: TaskState,
}

/// A snapshot of the backend job: its size `N` and the tasks known by index.
///
/// Each update the balancer receives is a whole new view that replaces the previous
/// one. Subsetting runs over the indices `0..size`; an index with no entry in `tasks`,
/// or one that is not [`TaskState::Serving`], is skipped and the next backend in the
/// frontend's preference order stands in for it.
///
/// The task map is shared (`Arc`): cloning a view, as every hop through a channel
/// does, costs `O(1)` whatever the job's size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobView<T> {
    /// `N`, the job size.
    pub size: usize,
    /// The tasks, by index. Entries at or above `size` are ignored.
    pub tasks: Arc<BTreeMap<usize, Task<T>>>,
}

impl<T> Default for JobView<T> {
    fn default() -> Self {
        Self { size: 0, tasks: Arc::default() }
    }
}

impl<T> JobView<T> {
    /// A job of `addresses.len()` serving tasks, task `i` at `addresses[i]`.
    pub fn serving(addresses: impl IntoIterator<Item = T>) -> Self {
        let tasks: BTreeMap<usize, Task<T>> = addresses
            .into_iter()
            .enumerate()
            .map(|(i, address)| (i, Task { address, state: TaskState::Serving }))
            .collect();
        Self { size: tasks.len(), tasks: Arc::new(tasks) }
    }

    /// The serving task at `index`, if it is inside the job and serving.
    pub fn serving_task(&self, index: usize) -> Option<&T> {
        if index >= self.size {
            return None;
        }
        self.tasks.get(&index).filter(|t| t.state == TaskState::Serving).map(|t| &t.address)
    }

    /// The address of task `index` if it is still up: serving or draining (not gone).
    pub fn live_task(&self, index: usize) -> Option<&T> {
        if index >= self.size {
            return None;
        }
        self.tasks
            .get(&index)
            .filter(|t| matches!(t.state, TaskState::Serving | TaskState::Draining))
            .map(|t| &t.address)
    }

    /// Sets task `index`'s state (no effect if the task is unknown); returns the view.
    pub fn with_state(mut self, index: usize, state: TaskState) -> Self
    where
        T: Clone,
    {
        if let Some(t) = Arc::make_mut(&mut self.tasks).get_mut(&index) {
            t.state = state;
        }
        self
    }

    /// The same tasks with the job size set to `size` (tasks at or above it are ignored).
    pub fn with_size(mut self, size: usize) -> Self {
        self.size = size;
        self
    }
}
