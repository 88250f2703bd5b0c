//! The `AssignmentDistributor.Watch` service over assignments encoded once per generation:
//! whoever serves Watch (the control plane's `Distributor`, a backend's Slicelet) hands
//! every stream the same bytes instead of letting each stream convert and encode the
//! assignment itself (with 5,000 watchers and 15,000 slices, seconds of CPU per
//! generation). The service is written out by hand instead of generated for that one
//! reason: its responses go through a codec that passes the bytes through. Requests are
//! decoded as usual.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::Stream;
use prost::bytes::{BufMut, Bytes};
use tonic::body::Body;
use tonic::codec::{Codec, EncodeBuf, Encoder};
use tonic::codegen::{http, BoxFuture, Service, StdError};
use tonic::server::{Grpc, NamedService, ServerStreamingService};
use tonic::Status;

use crate::assignment::WatchRequest;

/// The service's name.
pub(crate) const SERVICE: &str = "steady.assignment.v1.AssignmentDistributor";
/// The gRPC path of its one method.
pub(crate) const WATCH: &str = "/steady.assignment.v1.AssignmentDistributor/Watch";

/// A stream of encoded `AssignmentUpdate` messages, as a Watch call returns them.
pub type EncodedWatchStream = Pin<Box<dyn Stream<Item = Result<Bytes, Status>> + Send>>;

/// What serves Watch calls with encoded messages (see [`EncodedWatchServer`]).
pub trait EncodedWatch: Clone + Send + Sync + 'static {
    /// The stream of `request.job`'s assignments newer than `request.known_generation`,
    /// each encoded with [`encode_update`](crate::encode_update) (once per generation,
    /// shared by every stream).
    ///
    /// # Errors
    ///
    /// The status the call fails with (an unknown job, too many watchers, ...).
    fn watch(&self, request: WatchRequest) -> Result<EncodedWatchStream, Status>;
}

/// The tonic service of an [`EncodedWatch`] source: add it to a server like a generated
/// `AssignmentDistributorServer`; clients cannot tell them apart.
#[derive(Debug, Clone)]
pub struct EncodedWatchServer<W> {
    source: W,
}

impl<W> EncodedWatchServer<W> {
    /// Serves Watch from `source`.
    pub fn new(source: W) -> Self {
        Self { source }
    }

    /// What it serves from.
    pub fn source(&self) -> &W {
        &self.source
    }
}

impl<W> NamedService for EncodedWatchServer<W> {
    const NAME: &'static str = SERVICE;
}

/// Responses: already-encoded messages, written as they are. Requests: `D`, decoded by
/// prost. The codec of both hand-written services (Watch here, A119's
/// `WatchShardingAssignment`).
#[derive(Debug)]
pub(crate) struct EncodedCodec<D>(std::marker::PhantomData<fn() -> D>);

impl<D> Default for EncodedCodec<D> {
    fn default() -> Self {
        Self(std::marker::PhantomData)
    }
}

#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PassThrough;

impl Encoder for PassThrough {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl<D: prost::Message + Default + Send + 'static> Codec for EncodedCodec<D> {
    type Encode = Bytes;
    type Decode = D;
    type Encoder = PassThrough;
    type Decoder = tonic_prost::ProstDecoder<D>;

    fn encoder(&mut self) -> Self::Encoder {
        PassThrough
    }

    fn decoder(&mut self) -> Self::Decoder {
        tonic_prost::ProstDecoder::default()
    }
}

/// The answer of a hand-written service to a method it does not serve: `UNIMPLEMENTED`, as
/// a generated service answers.
pub(crate) fn unimplemented() -> BoxFuture<http::Response<Body>, Infallible> {
    Box::pin(async {
        let mut response = http::Response::new(Body::default());
        let headers = response.headers_mut();
        headers.insert(Status::GRPC_STATUS, (tonic::Code::Unimplemented as i32).into());
        headers.insert(http::header::CONTENT_TYPE, tonic::metadata::GRPC_CONTENT_TYPE);
        Ok(response)
    })
}

/// The Watch method, for tonic's server-streaming machinery.
struct WatchMethod<W>(W);

impl<W: EncodedWatch> ServerStreamingService<WatchRequest> for WatchMethod<W> {
    type Response = Bytes;
    type ResponseStream = EncodedWatchStream;
    type Future = BoxFuture<tonic::Response<EncodedWatchStream>, Status>;

    fn call(&mut self, request: tonic::Request<WatchRequest>) -> Self::Future {
        let result = self.0.watch(request.into_inner()).map(tonic::Response::new);
        Box::pin(std::future::ready(result))
    }
}

impl<W, B> Service<http::Request<B>> for EncodedWatchServer<W>
where
    W: EncodedWatch,
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
        if request.uri().path() != WATCH {
            return unimplemented();
        }
        let source = self.source.clone();
        Box::pin(async move {
            // tonic's default bound on a request (4 MiB), as the generated service had:
            // an overlong job name is then refused by name, `INVALID_ARGUMENT`.
            let mut grpc = Grpc::new(EncodedCodec::<WatchRequest>::default());
            Ok(grpc.server_streaming(WatchMethod(source), request).await)
        })
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;
    use steady_slice::Assignment;

    use crate::assignment::AssignmentUpdate;
    use crate::encode_update;

    #[test]
    fn the_bytes_sent_are_the_update_message_a_client_decodes() {
        let assignment = Assignment::single(7, vec![0, 2]).unwrap();
        let decoded = AssignmentUpdate::decode(encode_update(&assignment)).unwrap();
        assert_eq!(Assignment::try_from(decoded).unwrap(), assignment);
    }
}
