//! steady for tonic: a balanced, slice-aware channel, and assignment distribution over
//! gRPC.
//!
//! * [`SteadyChannel`]: a channel that generated tonic clients take directly. It keeps
//!   connections to this frontend's subset of a backend job (Rocksteadier by default),
//!   balances over them, routes requests with a slice key (metadata `x-slice-key`, or a
//!   [`steady_balance::SliceKey`] request extension) to their assigned backends, and
//!   fails with `Unavailable` instead of hanging when no backend is ready.
//! * [`Distributor`] and [`watch_assignments`]: the `AssignmentDistributor.Watch` RPC of
//!   `proto/assignment.proto`, server and client. The client reconnects with backoff and
//!   the balancer keeps the last good assignment meanwhile.
//! * [`Slicelet`]: the server side: which slices a backend task holds, and a layer that
//!   counts requests for keys it does not hold (misroutes).
//!
//! The protobuf code is generated at build time with a protoc that cargo installs
//! (`protoc-bin-vendored`): a fresh machine needs nothing else.

#![deny(unsafe_code)]
#![warn(missing_docs)]

mod channel;
mod convert;
pub mod demo;
mod slicelet;
mod watch;

pub use channel::{
    MetadataKey, ResponseFuture, SteadyChannel, SteadyChannelBuilder, TaskEndpoint, DEFAULT_KEY_HEADER,
};
pub use convert::{from_proto, to_proto};
pub use slicelet::{Slicelet, SliceletLayer, SliceletService};
pub use watch::{watch_assignments, Distributor, WatchStream};

/// Generated code of `proto/assignment.proto`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto {
    tonic::include_proto!("steady.assignment.v1");
}

/// Generated code of `proto/echo.proto`: a tiny service for tests, benchmarks and the
/// demo, whose reply names the backend task that served it.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod echo {
    tonic::include_proto!("steady.echo.v1");
}
