//! The Assigner's task set from backend job views (from `steady-discovery`, say).

use steady_assigner::{TaskProfile, Tasks};
use tokio::sync::watch;

#[cfg(doc)]
use super::AssignerService;

/// The assigner's task set for a backend job view: every task of the view inside the
/// job, in its state (serving, draining, gone), in the zone the view gives it (racks and
/// capacities come from the job spec's task rules, `AssignerConfig::task_rules`). Feed
/// [`AssignerService::spawn`] from a discovery source with [`follow_job`].
pub fn tasks_of<T>(view: &steady_core::JobView<T>) -> Tasks {
    use steady_assigner::TaskState as Assigned;
    use steady_core::TaskState as Seen;
    let tasks =
        view.tasks.iter().filter(|(&i, _)| i < view.size && i <= steady_slice::MAX_TASK as usize).map(
            |(&i, t)| {
                let state = match t.state {
                    Seen::Serving => Assigned::Serving,
                    Seen::Draining => Assigned::Draining,
                    Seen::Gone => Assigned::Gone,
                };
                (i as u32, state)
            },
        );
    let mut tasks = Tasks::new(tasks).expect("a view's indices are distinct and in range");
    for (&i, t) in view.tasks.iter() {
        if let (Some(locality), true) = (&t.locality, i < view.size && i <= steady_slice::MAX_TASK as usize) {
            // A zone label valid for discovery is valid here (the same rules); were it
            // not, the task would keep no zone.
            let _ = tasks.set_profile(i as u32, TaskProfile::in_zone(locality.zone.as_str()));
        }
    }
    tasks
}

/// Follows backend job views (from `steady-discovery`, say) as the assigner's task set:
/// a task that drains in the view loses its slices at the next run, which the task-set
/// change triggers at once. The mapping task ends when `views` closes.
pub fn follow_job<T: Send + Sync + 'static>(
    mut views: watch::Receiver<steady_core::JobView<T>>,
) -> watch::Receiver<Tasks> {
    let (tx, rx) = watch::channel(tasks_of(&views.borrow_and_update()));
    tokio::spawn(async move {
        while views.changed().await.is_ok() {
            let tasks = tasks_of(&views.borrow_and_update());
            if tx.send(tasks).is_err() {
                return;
            }
        }
    });
    rx
}
