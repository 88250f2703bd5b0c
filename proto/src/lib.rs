//! steady's gRPC protocol, shared by the client channel, the backends' Slicelets and the
//! control plane, so that none of them has to depend on another for it.
//!
//! * [`assignment`]: `AssignmentDistributor.Watch` (`proto/assignment.proto`, package
//!   `steady.assignment.v1`): a watcher names a job and the newest generation it holds,
//!   and receives every newer assignment. The message converts to and from
//!   [`steady_slice::Assignment`] with `From`/`TryFrom` (the `TryFrom` validates), and
//!   its bytes are written and read without prost's structs in between by
//!   [`encode_update`] and [`decode_update`] (what the Distributor and the Watch client
//!   use: decoding takes at most 4 times the message, see [`decode_update`]).
//! * [`watch_assignments`]: the client of that RPC, reconnecting with backoff, ending
//!   only on a refusal that retrying cannot change ([`WatchError`]).
//! * [`load`]: `LoadCollector.Report` (`proto/load.proto`, package `steady.load.v1`), the
//!   stream on which backend tasks report their keyed load to the Assigner.
//! * [`autosharding`]: gRPC's autosharding protocol (gRFC A119,
//!   `google.cloud.autosharding.v1`), the open counterpart of the Watch and the load
//!   reports: its messages, how steady's key space maps onto its byte keys, assignments as
//!   chunks and back, and load per key range.
//! * [`DEFAULT_KEY_HEADER`]: the request metadata a slice key travels in.
//! * `tls` (feature `tls`): TLS whose certificates rotate while serving and connecting:
//!   a replaceable server certificate and client CA bundle (a rustls resolver and
//!   verifier), a listener of TLS connections for tonic's `serve_with_incoming`, and a
//!   replaceable client configuration read at each connection.
//!
//! The wire formats are contracts: fields are only ever added, and a message a newer
//! sender adds fields to still decodes here.
//!
//! # Dependencies
//!
//! `steady-slice`, `steady-core`, tonic, prost and tokio; with `tls`, tonic's rustls on
//! ring, the tokio-rustls it uses, and arc-swap. The protobuf code is generated
//! at build time with a protoc that cargo installs (`protoc-bin-vendored`): a fresh
//! machine needs nothing else.

#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub, rust_2018_idioms)]

pub mod autosharding;
mod convert;
mod encoded;
#[cfg(feature = "tls")]
pub mod tls;
mod update;
mod watch;

pub use encoded::{EncodedWatch, EncodedWatchServer, EncodedWatchStream};
pub use update::{decode_update, encode_update, UpdateError};
pub use watch::{watch_assignments, watch_assignments_any, WatchEndpoint, WatchError};

/// The metadata key a request's slice key is read from by default, by the client
/// channel (`steady_tonic::SteadyChannel`) and by the backends' Slicelets alike: the key
/// as text, hashed with `steady_slice::SliceKey::of` on both sides.
pub const DEFAULT_KEY_HEADER: &str = "x-slice-key";

/// Request metadata: the generation of the assignment the client routed a keyed request
/// by (decimal). A backend that is behind the client serves the request whatever it
/// holds: the client knows better. Sent by `steady_tonic::SteadyChannel`.
pub const GENERATION_HEADER: &str = "x-steady-generation";

/// Response metadata of a keyed request refused because its key moved: the generation
/// of the backend's assignment (decimal), which no longer gives it the key. The status is
/// `FAILED_PRECONDITION`; a client routes again once its assignment is at least that
/// generation (`steady_tonic::SteadyChannel` does, once).
pub const MOVED_HEADER: &str = "x-steady-moved";

/// Request metadata: how many times a backend already forwarded this request to the
/// key's owner. A forwarded request is never forwarded again.
pub const FORWARDED_HEADER: &str = "x-steady-forwarded";

/// Generated code of `proto/assignment.proto` (package `steady.assignment.v1`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod assignment {
    tonic::include_proto!("steady.assignment.v1");
}

/// Generated code of `proto/load.proto` (package `steady.load.v1`): the
/// `LoadCollector.Report` stream on which backend tasks report their keyed load to the
/// Assigner. The report's validated form and its conversions are in `steady-slicelet`;
/// the server in `steady-slicer`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod load {
    tonic::include_proto!("steady.load.v1");
}
