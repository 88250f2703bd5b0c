//! Keyed load, from the Slicelets that measure it to the Assigner that balances it.
//!
//! * [`LoadReport`]: what one backend task measured for the slices it held in one
//!   generation, and its heaviest keys; validated when built (bounded in size).
//! * [`LoadBook`]: the Assigner's side: the latest report of every known task, accepted
//!   only for the job's recent generations and known tasks (the rest is dropped and
//!   counted), read back fresh for each run.

mod book;
mod report;

pub use book::{Dropped, LoadBook, Received, KEPT_GENERATIONS};
pub use report::{LoadReport, ReportError, MAX_REPORTED_KEYS, MAX_REPORTED_SLICES};
