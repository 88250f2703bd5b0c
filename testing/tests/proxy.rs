//! `proxy::FaultProxy` on real TCP over loopback: it forwards both ways, a cut resets live
//! connections and refuses new ones until restored, delayed answers come late but whole
//! and in order (on a live HTTP/2 connection too), and dropping it ends everything it ran.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use steady_testing::proxy::FaultProxy;
use steady_testing::wait::PATIENCE;
use steady_testing::{eventually, within};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

/// An upstream that echoes every connection, counting those it accepted and those that
/// ended (by an end of stream or an error).
#[derive(Default)]
struct Upstream {
    accepted: AtomicU64,
    ended: AtomicU64,
}

/// Starts an echo upstream on loopback; it runs until the runtime ends.
async fn echo_upstream() -> (SocketAddr, Arc<Upstream>) {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let upstream = Arc::new(Upstream::default());
    let counts = upstream.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            counts.accepted.fetch_add(1, Ordering::SeqCst);
            let counts = counts.clone();
            tokio::spawn(async move {
                let (mut read, mut write) = stream.split();
                let _ = tokio::io::copy(&mut read, &mut write).await;
                counts.ended.fetch_add(1, Ordering::SeqCst);
            });
        }
    });
    (addr, upstream)
}

/// Writes `message` and reads as many bytes back.
async fn round_trip(stream: &mut TcpStream, message: &[u8]) -> io::Result<Vec<u8>> {
    stream.write_all(message).await?;
    let mut back = vec![0; message.len()];
    stream.read_exact(&mut back).await?;
    Ok(back)
}

/// Whether the peer closed or reset `stream`: a read ends with no bytes or an error (within
/// the patience of the waits, else a panic).
async fn closed(stream: &mut TcpStream) -> bool {
    let mut byte = [0; 1];
    matches!(within(PATIENCE, "the connection to close", stream.read(&mut byte)).await, Ok(0) | Err(_))
}

#[tokio::test]
async fn it_forwards_both_ways_and_passes_an_end_of_stream_on() {
    let (addr, upstream) = echo_upstream().await;
    let proxy = FaultProxy::start(addr).await;
    assert!(proxy.endpoint().starts_with("http://127.0.0.1:"));
    assert_eq!(proxy.endpoint(), format!("http://{}", proxy.addr()));
    assert_eq!(proxy.upstream(), addr);
    let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(round_trip(&mut client, b"hello").await.unwrap(), b"hello");
    assert_eq!(round_trip(&mut client, b", world").await.unwrap(), b", world");
    let counts = proxy.counts();
    assert_eq!((counts.accepted, counts.refused, counts.open), (1, 0, 1));
    assert_eq!((counts.bytes_to_upstream, counts.bytes_to_client), (12, 12));
    assert_eq!(upstream.accepted.load(Ordering::SeqCst), 1);
    // The client's end of stream reaches the upstream, which ends its echo, whose end of
    // stream comes back: the relay is over.
    client.shutdown().await.unwrap();
    let mut rest = Vec::new();
    within(PATIENCE, "the upstream's end of stream", client.read_to_end(&mut rest)).await.unwrap();
    assert!(rest.is_empty());
    eventually("the upstream to see the end", || upstream.ended.load(Ordering::SeqCst) == 1).await;
    eventually("the relay to end", || proxy.counts().open == 0).await;
}

#[tokio::test]
async fn a_cut_resets_live_connections_and_refuses_new_ones_until_restored() {
    let (addr, upstream) = echo_upstream().await;
    let proxy = FaultProxy::start(addr).await;
    let mut live = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(round_trip(&mut live, b"before").await.unwrap(), b"before");

    proxy.cut();
    assert!(closed(&mut live).await, "the live connection was not closed");
    eventually("the upstream's side to close too", || upstream.ended.load(Ordering::SeqCst) == 1).await;
    eventually("no open connection", || proxy.counts().open == 0).await;
    // A new connection is accepted by the kernel, then reset at once, and never reaches
    // the upstream.
    let mut refused = TcpStream::connect(proxy.addr()).await.unwrap();
    assert!(round_trip(&mut refused, b"during").await.is_err(), "a connection went through the cut");
    assert_eq!(proxy.counts().refused, 1);
    assert_eq!(upstream.accepted.load(Ordering::SeqCst), 1);

    proxy.restore();
    let mut after = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(round_trip(&mut after, b"after").await.unwrap(), b"after");
    assert_eq!(upstream.accepted.load(Ordering::SeqCst), 2);
    let counts = proxy.counts();
    assert_eq!((counts.accepted, counts.refused, counts.open), (3, 1, 1));
}

#[tokio::test]
async fn a_cut_then_restore_before_the_relays_run_still_closes_them() {
    let (addr, upstream) = echo_upstream().await;
    let proxy = FaultProxy::start(addr).await;
    let mut live = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(round_trip(&mut live, b"x").await.unwrap(), b"x");
    // On this single-threaded runtime no relay runs between the two calls.
    proxy.cut();
    proxy.restore();
    assert!(closed(&mut live).await, "a cut restored at once was missed");
    eventually("the upstream's side to close too", || upstream.ended.load(Ordering::SeqCst) == 1).await;
}

#[tokio::test]
async fn delayed_responses_arrive_late_whole_and_in_order() {
    const DELAY: Duration = Duration::from_millis(200);
    let (addr, _upstream) = echo_upstream().await;
    let proxy = FaultProxy::start(addr).await;
    let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(round_trip(&mut client, b"warm").await.unwrap(), b"warm");

    // The delay applies to a connection already open; the request is not held back.
    proxy.delay_responses(DELAY);
    let sent = Instant::now();
    client.write_all(b"ping").await.unwrap();
    eventually("the request to reach the upstream", || proxy.counts().bytes_to_upstream == 8).await;
    let mut back = [0; 4];
    client.read_exact(&mut back).await.unwrap();
    let waited = sent.elapsed();
    assert_eq!(&back, b"ping");
    assert!(waited >= DELAY, "the answer came after {waited:?}, under {DELAY:?}");

    // Far more than the proxy may hold (it stops reading and TCP holds the sender back):
    // every byte comes back, in order.
    let message: Vec<u8> = (0..1_000_000_u32).map(|i| (i % 251) as u8).collect();
    let (mut read, mut write) = client.into_split();
    let writing = {
        let message = message.clone();
        tokio::spawn(async move { write.write_all(&message).await.map(|()| write) })
    };
    let started = Instant::now();
    let mut back = vec![0; message.len()];
    within(PATIENCE, "the echo of 1 MB", read.read_exact(&mut back)).await.unwrap();
    assert!(started.elapsed() >= DELAY);
    assert!(back == message, "the echo differs from what was sent");
    let write = writing.await.unwrap().unwrap();

    // Back to no delay.
    proxy.delay_responses(Duration::ZERO);
    let mut client = read.reunite(write).unwrap();
    let sent = Instant::now();
    assert_eq!(round_trip(&mut client, b"pong").await.unwrap(), b"pong");
    assert!(sent.elapsed() < DELAY, "still delayed: {:?}", sent.elapsed());
    assert_eq!(proxy.counts().bytes_to_client, 4 + 4 + 1_000_000 + 4);
    assert_eq!(proxy.counts().accepted, 1);
}

#[tokio::test]
async fn dropping_the_proxy_ends_its_tasks_and_closes_both_sides() {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let upstream = listener.local_addr().unwrap();
    // The upstream reads its one connection until it ends, and reports how.
    let upstream_side = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut received = Vec::new();
        stream.read_to_end(&mut received).await.map(|_| received)
    });
    let proxy = FaultProxy::start(upstream).await;
    let addr = proxy.addr();
    let mut client = TcpStream::connect(addr).await.unwrap();
    client.write_all(b"bye").await.unwrap();
    eventually("the bytes to reach the upstream", || proxy.counts().bytes_to_upstream == 3).await;

    drop(proxy);
    let ended = within(PATIENCE, "the upstream's connection to end", upstream_side).await.unwrap();
    if let Ok(received) = ended {
        assert_eq!(received, b"bye");
    }
    assert!(closed(&mut client).await, "the client's connection is still open");
    let refused = TcpStream::connect(addr).await;
    assert!(refused.is_err(), "the listener still accepts");
    // The test's body is not a task: once the upstream's has ended, none is left.
    let runtime = tokio::runtime::Handle::current();
    eventually("every task to end", || runtime.metrics().num_alive_tasks() == 0).await;
}

#[cfg(feature = "grpc")]
#[tokio::test]
async fn a_live_grpc_connection_survives_a_delay_and_reconnects_after_a_cut() {
    use steady_testing::echo::{echo, echo_client::EchoClient, serve_echo};

    const DELAY: Duration = Duration::from_millis(200);
    let (addr, _server) = serve_echo(7).await;
    let proxy = FaultProxy::start(addr).await;
    let channel = tonic::transport::Endpoint::from_shared(proxy.endpoint()).unwrap().connect().await.unwrap();
    let mut client = EchoClient::new(channel);
    assert_eq!(echo(&mut client, None, b"a").await.unwrap(), 7);

    proxy.delay_responses(DELAY);
    for _ in 0..3 {
        let sent = Instant::now();
        assert_eq!(echo(&mut client, None, b"b").await.unwrap(), 7);
        assert!(sent.elapsed() >= DELAY, "answered in {:?}", sent.elapsed());
    }
    proxy.delay_responses(Duration::ZERO);
    assert_eq!(echo(&mut client, None, b"c").await.unwrap(), 7);
    assert_eq!(proxy.counts().accepted, 1, "the HTTP/2 connection did not survive the delay");

    proxy.cut();
    eventually("the connection to close", || proxy.counts().open == 0).await;
    assert!(echo(&mut client, None, b"d").await.is_err(), "a call went through the cut");
    proxy.restore();
    within(PATIENCE, "a call after the restore", async {
        while echo(&mut client, None, b"e").await.is_err() {
            tokio::time::sleep(steady_testing::wait::POLL).await;
        }
    })
    .await;
    assert!(proxy.counts().accepted >= 2);
}

#[tokio::test]
async fn held_requests_never_reach_the_upstream_while_answers_already_due_still_arrive() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    // The upstream answers every byte it gets with the same byte.
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut buffer = [0u8; 1024];
        loop {
            let n = socket.read(&mut buffer).await.unwrap();
            if n == 0 {
                return;
            }
            socket.write_all(&buffer[..n]).await.unwrap();
        }
    });
    let proxy = FaultProxy::start(upstream).await;
    proxy.delay_responses(Duration::from_millis(200));
    let mut client = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    client.write_all(b"a").await.unwrap();
    eventually("the request reached the upstream", || proxy.counts().bytes_to_upstream == 1).await;
    proxy.hold_requests(true);
    client.write_all(b"b").await.unwrap();
    let mut answer = [0u8; 1];
    client.read_exact(&mut answer).await.unwrap();
    assert_eq!(&answer, b"a", "the answer to a request sent before the hold still arrives");
    assert_eq!(proxy.counts().bytes_to_upstream, 1, "the held request never left");
    proxy.hold_requests(false);
    client.read_exact(&mut answer).await.unwrap();
    assert_eq!(&answer, b"b", "released, it goes through");
}
