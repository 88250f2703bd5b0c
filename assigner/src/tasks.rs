//! [`Tasks`]: the backend tasks of a job, whether each takes keys, and where each sits.

use std::collections::BTreeMap;

use steady_slice::MAX_TASK;

use crate::error::AssignError;
use crate::placement::TaskProfile;

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

/// A job's task set: task indices (at most [`MAX_TASK`]) with their [`TaskState`]s and,
/// for placement, their [`TaskProfile`]s (zone, rack, capacity; the default profile
/// otherwise).
///
/// Built through validation (no duplicates, indices in range, valid profiles); a set with
/// no serving task is valid here and refused by a run ([`AssignError::NoServingTasks`]).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Tasks {
    states: BTreeMap<u32, TaskState>,
    /// Profiles other than the default, by task.
    profiles: BTreeMap<u32, TaskProfile>,
}

/// The profile of a task nobody described.
static DEFAULT_PROFILE: TaskProfile = TaskProfile { zone: None, rack: None, capacity: 1.0 };

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
        Ok(Self { states, profiles: BTreeMap::new() })
    }

    /// Every task serving.
    ///
    /// # Errors
    ///
    /// As [`Tasks::new`].
    pub fn serving(tasks: impl IntoIterator<Item = u32>) -> Result<Self, AssignError> {
        Self::new(tasks.into_iter().map(|t| (t, TaskState::Serving)))
    }

    /// With `profile` for `task` (replacing any profile it had).
    ///
    /// # Errors
    ///
    /// As [`Tasks::set_profile`].
    pub fn with_profile(mut self, task: u32, profile: TaskProfile) -> Result<Self, AssignError> {
        self.set_profile(task, profile)?;
        Ok(self)
    }

    /// Gives `task` the profile `profile` (replacing any profile it had); on error the
    /// set is unchanged.
    ///
    /// # Errors
    ///
    /// [`AssignError::TaskOutOfRange`] for a task that is not listed,
    /// [`AssignError::BadProfile`] for an invalid profile ([`TaskProfile::validate`]).
    pub fn set_profile(&mut self, task: u32, profile: TaskProfile) -> Result<(), AssignError> {
        if !self.states.contains_key(&task) {
            return Err(AssignError::TaskOutOfRange { task });
        }
        profile.validate(task)?;
        if profile == DEFAULT_PROFILE {
            self.profiles.remove(&task);
        } else {
            self.profiles.insert(task, profile);
        }
        Ok(())
    }

    /// The profile of `task`: the one given by [`Tasks::with_profile`], else the default
    /// (no zone, no rack, capacity 1).
    pub fn profile(&self, task: u32) -> &TaskProfile {
        self.profiles.get(&task).unwrap_or(&DEFAULT_PROFILE)
    }

    /// Whether any task has a profile other than the default.
    pub fn has_profiles(&self) -> bool {
        !self.profiles.is_empty()
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
