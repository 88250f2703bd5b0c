//! The echo service (feature `grpc`) and backends that answer it, for tests, the
//! benchmarks, the lab and the examples.
//!
//! * [`echo_client`], [`echo_server`], [`EchoRequest`], [`EchoReply`]: the code generated
//!   from `proto/echo.proto` (package `steady.echo.v1`, method
//!   `/steady.echo.v1.Echo/Echo`): a reply carries the request's payload and the index of
//!   the task that answered. Test support, not a published contract.
//! * [`EchoTask`]: answers at once with its task index; [`serve_echo`] serves one on
//!   loopback.
//! * [`RecordingEcho`]: also counts its calls and records the slice keys it receives;
//!   [`serve_recording`] serves a fleet of them.
//! * [`echo`]: one call, keyed or not, answered with the serving task's index.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tonic::codegen::{Body, Bytes, StdError};
use tonic::transport::Endpoint;
use tonic::{Request, Response, Status};

use crate::loopback::{self, ServerGuard};

#[allow(missing_docs, unreachable_pub, clippy::all, clippy::pedantic)]
mod generated {
    tonic::include_proto!("steady.echo.v1");
}

pub use generated::{echo_client, echo_server, EchoReply, EchoRequest};

use echo_client::EchoClient;
use echo_server::{Echo, EchoServer};

/// The request metadata a slice key travels in, as steady's channel and Slicelet read it
/// by default (`steady_proto::DEFAULT_KEY_HEADER`).
pub const KEY_HEADER: &str = "x-slice-key";

/// Backend task `0`'s echo service: answers every call at once with its payload and the
/// task index.
#[derive(Debug, Clone, Copy, Default)]
pub struct EchoTask(pub u32);

#[tonic::async_trait]
impl Echo for EchoTask {
    async fn echo(&self, request: Request<EchoRequest>) -> Result<Response<EchoReply>, Status> {
        Ok(Response::new(EchoReply { payload: request.into_inner().payload, task: self.0 }))
    }
}

/// Serves [`EchoTask`] `task` on a port of 127.0.0.1 the system chooses, until the guard
/// is dropped.
///
/// # Panics
///
/// When 127.0.0.1 cannot be bound.
pub async fn serve_echo(task: u32) -> (SocketAddr, ServerGuard) {
    loopback::serve(EchoServer::new(EchoTask(task))).await
}

/// An echo backend task that counts its calls and records the slice keys ([`KEY_HEADER`])
/// it receives. It answers with the payload and its task index, a payload starting with
/// `s` ("slow") 20 ms late. Clones share the counts.
#[derive(Debug, Clone, Default)]
pub struct RecordingEcho {
    /// The task index it answers with.
    pub task: u32,
    /// The calls it received.
    pub requests: Arc<AtomicUsize>,
    /// The slice keys of the keyed calls it received, in order.
    pub keys: Arc<Mutex<Vec<String>>>,
}

#[tonic::async_trait]
impl Echo for RecordingEcho {
    async fn echo(&self, request: Request<EchoRequest>) -> Result<Response<EchoReply>, Status> {
        self.requests.fetch_add(1, Ordering::SeqCst);
        if let Some(key) = request.metadata().get(KEY_HEADER).and_then(|v| v.to_str().ok()) {
            self.keys.lock().unwrap().push(key.to_owned());
        }
        let payload = request.into_inner().payload;
        if payload.first() == Some(&b's') {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(Response::new(EchoReply { payload, task: self.task }))
    }
}

/// A [`RecordingEcho`] served on loopback; dropping it stops the server.
#[derive(Debug)]
pub struct RecordingServer {
    /// The server's address.
    pub addr: SocketAddr,
    /// The backend it serves (a clone: it shares the counts).
    pub backend: RecordingEcho,
    _server: ServerGuard,
}

impl RecordingServer {
    /// Stops the server and waits until it has (see [`ServerGuard::stop`]): its
    /// listener is closed and its connections ended.
    ///
    /// # Panics
    ///
    /// As [`ServerGuard::stop`].
    pub async fn stop(self) {
        self._server.stop().await;
    }
}

/// Tasks `0..n`, each a [`RecordingEcho`] on a loopback port of its own.
///
/// # Panics
///
/// When 127.0.0.1 cannot be bound.
pub async fn serve_recording(n: u32) -> Vec<RecordingServer> {
    let mut out = Vec::new();
    for task in 0..n {
        let backend = RecordingEcho { task, ..RecordingEcho::default() };
        let (addr, server) = loopback::serve(EchoServer::new(backend.clone())).await;
        out.push(RecordingServer { addr, backend, _server: server });
    }
    out
}

/// The endpoints of `servers`, in order.
pub fn endpoints(servers: &[RecordingServer]) -> Vec<Endpoint> {
    servers.iter().map(|s| loopback::endpoint(s.addr)).collect()
}

/// Sends `payload` through `client`, with `key` as its slice key ([`KEY_HEADER`]) when
/// there is one; answers with the index of the task that served it.
///
/// # Errors
///
/// The call's status when it fails.
///
/// # Panics
///
/// When `key` is not valid metadata (ASCII).
pub async fn echo<T>(client: &mut EchoClient<T>, key: Option<&str>, payload: &[u8]) -> Result<u32, Status>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<StdError>,
    T::ResponseBody: Body<Data = Bytes> + Send + 'static,
    <T::ResponseBody as Body>::Error: Into<StdError> + Send,
{
    let mut request = Request::new(EchoRequest { payload: payload.to_vec() });
    if let Some(key) = key {
        request.metadata_mut().insert(KEY_HEADER, key.parse().expect("a key is ASCII"));
    }
    Ok(client.echo(request).await?.into_inner().task)
}
