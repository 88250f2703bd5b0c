//! [`TaskNames`]: the tasks of a channel's job view by the names an A119 server gives
//! them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use steady_balance::JobView;
use steady_proto::autosharding::client::decimal_index;

use crate::endpoint::TaskEndpoint;

/// The tasks of the channel's latest job view by the names an A119 server may give them:
/// each task's endpoint as `host:port` and as its URI. Updated with every view (a
/// pointer copy); the lookup table is built when a name is first looked up after a
/// change, so a channel that never follows an A119 server never builds it.
#[derive(Debug, Clone, Default)]
pub(crate) struct TaskNames {
    inner: Arc<Mutex<Names>>,
}

#[derive(Debug, Default)]
struct Names {
    view: JobView<TaskEndpoint>,
    /// Built from `view` on the first lookup after it changed.
    table: Option<HashMap<String, u32>>,
}

impl TaskNames {
    /// Takes `view` as the channel's latest.
    pub(crate) fn update(&self, view: &JobView<TaskEndpoint>) {
        let mut names = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        names.view = view.clone();
        names.table = None;
    }

    /// The task named `name`: by its address in the latest view, else as a decimal
    /// index.
    pub(crate) fn task(&self, name: &str) -> Option<u32> {
        let mut names = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let Names { view, table } = &mut *names;
        let table = table.get_or_insert_with(|| by_name(view));
        table.get(name).copied().or_else(|| decimal_index(name))
    }
}

/// Every task of `view` (inside its size) under each of its names.
fn by_name(view: &JobView<TaskEndpoint>) -> HashMap<String, u32> {
    let mut table = HashMap::new();
    for (&index, task) in view.tasks.range(..view.size) {
        let Ok(index) = u32::try_from(index) else { continue };
        let uri = task.address.0.uri();
        if let Some(authority) = uri.authority() {
            table.insert(authority.as_str().to_owned(), index);
        }
        let whole = uri.to_string();
        table.insert(whole.trim_end_matches('/').to_owned(), index);
        table.insert(whole, index);
    }
    table
}

#[cfg(test)]
mod tests {
    use tonic::transport::Endpoint;

    use super::*;

    #[test]
    fn a_task_is_named_by_its_address_or_its_index() {
        let names = TaskNames::default();
        let endpoints = ["http://10.0.0.1:50051", "http://backend-b:7000"]
            .map(|uri| TaskEndpoint(Endpoint::from_static(uri)));
        names.update(&JobView::serving(endpoints));
        assert_eq!(names.task("10.0.0.1:50051"), Some(0));
        assert_eq!(names.task("backend-b:7000"), Some(1));
        assert_eq!(names.task("http://backend-b:7000"), Some(1));
        assert_eq!(names.task("http://backend-b:7000/"), Some(1));
        assert_eq!(names.task("17"), Some(17), "an index the view does not hold is still an index");
        assert_eq!(names.task("10.0.0.9:50051"), None);
        names.update(&JobView::serving([TaskEndpoint(Endpoint::from_static("http://10.0.0.9:50051"))]));
        assert_eq!(names.task("10.0.0.9:50051"), Some(0), "the latest view names");
        assert_eq!(names.task("10.0.0.1:50051"), None);
    }
}
