//! The server side of steady's keyed routing (Slicer's, in our words): what runs beside
//! the backend tasks and the assigner, as opposed to the client's channel.
//!
//! * [`Distributor`]: the server of `AssignmentDistributor.Watch` (the `.proto` is in
//!   `steady-tonic`): holds the current assignment of each job and streams every newer
//!   one to every watcher, clients (`steady_tonic::watch_assignments`) and slicelets
//!   alike. What remote watchers can make it hold is bounded ([`MAX_JOB_NAME_LEN`],
//!   [`MAX_UNPUBLISHED_JOBS`]).
//! * [`Slicelet`]: a backend task's view of the assignment: which slices it holds, and
//!   a server layer that counts requests for keys it does not hold (misroutes) and
//!   measures the task's keyed load (per slice, decayed, and its hot keys), which
//!   [`Slicelet::report_to`] streams to the Assigner.
//! * [`load`]: load reports, and the Assigner's side of them: the [`load::LoadCollector`]
//!   gRPC server and the [`load::LoadBook`] it feeds.
//! * [`store`]: where each job's assignment lives and who may write it: the
//!   [`AssignmentStore`] trait (read with a revision, write conditioned on it and fenced
//!   by a [`Leadership`], watch, campaign), the embedded [`MemoryStore`], and
//!   [`EtcdStore`] (feature `etcd`) for Assigners on several machines.
//! * [`load`]: the load reports Slicelets send ([`load::LoadReport`]) and the Assigner's
//!   bounded book of them ([`load::LoadBook`]).
//! * [`assigner`] (feature `assigner`, on by default): the Assigner service: one job's
//!   loop that campaigns in a store, runs a `steady-assigner` algorithm on the estimated
//!   load on a cadence and at once on a task-set change, and writes and distributes each
//!   new generation, rate-limited.
//!
//! # Dependencies
//!
//! `steady-slice` (the model), `steady-tonic` (the proto and its conversions), tonic and
//! tokio. A client that only wants the channel does not compile this crate; this crate
//! never depends on the balancer's internals. The etcd-backed store is behind the `etcd`
//! feature (on by default; `default-features = false` leaves out `etcd-client`), and the
//! channel never pulls any of this in. Building `etcd-client` runs protoc: the workspace's
//! `.cargo/config.toml` points it at the protoc cargo fetched for `steady-tonic`.
//!
//! # Example
//!
//! ```no_run
//! use steady_slice::Assignment;
//! use steady_slicer::{Distributor, Slicelet};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let distributor = Distributor::new();
//! distributor.publish("users", Assignment::single(1, vec![0, 1])?);
//! // Backend task 0 follows the same job and counts misrouted requests.
//! let slicelet = Slicelet::new(0);
//! slicelet.set_assignment(distributor.current("users").expect("published"));
//! tonic::transport::Server::builder()
//!     .layer(slicelet.layer())
//!     .add_service(distributor.service())
//!     .serve("127.0.0.1:50051".parse()?)
//!     .await?;
//! # Ok(())
//! # }
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub, rust_2018_idioms)]

#[cfg(feature = "assigner")]
pub mod assigner;
#[cfg(feature = "cli")]
pub mod cli;
mod distributor;
pub mod load;
mod slicelet;
pub mod store;

pub use distributor::{Distributor, WatchStream, MAX_JOB_NAME_LEN, MAX_UNPUBLISHED_JOBS, MAX_WATCHERS};
pub use slicelet::{
    LoadReporter, MeterConfig, MeterConfigError, Slicelet, SliceletLayer, SliceletService,
    MIN_REPORT_INTERVAL,
};
pub use store::{AssignmentStore, Leadership, MemoryStore, StoreError};
#[cfg(feature = "etcd")]
pub use store::{EtcdConfig, EtcdStore};
