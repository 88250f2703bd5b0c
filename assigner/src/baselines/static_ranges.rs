//! [`StaticRanges`]: equal key ranges, round-robin over the serving tasks; blind to load.

use std::time::Instant;

use crate::error::AssignError;
use crate::initial;
use crate::placement::layout::Layout;
use crate::report::{finish, Outcome, RunNotes};
use crate::{serving_of, Assigner, RunInput};

/// Static sharding: `slices_per_task * n` equal ranges, the `k`-th on the `k`-th serving
/// task (mod `n`) and the next ones for extra replicas. One range per task is plain
/// range sharding; 100 per task is the static model Slicer's evaluation compares with.
/// The assignment depends only on the serving tasks, so it changes only when they do.
#[derive(Debug, Clone, PartialEq)]
pub struct StaticRanges {
    slices_per_task: usize,
}

impl StaticRanges {
    /// One range per task (`static`).
    pub fn one_per_task() -> Self {
        Self { slices_per_task: 1 }
    }

    /// Slicer's static model: 100 ranges per task (`static-100`).
    pub fn slicer_model() -> Self {
        Self { slices_per_task: initial::SLICES_PER_TASK }
    }

    /// `slices_per_task` ranges per task.
    ///
    /// # Errors
    ///
    /// [`AssignError::BadConfig`] for 0.
    pub fn new(slices_per_task: usize) -> Result<Self, AssignError> {
        if slices_per_task == 0 {
            return Err(AssignError::BadConfig { field: "slices_per_task", expected: "at least 1" });
        }
        Ok(Self { slices_per_task })
    }
}

impl Assigner for StaticRanges {
    fn name(&self) -> &'static str {
        match self.slices_per_task {
            1 => "static",
            100 => "static-100",
            _ => "static-n",
        }
    }

    fn assign(&self, input: &RunInput<'_>) -> Result<Outcome, AssignError> {
        let started = Instant::now();
        let serving = serving_of(input.tasks)?;
        let (replicas, _) = input.replicas.effective(serving.len());
        let pieces = initial::round_robin(&serving, self.slices_per_task, replicas, input.load);
        let notes = RunNotes { count_changed_ranges: true, ..RunNotes::default() };
        let layout = Layout::new(input.tasks, serving, input.placement, input.replicas);
        finish(self.name(), input, &layout, &pieces, notes, started)
    }
}
