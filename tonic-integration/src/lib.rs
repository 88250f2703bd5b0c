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
//!   backend tasks report their load (server and conversions in `steady-slicer`).
//!
//! The server side (the `Distributor`, the `Slicelet`) is in `steady-slicer`.
//!
//! # Dependencies
//!
//! `steady-balance`, `steady-slice`, tonic, prost and tokio. What a client links must
//! stay small: this crate never depends on the server side (`steady-slicer`), the
//! assigner, or an etcd client. The protobuf code is generated at build time with a
//! protoc that cargo installs (`protoc-bin-vendored`): a fresh machine needs nothing else.
//!
//! The `demo` feature (off by default, not a stable API) adds `demo`: the echo
//! backend and latency percentile that the lab and the benchmarks share.

#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub, rust_2018_idioms)]

mod channel;
mod classify;
mod convert;
#[cfg(feature = "demo")]
pub mod demo;
mod health;
mod replay;
mod watch;

pub use channel::{
    MemberChannel, MetadataKey, ResponseFuture, SteadyChannel, SteadyChannelBuilder, TaskEndpoint,
    DEFAULT_KEY_HEADER,
};
pub use classify::{GrpcClassifier, DEFAULT_FAULTS};
#[allow(deprecated)]
pub use convert::{from_proto, to_proto};
pub use replay::MAX_REPLAY_BYTES;
pub use watch::{watch_assignments, WatchError};

/// Generated code of `proto/assignment.proto`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto {
    tonic::include_proto!("steady.assignment.v1");
}

/// Generated code of `proto/load.proto` (package `steady.load.v1`): the
/// `LoadCollector.Report` stream on which backend tasks report their keyed load to the
/// Assigner. The server and the conversions to and from validated reports are in
/// `steady-slicer` (`steady_slicer::load`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod load_proto {
    tonic::include_proto!("steady.load.v1");
}

/// Generated code of `proto/echo.proto`: a tiny service for tests, benchmarks and the
/// demo, whose reply names the backend task that served it. Not a stable API.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod echo {
    tonic::include_proto!("steady.echo.v1");
}
