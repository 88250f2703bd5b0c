//! [`AssignError`]: why a run could not produce an assignment.

use std::fmt;

use steady_slice::{AssignmentError, SliceKey};

/// Why an assigner run failed. Every variant is a problem of the input (or of a
/// configuration), named with where it is; a run never fails on valid input except
/// with [`AssignError::GenerationExhausted`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum AssignError {
    /// No task is serving: there is nobody to assign the key space to.
    NoServingTasks,
    /// The same task listed twice in a task set.
    DuplicateTask {
        /// The task index.
        task: u32,
    },
    /// A task index above [`steady_slice::MAX_TASK`].
    TaskOutOfRange {
        /// The task index.
        task: u32,
    },
    /// A task profile with a bad field: `capacity` (not finite and above zero), `zone` or
    /// `rack` (not 1 to 63 bytes of `[A-Za-z0-9._-]`).
    BadProfile {
        /// The task index.
        task: u32,
        /// The field.
        field: &'static str,
    },
    /// A load that is negative, NaN or infinite.
    BadLoad {
        /// The key it was reported for (0 for the uniform part of a [`crate::Load`]).
        key: SliceKey,
        /// The value.
        load: f64,
    },
    /// Replica limits outside `1 <= min <= max <= MAX_REPLICAS`.
    BadReplicaLimits {
        /// The minimum asked for.
        min: usize,
        /// The maximum asked for.
        max: usize,
    },
    /// A configuration value out of its range.
    BadConfig {
        /// The field.
        field: &'static str,
        /// What it must be.
        expected: &'static str,
    },
    /// The previous assignment's generation is `u64::MAX`: no next generation exists.
    GenerationExhausted,
    /// The assigner built an invalid assignment. A bug of this crate, reported instead
    /// of a panic so a service keeps its previous assignment.
    Invalid(AssignmentError),
}

impl fmt::Display for AssignError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoServingTasks => write!(f, "no serving tasks: at least one task must be serving"),
            Self::DuplicateTask { task } => write!(f, "task {task} is listed twice"),
            Self::TaskOutOfRange { task } => {
                write!(f, "task {task} is above the largest task index {}", steady_slice::MAX_TASK)
            }
            Self::BadProfile { task, field } => match *field {
                "capacity" => write!(f, "task {task}: capacity must be finite and above zero"),
                _ => write!(f, "task {task}: {field} must be 1 to 63 bytes of [A-Za-z0-9._-]"),
            },
            Self::BadLoad { key, load } => {
                write!(f, "load {load} for key {key} is not a finite non-negative number")
            }
            Self::BadReplicaLimits { min, max } => write!(
                f,
                "replica limits min {min} max {max}: need 1 <= min <= max <= {}",
                steady_slice::MAX_REPLICAS
            ),
            Self::BadConfig { field, expected } => write!(f, "configuration {field}: must be {expected}"),
            Self::GenerationExhausted => write!(f, "the previous generation is u64::MAX: no next generation"),
            Self::Invalid(e) => write!(f, "internal error, the assigner built an invalid assignment: {e}"),
        }
    }
}

impl std::error::Error for AssignError {}
