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
//!
//! With handover on, a backend also warms the key ranges its Slicelet announces
//! (`SliceChange::warming`) from their current owner before they switch to it: it asks
//! the owner for the cache entries of the range (the echo call with `x-lab-export`
//! metadata, answered from the owner's cache, most recently used first), and refuses
//! requests for keys it no longer holds once the grace period after a move is over
//! (`OnMisroute::Reject`), so that frontends still on the older generation move on.

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use lru::LruCache;
use steady_slice::{KeyRange, SliceKey};
use steady_slicelet::{OnMisroute, Slicelet, SliceletLayer};
use steady_testing::echo::echo_client::EchoClient;
use steady_testing::echo::echo_server::{Echo, EchoServer};
use steady_testing::echo::{EchoReply, EchoRequest};
use tokio::sync::{oneshot, Semaphore};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Request, Response, Status};

/// The size of a value read from the database.
const VALUE_BYTES: usize = 64;

/// The metadata of a cache export: the range `start-end` in hex (`end` empty for the
/// end of the key space).
const EXPORT_HEADER: &str = "x-lab-export";

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
    slicelet: Option<SliceletLayer>,
) -> oneshot::Sender<()> {
    let (stop, stopped) = oneshot::channel::<()>();
    // Without TCP_NODELAY on accepted sockets (tonic sets it only on listeners it binds),
    // small replies wait for delayed ACKs: a 40 ms tail.
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let shutdown = async {
        let _ = stopped.await;
    };
    match slicelet {
        Some(layer) => {
            tokio::spawn(
                Server::builder()
                    .layer(layer)
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
    /// With handover: warm announced ranges from their owner, and refuse requests for
    /// keys moved away more than this long ago (`None`: serve every request).
    pub(crate) handover_grace: Option<Duration>,
}

/// Hits and misses of one backend, over its restarts.
#[derive(Debug, Default)]
pub(crate) struct CacheCounts {
    pub(crate) hits: AtomicU64,
    pub(crate) misses: AtomicU64,
    /// Entries loaded from another backend while warming a range.
    pub(crate) warmed: AtomicU64,
}

type Cache = Arc<Mutex<LruCache<Vec<u8>, Vec<u8>>>>;

#[derive(Clone)]
struct CacheService {
    task: u32,
    cache: Cache,
    workers: Arc<Semaphore>,
    work: Duration,
    database: EchoClient<Channel>,
    counts: Arc<CacheCounts>,
}

#[tonic::async_trait]
impl Echo for CacheService {
    async fn echo(&self, request: Request<EchoRequest>) -> Result<Response<EchoReply>, Status> {
        if let Some(range) = request.metadata().get(EXPORT_HEADER) {
            let range =
                range.to_str().ok().and_then(parse_range).ok_or_else(|| Status::invalid_argument("range"))?;
            return Ok(Response::new(EchoReply { payload: export(&self.cache, range), task: self.task }));
        }
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
    /// Every backend's address by task (filled once all have started), to warm from.
    peers: Peers,
    stop: Option<oneshot::Sender<()>>,
    warmer: Option<tokio::task::JoinHandle<()>>,
}

/// Every backend's address, by task.
pub(crate) type Peers = Arc<RwLock<Vec<SocketAddr>>>;

impl Backend {
    /// Starts task `task` on a port of its own, reading misses from `database`.
    pub(crate) async fn start(
        task: u32,
        config: BackendConfig,
        database: SocketAddr,
        slicelet: Slicelet,
        peers: Peers,
    ) -> Result<Self, Box<dyn std::error::Error>> {
        let database = EchoClient::new(Endpoint::from_shared(format!("http://{database}"))?.connect_lazy());
        let listener = bind(SocketAddr::from(([127, 0, 0, 1], 0)))?;
        let address = listener.local_addr()?;
        let mut backend = Self {
            task,
            address,
            slicelet,
            counts: Arc::default(),
            config,
            database,
            peers,
            stop: None,
            warmer: None,
        };
        backend.serve(listener);
        Ok(backend)
    }

    fn serve(&mut self, listener: tokio::net::TcpListener) {
        let entries = NonZeroUsize::new(self.config.cache_entries.max(1)).expect("at least 1");
        let cache: Cache = Arc::new(Mutex::new(LruCache::new(entries)));
        let service = CacheService {
            task: self.task,
            cache: cache.clone(),
            workers: Arc::new(Semaphore::new(self.config.workers.max(1))),
            work: self.config.work,
            database: self.database.clone(),
            counts: self.counts.clone(),
        };
        let mut layer = self.slicelet.layer();
        if let Some(grace) = self.config.handover_grace {
            layer = layer.on_misroute(OnMisroute::Reject).grace(grace);
            let warmer = warm(self.slicelet.clone(), cache, self.peers.clone(), self.counts.clone(), grace);
            if let Some(old) = self.warmer.replace(tokio::spawn(warmer)) {
                old.abort();
            }
        }
        self.stop = Some(spawn_server(listener, EchoServer::new(service), Some(layer)));
    }

    /// Stops the server (requests in flight finish) and starts it again on the same
    /// address with an empty cache: a process restart.
    pub(crate) async fn restart(&mut self) -> std::io::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(warmer) = self.warmer.take() {
            warmer.abort();
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

impl Drop for Backend {
    fn drop(&mut self) {
        if let Some(warmer) = self.warmer.take() {
            warmer.abort();
        }
    }
}

/// Reads `start-end` (hex; `end` empty for the end of the key space).
fn parse_range(text: &str) -> Option<KeyRange> {
    let (start, end) = text.split_once('-')?;
    let start = SliceKey(u64::from_str_radix(start, 16).ok()?);
    let end = if end.is_empty() { None } else { Some(SliceKey(u64::from_str_radix(end, 16).ok()?)) };
    (end.is_none_or(|e| start < e)).then(|| KeyRange::new(start, end))
}

fn format_range(range: &KeyRange) -> String {
    format!("{:x}-{}", range.start().0, range.end().map_or(String::new(), |e| format!("{:x}", e.0)))
}

/// The cache's entries whose keys fall in `range`, most recently used first: each a u16
/// key length, the key, a u16 value length, the value.
fn export(cache: &Cache, range: KeyRange) -> Vec<u8> {
    let cache = cache.lock().expect("not poisoned");
    let mut out = Vec::new();
    for (key, value) in cache.iter().filter(|(k, _)| range.contains(SliceKey::of(k.as_slice()))) {
        for field in [key, value] {
            out.extend_from_slice(&(field.len() as u16).to_le_bytes());
            out.extend_from_slice(field);
        }
    }
    out
}

/// The entries of an export, in its order.
fn entries(mut bytes: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let field = |bytes: &mut &[u8]| -> Option<Vec<u8>> {
        let len = u16::from_le_bytes(bytes.get(..2)?.try_into().ok()?) as usize;
        let out = bytes.get(2..2 + len)?.to_vec();
        *bytes = &bytes[2 + len..];
        Some(out)
    };
    let mut out = Vec::new();
    while let (Some(k), Some(v)) = (field(&mut bytes), field(&mut bytes)) {
        out.push((k, v));
    }
    out
}

/// Follows `slicelet`'s slice changes and loads every range it announces as warming from
/// the range's first owner into `cache` (the owner's least recently used first, so its
/// hottest entries end up the most recent here).
async fn warm(slicelet: Slicelet, cache: Cache, peers: Peers, counts: Arc<CacheCounts>, grace: Duration) {
    let mut changes = slicelet.slice_changes();
    let mut warmed: Vec<KeyRange> = Vec::new();
    while let Some(change) = changes.next().await {
        // Released ranges are flushed once the grace period is over (unless held again):
        // their entries would only take room from the keys this task still serves.
        if !change.released.is_empty() {
            let (cache, slicelet, released) = (cache.clone(), slicelet.clone(), change.released.clone());
            tokio::spawn(async move {
                tokio::time::sleep(grace).await;
                let mut cache = cache.lock().expect("not poisoned");
                let stale: Vec<Vec<u8>> = cache
                    .iter()
                    .map(|(k, _)| k)
                    .filter(|k| {
                        let key = SliceKey::of(k.as_slice());
                        released.iter().any(|r| r.contains(key)) && slicelet.holds(key) != Some(true)
                    })
                    .cloned()
                    .collect();
                for k in stale {
                    cache.pop(&k);
                }
            });
        }
        warmed.retain(|r| change.warming.iter().any(|w| w.range == *r));
        for w in change.warming {
            if warmed.contains(&w.range) {
                continue;
            }
            warmed.push(w.range);
            let Some(&owner) = w.owners.first() else { continue };
            let Some(address) = peers.read().expect("not poisoned").get(owner as usize).copied() else {
                continue;
            };
            let Ok(endpoint) = Endpoint::from_shared(format!("http://{address}")) else { continue };
            let Ok(channel) = endpoint.connect().await else { continue };
            let mut request = Request::new(EchoRequest { payload: Vec::new() });
            request.metadata_mut().insert(EXPORT_HEADER, format_range(&w.range).parse().expect("ascii"));
            let Ok(reply) = EchoClient::new(channel).echo(request).await else { continue };
            let entries = entries(&reply.into_inner().payload);
            counts.warmed.fetch_add(entries.len() as u64, Ordering::Relaxed);
            let mut cache = cache.lock().expect("not poisoned");
            for (key, value) in entries.into_iter().rev() {
                cache.put(key, value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_export_holds_the_entries_of_its_range_most_recent_first() {
        let cache: Cache = Arc::new(Mutex::new(LruCache::new(NonZeroUsize::new(100).unwrap())));
        let keys: Vec<String> = (0..100).map(|i| format!("key-{i}")).collect();
        for k in &keys {
            cache.lock().unwrap().put(k.as_bytes().to_vec(), vec![7; VALUE_BYTES]);
        }
        let lower = KeyRange::new(SliceKey(0), Some(SliceKey(1 << 63)));
        let text = format_range(&lower);
        assert_eq!(parse_range(&text), Some(lower));
        assert_eq!(
            parse_range(&format_range(&KeyRange::new(SliceKey(5), None))),
            Some(KeyRange::new(SliceKey(5), None))
        );
        assert_eq!(parse_range("9-3"), None);
        let got = entries(&export(&cache, lower));
        let expected: Vec<Vec<u8>> = keys
            .iter()
            .rev()
            .filter(|k| SliceKey::of(k.as_str()).0 < 1 << 63)
            .map(|k| k.as_bytes().to_vec())
            .collect();
        assert!(!expected.is_empty() && expected.len() < keys.len());
        assert_eq!(got.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>(), expected);
        assert!(got.iter().all(|(_, v)| v == &vec![7; VALUE_BYTES]));
    }
}
