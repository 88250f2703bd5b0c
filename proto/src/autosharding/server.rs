//! The server of `AutoshardingService.WatchShardingAssignment` over responses encoded once
//! per generation: whoever serves it hands every stream the same bytes (each chunk of an
//! assignment, [`encoded_responses`](super::chunks::encoded_responses)) instead of
//! letting each stream build and encode the messages itself. Written out by hand instead
//! of generated for that one reason, as `EncodedWatchServer` is for steady's own Watch:
//! responses go through a codec that passes the bytes through; requests are decoded as
//! usual, up to a bound.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::Stream;
use prost::bytes::Bytes;
use tonic::body::Body;
use tonic::codec::Streaming;
use tonic::codegen::{http, BoxFuture, Service, StdError};
use tonic::server::{Grpc, NamedService, StreamingService};
use tonic::Status;

use super::v1::WatchShardingAssignmentRequest;
use super::{SERVICE, WATCH_SHARDING_ASSIGNMENT};
use crate::encoded::{unimplemented, EncodedCodec};

/// The default bound on one request message (1 MiB): a load report at the most ranges a
/// server takes (4,096 by default, about 20 bytes each) is far below it. A larger message
/// ends its stream with `OUT_OF_RANGE` before it is buffered.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 1024 * 1024;

/// A stream of encoded `WatchShardingAssignmentResponse` messages, as a call returns them.
pub type EncodedAutoshardingStream = Pin<Box<dyn Stream<Item = Result<Bytes, Status>> + Send>>;

/// What serves `WatchShardingAssignment` calls with encoded responses (see
/// [`EncodedAutoshardingServer`]).
pub trait EncodedAutosharding: Clone + Send + Sync + 'static {
    /// The responses of one call: every item a `WatchShardingAssignmentResponse` as
    /// encoded (once, shared by every stream it is sent on). `request` carries the
    /// client's messages (decoded, each at most the server's bound) and what the call
    /// came with: its metadata, the peer's address and, over TLS, its certificates.
    ///
    /// # Errors
    ///
    /// The status the call fails with at once, before any response (the server is
    /// closing, too many streams are open, ...). What depends on the client's messages is
    /// better sent as the stream's error: a client may wait for the response headers
    /// before it sends its first message.
    fn watch_sharding_assignment(
        &self,
        request: tonic::Request<Streaming<WatchShardingAssignmentRequest>>,
    ) -> Result<EncodedAutoshardingStream, Status>;
}

/// The tonic service of an [`EncodedAutosharding`] source: add it to a server like a
/// generated `AutoshardingServiceServer`; clients cannot tell them apart.
#[derive(Debug, Clone)]
pub struct EncodedAutoshardingServer<A> {
    source: A,
    max_request_bytes: usize,
}

impl<A> EncodedAutoshardingServer<A> {
    /// Serves `WatchShardingAssignment` from `source`, decoding requests of at most
    /// [`DEFAULT_MAX_REQUEST_BYTES`].
    pub fn new(source: A) -> Self {
        Self { source, max_request_bytes: DEFAULT_MAX_REQUEST_BYTES }
    }

    /// Decodes requests of at most `max` bytes (a longer one ends its stream with
    /// `OUT_OF_RANGE`).
    pub fn max_request_bytes(mut self, max: usize) -> Self {
        self.max_request_bytes = max;
        self
    }

    /// What it serves from.
    pub fn source(&self) -> &A {
        &self.source
    }
}

impl<A> NamedService for EncodedAutoshardingServer<A> {
    const NAME: &'static str = SERVICE;
}

/// The method, for tonic's bidirectional-streaming machinery.
struct WatchMethod<A>(A);

impl<A: EncodedAutosharding> StreamingService<WatchShardingAssignmentRequest> for WatchMethod<A> {
    type Response = Bytes;
    type ResponseStream = EncodedAutoshardingStream;
    type Future = BoxFuture<tonic::Response<EncodedAutoshardingStream>, Status>;

    fn call(&mut self, request: tonic::Request<Streaming<WatchShardingAssignmentRequest>>) -> Self::Future {
        let result = self.0.watch_sharding_assignment(request).map(tonic::Response::new);
        Box::pin(std::future::ready(result))
    }
}

impl<A, B> Service<http::Request<B>> for EncodedAutoshardingServer<A>
where
    A: EncodedAutosharding,
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() != WATCH_SHARDING_ASSIGNMENT {
            return unimplemented();
        }
        let (source, max) = (self.source.clone(), self.max_request_bytes);
        Box::pin(async move {
            let mut grpc = Grpc::new(EncodedCodec::<WatchShardingAssignmentRequest>::default())
                .max_decoding_message_size(max);
            Ok(grpc.streaming(WatchMethod(source), request).await)
        })
    }
}
