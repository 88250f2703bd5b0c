//! The `AssignmentDistributor` gRPC service of a [`Distributor`], written out by hand
//! instead of generated, for one reason: its responses are the bytes encoded once at
//! publication (a codec that passes them through), where the generated service would
//! make every stream convert and encode the assignment itself: with 5,000 watchers and
//! 15,000 slices, seconds of CPU per generation. Requests are decoded as usual.

use std::convert::Infallible;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes};
use steady_proto::assignment::WatchRequest;
use tonic::body::Body;
use tonic::codec::{Codec, EncodeBuf, Encoder};
use tonic::codegen::{http, BoxFuture, Service, StdError};
use tonic::server::{Grpc, NamedService, ServerStreamingService};
use tonic::Status;

use super::{Distributor, WatchStream};

/// The gRPC path of the one method.
const WATCH: &str = "/steady.assignment.v1.AssignmentDistributor/Watch";

/// The tonic service of a [`Distributor`] (made by [`Distributor::service`]): add it to a
/// server like any generated one.
#[derive(Debug, Clone)]
pub struct DistributorServer {
    distributor: Distributor,
}

impl DistributorServer {
    pub(super) fn new(distributor: Distributor) -> Self {
        Self { distributor }
    }
}

impl NamedService for DistributorServer {
    const NAME: &'static str = "steady.assignment.v1.AssignmentDistributor";
}

/// Responses: already-encoded messages, written as they are. Requests: `WatchRequest`.
#[derive(Debug, Clone, Copy, Default)]
struct EncodedCodec;

#[derive(Debug, Clone, Copy, Default)]
struct PassThrough;

impl Encoder for PassThrough {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Codec for EncodedCodec {
    type Encode = Bytes;
    type Decode = WatchRequest;
    type Encoder = PassThrough;
    type Decoder = tonic_prost::ProstDecoder<WatchRequest>;

    fn encoder(&mut self) -> Self::Encoder {
        PassThrough
    }

    fn decoder(&mut self) -> Self::Decoder {
        tonic_prost::ProstDecoder::default()
    }
}

/// The Watch method, for tonic's server-streaming machinery.
struct Watch(Distributor);

impl ServerStreamingService<WatchRequest> for Watch {
    type Response = Bytes;
    type ResponseStream = WatchStream;
    type Future = BoxFuture<tonic::Response<WatchStream>, Status>;

    fn call(&mut self, request: tonic::Request<WatchRequest>) -> Self::Future {
        let result = self.0.watch(request.into_inner()).map(tonic::Response::new);
        Box::pin(std::future::ready(result))
    }
}

impl<B> Service<http::Request<B>> for DistributorServer
where
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
            return Box::pin(async {
                let mut response = http::Response::new(Body::default());
                let headers = response.headers_mut();
                headers.insert(Status::GRPC_STATUS, (tonic::Code::Unimplemented as i32).into());
                headers.insert(http::header::CONTENT_TYPE, tonic::metadata::GRPC_CONTENT_TYPE);
                Ok(response)
            });
        }
        let distributor = self.distributor.clone();
        Box::pin(async move {
            // tonic's default bound on a request (4 MiB), as the generated service had:
            // an overlong job name is then refused by name, `INVALID_ARGUMENT`.
            let mut grpc = Grpc::new(EncodedCodec);
            Ok(grpc.server_streaming(Watch(distributor), request).await)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;
    use steady_proto::assignment::AssignmentUpdate;
    use steady_slice::Assignment;

    #[test]
    fn the_bytes_sent_are_the_update_message_a_client_decodes() {
        let distributor = Distributor::new();
        let assignment = Assignment::single(7, vec![0, 2]).unwrap();
        assert!(distributor.publish("users", assignment.clone()));
        let published = distributor.lock().by_name["users"].borrow().clone().unwrap();
        let decoded = AssignmentUpdate::decode(published.encoded.clone()).unwrap();
        assert_eq!(Assignment::try_from(decoded).unwrap(), assignment);
    }
}
