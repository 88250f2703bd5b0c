//! What metrics cost, each against the same thing without them, in the same run.
//!
//! * `metrics_pick`: the balancer's pick (100 and 1,000 members);
//! * `metrics_keyed_pick`: a keyed pick (`route(Some(key))`, 15,000 slices of 3 replicas
//!   over 300 tasks);
//! * `metrics_channel`: one unary call through tonic over loopback (4 echo servers): the
//!   channel's instruments, and gRPC's per-call histogram (`CallMetricsLayer`, feature
//!   `call-metrics`, which costs per call by design) on top of them; `plain` is a tonic
//!   `Channel` to one server;
//! * `metrics_call_layer`: the per-call layer alone over an in-process service that answers
//!   at once, against the service without it.
//!
//! Variants: `steady` has no instruments; `steady_observed` has them registered in a meter
//! provider, never scraped; `steady_scraped` has them registered and scraped by another
//! thread every 100 ms (some 150 times as often as a Prometheus server at its default
//! 15 s). `metrics_scrape`: one scrape (the `/metrics` text) of a balancer with 100 and
//! 1,000 members.
//!
//! ```sh
//! cargo bench -p steady-benches --bench metrics
//! cargo run --release -p steady-benches --bin bench-ratios -- metrics_pick steady
//! cargo run --release -p steady-benches --bin bench-ratios -- metrics_keyed_pick steady
//! cargo run --release -p steady-benches --bin bench-ratios -- metrics_channel steady
//! cargo run --release -p steady-benches --bin bench-ratios -- metrics_call_layer none
//! ```

use std::convert::Infallible;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use steady_balance::{Balance, BalanceConfig, SliceKey};
use steady_benches::{echo_calls, hold_assignment, spread_assignment};
use steady_slicer_server::status::MetricsRegistry;
use steady_subset::prng::SplitMix64;
use steady_testing::echo::echo_client::EchoClient;
use steady_tonic::{CallMetricsLayer, SteadyChannel};
use tonic::transport::{Channel, Endpoint};
use tower::{service_fn, Layer, Service, ServiceExt};

/// Instruments registered and scraped; registered, never scraped; none.
const VARIANTS: [(&str, bool, bool); 3] =
    [("steady_scraped", true, true), ("steady_observed", true, false), ("steady", false, false)];

/// Renders `registry` every 100 ms on a thread of its own, as a Prometheus server would
/// scrape it, until dropped.
struct Scraper {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Scraper {
    fn start(registry: &MetricsRegistry, scraped: bool) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = scraped.then(|| {
            let (registry, stop) = (registry.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    black_box(registry.render());
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
        });
        Self { stop, thread }
    }
}

impl Drop for Scraper {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.join().expect("the scraper thread ends");
        }
    }
}

fn endpoint(
) -> impl Service<u64, Response = u64, Error = Infallible, Future = std::future::Ready<Result<u64, Infallible>>>
       + Clone
       + Send
       + Sync
       + 'static {
    service_fn(|req: u64| std::future::ready(Ok::<_, Infallible>(req)))
}

async fn drive<S>(svc: &mut S, iters: u64) -> Duration
where
    S: Service<u64>,
    S::Error: std::fmt::Debug,
{
    let start = Instant::now();
    for i in 0..iters {
        black_box(svc.ready().await.unwrap().call(i).await.unwrap());
    }
    start.elapsed()
}

fn pick(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut group = c.benchmark_group("metrics_pick");
    group.warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    for n in [100usize, 1000] {
        for (name, observed, scraped) in VARIANTS {
            group.bench_with_input(BenchmarkId::new(name, n), &n, |b, &n| {
                let registry = MetricsRegistry::new();
                let mut balance = rt.block_on(async {
                    let connect = service_fn(|_task: usize| async { Ok::<_, Infallible>(endpoint()) });
                    let balance =
                        Balance::from_addresses(BalanceConfig::new(0, n), connect, (0..n).collect()).unwrap();
                    assert!(balance.wait_for_members(n, Duration::from_secs(10)).await);
                    balance
                });
                if observed {
                    balance.observe_metrics(&registry.meter(), "bench");
                }
                let _scraper = Scraper::start(&registry, scraped);
                b.iter_custom(|iters| rt.block_on(drive(&mut balance, iters)));
            });
        }
    }
    group.finish();
}

fn keyed_pick(c: &mut Criterion) {
    const SLICES: usize = 15_000;
    const TASKS: usize = 300;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut rng = SplitMix64::new(7);
    let keys: Vec<SliceKey> = (0..4096).map(|_| SliceKey(rng.next())).collect();
    let mut group = c.benchmark_group("metrics_keyed_pick");
    group.warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    for (name, observed, scraped) in VARIANTS {
        group.bench_with_input(BenchmarkId::new(name, SLICES), &(), |b, _| {
            let registry = MetricsRegistry::new();
            let (mut balance, _assignments) = rt.block_on(async {
                let connect = service_fn(|_task: usize| async { Ok::<_, Infallible>(endpoint()) });
                // k = N: every replica is a connected subset member.
                let balance =
                    Balance::from_addresses(BalanceConfig::new(0, TASKS), connect, (0..TASKS).collect())
                        .unwrap();
                assert!(balance.wait_for_members(TASKS, Duration::from_secs(10)).await);
                let tx = hold_assignment(&balance, spread_assignment(1, SLICES, TASKS, 3)).await;
                (balance, tx)
            });
            if observed {
                balance.observe_metrics(&registry.meter(), "bench");
            }
            let _scraper = Scraper::start(&registry, scraped);
            let mut i = 0;
            b.iter(|| {
                i = (i + 1) & 4095;
                black_box(balance.route(Some(keys[i])))
            });
        });
    }
    group.finish();
}

/// `iters` calls; with `scrape`, its registry is rendered every 1,000 calls (about every
/// 100 ms here) on this same thread, so the scrapes' work is charged to the calls.
async fn calls<T>(client: &mut EchoClient<T>, iters: u64, scrape: Option<&MetricsRegistry>) -> Duration
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    echo_calls(client, iters, |i| {
        if let Some(registry) = scrape.filter(|_| i % 1000 == 999) {
            black_box(registry.render());
        }
    })
    .await
}

fn channel(c: &mut Criterion) {
    const SERVERS: usize = 4;
    // The servers run on a runtime of their own, so the client's runtime measures the
    // client.
    let servers = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let running: Vec<_> = servers.block_on(async {
        let mut out = Vec::new();
        for task in 0..SERVERS as u32 {
            out.push(steady_testing::echo::serve_echo(task).await);
        }
        out
    });
    let endpoints: Vec<Endpoint> =
        running.iter().map(|(addr, _)| Endpoint::from_shared(format!("http://{addr}")).unwrap()).collect();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let steady = || {
        rt.block_on(async {
            let channel = SteadyChannel::builder(BalanceConfig::new(0, SERVERS))
                .from_endpoints(endpoints.clone())
                .unwrap();
            assert!(channel.balance().wait_for_members(SERVERS, Duration::from_secs(10)).await);
            channel
        })
    };
    // Every client is made before any is measured and lives until the end, and all are
    // warmed up together, so that each is measured in the same state (the first variants
    // measured would otherwise pay for the process's own warm-up). Scrapes run inline
    // here, not on a thread of their own: on this 2-core machine a third thread waking
    // every 100 ms slows a loopback call ping-pong by 20-60% whether or not it reads
    // any metric (measured with the render taken out), which says nothing of metrics.
    let mut plain: EchoClient<Channel> =
        rt.block_on(async { EchoClient::new(endpoints[0].connect().await.unwrap()) });
    let mut variants: Vec<(&str, EchoClient<SteadyChannel>, MetricsRegistry, bool)> = VARIANTS
        .iter()
        .map(|&(name, observed, scraped)| {
            let registry = MetricsRegistry::new();
            let channel = steady();
            if observed {
                channel.observe_metrics(&registry.meter(), "bench");
            }
            (name, EchoClient::new(channel), registry, scraped)
        })
        .collect();
    // The channel's instruments and gRPC's per-call histogram, scraped.
    let registry = MetricsRegistry::new();
    let channel = steady();
    channel.observe_metrics(&registry.meter(), "bench");
    let mut per_call = EchoClient::new(CallMetricsLayer::new(&registry.meter(), "bench").layer(channel));
    rt.block_on(async {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(2) {
            calls(&mut plain, 50, None).await;
            calls(&mut per_call, 50, None).await;
            for (_, client, _, _) in &mut variants {
                calls(client, 50, None).await;
            }
        }
    });
    let mut group = c.benchmark_group("metrics_channel");
    group.warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(5));
    group.bench_with_input(BenchmarkId::new("plain", SERVERS), &(), |b, _| {
        b.iter_custom(|iters| rt.block_on(calls(&mut plain, iters, None)));
    });
    for (name, client, registry, scraped) in &mut variants {
        let scrape = scraped.then_some(&*registry);
        group.bench_with_input(BenchmarkId::new(*name, SERVERS), &(), |b, _| {
            b.iter_custom(|iters| rt.block_on(calls(client, iters, scrape)));
        });
    }
    group.bench_with_input(BenchmarkId::new("steady_call_metrics", SERVERS), &(), |b, _| {
        b.iter_custom(|iters| rt.block_on(calls(&mut per_call, iters, Some(&registry))));
    });
    group.finish();
    drop(running);
}

/// The per-call layer alone, over an in-process service that answers at once (a
/// trailers-only `OK`): what `CallMetricsLayer` adds to a call, in nanoseconds, without a
/// network's noise around it.
fn call_layer(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let answer = || {
        service_fn(|_req: http::Request<tonic::body::Body>| {
            let mut response = http::Response::new(tonic::body::Body::empty());
            response.headers_mut().insert("grpc-status", http::HeaderValue::from_static("0"));
            std::future::ready(Ok::<_, Infallible>(response))
        })
    };
    let request = || {
        http::Request::builder()
            .uri("http://backend/steady.echo.v1.Echo/Echo")
            .body(tonic::body::Body::empty())
            .unwrap()
    };
    let mut group = c.benchmark_group("metrics_call_layer");
    group.warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    group.bench_with_input(BenchmarkId::new("none", 1), &(), |b, _| {
        let mut svc = answer();
        b.iter(|| {
            rt.block_on(async { black_box(svc.ready().await.unwrap().call(request()).await.unwrap()) })
        });
    });
    group.bench_with_input(BenchmarkId::new("call_metrics", 1), &(), |b, _| {
        let registry = MetricsRegistry::new();
        let mut svc = CallMetricsLayer::new(&registry.meter(), "bench").layer(answer());
        b.iter(|| {
            rt.block_on(async { black_box(svc.ready().await.unwrap().call(request()).await.unwrap()) })
        });
        assert!(registry.render().contains("grpc_status=\"OK\""));
    });
    group.finish();
}

fn scrape(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut group = c.benchmark_group("metrics_scrape");
    group.warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    for n in [100usize, 1000] {
        group.bench_with_input(BenchmarkId::new("render", n), &n, |b, &n| {
            let registry = MetricsRegistry::new();
            let balance = rt.block_on(async {
                let connect = service_fn(|_task: usize| async { Ok::<_, Infallible>(endpoint()) });
                let balance =
                    Balance::from_addresses(BalanceConfig::new(0, n), connect, (0..n).collect()).unwrap();
                assert!(balance.wait_for_members(n, Duration::from_secs(10)).await);
                balance
            });
            balance.observe_metrics(&registry.meter(), "bench");
            let text = registry.render();
            assert!(text.lines().filter(|l| l.starts_with("steady_lb_member_requests_total")).count() == n);
            b.iter(|| black_box(registry.render()));
        });
    }
    group.finish();
}

criterion_group!(benches, pick, keyed_pick, channel, call_layer, scrape);
criterion_main!(benches);
