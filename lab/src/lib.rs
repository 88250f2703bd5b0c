//! steady-lab as a library: the sweeps, figures and report behind the CLI.
//!
//! The binary (`src/main.rs`) is a thin command line over these modules; the tests
//! call them directly on tiny configurations.

#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod experiments;
pub mod figures;
pub mod report;
pub mod sharding;
pub mod stats;
pub mod sweep;
