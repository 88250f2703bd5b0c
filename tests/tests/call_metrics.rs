//! gRPC's per-call duration histogram (`steady_tonic::CallMetricsLayer`, gRFC A66's
//! `grpc.client.call.duration`) over a `SteadyChannel`, against real tonic servers on
//! 127.0.0.1, read as a scrape reads it (`MetricsRegistry`, Prometheus text): each call
//! is recorded once, under the code the application saw, whether the status came in the
//! trailers, in a trailers-only response, from the channel itself, or from the
//! application giving up.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use steady_balance::{BalanceConfig, JobView};
use steady_slicer_server::status::MetricsRegistry;
use steady_testing::echo::echo_client::EchoClient;
use steady_testing::echo::echo_server::{Echo, EchoServer};
use steady_testing::echo::{EchoReply, EchoRequest};
use steady_testing::eventually;
use steady_testing::loopback::{self, ServerGuard};
use steady_tonic::call_metrics::{CallMetrics, LATENCY_BUCKETS};
use steady_tonic::{CallMetricsLayer, SteadyChannel, TaskEndpoint};
use tokio::sync::{watch, Notify};
use tonic::transport::Endpoint;
use tonic::{Code, Request, Response, Status};
use tower::{Layer, Service};

const METHOD: &str = "steady.echo.v1.Echo/Echo";
const HISTOGRAM: &str = "grpc_client_call_duration_seconds";

/// Answers `missing` with NOT_FOUND (a trailers-only response), `hold` once `release` is
/// notified, anything else with the payload (status in the trailers).
#[derive(Clone, Default)]
struct Backend {
    received: Arc<AtomicUsize>,
    release: Arc<Notify>,
}

#[tonic::async_trait]
impl Echo for Backend {
    async fn echo(&self, request: Request<EchoRequest>) -> Result<Response<EchoReply>, Status> {
        self.received.fetch_add(1, Ordering::SeqCst);
        let payload = request.into_inner().payload;
        match &payload[..] {
            b"missing" => Err(Status::not_found("no such thing")),
            b"hold" => {
                self.release.notified().await;
                Ok(Response::new(EchoReply { payload, task: 0 }))
            }
            _ => Ok(Response::new(EchoReply { payload, task: 0 })),
        }
    }
}

/// Serves `backend` on 127.0.0.1 until the sender is dropped.
async fn serve(backend: Backend) -> (SocketAddr, ServerGuard) {
    loopback::serve(EchoServer::new(backend)).await
}

/// A client over a measured channel to `addrs`, its histogram in `registry` under `target`.
async fn client(
    registry: &MetricsRegistry,
    target: &str,
    addrs: &[SocketAddr],
) -> EchoClient<CallMetrics<SteadyChannel>> {
    let endpoints =
        addrs.iter().map(|a| Endpoint::from_shared(format!("http://{a}")).unwrap()).collect::<Vec<_>>();
    let channel =
        SteadyChannel::builder(BalanceConfig::new(0, addrs.len())).from_endpoints(endpoints).unwrap();
    assert!(channel.balance().wait_for_members(addrs.len(), Duration::from_secs(10)).await);
    EchoClient::new(CallMetricsLayer::new(&registry.meter(), target).layer(channel))
}

async fn echo(client: &mut EchoClient<CallMetrics<SteadyChannel>>, payload: &[u8]) -> Result<(), Status> {
    client.echo(EchoRequest { payload: payload.to_vec() }).await.map(drop)
}

/// The value of the one sample of `text` that is `series` (name and labels).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')?.parse().ok()))
}

/// The label set of the calls of `target` that ended with `status`.
fn labels(target: &str, status: &str) -> String {
    format!("grpc_method=\"{METHOD}\",grpc_status=\"{status}\",grpc_target=\"{target}\"")
}

fn count(text: &str, target: &str, status: &str) -> Option<f64> {
    sample(text, &format!("{HISTOGRAM}_count{{{}}}", labels(target, status)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_call_is_recorded_once_by_method_target_and_the_status_the_application_saw() {
    let registry = MetricsRegistry::new();
    let backend = Backend::default();
    let (a, _stop_a) = serve(backend.clone()).await;
    let (b, _stop_b) = serve(backend.clone()).await;
    let mut client = client(&registry, "users", &[a, b]).await;
    for _ in 0..5 {
        echo(&mut client, b"hello").await.unwrap();
    }
    for _ in 0..3 {
        let status = echo(&mut client, b"missing").await.unwrap_err();
        assert_eq!(status.code(), Code::NotFound);
    }
    let text = registry.render();
    assert!(text.contains(&format!("# TYPE {HISTOGRAM} histogram\n")), "{text}");
    // The status in the trailers (OK) and in a trailers-only response (NOT_FOUND).
    assert_eq!(count(&text, "users", "OK"), Some(5.0), "{text}");
    assert_eq!(count(&text, "users", "NOT_FOUND"), Some(3.0), "{text}");
    let statuses = text.lines().filter(|l| l.starts_with(&format!("{HISTOGRAM}_count"))).count();
    assert_eq!(statuses, 2, "{text}");
    // A66's latency buckets, cumulative, ending in every call.
    let ok = labels("users", "OK");
    let bounds: Vec<f64> = text
        .lines()
        .filter(|l| l.starts_with(&format!("{HISTOGRAM}_bucket{{{ok},le=\"")) && !l.contains("+Inf"))
        .map(|l| l.split("le=\"").nth(1).unwrap().split('"').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(bounds, LATENCY_BUCKETS.to_vec());
    assert_eq!(sample(&text, &format!("{HISTOGRAM}_bucket{{{ok},le=\"+Inf\"}}")), Some(5.0));
    assert_eq!(sample(&text, &format!("{HISTOGRAM}_bucket{{{ok},le=\"0\"}}")), Some(0.0));
    let sum = sample(&text, &format!("{HISTOGRAM}_sum{{{ok}}}")).unwrap();
    assert!(sum > 0.0 && sum < 50.0, "{sum}");
    assert_eq!(backend.received.load(Ordering::SeqCst), 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_without_a_backend_is_unavailable_and_its_wait_is_counted() {
    let registry = MetricsRegistry::new();
    let (_job, views) = watch::channel(JobView::<TaskEndpoint>::default());
    let wait = Duration::from_millis(100);
    let config = BalanceConfig::new(0, 3).with_no_backend_wait(wait);
    let channel = SteadyChannel::builder(config).from_job(views).unwrap();
    let mut client = EchoClient::new(CallMetricsLayer::new(&registry.meter(), "empty").layer(channel));
    let start = Instant::now();
    for _ in 0..2 {
        let status = echo(&mut client, b"x").await.unwrap_err();
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    }
    let elapsed = start.elapsed().as_secs_f64();
    let text = registry.render();
    assert_eq!(count(&text, "empty", "UNAVAILABLE"), Some(2.0), "{text}");
    // Each call waited for a backend before failing, and that wait is in its duration.
    let sum = sample(&text, &format!("{HISTOGRAM}_sum{{{}}}", labels("empty", "UNAVAILABLE"))).unwrap();
    assert!(sum >= 2.0 * wait.as_secs_f64() && sum <= elapsed, "{sum} vs {elapsed}");
}

/// A service that is not ready until opened, and tells when it was first asked.
#[derive(Clone)]
struct Gate<S> {
    inner: S,
    asked: Arc<AtomicUsize>,
    open: Arc<std::sync::Mutex<(bool, Option<Waker>)>>,
}

impl<S: Service<R>, R> Service<R> for Gate<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        let mut open = self.open.lock().unwrap();
        if !open.0 {
            open.1 = Some(cx.waker().clone());
            return Poll::Pending;
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> S::Future {
        self.inner.call(req)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wait_for_readiness_below_the_layer_is_part_of_the_call() {
    let registry = MetricsRegistry::new();
    let (addr, _stop) = serve(Backend::default()).await;
    let endpoints = vec![Endpoint::from_shared(format!("http://{addr}")).unwrap()];
    let channel = SteadyChannel::builder(BalanceConfig::new(0, 1)).from_endpoints(endpoints).unwrap();
    assert!(channel.balance().wait_for_members(1, Duration::from_secs(10)).await);
    let gate = Gate { inner: channel, asked: Arc::default(), open: Arc::default() };
    let (asked, open) = (gate.asked.clone(), gate.open.clone());
    let mut client = EchoClient::new(CallMetricsLayer::new(&registry.meter(), "gated").layer(gate));
    let call =
        tokio::spawn(async move { client.echo(EchoRequest { payload: b"x".to_vec() }).await.map(drop) });
    eventually("the call to ask for readiness", || asked.load(Ordering::SeqCst) > 0).await;
    // The call waits for readiness at least this long (the time measured, not a wait
    // for some state).
    let held = Duration::from_millis(60);
    tokio::time::sleep(held).await;
    let waker = {
        let mut open = open.lock().unwrap();
        open.0 = true;
        open.1.take()
    };
    waker.into_iter().for_each(Waker::wake);
    call.await.unwrap().unwrap();
    let text = registry.render();
    let ok = labels("gated", "OK");
    assert_eq!(sample(&text, &format!("{HISTOGRAM}_count{{{ok}}}")), Some(1.0), "{text}");
    let sum = sample(&text, &format!("{HISTOGRAM}_sum{{{ok}}}")).unwrap();
    assert!(sum >= held.as_secs_f64(), "{sum}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_the_application_drops_before_its_status_is_cancelled() {
    let registry = MetricsRegistry::new();
    let backend = Backend::default();
    let (addr, _stop) = serve(backend.clone()).await;
    let mut client = client(&registry, "held", &[addr]).await;
    let call = tokio::spawn({
        let mut client = client.clone();
        async move { echo(&mut client, b"hold").await }
    });
    // The server has the call; then the application gives up on it.
    eventually("the held call to reach the server", || backend.received.load(Ordering::SeqCst) > 0).await;
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());
    let text = registry.render();
    assert_eq!(count(&text, "held", "CANCELLED"), Some(1.0), "{text}");
    // Released, the server's late answer records nothing more; the next call is OK.
    backend.release.notify_waiters();
    echo(&mut client, b"after").await.unwrap();
    let text = registry.render();
    assert_eq!(count(&text, "held", "CANCELLED"), Some(1.0), "{text}");
    assert_eq!(count(&text, "held", "OK"), Some(1.0), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn methods_outside_the_allowed_set_are_other() {
    let registry = MetricsRegistry::new();
    let (addr, _stop) = serve(Backend::default()).await;
    let endpoints = vec![Endpoint::from_shared(format!("http://{addr}")).unwrap()];
    let channel = SteadyChannel::builder(BalanceConfig::new(0, 1)).from_endpoints(endpoints).unwrap();
    let layer = CallMetricsLayer::new(&registry.meter(), "users").only_methods(["/pkg.Other/Get"]);
    let mut client = EchoClient::new(layer.layer(channel));
    echo(&mut client, b"hello").await.unwrap();
    let text = registry.render();
    let series =
        format!("{HISTOGRAM}_count{{grpc_method=\"other\",grpc_status=\"OK\",grpc_target=\"users\"}}");
    assert_eq!(sample(&text, &series), Some(1.0), "{text}");
    assert!(!text.contains(METHOD), "{text}");
}
