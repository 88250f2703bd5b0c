//! Load reports: what one backend task measured of its keyed load ([`LoadReport`],
//! validated and bounded when built), and between it and its wire message
//! (`steady_proto::load::LoadReport`, version [`REPORT_VERSION`]; [`MessageError`]).
//!
//! The Slicelet builds and sends them; the Assigner's `LoadCollector` (in
//! `steady-slicer`) receives, validates and books them.

mod message;

use std::fmt;

use steady_core::valid_job_name;
#[cfg(doc)]
use steady_core::MAX_JOB_NAME_LEN;
use steady_slice::{SliceKey, MAX_TASK};

pub use message::{MessageError, REPORT_VERSION};

/// The most slices one report may list: a task holds at most this many slices at once
/// in any assignment an assigner of `steady-assigner` makes (150 per task on average;
/// a task may hold more, and a report that would list more keeps the heaviest).
pub const MAX_REPORTED_SLICES: usize = 4096;

/// The most hot keys one report may list.
pub const MAX_REPORTED_KEYS: usize = 64;

/// The highest rate a report may state, requests per second: far above any real task,
/// low enough that the rates of a whole job of reports add up to a finite total.
pub const MAX_REPORTED_RATE: f64 = 1e12;

/// One backend task's measured load, for the slices it held in one generation.
///
/// Rates are requests per second, decayed over the Slicelet's half-life. A slice's rate
/// includes its hot keys' rates; hot keys are the heaviest keys the task saw (a sketch:
/// their rates may be overestimated, never by more than the sketch's error).
#[derive(Debug, Clone, PartialEq)]
pub struct LoadReport {
    job: String,
    task: u32,
    generation: u64,
    slices: Vec<(SliceKey, f64)>,
    hot_keys: Vec<(SliceKey, f64)>,
}

/// Why a [`LoadReport`] was refused at construction (on receipt from the wire).
#[derive(Debug, Clone, PartialEq)]
pub enum ReportError {
    /// The job name is empty or longer than [`MAX_JOB_NAME_LEN`] bytes.
    InvalidJob,
    /// The task index is above `steady_slice::MAX_TASK`.
    TaskOutOfRange(u32),
    /// Generation 0 (assignments start at 1).
    ZeroGeneration,
    /// More than [`MAX_REPORTED_SLICES`] slices or [`MAX_REPORTED_KEYS`] hot keys.
    TooLong {
        /// `"slices"` or `"hot_keys"`.
        field: &'static str,
        /// How many there were.
        len: usize,
    },
    /// A rate that is negative, NaN, infinite or above [`MAX_REPORTED_RATE`].
    BadRate {
        /// The slice start or the key it was reported for.
        key: SliceKey,
        /// The rate.
        rate: f64,
    },
    /// Slices listed twice or out of order (they must be strictly ascending by start).
    Unsorted,
}

impl fmt::Display for ReportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidJob => write!(f, "load report: job name empty or too long"),
            Self::TaskOutOfRange(t) => write!(f, "load report: task {t} out of range"),
            Self::ZeroGeneration => write!(f, "load report: generation 0"),
            Self::TooLong { field, len } => write!(f, "load report: {len} {field}, over the limit"),
            Self::BadRate { key, rate } => write!(f, "load report: bad rate {rate} at {key:?}"),
            Self::Unsorted => write!(f, "load report: slices not strictly ascending"),
        }
    }
}

impl std::error::Error for ReportError {}

impl LoadReport {
    /// A report, validated.
    ///
    /// # Errors
    ///
    /// [`ReportError`] naming the first problem.
    pub fn new(
        job: impl Into<String>,
        task: u32,
        generation: u64,
        slices: Vec<(SliceKey, f64)>,
        hot_keys: Vec<(SliceKey, f64)>,
    ) -> Result<Self, ReportError> {
        let job = job.into();
        if !valid_job_name(&job) {
            return Err(ReportError::InvalidJob);
        }
        if task > MAX_TASK {
            return Err(ReportError::TaskOutOfRange(task));
        }
        if generation == 0 {
            return Err(ReportError::ZeroGeneration);
        }
        if slices.len() > MAX_REPORTED_SLICES {
            return Err(ReportError::TooLong { field: "slices", len: slices.len() });
        }
        if hot_keys.len() > MAX_REPORTED_KEYS {
            return Err(ReportError::TooLong { field: "hot_keys", len: hot_keys.len() });
        }
        for &(key, rate) in slices.iter().chain(&hot_keys) {
            if !rate.is_finite() || !(0.0..=MAX_REPORTED_RATE).contains(&rate) {
                return Err(ReportError::BadRate { key, rate });
            }
        }
        if slices.windows(2).any(|w| w[0].0 >= w[1].0) {
            return Err(ReportError::Unsorted);
        }
        Ok(Self { job, task, generation, slices, hot_keys })
    }

    /// The job.
    pub fn job(&self) -> &str {
        &self.job
    }

    /// The reporting task.
    pub fn task(&self) -> u32 {
        self.task
    }

    /// The generation whose slices the rates are for.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// `(slice start, rate)` for slices of that generation the task held, ascending.
    pub fn slices(&self) -> &[(SliceKey, f64)] {
        &self.slices
    }

    /// `(key, rate)` of the heaviest keys the task saw.
    pub fn hot_keys(&self) -> &[(SliceKey, f64)] {
        &self.hot_keys
    }

    /// The task's total rate.
    pub fn total(&self) -> f64 {
        self.slices.iter().map(|s| s.1).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_reports_are_refused_with_the_reason() {
        let ok = |s: Vec<(SliceKey, f64)>| LoadReport::new("job", 1, 3, s, vec![]);
        assert!(ok(vec![(SliceKey(0), 1.0), (SliceKey(9), 2.0)]).is_ok());
        assert_eq!(ok(vec![(SliceKey(9), 1.0), (SliceKey(9), 2.0)]), Err(ReportError::Unsorted));
        assert!(matches!(ok(vec![(SliceKey(0), f64::NAN)]), Err(ReportError::BadRate { .. })));
        assert!(matches!(ok(vec![(SliceKey(0), -1.0)]), Err(ReportError::BadRate { .. })));
        assert!(matches!(ok(vec![(SliceKey(0), 2e12)]), Err(ReportError::BadRate { .. })));
        assert_eq!(LoadReport::new("", 1, 3, vec![], vec![]), Err(ReportError::InvalidJob));
        assert_eq!(LoadReport::new("j", 1, 0, vec![], vec![]), Err(ReportError::ZeroGeneration));
        assert_eq!(
            LoadReport::new("j", MAX_TASK + 1, 1, vec![], vec![]),
            Err(ReportError::TaskOutOfRange(MAX_TASK + 1))
        );
        let many = vec![(SliceKey(1), 1.0); MAX_REPORTED_KEYS + 1];
        assert!(matches!(LoadReport::new("j", 1, 1, vec![], many), Err(ReportError::TooLong { .. })));
    }
}
