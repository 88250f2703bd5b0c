//! The experiment's servers: a database that every cache miss reads from, and backends
//! that cache what they read.
//!
//! Both speak the echo protocol (`steady.echo.v1.Echo/Echo`): the request's payload is
//! the key's name, the reply's payload the value, and its `task` the backend that
//! answered. The database sleeps a fixed read latency while holding one of a fixed number
//! of permits, so a database asked for more than it serves queues and the queue shows in
//! the latency of every miss. A backend holds one of its worker permits for a fixed
//! service time per request (its CPU: this 2-core machine cannot give eight backends
//! cores of their own, so capacity is modelled, not spun), then answers from its bounded
//! LRU cache or reads the database and caches the value.

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lru::LruCache;
use steady_slicelet::Slicelet;
use steady_tonic::echo::echo_client::EchoClient;
use steady_tonic::echo::echo_server::{Echo, EchoServer};
use steady_tonic::echo::{EchoReply, EchoRequest};
use tokio::sync::{oneshot, Semaphore};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Request, Response, Status};

/// The size of a value read from the database.
const VALUE_BYTES: usize = 64;

/// Binds `address` (port 0: any), allowing a restarted server to take its old port back.
fn bind(address: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind(address)?;
    socket.listen(1024)
}

/// Serves `service` (behind `slicelet`'s layer when given) on `listener` until the
/// returned sender fires or drops; then requests in flight finish.
fn spawn_server(
    listener: tokio::net::TcpListener,
    service: EchoServer<impl Echo>,
    slicelet: Option<&Slicelet>,
) -> oneshot::Sender<()> {
    let (stop, stopped) = oneshot::channel::<()>();
    // Without TCP_NODELAY on accepted sockets (tonic sets it only on listeners it binds),
    // small replies wait for delayed ACKs: a 40 ms tail.
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let shutdown = async {
        let _ = stopped.await;
    };
    match slicelet {
        Some(s) => {
            tokio::spawn(
                Server::builder()
                    .layer(s.layer())
                    .add_service(service)
                    .serve_with_incoming_shutdown(incoming, shutdown),
            );
        }
        None => {
            tokio::spawn(
                Server::builder().add_service(service).serve_with_incoming_shutdown(incoming, shutdown),
            );
        }
    }
    stop
}

/// The database's settings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DatabaseConfig {
    /// The time one read takes once it has a permit.
    pub(crate) read_latency: Duration,
    /// Reads served at once; more wait.
    pub(crate) concurrency: usize,
}

/// The database: counts its reads.
#[derive(Debug, Clone)]
struct Database {
    permits: Arc<Semaphore>,
    latency: Duration,
    reads: Arc<AtomicU64>,
}

#[tonic::async_trait]
impl Echo for Database {
    async fn echo(&self, request: Request<EchoRequest>) -> Result<Response<EchoReply>, Status> {
        let _permit = self.permits.acquire().await.map_err(|_| Status::unavailable("closed"))?;
        if !self.latency.is_zero() {
            tokio::time::sleep(self.latency).await;
        }
        self.reads.fetch_add(1, Ordering::Relaxed);
        let key = request.into_inner().payload;
        let mut value = vec![0u8; VALUE_BYTES];
        for (i, b) in key.iter().enumerate() {
            value[i % VALUE_BYTES] ^= b;
        }
        Ok(Response::new(EchoReply { payload: value, task: u32::MAX }))
    }
}

/// A running database server.
pub(crate) struct DatabaseServer {
    pub(crate) address: SocketAddr,
    reads: Arc<AtomicU64>,
    _stop: oneshot::Sender<()>,
}

impl DatabaseServer {
    pub(crate) async fn start(config: DatabaseConfig) -> std::io::Result<Self> {
        let listener = bind(SocketAddr::from(([127, 0, 0, 1], 0)))?;
        let address = listener.local_addr()?;
        let reads = Arc::new(AtomicU64::new(0));
        let db = Database {
            permits: Arc::new(Semaphore::new(config.concurrency.max(1))),
            latency: config.read_latency,
            reads: reads.clone(),
        };
        let stop = spawn_server(listener, EchoServer::new(db), None);
        Ok(Self { address, reads, _stop: stop })
    }

    /// Reads served so far.
    pub(crate) fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }
}

/// A backend's settings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BackendConfig {
    /// Entries its cache holds.
    pub(crate) cache_entries: usize,
    /// Requests it works on at once.
    pub(crate) workers: usize,
    /// The work per request (holding a worker).
    pub(crate) work: Duration,
}

/// Hits and misses of one backend, over its restarts.
#[derive(Debug, Default)]
pub(crate) struct CacheCounts {
    pub(crate) hits: AtomicU64,
    pub(crate) misses: AtomicU64,
}

#[derive(Clone)]
struct CacheService {
    task: u32,
    cache: Arc<Mutex<LruCache<Vec<u8>, Vec<u8>>>>,
    workers: Arc<Semaphore>,
    work: Duration,
    database: EchoClient<Channel>,
    counts: Arc<CacheCounts>,
}

#[tonic::async_trait]
impl Echo for CacheService {
    async fn echo(&self, request: Request<EchoRequest>) -> Result<Response<EchoReply>, Status> {
        let key = request.into_inner().payload;
        {
            let _worker = self.workers.acquire().await.map_err(|_| Status::unavailable("closed"))?;
            if !self.work.is_zero() {
                tokio::time::sleep(self.work).await;
            }
        }
        let cached = self.cache.lock().expect("not poisoned").get(&key).cloned();
        let value = match cached {
            Some(value) => {
                self.counts.hits.fetch_add(1, Ordering::Relaxed);
                value
            }
            None => {
                self.counts.misses.fetch_add(1, Ordering::Relaxed);
                let read = self.database.clone().echo(EchoRequest { payload: key.clone() }).await?;
                let value = read.into_inner().payload;
                self.cache.lock().expect("not poisoned").put(key, value.clone());
                value
            }
        };
        Ok(Response::new(EchoReply { payload: value, task: self.task }))
    }
}

/// One backend task: its address (kept over restarts), its Slicelet, its counters.
pub(crate) struct Backend {
    pub(crate) task: u32,
    pub(crate) address: SocketAddr,
    pub(crate) slicelet: Slicelet,
    pub(crate) counts: Arc<CacheCounts>,
    config: BackendConfig,
    database: EchoClient<Channel>,
    stop: Option<oneshot::Sender<()>>,
}

impl Backend {
    /// Starts task `task` on a port of its own, reading misses from `database`.
    pub(crate) async fn start(
        task: u32,
        config: BackendConfig,
        database: SocketAddr,
        slicelet: Slicelet,
    ) -> Result<Self, Box<dyn std::error::Error>> {
        let database = EchoClient::new(Endpoint::from_shared(format!("http://{database}"))?.connect_lazy());
        let listener = bind(SocketAddr::from(([127, 0, 0, 1], 0)))?;
        let address = listener.local_addr()?;
        let mut backend =
            Self { task, address, slicelet, counts: Arc::default(), config, database, stop: None };
        backend.serve(listener);
        Ok(backend)
    }

    fn serve(&mut self, listener: tokio::net::TcpListener) {
        let entries = NonZeroUsize::new(self.config.cache_entries.max(1)).expect("at least 1");
        let service = CacheService {
            task: self.task,
            cache: Arc::new(Mutex::new(LruCache::new(entries))),
            workers: Arc::new(Semaphore::new(self.config.workers.max(1))),
            work: self.config.work,
            database: self.database.clone(),
            counts: self.counts.clone(),
        };
        self.stop = Some(spawn_server(listener, EchoServer::new(service), Some(&self.slicelet)));
    }

    /// Stops the server (requests in flight finish) and starts it again on the same
    /// address with an empty cache: a process restart.
    pub(crate) async fn restart(&mut self) -> std::io::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        // The old listener closes once its server task sees the signal; retry the bind
        // until the port is free, for at most 5 s.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            match bind(self.address) {
                Ok(listener) => {
                    self.serve(listener);
                    return Ok(());
                }
                Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
                Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
    }
}
