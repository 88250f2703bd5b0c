//! steady for tonic, the client side: a balanced, slice-aware channel, and the client of
//! assignment distribution over gRPC.
//!
//! * [`SteadyChannel`]: a channel that generated tonic clients take directly. It keeps
//!   connections to this frontend's subset of a backend job (decimal Rocksteadier by
//!   default; `BalanceConfig::with_algorithm` pins another, such as Rocksteadier),
//!   balances over them, routes requests with a slice key (metadata `x-slice-key`, or a
//!   [`steady_slice::SliceKey`] request extension) to their assigned backends, and
//!   fails with `Unavailable` instead of hanging when no backend is ready. A call whose
//!   backend's connection could not be made (nothing was sent) moves to another member.
//! * [`watch_assignments`]: the client of the `AssignmentDistributor.Watch` RPC of
//!   `proto/assignment.proto` ([`proto`]); it reconnects with backoff, and the channel
//!   keeps the last good assignment meanwhile; a refusal that retrying cannot change
//!   (`InvalidArgument`) ends it with a [`WatchError`]. The message converts to and from
//!   [`steady_slice::Assignment`] with `From`/`TryFrom`.
//! * [`load_proto`]: the generated code of `proto/load.proto`, the stream on which
//!   backend tasks report their load.
//!
//! The protocol and the Watch client are `steady-proto`'s, re-exported here. The server
//! side is apart: the `Slicelet` a backend links in `steady-slicelet`, the `Distributor`
//! and the rest of the control plane in `steady-slicer`.
//!
//! # Dependencies
//!
//! `steady-balance`, `steady-proto`, `steady-slice`, tonic and tokio. What a client
//! links must stay small: this crate never depends on the server side (`steady-slicelet`,
//! `steady-slicer`), the assigner, or an etcd client.
//!
//! The `call-metrics` feature adds [`call_metrics`]: gRPC's per-call duration histogram
//! (`grpc.client.call.duration`, by method, target and status) as a layer over the
//! channel; it costs per call, unlike the channel's own instruments (feature `metrics`).
//!
//! The `demo` feature (off by default, not a stable API) adds `demo`: the echo
//! backend and latency percentile that the lab and the benchmarks share.

#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub, rust_2018_idioms)]

#[cfg(feature = "call-metrics")]
pub mod call_metrics;
mod channel;
mod classify;
#[cfg(feature = "demo")]
pub mod demo;
mod endpoint;
mod health;
mod replay;
mod template;

#[cfg(feature = "call-metrics")]
pub use call_metrics::{CallMetrics, CallMetricsLayer};
pub use channel::{
    MemberChannel, MetadataKey, ResponseFuture, SteadyChannel, SteadyChannelBuilder, MOVED_WAIT,
};
pub use classify::{GrpcClassifier, DEFAULT_FAULTS};
pub use endpoint::TaskEndpoint;
pub use replay::MAX_REPLAY_BYTES;
pub use template::{ConnectError, EndpointTemplate, TemplateError};

// The protocol is `steady-proto`'s, shared with the Slicelet and the control plane;
// re-exported under the names it had here.
#[allow(deprecated)]
pub use steady_proto::{from_proto, to_proto};
pub use steady_proto::{watch_assignments, WatchError, DEFAULT_KEY_HEADER};

/// Generated code of `proto/assignment.proto` (`steady_proto::assignment`).
pub use steady_proto::assignment as proto;
/// Generated code of `proto/echo.proto` (`steady_proto::echo`): not a stable API.
pub use steady_proto::echo;
/// Generated code of `proto/load.proto` (`steady_proto::load`).
pub use steady_proto::load as load_proto;
