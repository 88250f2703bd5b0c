//! The types every part of steady shares, below the balancer: what a backend job looks
//! like to those who follow it, how a task retries reaching another, and how a
//! configuration value is refused.
//!
//! * [`JobView`], [`Task`], [`TaskState`]: a snapshot of a backend job (its size and
//!   each task's address, state and zone). Discovery produces them; the balancer, the
//!   Assigner service and the control plane consume them.
//! * [`Zone`], [`Locality`], [`ZoneSizes`], [`ZoneView`]: the zones a fleet spans, a
//!   task's place in them, and a job's per-zone sizes.
//! * [`Backoff`]: exponential retry delays with jitter, for reconnecting channels,
//!   watchers, load reporters and registries.
//! * [`ConfigError`]: a configuration value out of its accepted range, naming the field.
//! * [`MAX_JOB_NAME_LEN`] and [`valid_job_name`]: the bound on a job's name that every
//!   interface naming a job (Watch, load reports, stores) enforces.
//!
//! # Dependencies
//!
//! `steady-subset` only (for the frozen SplitMix64 of the jitter). This crate exists so
//! that discovery, the Slicelet and the control plane can share these types without
//! depending on the client balancer (`steady-balance`), which re-exports them.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use steady_core::{Backoff, JobView, TaskState};
//! use steady_subset::prng::SplitMix64;
//!
//! let view = JobView::serving(["10.0.0.1:80", "10.0.0.2:80"]).with_state(1, TaskState::Draining);
//! assert_eq!(view.serving_task(0), Some(&"10.0.0.1:80"));
//! assert_eq!(view.serving_task(1), None);
//!
//! let backoff = Backoff::default();
//! backoff.validate()?;
//! let delay = backoff.delay(3, &mut SplitMix64::new(7));
//! assert!(delay <= Duration::from_millis(400) && delay >= Duration::from_millis(200));
//! # Ok::<(), steady_core::ConfigError>(())
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub, rust_2018_idioms)]

mod backoff;
mod config_error;
mod error_chain;
mod job;
#[cfg(feature = "metrics")]
pub mod metrics;
mod zone;

pub use backoff::{Backoff, MAX_BACKOFF};
pub use config_error::ConfigError;
pub use error_chain::error_chain;
pub use job::{valid_job_name, JobView, Task, TaskState, MAX_JOB_NAME_LEN};
pub use zone::{Locality, Zone, ZoneError, ZoneSizes, ZoneView, MAX_ZONE_LEN};
