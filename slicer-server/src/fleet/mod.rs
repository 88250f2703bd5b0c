//! The fleet: every job in the spec store served by every instance, each job's Assigner
//! on the instance the spread names.

mod status;

pub use status::{FleetStatus, JobStatus};
