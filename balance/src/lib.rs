//! steady's tower balancer: each frontend task keeps connections to its subset of a
//! backend job and balances requests over them.
//!
//! * **Control side** (a task of its own, off the request path): takes views of the
//!   backend job (its size and each task's address and state), computes this
//!   frontend's subset with a [`steady_subset`] algorithm (decimal Rocksteadier by
//!   default; [`BalanceConfig::with_algorithm`] pins another, such as Rocksteadier),
//!   opens and closes connections, ejects and reconnects failed backends with backoff
//!   and jitter, lets the next backends in the frontend's order stand in for them, and
//!   publishes an immutable routing table.
//! * **Request side** ([`Balance`]): a cheap-to-clone tower `Service` that reads the
//!   current table without locks and sends each request to the less loaded of two
//!   random ready members (nearly equal loads are a tie: the tie band,
//!   `docs/balancer.md#the-tie-band`). No ready member:
//!   a typed error within the request's one wait budget, never a hang.
//! * **Draining**: a backend that is draining, gone, or no longer in the subset gets
//!   no new requests from the moment the table changes; its requests in flight finish,
//!   then its connection closes.
//! * **Keyed routing** (Slicer's Clerk): with a [`KeyExtractor`] and an assignment
//!   source ([`Balance::follow_assignments`]), a request with a [`SliceKey`] goes to the
//!   replicas of its slice in the [`Assignment`] in force: a radix-indexed lookup, then
//!   power of two choices among this frontend's share of the replicas (its own
//!   Ringsteady subset of them when a slice has more than [`BalanceConfig::fan_out`]).
//!   Replicas outside the subset get on-demand *affinity* connections, bounded in number
//!   and closed when idle. When no replica is usable, [`NoReplicaPolicy`] decides:
//!   fall back to the subset, or fail with [`BalanceError::NoReplica`].
//!
//! # Layout
//!
//! The two halves are two folders: `route/` is the request side (the pick policy, the
//! endpoint and its in-flight guard, the slice table, the routing table, the response
//! future), `control/` the task that owns membership, its state in pieces (the slots with
//! their health and backoff, connection attempts, draining connections, the affinity set,
//! the assignments, the table's publisher). The request side never reaches into the
//! control task; they share only the published table and counters.
//!
//! # Dependencies
//!
//! `steady-subset`, `steady-slice` and `steady-core` (whose types it re-exports), tower, tokio and
//! arc-swap. It must never depend on tonic (that is `steady-tonic`'s job), on the server
//! side (`steady-slicer`), an assigner or an etcd client: every RPC client links this crate.
//!
//! # Example
//!
//! ```
//! use std::convert::Infallible;
//! use steady_balance::{BalanceConfig, BalanceLayer, JobView};
//! use tokio::sync::watch;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), steady_balance::BoxError> {
//! // Connecting to a task's address gives a service; here one that echoes with its address.
//! let connect = service_fn(|address: &'static str| async move {
//!     Ok::<_, Infallible>(service_fn(move |req: u32| async move { Ok::<_, Infallible>((address, req)) }))
//! });
//! // The backend job: three serving tasks. Send new views to resize or drain it.
//! let (_job, views) = watch::channel(JobView::serving(["a", "b", "c"]));
//! // Frontend task 0 keeps connections to 2 of them (its decimal Rocksteadier subset).
//! let balance = ServiceBuilder::new()
//!     .layer(BalanceLayer::new(BalanceConfig::new(0, 2), views)?)
//!     .service(connect);
//! let (_address, echoed) = balance.clone().oneshot(7).await?;
//! assert_eq!(echoed, 7);
//! assert_eq!(balance.stats().subset.len(), 2);
//! # Ok(())
//! # }
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub, rust_2018_idioms)]

mod classify;
mod config;
mod connector;
mod control;
mod error;
mod key;
mod layer;
#[cfg(feature = "metrics")]
mod metrics;
mod route;
mod service;
mod stats;

// An assignment may name any backend index the subsetting handles, and no more.
const _: () = assert!(steady_slice::MAX_TASK as usize == steady_subset::MAX_BACKENDS - 1);

pub use classify::{Classify, Outcome, Report, TransportErrors};
pub use config::{
    BalanceConfig, FailureRate, KeyedLoadBound, KeyedSpill, Load, NoReplicaPolicy, OutlierDetection,
    SlowStart, ZoneRouting, MAX_IDLE, MAX_NEIGHBOUR_STEPS, MAX_SUBSET_SIZE, MAX_WAIT,
};
pub use connector::{Address, Connector};
pub use error::{BalanceError, BoxError};
pub use key::{KeyExtractor, NoKey};
pub use layer::BalanceLayer;
pub use route::future::ResponseFuture;
pub use route::key_counts::{KeyCounts, MAX_BINS_LOG2};
pub use service::Balance;
pub use stats::{BalanceStats, MemberState, MemberStats, ZoneSpill};
// Types of other crates that the balancer's own API takes or returns, so that its users
// need no second dependency to name them: the assignments it follows and the keys it
// routes by (`steady-slice`), the job views, backoff and configuration errors it shares
// with discovery, the Slicelet and the control plane (`steady-core`).
pub use steady_core::{Backoff, ConfigError, JobView, Locality, Task, TaskState, Zone, ZoneSizes};
pub use steady_slice::{Assignment, SliceKey};
