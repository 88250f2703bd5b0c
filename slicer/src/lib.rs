//! steady's control plane for keyed routing (Slicer's, in our words): what the operator
//! runs beside the backend jobs, as opposed to the client's channel (`steady-tonic`) and
//! the Slicelet every backend links (`steady-slicelet`).
//!
//! * [`Distributor`]: the server of `AssignmentDistributor.Watch` (the `.proto` is in
//!   `steady-proto`): holds the current assignment of each job and streams every newer
//!   one to every watcher, clients and Slicelets alike (`steady_proto::watch_assignments`).
//!   What remote watchers can make it hold is bounded: job names of at most
//!   [`MAX_JOB_NAME_LEN`](steady_core::MAX_JOB_NAME_LEN) bytes,
//!   [`Distributor::with_max_unpublished_jobs`], [`Distributor::with_max_watchers`].
//! * [`autosharding`]: gRPC's autosharding protocol (gRFC A119) served from the same
//!   Distributor: [`autosharding::Autosharding`] sends each job's assignments as chunks
//!   encoded once per generation, counts clients' acks and hands their load reports to a
//!   [`autosharding::ClientLoadSink`].
//! * [`load`]: the Assigner's side of load reports: the [`load::LoadCollector`] gRPC
//!   server the Slicelets stream to, and the bounded [`load::LoadBook`] it feeds.
//! * [`store`]: where each job's assignment lives and who may write it: the
//!   [`AssignmentStore`] trait (read with a revision, write conditioned on it and fenced
//!   by a [`Leadership`], watch, campaign), the embedded [`MemoryStore`], and
//!   [`EtcdStore`] (feature `etcd`) for Assigners on several machines.
//! * [`assigner_service`] (feature `assigner`): the Assigner service: one job's loop that
//!   campaigns in a store, runs a `steady-assigner` algorithm on the estimated load on a
//!   cadence and at once on a task-set change, and writes and distributes each new
//!   generation, rate-limited.
//! * [`specs`] (feature `assigner`): job specs as data: [`specs::JobConfig`], everything
//!   that configures one job (validated in one place, a versioned JSON document), and
//!   [`specs::SpecStore`], where the specs live (etcd beside the assignments, or a
//!   directory of files) and are managed while the control plane runs.
//! * [`fleet`] (feature `assigner`; its etcd keys with `etcd`): a fleet of instances on
//!   one etcd cluster: memberships, the live instances as they change, the operator's
//!   run requests, who leads a job.
//! * [`spread`]: which instance of a control-plane fleet is to run each job's Assigner:
//!   the jobs spread evenly over the live instances, few moved when one joins or dies
//!   (the rule; `steady-slicer-server`'s fleet applies it).
//!
//! # Dependencies and features
//!
//! `steady-slicelet` (the load report), `steady-proto`, `steady-core`, `steady-slice`,
//! tonic and tokio; never the client balancer (`steady-balance`), a command-line parser
//! or an HTTP server, which `tests/tests/layout.rs` checks. Default features `etcd` and
//! `assigner`. `etcd` brings `etcd-client` (whose build runs protoc: the workspace's
//! `.cargo/config.toml` points it at the protoc cargo fetched for `steady-proto`),
//! `assigner` brings `steady-assigner` (with its serde feature), serde and serde_json (the
//! job spec documents); `tls` serves and reports over TLS and accepts
//! reports only from the task a client certificate names; `metrics` registers
//! OpenTelemetry instruments in the application's meter.
//!
//! The `steady-slicer` binary, its status page and its Prometheus text are
//! `steady-slicer-server`'s: this crate is what a program that embeds the control plane
//! links.
//!
//! # Example
//!
//! ```no_run
//! use steady_slice::Assignment;
//! use steady_slicer::load::{LoadBook, LoadCollector};
//! use steady_slicer::Distributor;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! // The Distributor serves job "users"' assignments; the collector takes its load reports.
//! let distributor = Distributor::new();
//! distributor.publish("users", Assignment::single(1, vec![0, 1])?);
//! let book = LoadBook::new();
//! tonic::transport::Server::builder()
//!     .add_service(distributor.service())
//!     .add_service(LoadCollector::new(book).service())
//!     .serve("127.0.0.1:50051".parse()?)
//!     .await?;
//! # Ok(())
//! # }
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub, rust_2018_idioms)]

#[cfg(feature = "assigner")]
pub mod assigner_service;
pub mod autosharding;
mod distributor;
#[cfg(feature = "assigner")]
pub mod fleet;
pub mod load;
#[cfg(feature = "metrics")]
mod metrics;
#[cfg(feature = "assigner")]
pub mod specs;
pub mod spread;
pub mod store;

pub use distributor::{Distributor, DistributorServer, WatchStream};
pub use store::{AssignmentStore, Leadership, MemoryStore, StoreError};
#[cfg(feature = "etcd")]
pub use store::{EtcdConfig, EtcdStore};
