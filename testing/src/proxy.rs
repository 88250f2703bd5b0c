//! A TCP forwarder that injects faults into one link (feature `proxy`): put a
//! [`FaultProxy`] between one process and a server (a Slicelet and etcd's client port),
//! give the process [`FaultProxy::endpoint`] instead of the server's, and cut the link or
//! hold the server's answers back while both sides run.
//!
//! ```no_run
//! # async fn test(etcd: std::net::SocketAddr) {
//! use std::time::Duration;
//! let proxy = steady_testing::proxy::FaultProxy::start(etcd).await;
//! let endpoint = proxy.endpoint(); // "http://127.0.0.1:<port>", for the client
//! proxy.delay_responses(Duration::from_millis(300)); // answers arrive 300 ms late
//! proxy.cut(); // every connection closed, new ones refused...
//! proxy.restore(); // ...until now
//! # let _ = endpoint;
//! # }
//! ```
//!
//! # Faults
//!
//! * [`FaultProxy::cut`]: every open connection is reset at once, both sides (the client
//!   and the server each see their connection reset: an abortive close, not a goodbye),
//!   and each new one is reset as soon as it is accepted, until [`FaultProxy::restore`].
//! * [`FaultProxy::delay_responses`]: every chunk of bytes the server sends is forwarded
//!   to the client the delay after the proxy read it, in order. Requests still reach the
//!   server at once, so the server acts on a request (renews a lease) long before the
//!   client hears that it did. It works on a live HTTP/2 connection (a gRPC stream
//!   stays up): the bytes are only late, never reordered or lost. A delay longer than
//!   the client's HTTP/2 keep-alive timeout, if it set one, makes the client drop the
//!   connection, as it would on a slow network.
//!
//! # Bounds
//!
//! At most [`MAX_CONNECTIONS`] connections are relayed at once; more are reset as soon as
//! they are accepted (and counted as refused). Each direction of a connection holds at
//! most [`MAX_HELD`] bytes between reading and forwarding them (in chunks of at most
//! [`CHUNK`] bytes): a delayed direction that holds that much stops reading, so the sender
//! is held back by TCP's flow control instead of the proxy's memory growing (with a delay
//! `d`, a direction forwards at most about `MAX_HELD` bytes per `d`, plus what the
//! sockets' buffers hold).
//!
//! # Lifetime
//!
//! The proxy runs on tasks of the tokio runtime it was started on. Dropping it stops
//! them all: its listener closes and every relayed connection is closed on both sides.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

/// How many connections a proxy relays at once.
pub const MAX_CONNECTIONS: usize = 256;

/// The most bytes one read of a direction takes.
pub const CHUNK: usize = 16 * 1024;

/// The most bytes one direction of a connection holds between reading and forwarding
/// them: ten chunks.
pub const MAX_HELD: usize = 10 * CHUNK;

/// The chunks queued between a direction's reader and its writer: with the one the writer
/// holds (waiting for its time) and the one the reader holds (waiting for room), it holds
/// [`MAX_HELD`] at most.
const QUEUED: usize = MAX_HELD / CHUNK - 2;

/// How long the proxy waits before accepting again after the listener failed (out of
/// file descriptors, for instance).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(10);

/// A TCP forwarder on 127.0.0.1 in front of one upstream address, that can cut the link
/// or delay the upstream's answers; see the [module documentation](self).
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

/// What the proxy counted since it started, for tests to wait on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    /// Connections the listener accepted, refused ones included.
    pub accepted: u64,
    /// Accepted connections that were reset at once: while cut, or beyond
    /// [`MAX_CONNECTIONS`].
    pub refused: u64,
    /// Connections being relayed now (those refused never are).
    pub open: usize,
    /// Bytes forwarded from clients to the upstream.
    pub bytes_to_upstream: u64,
    /// Bytes forwarded from the upstream to clients (written to them, after any delay).
    pub bytes_to_client: u64,
}

#[derive(Debug)]
struct Shared {
    upstream: SocketAddr,
    link: watch::Sender<Link>,
    /// [`FaultProxy::delay_responses`]'s delay, in nanoseconds.
    delay: AtomicU64,
    /// [`FaultProxy::hold_requests`]: `true` while requests are held.
    held: watch::Sender<bool>,
    slots: Arc<Semaphore>,
    accepted: AtomicU64,
    refused: AtomicU64,
    to_upstream: AtomicU64,
    to_client: AtomicU64,
}

/// Whether the link is cut, and how many times it was: a connection ends when the count
/// moves past the one it started under, even if the link was restored before its task
/// looked.
#[derive(Debug, Clone, Copy, Default)]
struct Link {
    cut: bool,
    cuts: u64,
}

impl FaultProxy {
    /// Starts a proxy to `upstream` on a port of 127.0.0.1 the system chooses, on the
    /// current tokio runtime. Each connection it accepts is relayed to a connection of its
    /// own to `upstream`, opened then; when `upstream` refuses it, the client's connection
    /// is reset.
    ///
    /// # Panics
    ///
    /// When 127.0.0.1 cannot be bound, or outside a tokio runtime.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .unwrap_or_else(|e| panic!("cannot bind 127.0.0.1: {e}"));
        let addr = listener.local_addr().expect("a bound socket has an address");
        let shared = Arc::new(Shared {
            upstream,
            link: watch::Sender::new(Link::default()),
            delay: AtomicU64::new(0),
            held: watch::Sender::new(false),
            slots: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
            accepted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            to_upstream: AtomicU64::new(0),
            to_client: AtomicU64::new(0),
        });
        let accept = tokio::spawn(accept(listener, shared.clone()));
        Self { addr, shared, accept }
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port>`, for a gRPC or etcd client.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The address the proxy forwards to.
    pub fn upstream(&self) -> SocketAddr {
        self.shared.upstream
    }

    /// Cuts the link: resets every open connection, both sides, and every new one as soon
    /// as it is accepted, until [`FaultProxy::restore`]. Returns at once; the relaying
    /// tasks close their connections as soon as they run (wait for
    /// [`Counts::open`] to reach 0 to know they have).
    pub fn cut(&self) {
        self.shared.link.send_modify(|link| {
            link.cut = true;
            link.cuts += 1;
        });
    }

    /// Restores the link after [`FaultProxy::cut`]: new connections are relayed again.
    /// Connections reset by the cut stay closed.
    pub fn restore(&self) {
        self.shared.link.send_modify(|link| link.cut = false);
    }

    /// Holds every byte clients send (`true`) or lets them through again (`false`): a
    /// one-way partition. While held, the proxy reads nothing from clients, so no new
    /// request reaches the upstream, while answers to requests it already got still
    /// come back (after [`FaultProxy::delay_responses`]'s delay). Connections stay open.
    pub fn hold_requests(&self, held: bool) {
        self.shared.held.send_replace(held);
    }

    /// From now on, holds every chunk of bytes read from the upstream back `delay` from
    /// when it was read before forwarding it to its client, in order (a chunk read after
    /// a shorter delay was set still waits for those before it). [`Duration::ZERO`]
    /// forwards at once again. Applies to open connections as well as new ones; bytes
    /// from clients to the upstream are never delayed.
    pub fn delay_responses(&self, delay: Duration) {
        let nanos = u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX);
        self.shared.delay.store(nanos, Ordering::Relaxed);
    }

    /// What the proxy counted since it started.
    pub fn counts(&self) -> Counts {
        let shared = &self.shared;
        Counts {
            accepted: shared.accepted.load(Ordering::Relaxed),
            refused: shared.refused.load(Ordering::Relaxed),
            open: MAX_CONNECTIONS - shared.slots.available_permits(),
            bytes_to_upstream: shared.to_upstream.load(Ordering::Relaxed),
            bytes_to_client: shared.to_client.load(Ordering::Relaxed),
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // The accepting task owns the listener and the relaying tasks (a JoinSet, which
        // aborts them when dropped): aborting it ends them all.
        self.accept.abort();
    }
}

/// Accepts connections until aborted, relaying each on a task of its own.
async fn accept(listener: TcpListener, shared: Arc<Shared>) {
    let mut relays = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let client = match accepted {
                    Ok((client, _)) => client,
                    Err(_) => {
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                        continue;
                    }
                };
                shared.accepted.fetch_add(1, Ordering::Relaxed);
                // The state the connection is accepted under: a cut from now on ends it.
                let mut link = shared.link.subscribe();
                let now = *link.borrow_and_update();
                let permit = shared.slots.clone().try_acquire_owned();
                match permit {
                    Ok(permit) if !now.cut => {
                        relays.spawn(relay(client, link, now.cuts, shared.clone(), permit));
                    }
                    _ => {
                        shared.refused.fetch_add(1, Ordering::Relaxed);
                        reset(&client);
                    }
                }
            }
            // Finished relays are collected as they end, so the set holds live ones only.
            Some(_) = relays.join_next(), if !relays.is_empty() => {}
        }
    }
}

/// Relays `client` to a new connection to the upstream until both directions end (each
/// side's end of stream passed on to the other), an error ends one (both sides are reset),
/// or the link is cut after the `started`th cut (both are reset).
async fn relay(
    mut client: TcpStream,
    mut link: watch::Receiver<Link>,
    started: u64,
    shared: Arc<Shared>,
    _slot: OwnedSemaphorePermit,
) {
    let cut = async move {
        // The sender lives in `shared`, which this task holds: it never closes first.
        let _ = link.wait_for(|link| link.cuts != started).await;
    };
    let mut cut = std::pin::pin!(cut);
    let _ = client.set_nodelay(true);
    let connected = tokio::select! {
        connected = TcpStream::connect(shared.upstream) => connected,
        () = &mut cut => Err(io::ErrorKind::ConnectionAborted.into()),
    };
    let Ok(mut upstream) = connected else {
        reset(&client);
        return;
    };
    let _ = upstream.set_nodelay(true);
    let failed = {
        let (from_client, to_client) = client.split();
        let (from_upstream, to_upstream) = upstream.split();
        let held = Some(shared.held.subscribe());
        let requests = forward(from_client, to_upstream, || Duration::ZERO, held, &shared.to_upstream);
        let responses = forward(from_upstream, to_client, || shared.delay(), None, &shared.to_client);
        tokio::select! {
            relayed = async { tokio::try_join!(requests, responses) } => relayed.is_err(),
            () = &mut cut => true,
        }
    };
    // Cut, or reset by one side: the other side sees a reset too.
    if failed {
        reset(&client);
        reset(&upstream);
    }
}

impl Shared {
    fn delay(&self) -> Duration {
        Duration::from_nanos(self.delay.load(Ordering::Relaxed))
    }
}

/// Makes closing `stream` abortive: its peer sees the connection reset, and unsent bytes
/// are dropped, as when a link fails.
fn reset(stream: &TcpStream) {
    let _ = stream.set_zero_linger();
}

/// Copies `from` to `to` chunk by chunk, each forwarded `delay()` (as it was when the
/// chunk was read) after it was read, counting the bytes written in `forwarded`. At the
/// end of `from`, shuts `to`'s writing side down (after the delay too), so a half-closed
/// connection stays half-closed. Holds at most [`MAX_HELD`] bytes: with that much
/// waiting, it stops reading.
async fn forward(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    delay: impl Fn() -> Duration,
    mut held: Option<watch::Receiver<bool>>,
    forwarded: &AtomicU64,
) -> io::Result<()> {
    let (chunks, mut waiting) = mpsc::channel::<(Instant, Vec<u8>)>(QUEUED);
    let read = async move {
        let mut buffer = vec![0; CHUNK];
        loop {
            let n = from.read(&mut buffer).await?;
            if let Some(held) = held.as_mut() {
                // Held after it was read: a read already waiting when the hold began must
                // not slip through. The sender lives in the proxy's shared state.
                let _ = held.wait_for(|held| !*held).await;
            }
            let due = Instant::now() + delay();
            // An empty chunk is the end of the stream. The writer gone (it failed) ends
            // the reading too.
            if chunks.send((due, buffer[..n].to_vec())).await.is_err() || n == 0 {
                return Ok::<_, io::Error>(());
            }
        }
    };
    let write = async move {
        while let Some((due, chunk)) = waiting.recv().await {
            if due > Instant::now() {
                tokio::time::sleep_until(due).await;
            }
            if chunk.is_empty() {
                return to.shutdown().await;
            }
            to.write_all(&chunk).await?;
            forwarded.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        }
        Ok(())
    };
    tokio::try_join!(read, write).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_delayed_direction_holds_a_bounded_amount_then_stops_reading() {
        const PIPE: usize = 64 * 1024;
        static FORWARDED: AtomicU64 = AtomicU64::new(0);
        let (mut sender, from) = tokio::io::duplex(PIPE);
        let (to, _receiver) = tokio::io::duplex(PIPE);
        let forwarding = tokio::spawn(forward(from, to, || Duration::from_secs(3600), None, &FORWARDED));
        // Write until a write has been blocked for a second: on the paused clock, time
        // moves only when every task waits, so a second means nothing will read more.
        let mut written = 0;
        let piece = [7_u8; 4096];
        while let Ok(wrote) = tokio::time::timeout(Duration::from_secs(1), sender.write(&piece)).await {
            written += wrote.unwrap();
        }
        assert!(written > PIPE, "the forwarder read nothing ahead: {written} bytes written");
        let most = PIPE + MAX_HELD;
        assert!(written <= most, "{written} bytes taken in, more than the bound {most}");
        assert_eq!(FORWARDED.load(Ordering::Relaxed), 0, "bytes forwarded before their delay");
        forwarding.abort();
    }
}
