//! gRPC servers on 127.0.0.1 for one test (feature `grpc`): on a port the system chose
//! (or a given one, to restart a server where it was), accepting connections with
//! `TCP_NODELAY`, and serving until their [`ServerGuard`] is dropped.
//!
//! ```no_run
//! # async fn test(service: steady_testing::echo::echo_server::EchoServer<steady_testing::echo::EchoTask>) {
//! let (addr, server) = steady_testing::loopback::serve(service).await;
//! let endpoint = steady_testing::loopback::endpoint(addr); // http://127.0.0.1:<port>
//! drop(server); // the server stops: no new connections, calls in flight finish
//! # let _ = endpoint;
//! # }
//! ```

use std::convert::Infallible;
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::body::Body;
use tonic::codegen::http;
use tonic::server::NamedService;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Endpoint, Server};

/// Serves `service` alone on a port of 127.0.0.1 the system chooses: its address, and
/// the guard that stops it when dropped.
///
/// # Panics
///
/// When 127.0.0.1 cannot be bound.
pub async fn serve<S>(service: S) -> (SocketAddr, ServerGuard)
where
    S: tonic::codegen::Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    let port = Loopback::bind().await;
    (port.addr(), port.serve(service))
}

/// `http://{addr}`, for a tonic client or a channel.
pub fn endpoint(addr: SocketAddr) -> Endpoint {
    Endpoint::from_shared(format!("http://{addr}")).expect("an address is a valid URI")
}

/// A port bound on 127.0.0.1 that serves nothing yet: its address is known before its
/// server is built (servers that must know one another's addresses).
#[derive(Debug)]
pub struct Loopback {
    listener: TcpListener,
    addr: SocketAddr,
}

impl Loopback {
    /// A port the system chooses.
    ///
    /// # Panics
    ///
    /// When 127.0.0.1 cannot be bound.
    pub async fn bind() -> Self {
        Self::bind_to(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).await
    }

    /// `addr`, such as the address of a server a test stopped and now starts again.
    ///
    /// # Panics
    ///
    /// When `addr` cannot be bound (another socket holds it).
    pub async fn bind_to(addr: SocketAddr) -> Self {
        let listener = TcpListener::bind(addr).await.unwrap_or_else(|e| panic!("cannot bind {addr}: {e}"));
        let addr = listener.local_addr().expect("a bound socket has an address");
        Self { listener, addr }
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves `service` alone, until the returned guard is dropped.
    pub fn serve<S>(self, service: S) -> ServerGuard
    where
        S: tonic::codegen::Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
            + NamedService
            + Clone
            + Send
            + Sync
            + 'static,
        S::Future: Send + 'static,
    {
        self.serve_with(|incoming, stopped| {
            Server::builder().add_service(service).serve_with_incoming_shutdown(incoming, stopped)
        })
    }

    /// Serves what `start` builds (a server with layers, TLS or several services) on this
    /// port's connections, until the returned guard is dropped: `start` gets the incoming
    /// connections and the shutdown signal, and returns the server's future, typically
    /// `Server::builder()...serve_with_incoming_shutdown(incoming, stopped)`. The server
    /// runs on a task of its own; its error, if any, is dropped.
    pub fn serve_with<F, Fut>(self, start: F) -> ServerGuard
    where
        F: FnOnce(TcpIncoming, Stopped) -> Fut,
        Fut: Future<Output = Result<(), tonic::transport::Error>> + Send + 'static,
    {
        let (stop, stopped) = oneshot::channel();
        let incoming = TcpIncoming::from(self.listener).with_nodelay(Some(true));
        let task = tokio::spawn(start(incoming, Stopped(stopped)));
        ServerGuard { addr: self.addr, stop, task }
    }
}

/// A running loopback server: dropping it shuts the server down (it accepts no new
/// connection; calls in flight finish), without waiting for it to stop.
#[derive(Debug)]
pub struct ServerGuard {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), tonic::transport::Error>>,
}

impl ServerGuard {
    /// How long [`ServerGuard::stop`] waits for its server to stop.
    pub const STOP_TIMEOUT: Duration = Duration::from_secs(10);

    /// The server's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Lets the server run until its runtime shuts down, as a server spawned with no
    /// shutdown signal would (for a helper that returns only the address); its address.
    pub fn detach(self) -> SocketAddr {
        std::mem::forget(self.stop);
        self.addr
    }

    /// Shuts the server down and waits until it has stopped and its port is free again
    /// (for a test that starts a server on the same address next).
    ///
    /// # Panics
    ///
    /// When the server does not stop within [`ServerGuard::STOP_TIMEOUT`], or ended with
    /// an error.
    pub async fn stop(self) {
        let Self { addr, stop, task } = self;
        let _ = stop.send(());
        match tokio::time::timeout(Self::STOP_TIMEOUT, task).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => panic!("the server on {addr} failed: {e}"),
            Ok(Err(e)) => panic!("the server on {addr} panicked: {e}"),
            Err(_) => panic!("the server on {addr} did not stop in {:?}", Self::STOP_TIMEOUT),
        }
    }
}

/// A server's shutdown signal: resolves when its [`ServerGuard`] is dropped.
#[derive(Debug)]
pub struct Stopped(oneshot::Receiver<()>);

impl Future for Stopped {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        Pin::new(&mut self.0).poll(cx).map(|_| ())
    }
}
