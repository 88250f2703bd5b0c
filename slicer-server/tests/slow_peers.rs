//! The status pages under slow and idle peers, over real TCP on loopback: a slow-loris
//! storm (more connections than the server serves at once: some silent from the start,
//! some sending a request head a byte at a time, some idle on keep-alive after one
//! request) cannot lock a fresh scraper out, and the timeouts close each kind of slow
//! peer on their own.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use steady_slicer::load::{LoadBook, LoadCollector};
use steady_slicer::Distributor;
use steady_slicer_server::status::{MetricsRegistry, StatusServer, StatusSources};
use steady_testing::wait::{eventually_within, within};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::task::JoinSet;

/// What a scraper sends: HTTP/1.1, so keep-alive unless either side closes.
const SCRAPE: &[u8] = b"GET /metrics HTTP/1.1\r\nHost: pages\r\n\r\n";
/// The most connections the server serves at once (its documented bound).
const SLOTS: usize = 64;
/// How long a fresh scraper may take to get its page, the storm raging: well under the
/// 5 s head timeout a locked-out scraper would wait for a slot, with room for a loaded
/// machine (the storm's 96 peers share its two cores; the figures are printed).
const SCRAPE_BOUND: Duration = Duration::from_secs(2);

/// The pages' server on a runtime of its own (as in the binary: the peers are other
/// processes, not tasks sharing its threads), stopped when dropped.
struct Pages {
    addr: SocketAddr,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Drop for Pages {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// A server of an empty fleet's pages with a gauge `steady_test_up` at `/metrics` (kept while
/// the returned gauge is).
fn server() -> (StatusServer, opentelemetry::metrics::ObservableGauge<u64>) {
    let registry = MetricsRegistry::new();
    let up =
        registry.meter().u64_observable_gauge("steady.test.up").with_callback(|o| o.observe(1, &[])).build();
    let sources = StatusSources {
        instance: "a".into(),
        store: "memory".into(),
        distributor: Distributor::new(),
        collector: LoadCollector::new(LoadBook::new()),
        fleet: watch::channel(Arc::default()).1,
        autosharding: None,
    };
    (StatusServer::new(sources, registry), up)
}

/// [`server`], configured by `configure`, serving on 127.0.0.1, port 0.
fn serve(configure: impl FnOnce(StatusServer) -> StatusServer) -> Pages {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (server, up) = server();
    let server = configure(server);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    runtime.spawn(async move {
        let _up = up;
        server.serve(tokio::net::TcpListener::from_std(listener)?).await
    });
    Pages { addr, runtime: Some(runtime) }
}

/// Reads one response (a head, then a `Content-Length` body): its head and body.
async fn read_response(stream: &mut TcpStream) -> io::Result<(String, String)> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buffer[..end]).into_owned();
            let length: usize = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_owned())
                })
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let mut body = buffer[end + 4..].to_vec();
            while body.len() < length {
                let n = stream.read(&mut chunk).await?;
                if n == 0 {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                body.extend_from_slice(&chunk[..n]);
            }
            return Ok((head, String::from_utf8_lossy(&body).into_owned()));
        }
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        buffer.extend_from_slice(&chunk[..n]);
    }
}

/// Reads until the server closes the connection (end of stream or a reset), discarding
/// what comes.
async fn until_closed(stream: &mut TcpStream) {
    let mut sink = [0u8; 4096];
    while let Ok(n) = stream.read(&mut sink).await {
        if n == 0 {
            return;
        }
    }
}

/// A fresh scraper: connects, asks for `/metrics`, and returns how long the page took.
async fn scrape(addr: SocketAddr) -> Duration {
    let start = Instant::now();
    let page = async {
        let mut stream = TcpStream::connect(addr).await?;
        stream.write_all(SCRAPE).await?;
        read_response(&mut stream).await
    };
    let (head, body) = within(Duration::from_secs(30), "a scrape to end", page).await.expect("a scrape");
    let took = start.elapsed();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(body.contains("steady_test_up 1"), "{body}");
    took
}

/// How one peer of the storm behaves on each connection.
#[derive(Debug, Clone, Copy)]
enum Loris {
    /// Connects and never sends a byte.
    Silent,
    /// Sends a request head a byte at a time, one every 100 ms, and never ends it (a
    /// header that goes on).
    Trickle,
    /// Sends one whole request, reads its response, then stays idle on keep-alive.
    KeepAlive,
}

/// What the storm counts.
#[derive(Debug, Default)]
struct Storm {
    /// Connections made.
    connects: AtomicU64,
    /// Connections open now (the client's view: accepted by the kernel, maybe not yet
    /// by the server).
    open: AtomicU64,
    /// Responses the keep-alive peers read.
    served: AtomicU64,
    /// Bytes the trickling peers sent.
    trickled: AtomicU64,
    /// Connections the server closed within 4 s of their start: with the default
    /// timeouts (a head within 5 s, 30 s idle) none of them timed out, so the server
    /// closed them to make room.
    closed_early: AtomicU64,
    stop: AtomicBool,
}

impl Storm {
    /// One peer: connects as `kind` does, and connects again 50 ms after the server
    /// closes it (as a slow-loris tool keeps its connections), until the storm stops.
    async fn peer(self: Arc<Self>, addr: SocketAddr, kind: Loris) {
        while !self.stop.load(Ordering::Relaxed) {
            let Ok(mut stream) = TcpStream::connect(addr).await else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let start = Instant::now();
            self.connects.fetch_add(1, Ordering::Relaxed);
            self.open.fetch_add(1, Ordering::Relaxed);
            match kind {
                Loris::Silent => until_closed(&mut stream).await,
                Loris::Trickle => {
                    let (mut read, mut write) = stream.split();
                    let trickle = async {
                        let head = b"GET /metrics HTTP/1.1\r\nHost: pages\r\nX-Loris: ";
                        for byte in head.iter().chain(std::iter::repeat(&b'a')) {
                            if write.write_all(&[*byte]).await.is_err() {
                                break;
                            }
                            self.trickled.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    };
                    let closed = async {
                        let mut sink = [0u8; 512];
                        while let Ok(n) = read.read(&mut sink).await {
                            if n == 0 {
                                break;
                            }
                        }
                    };
                    tokio::select! {
                        () = trickle => {}
                        () = closed => {}
                    }
                }
                Loris::KeepAlive => {
                    if stream.write_all(SCRAPE).await.is_ok() && read_response(&mut stream).await.is_ok() {
                        self.served.fetch_add(1, Ordering::Relaxed);
                        until_closed(&mut stream).await;
                    }
                }
            }
            self.open.fetch_sub(1, Ordering::Relaxed);
            if start.elapsed() < Duration::from_secs(4) {
                self.closed_early.fetch_add(1, Ordering::Relaxed);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_scraper_gets_its_page_within_two_seconds_during_a_slow_loris_storm() {
    let pages = serve(|server| server);
    let addr = pages.addr;
    // Half again as many peers as the server serves at once, a third of each kind.
    const EACH: usize = SLOTS / 2;
    let storm = Arc::new(Storm::default());
    let mut peers = JoinSet::new();
    for kind in [Loris::Silent, Loris::Trickle, Loris::KeepAlive] {
        for _ in 0..EACH {
            peers.spawn(storm.clone().peer(addr, kind));
        }
    }
    // The storm holds every slot: at least as many of its connections are open as the
    // server serves, and every keep-alive peer has had its response (so it idles now).
    eventually_within(Duration::from_secs(30), "the storm to hold every slot", || {
        storm.open.load(Ordering::Relaxed) >= SLOTS as u64
            && storm.served.load(Ordering::Relaxed) >= EACH as u64
    })
    .await;

    let mut took = Vec::new();
    for _ in 0..6 {
        // Each scraper comes once the storm has gone on (every trickler sent about three
        // more bytes, 300 ms, and 32 more connections were made), so each meets it anew.
        let (connects, trickled) =
            (storm.connects.load(Ordering::Relaxed), storm.trickled.load(Ordering::Relaxed));
        eventually_within(Duration::from_secs(30), "the storm to go on", || {
            storm.connects.load(Ordering::Relaxed) >= connects + EACH as u64
                && storm.trickled.load(Ordering::Relaxed) >= trickled + 3 * EACH as u64
        })
        .await;
        took.push(scrape(addr).await);
    }
    storm.stop.store(true, Ordering::Relaxed);
    peers.abort_all();
    let closed_early = storm.closed_early.load(Ordering::Relaxed);
    let connects = storm.connects.load(Ordering::Relaxed);
    let trickled = storm.trickled.load(Ordering::Relaxed);
    println!(
        "scrapes took {took:?}; the storm made {connects} connections, {closed_early} closed to make room, \
         trickled {trickled} bytes"
    );
    assert!(took.iter().all(|t| *t < SCRAPE_BOUND), "a fresh scraper waited: {took:?}");
    // The storm did fill the table: peers were closed to make room (none timed out).
    assert!(closed_early > 0, "the storm never filled the table ({connects} connections)");
}

/// The head timeout of the tests of the timeouts (5 s in production).
const HEAD: Duration = Duration::from_millis(400);
/// Their idle timeout (30 s in production).
const IDLE: Duration = Duration::from_millis(1200);
/// How late a connection may be closed after its timeout, here: the sweep runs every
/// 50 ms; the rest is for a busy machine.
const LATE: Duration = Duration::from_secs(1);

/// How long after `start` the server closed the connection `read` reads from (end of
/// stream or a reset), while `during` runs; bounded.
async fn closed_after(
    what: &str,
    read: &mut (impl AsyncRead + Unpin),
    start: Instant,
    during: impl std::future::Future<Output = ()>,
) -> Duration {
    within(Duration::from_secs(10), what, async {
        let mut sink = [0u8; 4096];
        let closed = async {
            while let Ok(n) = read.read(&mut sink).await {
                if n == 0 {
                    break;
                }
            }
        };
        tokio::select! {
            () = closed => {}
            () = during => {}
        }
        start.elapsed()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_timeouts_close_silent_trickling_and_idle_peers_and_spare_keep_alive() {
    let pages = serve(|server| server.head_timeout(HEAD).idle_timeout(IDLE));
    let addr = pages.addr;
    // Fewer connections than slots: whatever closes them here is a timeout.

    let silent = async {
        let start = Instant::now();
        let mut stream = TcpStream::connect(addr).await.unwrap();
        closed_after("the silent peer to be closed", &mut stream, start, std::future::pending()).await
    };

    // A byte every 50 ms: progress all along, which does not extend the head.
    let trickler = async {
        let start = Instant::now();
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let (mut read, mut write) = stream.split();
        let mut sent = 0;
        let trickle = async {
            for byte in b"GET /metrics HTTP/1.1\r\nX-Loris: ".iter().chain(std::iter::repeat(&b'a')) {
                if write.write_all(&[*byte]).await.is_err() {
                    return;
                }
                sent += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        (closed_after("the trickler to be closed", &mut read, start, trickle).await, sent)
    };

    // One request, then idle: closed after the idle timeout, not the head timeout.
    let idle = async {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(SCRAPE).await.unwrap();
        // Timed from the request sent: the server's idle time starts later (as it writes
        // the response), so the time measured is never shorter than the server's.
        let served = Instant::now();
        let (head, _) = read_response(&mut stream).await.unwrap();
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        closed_after("the idle peer to be closed", &mut stream, served, std::future::pending()).await
    };

    // Idle for twice the head timeout between two requests: both are served (the idle
    // time is not counted against the second head). The pause is the scenario, not a
    // wait for a state.
    let reused = async {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(SCRAPE).await.unwrap();
        let (first, _) = read_response(&mut stream).await.unwrap();
        tokio::time::sleep(2 * HEAD).await;
        stream.write_all(SCRAPE).await.unwrap();
        let (second, body) = read_response(&mut stream).await.unwrap();
        (first, second, body)
    };

    let (silent, (trickler, sent), idle, (first, second, body)) =
        tokio::join!(silent, trickler, idle, reused);
    println!(
        "closed: silent after {silent:?}, trickler after {trickler:?} ({sent} bytes), idle after {idle:?}"
    );
    assert!(silent >= HEAD && silent < HEAD + LATE, "the silent peer was closed after {silent:?}");
    assert!(trickler >= HEAD && trickler < HEAD + LATE, "the trickler was closed after {trickler:?}");
    assert!(sent >= 4, "the trickler made progress all along ({sent} bytes)");
    assert!(idle > HEAD + Duration::from_millis(300), "idle closed by the head timeout ({idle:?})");
    assert!(idle >= IDLE - Duration::from_millis(10) && idle < IDLE + LATE, "idle closed after {idle:?}");
    assert!(first.starts_with("HTTP/1.1 200") && second.starts_with("HTTP/1.1 200"), "{first}\n{second}");
    assert!(body.contains("steady_test_up 1"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_does_not_read_its_responses_is_closed() {
    let pages = serve(|server| server.head_timeout(HEAD).idle_timeout(IDLE));
    // A small receive window, and requests pipelined without reading a response: the
    // server's writes stall once the socket buffers are full, and the response under
    // way must be written within the head timeout.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stream = socket.connect(pages.addr).await.unwrap();
    let start = Instant::now();
    let requests = b"GET / HTTP/1.1\r\nHost: pages\r\n\r\n".repeat(64);
    let error = within(Duration::from_secs(20), "the server to close the non-reader", async {
        loop {
            if let Err(error) = stream.write_all(&requests).await {
                return error;
            }
        }
    })
    .await;
    println!("the non-reader was closed ({error}) after {:?}", start.elapsed());
    assert!(start.elapsed() >= HEAD, "closed before any timeout: {error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_request_may_send_is_bounded() {
    let pages = serve(|server| server);
    let addr = pages.addr;
    // A body (promised, never sent): refused unread, the connection closed.
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: pages\r\nContent-Length: 1000000\r\n\r\nabc")
        .await
        .unwrap();
    let (head, _) = within(Duration::from_secs(10), "a refusal", read_response(&mut stream)).await.unwrap();
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");
    let start = Instant::now();
    let closed = closed_after("the connection to close", &mut stream, start, std::future::pending()).await;
    assert!(closed < Duration::from_secs(4), "closed by the head timeout, not at once ({closed:?})");

    // A head over 16 KiB: refused.
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let long = format!("GET /metrics HTTP/1.1\r\nHost: pages\r\nX-Long: {}\r\n\r\n", "a".repeat(20_000));
    let _ = stream.write_all(long.as_bytes()).await;
    let (head, _) = within(Duration::from_secs(10), "a refusal", read_response(&mut stream)).await.unwrap();
    assert!(head.starts_with("HTTP/1.1 431"), "{head}");

    // Other methods: refused.
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(b"DELETE /metrics HTTP/1.1\r\nHost: pages\r\n\r\n").await.unwrap();
    let (head, _) = within(Duration::from_secs(10), "a refusal", read_response(&mut stream)).await.unwrap();
    assert!(head.starts_with("HTTP/1.1 405"), "{head}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_serve_closes_its_connections() {
    let (server, _up) = server();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let serving = tokio::spawn(server.serve(listener));
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(SCRAPE).await.unwrap();
    let (head, _) = read_response(&mut stream).await.unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    // Idle on keep-alive (30 s allowed), its task still running: the serve future
    // dropped takes the connection with it.
    let start = Instant::now();
    serving.abort();
    let closed = closed_after("the connection to close", &mut stream, start, std::future::pending()).await;
    assert!(closed < Duration::from_secs(5), "{closed:?}");
}
