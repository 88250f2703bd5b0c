//! gRPC's autosharding protocol (gRFC A119): `google.cloud.autosharding.v1`, the messages
//! and the pieces of the protocol both of steady's sides share.
//!
//! A119 is the open form of what steady's own Watch and load reports do: a client opens
//! one bidirectional `AutoshardingService/WatchShardingAssignment` stream per target,
//! names itself first ([`v1::InitialClientConfig`]), then receives the server's
//! [`v1::LoadReportingConfig`] and every assignment as chunks closed by their
//! [`v1::AssignmentMetadata`], acknowledges each one, and reports the load it sent per
//! key range. steady serves it beside its Watch (`steady_slicer::autosharding`) and
//! follows it (`steady_tonic::SteadyChannel`).
//!
//! * [`keys`]: how steady's 64-bit key space maps onto A119's byte keys: the A119 key of a
//!   request is the 8-byte big-endian slice key ([`key_bytes`]), sent in the binary
//!   header [`KEY_HEADER`].
//! * [`chunks`]: an [`Assignment`](steady_slice::Assignment) as the server's responses,
//!   split into chunks of bounded size, each message encoded once.
//! * [`reassembly`]: the client's side of an assignment: chunks collected (bounded),
//!   validated by the gRFC's rules, gap-filled, answered with an ack.
//! * [`ranges`]: load per key range: the client's aggregation of per-key load under the
//!   server's quantum and resolution, and the server's validation of a report.
//! * [`client`]: the client itself ([`follow_autosharding`]): assignments followed across
//!   reconnections, acknowledged, converted to steady's, and load reported.
//!
//! The messages are a frozen contract (the protocol's): golden bytes in the tests pin
//! them.

pub mod chunks;
pub mod client;
pub mod keys;
pub mod ranges;
pub mod reassembly;
pub mod server;

pub use client::{follow_autosharding, AutoshardingConfig, AutoshardingError, KeyLoadSource};
pub use keys::{key_bytes, key_from_header, slice_key_at, KEY_HEADER};
pub use server::{EncodedAutosharding, EncodedAutoshardingServer, EncodedAutoshardingStream};

/// Generated code of `proto/autosharding.proto` (package `google.cloud.autosharding.v1`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("google.cloud.autosharding.v1");
}

/// The service's name.
pub const SERVICE: &str = "google.cloud.autosharding.v1.AutoshardingService";

/// The gRPC path of its one method.
pub const WATCH_SHARDING_ASSIGNMENT: &str =
    "/google.cloud.autosharding.v1.AutoshardingService/WatchShardingAssignment";

/// The longest `error_message` of an ack the protocol allows, in characters.
pub const MAX_ACK_MESSAGE_CHARS: usize = 512;

/// The longest slice key the protocol allows, in bytes.
pub const MAX_SLICE_KEY_BYTES: usize = 512;
