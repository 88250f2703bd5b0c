//! `steady-lab resize`: the article's figure 5 on real connections.
//!
//! Starts tonic echo servers on 127.0.0.1 and two fleets of frontends in this process,
//! one on the algorithm under test (the library's default, decimal Rocksteadier, unless
//! `--algorithm` names another, e.g. `rocksteadier`) and one on Deterministic subsetting,
//! both following the same backend job. Drives steady load through every frontend's `SteadyChannel`, resizes the
//! job step by step (growing and shrinking, varying step sizes), and prints per step and
//! algorithm: connections opened and closed, requests failed, p50/p99 latency, and the
//! most and mean connections per backend. Writes an SVG of connections opened and
//! failures per step.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use plotters::prelude::*;
use steady_balance::{BalanceConfig, JobView};
use steady_subset::Algorithm;
use steady_testing::echo::echo_client::EchoClient;
use steady_testing::echo::{serve_echo, EchoRequest};
use steady_testing::loopback::ServerGuard;
use steady_testing::percentile;
use steady_tonic::{SteadyChannel, TaskEndpoint};
use tokio::sync::watch;
use tonic::transport::Endpoint;

use crate::LabResult;

/// Arguments of `steady-lab resize`.
#[derive(Debug, Args)]
pub struct ResizeArgs {
    /// The first fleet's algorithm (default: the library's, rocksteadier-decimal;
    /// `--algorithm rocksteadier` runs Rocksteadier). The second fleet runs deterministic.
    #[arg(long, default_value_t = Algorithm::default())]
    algorithm: Algorithm,
    /// Frontends per algorithm.
    #[arg(long, default_value_t = 8)]
    frontends: usize,
    /// Subset size k.
    #[arg(long, default_value_t = 4)]
    subset_size: usize,
    /// The backend job's size at each step (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = vec![12, 13, 15, 14, 20, 17, 24, 12])]
    steps: Vec<usize>,
    /// How long each step lasts, in milliseconds.
    #[arg(long, default_value_t = 1500)]
    step_ms: u64,
    /// Concurrent request loops per frontend.
    #[arg(long, default_value_t = 2)]
    concurrency: usize,
    /// Where to write the SVG [default: resize.svg in the lab's output folder,
    /// `target/steady-lab/` or $STEADY_LAB_OUT].
    #[arg(long)]
    svg: Option<PathBuf>,
}

/// What one fleet's requests recorded during a step.
#[derive(Default)]
struct StepLog {
    latencies_us: Vec<u32>,
    failures: u64,
}

/// One fleet of frontends on one algorithm.
struct Fleet {
    algorithm: Algorithm,
    channels: Vec<SteadyChannel>,
    log: Arc<Mutex<StepLog>>,
}

/// One line of the result.
struct StepResult {
    backends: usize,
    opened: u64,
    closed: u64,
    failures: u64,
    p50_us: u32,
    p99_us: u32,
    max_per_backend: usize,
    mean_per_backend: f64,
}

async fn start_backends(n: usize) -> Vec<(SocketAddr, ServerGuard)> {
    let mut out = Vec::new();
    for task in 0..n {
        out.push(serve_echo(task as u32).await);
    }
    out
}

/// Runs the experiment.
pub fn run(out: &mut impl Write, args: &ResizeArgs) -> LabResult {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(experiment(out, args))
}

async fn experiment(out: &mut impl Write, args: &ResizeArgs) -> LabResult {
    let most = args.steps.iter().copied().max().unwrap_or(1);
    let servers = start_backends(most).await;
    let endpoints: Vec<TaskEndpoint> = servers
        .iter()
        .map(|(addr, _)| Endpoint::from_shared(format!("http://{addr}")).map(TaskEndpoint))
        .collect::<Result<_, _>>()?;
    let all = JobView::serving(endpoints);
    let first = args.steps.first().copied().unwrap_or(1);
    let (job, views) = watch::channel(all.clone().with_size(first));

    let stop = Arc::new(AtomicBool::new(false));
    let mut fleets = Vec::new();
    let mut loops = Vec::new();
    for algorithm in [args.algorithm.clone(), Algorithm::from_name("deterministic")?] {
        let log = Arc::new(Mutex::new(StepLog::default()));
        let mut channels = Vec::new();
        for m in 0..args.frontends {
            let config = BalanceConfig::new(m, args.subset_size).with_algorithm(algorithm.clone());
            let channel =
                SteadyChannel::builder(config).from_job(views.clone()).expect("valid balancer configuration");
            for _ in 0..args.concurrency {
                let (mut client, log, stop) = (EchoClient::new(channel.clone()), log.clone(), stop.clone());
                loops.push(tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        let start = Instant::now();
                        let ok = client.echo(EchoRequest { payload: vec![7; 64] }).await.is_ok();
                        let mut log = log.lock().expect("not poisoned");
                        if ok {
                            log.latencies_us.push(start.elapsed().as_micros().min(u32::MAX as u128) as u32);
                        } else {
                            log.failures += 1;
                        }
                    }
                }));
            }
            channels.push(channel);
        }
        fleets.push(Fleet { algorithm, channels, log });
    }

    let counters = |fleet: &Fleet| -> (u64, u64) {
        fleet.channels.iter().fold((0, 0), |(o, c), ch| {
            let s = ch.stats();
            (o + s.connections_opened, c + s.connections_closed)
        })
    };
    // Let the first subsets connect before measuring.
    tokio::time::sleep(Duration::from_millis(args.step_ms.min(1000))).await;
    let mut before: Vec<(u64, u64)> = fleets.iter().map(counters).collect();
    for fleet in &fleets {
        *fleet.log.lock().expect("not poisoned") = StepLog::default();
    }

    let mut results: Vec<Vec<StepResult>> = fleets.iter().map(|_| Vec::new()).collect();
    // The first column fits the longest algorithm name (rocksteadier-decimal is 20).
    let width = fleets.iter().map(|f| f.algorithm.to_string().len()).max().unwrap_or(0).max(14);
    writeln!(
        out,
        "{:<width$} {:>5} {:>7} {:>7} {:>7} {:>8} {:>8} {:>9} {:>9}",
        "algorithm", "N", "opened", "closed", "failed", "p50 µs", "p99 µs", "max/bknd", "mean/bknd"
    )?;
    for (step, &size) in args.steps.iter().enumerate() {
        if step > 0 {
            job.send_replace(all.clone().with_size(size));
        }
        tokio::time::sleep(Duration::from_millis(args.step_ms)).await;
        for (f, fleet) in fleets.iter().enumerate() {
            let now = counters(fleet);
            let log = std::mem::take(&mut *fleet.log.lock().expect("not poisoned"));
            let mut lat = log.latencies_us;
            lat.sort_unstable();
            let mut per_backend = vec![0usize; most];
            for ch in &fleet.channels {
                for member in ch.stats().members {
                    per_backend[member.task] += 1;
                }
            }
            let live = &per_backend[..size];
            let r = StepResult {
                backends: size,
                opened: now.0 - before[f].0,
                closed: now.1 - before[f].1,
                failures: log.failures,
                p50_us: percentile(&lat, 0.5),
                p99_us: percentile(&lat, 0.99),
                max_per_backend: live.iter().copied().max().unwrap_or(0),
                mean_per_backend: live.iter().sum::<usize>() as f64 / size.max(1) as f64,
            };
            writeln!(
                out,
                "{:<width$} {:>5} {:>7} {:>7} {:>7} {:>8} {:>8} {:>9} {:>9.2}",
                fleet.algorithm.to_string(),
                r.backends,
                r.opened,
                r.closed,
                r.failures,
                r.p50_us,
                r.p99_us,
                r.max_per_backend,
                r.mean_per_backend
            )?;
            before[f] = now;
            results[f].push(r);
        }
    }
    stop.store(true, Ordering::Relaxed);
    for l in loops {
        let _ = tokio::time::timeout(Duration::from_secs(5), l).await;
    }
    let svg = crate::output::or_default(&args.svg, "resize.svg")?;
    draw(&svg, &fleets, &results)?;
    writeln!(out, "# wrote {}", svg.display())?;
    drop(servers);
    Ok(())
}

/// One panel: where, its caption, and the value it plots per step.
type Panel<'a, 'b> =
    (&'a DrawingArea<SVGBackend<'b>, plotters::coord::Shift>, &'static str, fn(&StepResult) -> f64);

/// Connections opened and requests failed per step, one line per algorithm.
fn draw(path: &PathBuf, fleets: &[Fleet], results: &[Vec<StepResult>]) -> LabResult {
    let root = SVGBackend::new(path, (1200, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(600);
    let steps = results.first().map_or(0, Vec::len).max(1);
    let panels: [Panel<'_, '_>; 2] = [
        (&left, "Connections opened per resize step", |r| r.opened as f64),
        (&right, "Requests failed per resize step", |r| r.failures as f64),
    ];
    for (area, caption, value) in panels {
        let y_max = results.iter().flatten().map(value).fold(1.0, f64::max) * 1.15;
        let mut chart = ChartBuilder::on(area)
            .caption(caption, ("sans-serif", 17))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(55)
            .build_cartesian_2d(0f64..(steps - 1).max(1) as f64, 0f64..y_max)?;
        chart.configure_mesh().x_desc("step (N changes at each)").label_style(("sans-serif", 14)).draw()?;
        for (fleet, rows) in fleets.iter().zip(results) {
            let colour = steady_lab::figures::colour(&fleet.algorithm);
            chart
                .draw_series(LineSeries::new(
                    rows.iter().enumerate().map(|(i, r)| (i as f64, value(r))),
                    colour.stroke_width(3),
                ))?
                .label(fleet.algorithm.to_string())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], colour.stroke_width(3)));
        }
        chart.configure_series_labels().border_style(BLACK).background_style(WHITE.mix(0.85)).draw()?;
    }
    root.present()?;
    Ok(())
}
