//! Loopback scaffolding shared by the tonic tests of `steady-tonic` and `steady-slicer`
//! (which includes this file): echo backends that record what they receive, servers on
//! 127.0.0.1 that stop when dropped, and bounded waits.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use steady_tonic::echo::echo_client::EchoClient;
use steady_tonic::echo::echo_server::{Echo, EchoServer};
use steady_tonic::echo::{EchoReply, EchoRequest};
use steady_tonic::SteadyChannel;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Endpoint, Server};
use tonic::{Request, Response, Status};

/// One backend task: answers with its index and records the slice keys it receives.
#[derive(Clone, Default)]
pub(crate) struct Backend {
    pub(crate) task: u32,
    pub(crate) requests: Arc<AtomicUsize>,
    pub(crate) keys: Arc<Mutex<Vec<String>>>,
}

#[tonic::async_trait]
impl Echo for Backend {
    async fn echo(&self, request: Request<EchoRequest>) -> Result<Response<EchoReply>, Status> {
        self.requests.fetch_add(1, Ordering::SeqCst);
        if let Some(key) = request.metadata().get("x-slice-key").and_then(|v| v.to_str().ok()) {
            self.keys.lock().unwrap().push(key.to_owned());
        }
        let payload = request.into_inner().payload;
        if payload.first() == Some(&b's') {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(Response::new(EchoReply { payload, task: self.task }))
    }
}

/// A running server; dropping it shuts it down.
pub(crate) struct Running {
    pub(crate) addr: SocketAddr,
    pub(crate) backend: Backend,
    _stop: oneshot::Sender<()>,
}

pub(crate) async fn serve<S>(service: S) -> (SocketAddr, oneshot::Sender<()>)
where
    S: tower::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
            Error = std::convert::Infallible,
        > + tonic::server::NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(Server::builder().add_service(service).serve_with_incoming_shutdown(
        TcpListenerStream::new(listener),
        async {
            let _ = stopped.await;
        },
    ));
    (addr, stop)
}

pub(crate) async fn start_backends(n: u32) -> Vec<Running> {
    let mut out = Vec::new();
    for task in 0..n {
        let backend = Backend { task, ..Backend::default() };
        let (addr, stop) = serve(EchoServer::new(backend.clone())).await;
        out.push(Running { addr, backend, _stop: stop });
    }
    out
}

pub(crate) fn endpoint(addr: SocketAddr) -> Endpoint {
    Endpoint::from_shared(format!("http://{addr}")).unwrap()
}

pub(crate) fn endpoints(backends: &[Running]) -> Vec<Endpoint> {
    backends.iter().map(|b| endpoint(b.addr)).collect()
}

pub(crate) async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let start = Instant::now();
    while !condition() {
        assert!(start.elapsed() < Duration::from_secs(10), "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

pub(crate) async fn echo(
    client: &mut EchoClient<SteadyChannel>,
    key: Option<&str>,
    payload: &[u8],
) -> Result<u32, Status> {
    let mut request = Request::new(EchoRequest { payload: payload.to_vec() });
    if let Some(key) = key {
        request.metadata_mut().insert("x-slice-key", key.parse().unwrap());
    }
    Ok(client.echo(request).await?.into_inner().task)
}
