//! Where a steady frontend gets its backends and its own index (DESIGN §7).
//!
//! Rocksteadier needs each frontend to know its index `m` in `0..M` and each backend
//! task's index in `0..N`. This crate provides both, so that nobody numbers tasks by hand:
//!
//! * **Job views** ([`Discovery`]): a `watch` of [`JobView`]s of `host:port` addresses,
//!   which `steady_tonic::SteadyChannelBuilder::from_addresses` (and the balancer) take:
//!   * [`Discovery::fixed`]: a static list;
//!   * [`dns`] (feature `dns`): a name re-resolved on a period, indices from
//!     StatefulSet-style ordinals in host names;
//!   * [`registry`] (feature `etcd`): tasks registered under
//!     `/steady/jobs/<job>/tasks/<index>` with a lease, the view following the prefix.
//! * **Task identity** ([`identity`]): from an explicit value, an environment variable,
//!   a StatefulSet hostname ordinal, or (feature `etcd`) the lowest free index of the
//!   job taken under a lease; with none of them, a random index for random subsetting
//!   (gRFC A68) with a warning.
//!
//! # Dependencies
//!
//! `steady-balance` (for [`JobView`]), tokio, and optionally an etcd client and a DNS
//! resolver. The balancer and the channel never depend on this crate: they take the
//! views it produces.

#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub, rust_2018_idioms)]

#[cfg(feature = "dns")]
pub mod dns;
pub mod identity;
#[cfg(feature = "etcd")]
pub mod registry;
mod source;

pub use source::Discovery;
pub use steady_balance::{JobView, Task, TaskState};
