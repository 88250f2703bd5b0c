//! Per-request overhead of steady's unkeyed pick against tower's p2c balancer, and the
//! cost of applying a backend resize.
//!
//! Group `pick`: one request = ready + call + response on a current-thread runtime,
//! over N in {10, 100, 1000} ready endpoints that answer at once (`service_fn`):
//! * `bare` — one `service_fn`, no balancing: the floor;
//! * `tower_p2c` — `tower::balance::p2c::Balance` over the endpoints, each wrapped in
//!   `tower::load::PendingRequests` (the baseline for requests in flight);
//! * `tower_p2c_ewma` — the same with `tower::load::PeakEwma` (1 ms default, 1 s decay:
//!   the baseline for Peak EWMA);
//! * `steady` — `steady_balance::Balance` with k = N (every endpoint a member), default
//!   configuration; `steady_inflight` and `steady_ewma` the same with the load signal
//!   pinned to requests in flight and to Peak EWMA (`Load::peak_ewma()`);
//! * `steady_zones` — zone-aware (`BalanceConfig::with_zones`): three zones of N backends,
//!   one frontend each, so nothing spills (target: within 5% of `steady`);
//!   `steady_spill` the same with frontends 6/3/3, so a third of the requests spill to
//!   the other two zones (each request draws its zone, then picks there).
//!
//! Target: steady at least 3x faster than tower's p2c over the same load signal at every N
//! (the figures: `docs/benchmarks.md#the-balancers-pick`). Ratios: `cargo run --release -p
//! steady-benches --bin bench-ratios -- pick tower_p2c` (requests in flight) and `... -- pick
//! tower_p2c_ewma` (Peak EWMA).
//!
//! Group `resize`: sending a job view that changes one member of the subset (k = 20)
//! until the new member is connected and in the published routing table.

use std::convert::Infallible;
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use steady_balance::{Balance, BalanceConfig, JobView, Load, Locality, Zone, ZoneRouting, ZoneSizes};
use steady_subset::{Algorithm, Subsetting};
use tokio::runtime::Runtime;
use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;
use tower::balance::p2c;
use tower::discover::ServiceList;
use tower::load::{CompleteOnResponse, PeakEwma, PendingRequests};
use tower::{service_fn, Service, ServiceExt};

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// An endpoint that answers at once.
fn endpoint(
) -> impl Service<u64, Response = u64, Error = Infallible, Future = std::future::Ready<Result<u64, Infallible>>>
       + Clone
       + Send
       + Sync
       + 'static {
    service_fn(|req: u64| std::future::ready(Ok::<_, Infallible>(req)))
}

/// Runs `iters` sequential requests through `svc` inside one task; returns the time.
async fn drive<S>(svc: &mut S, iters: u64) -> Duration
where
    S: Service<u64>,
    S::Error: std::fmt::Debug,
{
    let start = Instant::now();
    for i in 0..iters {
        let r = svc.ready().await.unwrap().call(i).await.unwrap();
        black_box(r);
    }
    start.elapsed()
}

fn pick(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("pick");
    group.warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    for n in [10usize, 100, 1000] {
        group.bench_with_input(BenchmarkId::new("bare", n), &n, |b, _| {
            let mut svc = endpoint();
            b.iter_custom(|iters| rt.block_on(drive(&mut svc, iters)));
        });
        group.bench_with_input(BenchmarkId::new("tower_p2c", n), &n, |b, &n| {
            let services: Vec<_> =
                (0..n).map(|_| PendingRequests::new(endpoint(), CompleteOnResponse::default())).collect();
            let mut balance = rt.block_on(async { p2c::Balance::new(ServiceList::new(services)) });
            b.iter_custom(|iters| rt.block_on(drive(&mut balance, iters)));
        });
        group.bench_with_input(BenchmarkId::new("tower_p2c_ewma", n), &n, |b, &n| {
            let services: Vec<_> = (0..n)
                .map(|_| {
                    let (rtt, decay) = (Duration::from_millis(1), Duration::from_secs(1));
                    PeakEwma::new(endpoint(), rtt, decay.as_nanos() as f64, CompleteOnResponse::default())
                })
                .collect();
            let mut balance = rt.block_on(async { p2c::Balance::new(ServiceList::new(services)) });
            b.iter_custom(|iters| rt.block_on(drive(&mut balance, iters)));
        });
        // The default configuration, then each load signal pinned.
        for (name, load) in [
            ("steady", None),
            ("steady_inflight", Some(Load::InFlight)),
            ("steady_ewma", Some(Load::peak_ewma())),
        ] {
            group.bench_with_input(BenchmarkId::new(name, n), &n, |b, &n| {
                let mut balance = rt.block_on(async {
                    let connect = service_fn(|_task: usize| async { Ok::<_, Infallible>(endpoint()) });
                    let mut config = BalanceConfig::new(0, n);
                    if let Some(load) = load {
                        config = config.with_load(load);
                    }
                    let balance = Balance::from_addresses(config, connect, (0..n).collect()).unwrap();
                    assert!(balance.wait_for_members(n, Duration::from_secs(10)).await);
                    balance
                });
                b.iter_custom(|iters| rt.block_on(drive(&mut balance, iters)));
            });
        }
        for (name, frontends) in [("steady_zones", [1, 1, 1]), ("steady_spill", [6, 3, 3])] {
            group.bench_with_input(BenchmarkId::new(name, n), &n, |b, &n| {
                let mut balance = rt.block_on(zone_aware(n, frontends));
                b.iter_custom(|iters| rt.block_on(drive(&mut balance, iters)));
            });
        }
    }
    group.finish();
}

/// A zone-aware balancer in zone `z0` of three zones of `n` backends each, with
/// `frontends` per zone, once every member it wants is connected.
async fn zone_aware(
    n: usize,
    frontends: [usize; 3],
) -> Balance<impl Service<u64, Response = u64, Error = Infallible> + Clone + Send + Sync + 'static> {
    let zones: Vec<Zone> = (0..3).map(|z| Zone::new(&format!("z{z}")).unwrap()).collect();
    let view = (0..3 * n).fold(JobView::serving(0..3 * n), |view, t| {
        view.with_locality(t, Locality::new(zones[t / n].clone(), t % n))
    });
    let sizes: ZoneSizes = zones.iter().cloned().zip(frontends).collect();
    let config = BalanceConfig::new(0, n).with_zones(ZoneRouting::new(zones[0].clone(), sizes));
    let connect = service_fn(|_task: usize| async { Ok::<_, Infallible>(endpoint()) });
    let (_views, rx) = watch::channel(view);
    let balance = Balance::new(config, connect, WatchStream::new(rx)).unwrap();
    let spills = frontends[0] * 3 > frontends.iter().sum::<usize>();
    let wanted = if spills { 3 * n } else { n };
    let deadline = Instant::now() + Duration::from_secs(10);
    while balance.stats().members.len() < wanted {
        assert!(Instant::now() < deadline, "the zone-aware balancer never connected its members");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    balance
}

fn resize(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("resize");
    group.warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    let k = 20;
    for n in [1_000usize, 100_000] {
        // A frontend whose subset changes between N and N + 1.
        let alg = Algorithm::default();
        let m = (0..)
            .find(|&m| alg.subset(m, n, k).unwrap() != alg.subset(m, n + 1, k).unwrap())
            .expect("some frontend's subset changes");
        group.bench_with_input(BenchmarkId::new("steady", n), &n, |b, &n| {
            let (job, views) = watch::channel(JobView::serving(0..n));
            let balance = rt.block_on(async {
                let connect = service_fn(|_task: usize| async { Ok::<_, Infallible>(endpoint()) });
                let balance =
                    Balance::<_>::new(BalanceConfig::new(m, k), connect, WatchStream::new(views)).unwrap();
                assert!(balance.wait_for_members(k, Duration::from_secs(10)).await);
                balance
            });
            // Views of N and N + 1 tasks built once; sending one is an O(1) clone.
            let small = JobView::serving(0..n + 1).with_size(n);
            let large = small.clone().with_size(n + 1);
            let wants = [alg.subset(m, n, k).unwrap(), alg.subset(m, n + 1, k).unwrap()];
            let mut grow = true;
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters {
                        let (view, want) = if grow { (&large, &wants[1]) } else { (&small, &wants[0]) };
                        grow = !grow;
                        job.send_replace(view.clone());
                        loop {
                            let s = balance.stats();
                            if s.subset == *want && s.members.len() == k {
                                break;
                            }
                            balance.wait_for_version(s.version + 1).await;
                        }
                    }
                    start.elapsed()
                })
            });
        });
    }
    group.finish();
}

criterion_group!(benches, pick, resize);
criterion_main!(benches);
