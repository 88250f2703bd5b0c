//! What metrics cost: the balancer's pick with its OpenTelemetry instruments registered
//! in a meter provider (never scraped; and scraped by another thread every 100 ms, some
//! 150 times as often as a Prometheus server at its default 15 s) against the same
//! balancer without, in the same run; and one scrape (the `/metrics` text) of a balancer
//! with 100 and 1,000 members.
//!
//! ```sh
//! cargo bench -p steady-benches --bench metrics
//! cargo run --release -p steady-benches --bin bench-ratios -- metrics_pick steady
//! ```

use std::convert::Infallible;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use steady_balance::{Balance, BalanceConfig};
use steady_slicer::status::MetricsRegistry;
use tower::{service_fn, Service, ServiceExt};

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
        // Instruments registered and scraped; registered, never scraped; none.
        for (name, observed, scraped) in
            [("steady_scraped", true, true), ("steady_observed", true, false), ("steady", false, false)]
        {
            group.bench_with_input(BenchmarkId::new(name, n), &n, |b, &n| {
                let registry = MetricsRegistry::new();
                let mut balance = rt.block_on(async {
                    let connect = service_fn(|_task: usize| async { Ok::<_, Infallible>(endpoint()) });
                    let balance =
                        Balance::from_addresses(BalanceConfig::new(0, n), connect, (0..n).collect()).unwrap();
                    assert!(balance.wait_for_members(n, Duration::from_secs(10)).await);
                    balance
                });
                // A scraper on another thread, as a Prometheus server would be.
                let stop = Arc::new(AtomicBool::new(false));
                if observed {
                    balance.observe_metrics(&registry.meter(), "bench");
                }
                let scraper = scraped.then(|| {
                    let (registry, stop) = (registry.clone(), stop.clone());
                    std::thread::spawn(move || {
                        while !stop.load(Ordering::Relaxed) {
                            black_box(registry.render());
                            std::thread::sleep(Duration::from_millis(100));
                        }
                    })
                });
                b.iter_custom(|iters| rt.block_on(drive(&mut balance, iters)));
                stop.store(true, Ordering::Relaxed);
                if let Some(scraper) = scraper {
                    scraper.join().unwrap();
                }
            });
        }
    }
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

criterion_group!(benches, pick, scrape);
criterion_main!(benches);
