//! [`Discovery`]: a running source of job views.

use std::collections::BTreeMap;
use std::sync::Arc;

use steady_core::{JobView, Locality, Task, TaskState, Zone};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A source of [`JobView`]s of `host:port` addresses: follow [`Discovery::views`].
///
/// Sources that poll or watch (DNS, etcd) run a task of their own; **dropping the
/// `Discovery` stops it**, and the last view stays in force for whoever still holds a
/// receiver. A source's errors never empty the view: the last good view stays (each
/// source documents what it logs and counts).
#[derive(Debug)]
pub struct Discovery {
    views: watch::Receiver<JobView<String>>,
    task: Option<JoinHandle<()>>,
}

impl Discovery {
    /// A static job: task `i` at `addresses[i]`, all serving, never changing.
    pub fn fixed(addresses: impl IntoIterator<Item = impl Into<String>>) -> Self {
        let (_, views) = watch::channel(JobView::serving(addresses.into_iter().map(Into::into)));
        Self { views, task: None }
    }

    /// A static job in zones: task `i` at `entries[i]`'s address, all serving, never
    /// changing; its zone index is its position among the entries of its zone.
    ///
    /// ```
    /// use steady_discovery::{Discovery, Zone};
    ///
    /// let (a, b) = (Zone::new("zone-a")?, Zone::new("zone-b")?);
    /// let backends = Discovery::fixed_in_zones([
    ///     (a.clone(), "10.0.0.1:50051"), // job index 0, zone-a/0
    ///     (b.clone(), "10.0.1.1:50051"), // job index 1, zone-b/0
    ///     (a.clone(), "10.0.0.2:50051"), // job index 2, zone-a/1
    /// ]);
    /// assert_eq!(backends.current().zone_sizes().get(&a), 2);
    /// # Ok::<(), steady_discovery::ZoneError>(())
    /// ```
    pub fn fixed_in_zones(entries: impl IntoIterator<Item = (Zone, impl Into<String>)>) -> Self {
        let mut next_in_zone: BTreeMap<Zone, usize> = BTreeMap::new();
        let tasks: BTreeMap<usize, Task<String>> = entries
            .into_iter()
            .enumerate()
            .map(|(i, (zone, address))| {
                let slot = next_in_zone.entry(zone.clone()).or_insert(0);
                let locality = Locality::new(zone, *slot);
                *slot += 1;
                (i, Task::new(address.into(), TaskState::Serving).in_zone(locality))
            })
            .collect();
        let view = JobView { size: tasks.len(), tasks: Arc::new(tasks) };
        let (_, views) = watch::channel(view);
        Self { views, task: None }
    }

    /// A source whose task `task` publishes into the channel behind `views`.
    #[cfg_attr(not(any(feature = "dns", feature = "etcd")), allow(dead_code))]
    pub(crate) fn spawned(views: watch::Receiver<JobView<String>>, task: JoinHandle<()>) -> Self {
        Self { views, task: Some(task) }
    }

    /// The views: the current one at once, each change after.
    pub fn views(&self) -> watch::Receiver<JobView<String>> {
        self.views.clone()
    }

    /// The view in force now.
    pub fn current(&self) -> JobView<String> {
        self.views.borrow().clone()
    }
}

impl Drop for Discovery {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// A view of `size` tasks from `(index, address, state)` entries; indices at or above
/// `size` are ignored by the balancer, and missing ones are skipped.
#[cfg_attr(not(any(feature = "dns", feature = "etcd")), allow(dead_code))]
pub(crate) fn view_of(
    size: usize,
    tasks: impl IntoIterator<Item = (usize, String, TaskState)>,
) -> JobView<String> {
    let tasks: BTreeMap<usize, Task<String>> =
        tasks.into_iter().map(|(i, address, state)| (i, Task::new(address, state))).collect();
    JobView { size, tasks: Arc::new(tasks) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fixed_list_is_one_serving_view_by_position() {
        let d = Discovery::fixed(["10.0.0.1:80", "10.0.0.2:80"]);
        let v = d.current();
        assert_eq!(v.size, 2);
        assert_eq!(v.serving_task(1).map(String::as_str), Some("10.0.0.2:80"));
        let sparse = view_of(4, [(3, "a:1".to_owned(), TaskState::Draining)]);
        assert_eq!((sparse.size, sparse.serving_task(3)), (4, None));
        assert!(!v.has_zones());
    }

    #[test]
    fn a_zoned_fixed_list_numbers_each_zone_by_position_among_its_entries() {
        let zone = |label| Zone::new(label).unwrap();
        let d = Discovery::fixed_in_zones([
            (zone("a"), "10.0.0.1:80"),
            (zone("b"), "10.0.1.1:80"),
            (zone("a"), "10.0.0.2:80"),
            (zone("c"), "10.0.2.1:80"),
            (zone("a"), "10.0.0.3:80"),
            (zone("b"), "10.0.1.2:80"),
        ]);
        let v = d.current();
        assert_eq!(v.size, 6);
        let localities: Vec<(String, usize)> = (0..6)
            .map(|i| v.tasks[&i].locality.as_ref().map(|l| (l.zone.to_string(), l.index)).unwrap())
            .collect();
        let expected = [("a", 0), ("b", 0), ("a", 1), ("c", 0), ("a", 2), ("b", 1)];
        assert_eq!(localities, expected.map(|(z, i)| (z.to_owned(), i)));
        assert_eq!(v.serving_task(5).map(String::as_str), Some("10.0.1.2:80"));
        let sizes = v.zone_sizes();
        assert_eq!((sizes.get(&zone("a")), sizes.get(&zone("b")), sizes.get(&zone("c"))), (3, 2, 1));
        assert_eq!(v.zones()[&zone("a")].tasks.values().copied().collect::<Vec<_>>(), [0, 2, 4]);
    }
}
