//! [`TlsIncoming`]: TLS connections accepted on a listener, handshakes made concurrently
//! and bounded, for tonic's `serve_with_incoming`.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::Stream;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinHandle;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// How long a peer has to finish its handshake before its connection is closed.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The most handshakes under way at once; past it, accepting waits for one to end (the
/// kernel's backlog holds the rest).
pub const MAX_HANDSHAKES: usize = 1024;

/// Established connections handed over but not yet taken by the server.
const READY_QUEUE: usize = 64;

/// How long accepting pauses after the listener fails (out of file descriptors, say).
const ACCEPT_PAUSE: Duration = Duration::from_millis(50);

/// The TLS connections accepted on a listener: a stream of established sessions for
/// tonic's `Router::serve_with_incoming` (tonic reads the peer's certificates from each,
/// as with its own TLS).
///
/// Handshakes run concurrently on tasks of their own, at most [`MAX_HANDSHAKES`] at
/// once, each given [`HANDSHAKE_TIMEOUT`]: a peer that connects and stalls holds one
/// slot for that long and delays nobody else. A failed handshake (an untrusted
/// certificate, a peer that does not speak TLS) closes that connection, is counted
/// ([`TlsIncoming::counts`]) and logged at debug level; accepting goes on. An error of
/// the listener itself is logged and accepting resumes after a short pause: the stream
/// never ends while it lives. Each handshake reads the `ServerConfig`'s resolver and
/// verifier, so replacing their material ([`super::ServerIdentity`],
/// [`super::ClientCas`]) applies from the next connection.
///
/// Dropping it stops accepting and closes the listener (handshakes under way finish
/// or time out, and their connections are dropped).
#[derive(Debug)]
pub struct TlsIncoming {
    ready: mpsc::Receiver<TlsStream<TcpStream>>,
    acceptor: JoinHandle<()>,
    counts: Arc<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    established: AtomicU64,
    failed: AtomicU64,
}

/// What a [`TlsIncoming`] has done so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HandshakeCounts {
    /// Handshakes completed.
    pub established: u64,
    /// Handshakes that failed or timed out.
    pub failed: u64,
}

impl TlsIncoming {
    /// Accepts on `listener` with `config` (see [`super::server_config`]; its ALPN
    /// should offer `h2`). Sets `TCP_NODELAY` on every connection. Must be called within
    /// a tokio runtime.
    pub fn new(listener: TcpListener, config: Arc<ServerConfig>) -> Self {
        let (handed, ready) = mpsc::channel(READY_QUEUE);
        let counts = Arc::new(Counts::default());
        let acceptor = tokio::spawn(accept(listener, TlsAcceptor::from(config), handed, counts.clone()));
        Self { ready, acceptor, counts }
    }

    /// Handshakes completed and failed so far.
    pub fn counts(&self) -> HandshakeCounts {
        counts_of(&self.counts)
    }

    /// A reader of [`TlsIncoming::counts`] that outlives the move of the stream into a
    /// server.
    pub fn counter(&self) -> impl Fn() -> HandshakeCounts + Send + Sync + 'static {
        let counts = self.counts.clone();
        move || counts_of(&counts)
    }
}

fn counts_of(counts: &Counts) -> HandshakeCounts {
    HandshakeCounts {
        established: counts.established.load(Ordering::Relaxed),
        failed: counts.failed.load(Ordering::Relaxed),
    }
}

impl Drop for TlsIncoming {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

impl Stream for TlsIncoming {
    type Item = Result<TlsStream<TcpStream>, std::io::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.ready.poll_recv(cx).map(|next| next.map(Ok))
    }
}

/// The accept loop: one task per handshake, at most [`MAX_HANDSHAKES`] at once.
async fn accept(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    handed: mpsc::Sender<TlsStream<TcpStream>>,
    counts: Arc<Counts>,
) {
    let slots = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    loop {
        // The semaphore is never closed.
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        let (tcp, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "TLS listener: accept failed; retrying");
                tokio::time::sleep(ACCEPT_PAUSE).await;
                continue;
            }
        };
        if handed.is_closed() {
            return;
        }
        let _ = tcp.set_nodelay(true);
        let (acceptor, handed, counts) = (acceptor.clone(), handed.clone(), counts.clone());
        tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => {
                    counts.established.fetch_add(1, Ordering::Relaxed);
                    // The slot is held until the server takes the connection: a server
                    // that stops taking them stops the accepting too.
                    let _ = handed.send(tls).await;
                }
                Ok(Err(error)) => {
                    counts.failed.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(%peer, %error, "TLS handshake failed");
                }
                Err(_) => {
                    counts.failed.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(%peer, "TLS handshake timed out");
                }
            }
            drop(slot);
        });
    }
}
