//! Backends that stay up but answer badly, against the tonic channel on real tonic
//! servers on 127.0.0.1: statuses from headers (trailers-only) and from trailers after a
//! body, application answers, and deadlines. Servers and loops are bounded.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use http_body_util::StreamBody;
use prost::Message;
use steady_balance::{BalanceConfig, Load, MemberState};
use steady_testing::echo::echo_client::EchoClient;
use steady_testing::echo::echo_server::{Echo, EchoServer};
use steady_testing::echo::{EchoReply, EchoRequest};
use steady_testing::eventually;
use steady_testing::loopback::{endpoint, serve, Loopback, ServerGuard};
use steady_tonic::SteadyChannel;
use tonic::body::Body;
use tonic::{Code, Request, Response, Status};

/// How a backend answers its calls.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Fine,
    /// Every call: this status, in a trailers-only response.
    Status(Code),
    /// Never answers.
    Blackhole,
}

/// An echo backend whose answers the test sets.
#[derive(Clone)]
struct Backend {
    task: u32,
    mode: Arc<Mutex<Mode>>,
    calls: Arc<AtomicUsize>,
}

#[tonic::async_trait]
impl Echo for Backend {
    async fn echo(&self, request: Request<EchoRequest>) -> Result<Response<EchoReply>, Status> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let mode = *self.mode.lock().unwrap();
        match mode {
            Mode::Fine => {
                Ok(Response::new(EchoReply { payload: request.into_inner().payload, task: self.task }))
            }
            Mode::Status(code) => Err(Status::new(code, "as the test says")),
            Mode::Blackhole => std::future::pending().await,
        }
    }
}

struct Fleet {
    backends: Vec<Backend>,
    _stops: Vec<ServerGuard>,
    channel: SteadyChannel,
}

impl Fleet {
    /// `n` backends, all fine, and a channel keeping `k` of them. The load is requests in
    /// flight unless `load` says otherwise: with Peak EWMA, calls one after another mostly
    /// go to whichever backend answers fastest, and a failing one is avoided (its failures
    /// raise its estimate) before it can be ejected; these tests are about ejection.
    async fn start(n: u32, k: usize) -> Fleet {
        Fleet::start_with(n, BalanceConfig::new(0, k).with_load(Load::InFlight)).await
    }

    async fn start_with(n: u32, config: BalanceConfig) -> Fleet {
        let k = config.subset_size;
        let (mut backends, mut stops, mut endpoints) = (Vec::new(), Vec::new(), Vec::new());
        for task in 0..n {
            let backend = Backend { task, mode: Arc::new(Mutex::new(Mode::Fine)), calls: Arc::default() };
            let (addr, stop) = serve(EchoServer::new(backend.clone())).await;
            backends.push(backend);
            stops.push(stop);
            endpoints.push(endpoint(addr));
        }
        let channel = SteadyChannel::builder(config).from_endpoints(endpoints).unwrap();
        assert!(channel.balance().wait_for_members(k, Duration::from_secs(10)).await);
        Fleet { backends, _stops: stops, channel }
    }

    fn set(&self, task: usize, mode: Mode) {
        *self.backends[task].mode.lock().unwrap() = mode;
    }

    fn calls(&self, task: usize) -> usize {
        self.backends[task].calls.load(Ordering::SeqCst)
    }

    /// Sends `n` calls one after another (each with `timeout`, if any); returns the
    /// statuses of those that failed.
    async fn send(&self, n: usize, timeout: Option<Duration>) -> Vec<Status> {
        let mut client = EchoClient::new(self.channel.clone());
        let mut failed = Vec::new();
        for _ in 0..n {
            let mut request = Request::new(EchoRequest { payload: b"hi".to_vec() });
            if let Some(timeout) = timeout {
                request.set_timeout(timeout);
            }
            if let Err(status) = client.echo(request).await {
                failed.push(status);
            }
        }
        failed
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_answering_unavailable_is_ejected_and_a_stand_in_serves() {
    let fleet = Fleet::start(3, 2).await;
    let bad = fleet.channel.stats().subset[0];
    fleet.set(bad, Mode::Status(Code::Unavailable));
    let failed = fleet.send(200, None).await;
    let stats = fleet.channel.stats();
    assert_eq!(stats.ejected, vec![bad], "{stats:?}");
    assert_eq!(stats.ejections, 0, "its connection works: no transport failure");
    // Without ejection about half the calls would fail (100). A run of five ejects once
    // the other member's answers make it stand out (about ten of them: usually the
    // second or third run); 40 leaves room for how picks happen to spread.
    assert!(failed.len() <= 40 && failed.iter().all(|s| s.code() == Code::Unavailable), "{}", failed.len());
    // The stand-in (the third backend) serves beside the good member, and the ejected
    // one gets nothing more.
    assert!(fleet.channel.balance().wait_for_members(2, Duration::from_secs(10)).await);
    let before = fleet.calls(bad);
    assert!(fleet.send(100, None).await.is_empty());
    assert_eq!(fleet.calls(bad), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_default_load_a_backend_failing_at_once_is_avoided_not_favoured() {
    // Requests in flight alone would favour it (its calls end at once, so it is never
    // busy); Peak EWMA doubles its estimate with every failure.
    let fleet = Fleet::start_with(2, BalanceConfig::new(0, 2)).await;
    fleet.set(0, Mode::Status(Code::Unavailable));
    let failed = fleet.send(400, None).await;
    // Half would fail if calls were spread evenly; the penalty keeps it to a few per
    // second of aging.
    assert!(failed.len() <= 40, "{} of 400 failed", failed.len());
    assert!(fleet.calls(1) >= 360, "{}", fleet.calls(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn application_statuses_never_eject() {
    let fleet = Fleet::start(2, 2).await;
    for code in [Code::NotFound, Code::InvalidArgument, Code::FailedPrecondition, Code::PermissionDenied] {
        fleet.set(0, Mode::Status(code));
        fleet.send(100, None).await;
    }
    let stats = fleet.channel.stats();
    assert!(stats.ejected.is_empty(), "{stats:?}");
    assert_eq!(stats.outlier_ejections_consecutive + stats.outlier_ejections_failure_rate, 0);
    assert!(fleet.calls(0) > 100, "task 0 kept its share: {}", fleet.calls(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_past_their_deadline_count_as_timeouts_and_keep_the_connection() {
    let fleet = Fleet::start(2, 2).await;
    fleet.set(0, Mode::Blackhole);
    let failed = fleet.send(60, Some(Duration::from_millis(50))).await;
    let stats = fleet.channel.stats();
    assert_eq!(stats.ejected, vec![0], "{stats:?}");
    assert_eq!(stats.ejections, 0, "a timeout is no transport failure");
    assert_eq!(stats.connections_open, 2, "the ejected member's connection stays open");
    // tonic ends the call at its deadline, or the server does first (it reads the
    // deadline too, and answers CANCELLED): both count as timeouts. Bounded as above.
    assert!(failed.len() <= 40 && failed.iter().all(|s| s.code() == Code::Cancelled), "{}", failed.len());
}

/// A raw gRPC `steady.echo.v1.Echo/Echo` service that answers every call with an `EchoReply` in the
/// body, then `grpc-status` in the trailers: the status a classifier must find after the
/// body.
#[derive(Clone)]
struct TrailerStatus {
    code: Code,
    calls: Arc<AtomicUsize>,
}

impl tonic::server::NamedService for TrailerStatus {
    const NAME: &'static str = "steady.echo.v1.Echo";
}

impl tower::Service<http::Request<Body>> for TrailerStatus {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<http::Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<Body>) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let code = self.code;
        Box::pin(async move {
            let reply = EchoReply { payload: b"hi".to_vec(), task: 0 }.encode_to_vec();
            let mut framed = BytesMut::new();
            framed.put_u8(0);
            framed.put_u32(reply.len() as u32);
            framed.put_slice(&reply);
            let mut trailers = http::HeaderMap::new();
            trailers.insert("grpc-status", (code as i32).to_string().parse().unwrap());
            let frames = [
                Ok::<_, Status>(http_body::Frame::data(Bytes::from(framed))),
                Ok(http_body::Frame::trailers(trailers)),
            ];
            let body = Body::new(StreamBody::new(futures_util::stream::iter(frames)));
            Ok(http::Response::builder().header("content-type", "application/grpc").body(body).unwrap())
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_in_the_trailers_is_classified_when_the_body_ends() {
    for (code, ejected) in [(Code::Ok, false), (Code::NotFound, false), (Code::Internal, true)] {
        let (mut stops, mut endpoints, mut calls) = (Vec::new(), Vec::new(), Vec::new());
        // Task 0 answers with the status after the body; task 1 is a plain echo server.
        let raw = TrailerStatus { code, calls: Arc::default() };
        calls.push(raw.calls.clone());
        let (addr, stop) = serve(raw).await;
        stops.push(stop);
        endpoints.push(endpoint(addr));
        let good = Backend { task: 1, mode: Arc::new(Mutex::new(Mode::Fine)), calls: Arc::default() };
        let (addr, stop) = serve(EchoServer::new(good)).await;
        stops.push(stop);
        endpoints.push(endpoint(addr));
        // Requests in flight as the load, so that task 0 gets its share of calls one
        // after another (see `Fleet::start`).
        let config = BalanceConfig::new(0, 2).with_load(Load::InFlight);
        let channel = SteadyChannel::builder(config).from_endpoints(endpoints).unwrap();
        assert!(channel.balance().wait_for_members(2, Duration::from_secs(10)).await);
        let mut client = EchoClient::new(channel.clone());
        for _ in 0..100 {
            let result = client.echo(EchoRequest { payload: b"hi".to_vec() }).await;
            if let Err(status) = result {
                assert_eq!(status.code(), code);
            }
        }
        let stats = channel.stats();
        if ejected {
            eventually("the trailers' fault ejects task 0", || channel.stats().ejected == vec![0]).await;
        } else {
            assert!(stats.ejected.is_empty(), "{code:?}: {stats:?}");
            assert!(calls[0].load(Ordering::SeqCst) > 20, "{code:?}: task 0 kept its share");
        }
    }
}

/// A backend with the standard health service beside its echo service.
struct Checked {
    calls: Arc<AtomicUsize>,
    reporter: tonic_health::server::HealthReporter,
    _stop: ServerGuard,
    addr: std::net::SocketAddr,
}

async fn checked_backend(task: u32) -> Checked {
    let (reporter, health) = tonic_health::server::health_reporter();
    let backend = Backend { task, mode: Arc::new(Mutex::new(Mode::Fine)), calls: Arc::default() };
    let calls = backend.calls.clone();
    let port = Loopback::bind().await;
    let addr = port.addr();
    let stop = port.serve_with(|incoming, stopped| {
        tonic::transport::Server::builder()
            .add_service(health)
            .add_service(EchoServer::new(backend))
            .serve_with_incoming_shutdown(incoming, stopped)
    });
    Checked { calls, reporter, _stop: stop, addr }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_health_checks_a_member_not_serving_leaves_rotation_until_it_serves_again() {
    const SERVICE: &str = "steady.echo.v1.Echo";
    let mut backends = Vec::new();
    for task in 0..3 {
        let b = checked_backend(task).await;
        b.reporter.set_service_status(SERVICE, tonic_health::ServingStatus::Serving).await;
        backends.push(b);
    }
    let endpoints = backends.iter().map(|b| endpoint(b.addr)).collect();
    let channel = SteadyChannel::builder(BalanceConfig::new(0, 2))
        .health_checks(SERVICE)
        .from_endpoints(endpoints)
        .unwrap();
    assert!(channel.balance().wait_for_members(2, Duration::from_secs(10)).await);
    let subset = channel.stats().subset;
    let (bad, spare) = (subset[0], (0..3).find(|t| !subset.contains(t)).unwrap());
    backends[bad].reporter.set_service_status(SERVICE, tonic_health::ServingStatus::NotServing).await;
    eventually("the member reported NOT_SERVING leaves the subset", || {
        let s = channel.stats();
        !s.subset.contains(&bad) && s.members.len() == 2
    })
    .await;
    // The next backend in the order stands in, and the member gets no new request.
    assert!(channel.stats().subset.contains(&spare));
    let before = backends[bad].calls.load(Ordering::SeqCst);
    let mut client = EchoClient::new(channel.clone());
    for _ in 0..50 {
        client.echo(EchoRequest { payload: b"hi".to_vec() }).await.unwrap();
    }
    assert_eq!(backends[bad].calls.load(Ordering::SeqCst), before);
    // Serving again: back in the subset, and it gets requests again.
    backends[bad].reporter.set_service_status(SERVICE, tonic_health::ServingStatus::Serving).await;
    eventually("the member serving again is back", || {
        let s = channel.stats();
        s.subset.contains(&bad) && s.members.iter().any(|m| m.task == bad)
    })
    .await;
    let before = backends[bad].calls.load(Ordering::SeqCst);
    for _ in 0..200 {
        client.echo(EchoRequest { payload: b"hi".to_vec() }).await.unwrap();
    }
    assert!(backends[bad].calls.load(Ordering::SeqCst) > before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_health_checks_a_backend_without_the_health_service_serves() {
    let fleet_backends = steady_testing::echo::serve_recording(2).await;
    let channel = SteadyChannel::builder(BalanceConfig::new(0, 2))
        .health_checks("")
        .from_endpoints(steady_testing::echo::endpoints(&fleet_backends))
        .unwrap();
    assert!(channel.balance().wait_for_members(2, Duration::from_secs(10)).await);
    let mut client = EchoClient::new(channel.clone());
    for _ in 0..100 {
        client.echo(EchoRequest { payload: b"hi".to_vec() }).await.unwrap();
    }
    assert_eq!(channel.stats().members.len(), 2);
    assert!(fleet_backends.iter().all(|b| b.backend.requests.load(Ordering::SeqCst) > 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_restarted_where_it_was_leaves_probation_after_its_probe() {
    // A gRPC call's outcome is in its trailers, read after the response's head: the
    // probe's success comes after its request is done, and must still end probation.
    let mut fleet = Fleet::start(2, 2).await;
    let addr = fleet._stops[0].addr();
    // Backend 0 stops: its connection ends, and calls find it broken.
    fleet._stops.remove(0);
    let deadline = tokio::time::Instant::now() + steady_testing::wait::PATIENCE;
    while fleet.channel.stats().members.iter().any(|m| m.task == 0) {
        let _ = fleet.send(5, None).await;
        assert!(tokio::time::Instant::now() < deadline, "backend 0 still in rotation");
    }
    // Back on its port: reconnected after a broken connection, it is on probation.
    fleet._stops.insert(0, Loopback::bind_to(addr).await.serve(EchoServer::new(fleet.backends[0].clone())));
    eventually("backend 0 back", || fleet.channel.stats().members.iter().any(|m| m.task == 0)).await;
    let calls_before = fleet.calls(0);
    // Calls flow until its probe has served and probation is over.
    let deadline = tokio::time::Instant::now() + steady_testing::wait::PATIENCE;
    loop {
        assert!(fleet.send(10, None).await.is_empty());
        let state = fleet.channel.stats().members.iter().find(|m| m.task == 0).map(|m| m.state);
        if !matches!(state, Some(MemberState::Probation { .. })) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still on probation after {} calls",
            fleet.calls(0) - calls_before
        );
    }
    assert!(fleet.calls(0) > calls_before, "the probe was served");
}
