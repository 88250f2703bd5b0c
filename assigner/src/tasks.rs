//! [`Tasks`]: the backend tasks of a job and whether each takes keys.

use std::collections::BTreeMap;

use steady_slice::MAX_TASK;

use crate::error::AssignError;

/// What an assigner may do with a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TaskState {
    /// Takes keys.
    Serving,
    /// Still up but leaving: its slices move off it, nothing new goes to it.
    Draining,
    /// Left the job: its slices move off it. A task the previous assignment names but
    /// the task set does not list is treated the same.
    Gone,
}

/// A job's task set: task indices (at most [`MAX_TASK`]) with their [`TaskState`]s.
///
/// Built through validation (no duplicates, indices in range); a set with no serving
/// task is valid here and refused by a run ([`AssignError::NoServingTasks`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Tasks {
    states: BTreeMap<u32, TaskState>,
}

impl Tasks {
    /// Tasks with their states.
    ///
    /// # Errors
    ///
    /// [`AssignError::DuplicateTask`] for a task listed twice,
    /// [`AssignError::TaskOutOfRange`] for an index above [`MAX_TASK`].
    pub fn new(tasks: impl IntoIterator<Item = (u32, TaskState)>) -> Result<Self, AssignError> {
        let mut states = BTreeMap::new();
        for (task, state) in tasks {
            if task > MAX_TASK {
                return Err(AssignError::TaskOutOfRange { task });
            }
            if states.insert(task, state).is_some() {
                return Err(AssignError::DuplicateTask { task });
            }
        }
        Ok(Self { states })
    }

    /// Every task serving.
    ///
    /// # Errors
    ///
    /// As [`Tasks::new`].
    pub fn serving(tasks: impl IntoIterator<Item = u32>) -> Result<Self, AssignError> {
        Self::new(tasks.into_iter().map(|t| (t, TaskState::Serving)))
    }

    /// The state of `task`; [`TaskState::Gone`] when it is not listed.
    pub fn state(&self, task: u32) -> TaskState {
        self.states.get(&task).copied().unwrap_or(TaskState::Gone)
    }

    /// The serving tasks, ascending.
    pub fn serving_ids(&self) -> Vec<u32> {
        self.states.iter().filter(|(_, s)| **s == TaskState::Serving).map(|(t, _)| *t).collect()
    }

    /// Every listed task with its state, ascending.
    pub fn iter(&self) -> impl Iterator<Item = (u32, TaskState)> + '_ {
        self.states.iter().map(|(t, s)| (*t, *s))
    }
}
