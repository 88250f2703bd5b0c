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
//! * [`watch_assignments`]: the client of the `AssignmentDistributor.Watch` RPC
//!   (`steady_proto::assignment`); it reconnects with backoff, and the channel keeps the
//!   last good assignment meanwhile; a refusal that retrying cannot change
//!   (`InvalidArgument`) ends it with a [`WatchError`]. The message converts to and from
//!   [`steady_slice::Assignment`] with `From`/`TryFrom`.
//! * [`SteadyChannel::follow_autosharding`]: the channel follows an A119 server (gRPC's
//!   autosharding protocol) instead, acknowledging each assignment and reporting its
//!   keyed requests per key ([`KeyTally`]) as load on the same stream.
//!
//! [`watch_assignments`], [`WatchError`], [`AutoshardingConfig`] and
//! [`DEFAULT_KEY_HEADER`] are `steady-proto`'s, re-exported as part of the channel's
//! API (a client author follows assignments and keys requests with no second
//! dependency); the rest of the protocol is named in `steady_proto`.
//!
//! * [`hedge`]: hedging (gRFC A6) for the methods one names, each extra attempt to
//!   another member, throttled by a retry budget: [`hedge::HedgeLayer`] over the channel.
//!
//! The server side is apart: the `Slicelet` a backend links in `steady-slicelet`, the
//! `Distributor` and the rest of the control plane in `steady-slicer`.
//!
//! # Dependencies
//!
//! `steady-balance`, `steady-proto`, `steady-slice`, tonic and tokio. What a client
//! links must stay small: this crate never depends on the server side (`steady-slicelet`,
//! `steady-slicer`), the assigner, or an etcd client.
//!
//! The `call-metrics` feature adds `call_metrics`: gRPC's per-call duration histogram
//! (`grpc.client.call.duration`, by method, target and status) as a layer over the
//! channel; it costs per call, unlike the channel's own instruments (feature `metrics`).

#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub, rust_2018_idioms)]

mod autosharding;
#[cfg(feature = "call-metrics")]
pub mod call_metrics;
mod channel;
mod classify;
mod endpoint;
mod health;
pub mod hedge;
mod key_tally;
mod replay;
mod task_names;
mod template;

#[cfg(feature = "call-metrics")]
pub use call_metrics::{CallMetrics, CallMetricsLayer};
pub use channel::{
    MemberChannel, MetadataKey, ResponseFuture, SteadyChannel, SteadyChannelBuilder, MOVED_WAIT,
    TAKEOVER_WAIT,
};
pub use classify::{GrpcClassifier, DEFAULT_FAULTS};
pub use endpoint::TaskEndpoint;
pub use key_tally::{KeyTally, DEFAULT_TALLY_KEYS, MAX_TALLY_KEYS};
pub use replay::MAX_REPLAY_BYTES;
pub use template::{ConnectError, EndpointTemplate, TemplateError};

// Part of the channel's API for a client author: the Watch client a channel follows, its
// error, how it follows an A119 server, and the metadata a request's slice key travels in
// (all `steady-proto`'s).
pub use steady_proto::autosharding::AutoshardingConfig;
pub use steady_proto::{watch_assignments, WatchError, DEFAULT_KEY_HEADER};
