//! The backend job as its followers see it (the balancer, the Assigner service): its
//! size and each task's address, state and zone; and the bound on a job's name.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::zone::{Locality, Zone, ZoneSizes, ZoneView};

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

/// One backend task: where it is, whether it serves, and which zone it is in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Task<T> {
    /// Where to connect (a socket address, a URI, a tonic `Endpoint`, ...).
    pub address: T,
    /// Its state.
    pub state: TaskState,
    /// Its zone and index within the zone; `None` in a job without zones (or a record
    /// written before zones existed).
    pub locality: Option<Locality>,
}

impl<T> Task<T> {
    /// A task at `address` in `state`, in no zone.
    pub fn new(address: T, state: TaskState) -> Self {
        Self { address, state, locality: None }
    }

    /// The same task, at `locality`.
    pub fn in_zone(mut self, locality: Locality) -> Self {
        self.locality = Some(locality);
        self
    }

    /// Its zone, if it has one.
    pub fn zone(&self) -> Option<&Zone> {
        self.locality.as_ref().map(|l| &l.zone)
    }
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
            .map(|(i, address)| (i, Task::new(address, TaskState::Serving)))
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

    /// Puts task `index` at `locality` (no effect if the task is unknown); returns the view.
    pub fn with_locality(mut self, index: usize, locality: Locality) -> Self
    where
        T: Clone,
    {
        if let Some(t) = Arc::make_mut(&mut self.tasks).get_mut(&index) {
            t.locality = Some(locality);
        }
        self
    }

    /// Whether any task inside the job has a zone.
    pub fn has_zones(&self) -> bool {
        self.tasks.range(..self.size).any(|(_, t)| t.locality.is_some())
    }

    /// The zone of task `index`, if it is inside the job and has one.
    pub fn zone_of(&self, index: usize) -> Option<&Zone> {
        if index >= self.size {
            return None;
        }
        self.tasks.get(&index).and_then(Task::zone)
    }

    /// Each zone's part of the job: its size and its tasks by zone index, for the tasks
    /// inside the job that have a zone (whatever their state: like the job's own
    /// indices, a zone's are skipped, not renumbered, while a task drains).
    ///
    /// Two tasks claiming one zone index (a misconfiguration: the registry's claims
    /// never do) resolve to the lower job-wide index, so every reader agrees.
    /// `O(N log N)`: the control side computes it once per view.
    pub fn zones(&self) -> BTreeMap<Zone, ZoneView> {
        let mut zones: BTreeMap<Zone, ZoneView> = BTreeMap::new();
        for (&index, task) in self.tasks.range(..self.size) {
            let Some(locality) = &task.locality else { continue };
            let zone = zones.entry(locality.zone.clone()).or_default();
            // Ascending job-wide indices: the first holder of a zone index keeps it.
            zone.tasks.entry(locality.index).or_insert(index);
            zone.size = zone.size.max(locality.index.saturating_add(1));
        }
        zones
    }

    /// Each zone's size (`1 +` its highest zone index), for the tasks inside the job
    /// that are up (serving or draining): for a frontend job, how many frontends each
    /// zone has.
    pub fn zone_sizes(&self) -> ZoneSizes {
        let mut sizes = ZoneSizes::new();
        for (_, task) in self.tasks.range(..self.size) {
            let Some(locality) = &task.locality else { continue };
            if task.state == TaskState::Gone {
                continue;
            }
            let size = locality.index.saturating_add(1);
            if size > sizes.get(&locality.zone) {
                sizes.set(locality.zone.clone(), size);
            }
        }
        sizes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zone(label: &str) -> Zone {
        Zone::new(label).unwrap()
    }

    #[test]
    fn a_view_without_zones_has_none() {
        let view = JobView::serving(["a:1", "b:1"]);
        assert!(!view.has_zones());
        assert!(view.zones().is_empty() && view.zone_sizes().is_empty());
        assert_eq!(view.zone_of(0), None);
    }

    #[test]
    fn zone_views_map_zone_indices_to_job_indices_with_holes_kept() {
        // Job tasks 0..5: zone a holds zone indices 0, 2 (1 is a hole); zone b 0 and 1;
        // task 4 is outside the job (size 4) and not counted.
        let view = JobView::serving(["t0", "t1", "t2", "t3", "t4"])
            .with_locality(0, Locality::new(zone("a"), 0))
            .with_locality(1, Locality::new(zone("b"), 0))
            .with_locality(2, Locality::new(zone("a"), 2))
            .with_locality(3, Locality::new(zone("b"), 1))
            .with_locality(4, Locality::new(zone("b"), 9))
            .with_size(4)
            .with_state(3, TaskState::Draining);
        let zones = view.zones();
        let a = &zones[&zone("a")];
        assert_eq!((a.size, a.tasks.clone()), (3, BTreeMap::from([(0, 0), (2, 2)])));
        // A draining task keeps its zone index (skipped by subsetting, not renumbered).
        let b = &zones[&zone("b")];
        assert_eq!((b.size, b.tasks.clone()), (2, BTreeMap::from([(0, 1), (1, 3)])));
        assert_eq!(view.zone_sizes(), ZoneSizes::new().with(zone("a"), 3).with(zone("b"), 2));
        assert_eq!(view.zone_of(2), Some(&zone("a")));
        assert_eq!(view.zone_of(4), None);
    }

    #[test]
    fn two_tasks_claiming_one_zone_index_resolve_to_the_lower_job_index() {
        let view = JobView::serving(["t0", "t1"])
            .with_locality(1, Locality::new(zone("a"), 0))
            .with_locality(0, Locality::new(zone("a"), 0));
        assert_eq!(view.zones()[&zone("a")].tasks, BTreeMap::from([(0, 0)]));
    }
}
