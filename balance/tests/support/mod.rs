//! Real HTTP/2 servers and clients on loopback for the integration tests.
//!
//! Each server answers any request with its task index in the body, after sleeping
//! for the milliseconds given in the `x-delay-ms` header. It counts connections
//! accepted and open, and requests received and in progress; `kill` drops its
//! listener and every connection at once, like a crashed process.

#![allow(dead_code)]

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tower::{service_fn, BoxError, Service};

/// Counters of one server.
#[derive(Debug, Default)]
pub struct ServerStats {
    pub accepted: AtomicUsize,
    pub open: AtomicUsize,
    pub requests: AtomicUsize,
    pub in_progress: AtomicUsize,
    /// The `x-slice-key` header of every request received.
    pub keys: std::sync::Mutex<Vec<String>>,
}

/// A running test server.
pub struct TestServer {
    pub task: usize,
    pub addr: SocketAddr,
    pub stats: Arc<ServerStats>,
    tasks: Arc<std::sync::Mutex<JoinSet<()>>>,
}

impl TestServer {
    /// Starts task `task`'s server on 127.0.0.1, port chosen by the OS.
    pub async fn start(task: usize) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stats = Arc::new(ServerStats::default());
        let tasks: Arc<std::sync::Mutex<JoinSet<()>>> = Arc::default();
        let (s, t) = (stats.clone(), tasks.clone());
        tasks.lock().unwrap().spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { return };
                s.accepted.fetch_add(1, Ordering::SeqCst);
                s.open.fetch_add(1, Ordering::SeqCst);
                let s = s.clone();
                t.lock().unwrap().spawn(async move {
                    let s2 = s.clone();
                    let handler = service_fn(move |req: http::Request<Incoming>| {
                        let s = s2.clone();
                        async move {
                            s.requests.fetch_add(1, Ordering::SeqCst);
                            if let Some(key) = req.headers().get("x-slice-key").and_then(|v| v.to_str().ok())
                            {
                                s.keys.lock().unwrap().push(key.to_owned());
                            }
                            s.in_progress.fetch_add(1, Ordering::SeqCst);
                            let delay = req
                                .headers()
                                .get("x-delay-ms")
                                .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
                                .unwrap_or(0);
                            tokio::time::sleep(Duration::from_millis(delay)).await;
                            s.in_progress.fetch_sub(1, Ordering::SeqCst);
                            Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::from(
                                task.to_string(),
                            ))))
                        }
                    });
                    let io = TokioIo::new(stream);
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(io, hyper_util::service::TowerToHyperService::new(handler))
                        .await;
                    s.open.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        Self { task, addr, stats, tasks }
    }

    /// Drops the listener and every connection at once.
    pub fn kill(&self) {
        self.tasks.lock().unwrap().abort_all();
    }

    pub fn accepted(&self) -> usize {
        self.stats.accepted.load(Ordering::SeqCst)
    }
    pub fn open(&self) -> usize {
        self.stats.open.load(Ordering::SeqCst)
    }
    pub fn requests(&self) -> usize {
        self.stats.requests.load(Ordering::SeqCst)
    }
    pub fn in_progress(&self) -> usize {
        self.stats.in_progress.load(Ordering::SeqCst)
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.kill();
    }
}

pub async fn start_servers(n: usize) -> Vec<TestServer> {
    let mut servers = Vec::new();
    for task in 0..n {
        servers.push(TestServer::start(task).await);
    }
    servers
}

/// An HTTP/2 client connection as a tower `Service`.
#[derive(Clone)]
pub struct H2(hyper::client::conn::http2::SendRequest<Full<Bytes>>);

type Request = http::Request<Full<Bytes>>;

impl Service<Request> for H2 {
    type Response = http::Response<Incoming>;
    type Error = hyper::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, hyper::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), hyper::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: Request) -> Self::Future {
        let fut = self.0.send_request(req);
        Box::pin(fut)
    }
}

/// Connects to a test server over TCP and HTTP/2.
pub fn connector() -> impl Service<
    SocketAddr,
    Response = H2,
    Error = BoxError,
    Future = Pin<Box<dyn Future<Output = Result<H2, BoxError>> + Send>>,
> + Send
       + 'static {
    service_fn(|addr: SocketAddr| -> Pin<Box<dyn Future<Output = Result<H2, BoxError>> + Send>> {
        Box::pin(async move {
            let stream = TcpStream::connect(addr).await?;
            let (sender, connection) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await?;
            tokio::spawn(connection);
            Ok(H2(sender))
        })
    })
}

/// A request that the server answers after `delay_ms`.
pub fn request(delay_ms: u64) -> Request {
    http::Request::builder()
        .uri("http://steady.test/")
        .header("x-delay-ms", delay_ms.to_string())
        .body(Full::new(Bytes::new()))
        .unwrap()
}

/// A request carrying `key` in the `x-slice-key` header.
pub fn keyed_request(key: &str) -> Request {
    http::Request::builder()
        .uri("http://steady.test/")
        .header("x-slice-key", key)
        .body(Full::new(Bytes::new()))
        .unwrap()
}

/// The slice key of a request: XXH3 of its `x-slice-key` header.
pub fn header_key(req: &Request) -> Option<steady_balance::SliceKey> {
    req.headers().get("x-slice-key").map(|v| steady_balance::SliceKey::of(v.as_bytes()))
}

/// The task index a response came from.
pub async fn task_of(response: http::Response<Incoming>) -> Result<usize, BoxError> {
    let body = response.into_body().collect().await?.to_bytes();
    Ok(std::str::from_utf8(&body)?.parse()?)
}
