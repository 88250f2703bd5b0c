//! [`Discovery`]: a running source of job views.

use std::collections::BTreeMap;
use std::sync::Arc;

use steady_core::{JobView, Task, TaskState};
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
    }
}
