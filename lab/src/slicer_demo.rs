//! `steady-lab slicer`: the keyed Slicer loop end to end on real tonic servers.
//!
//! Starts backend echo servers with Slicelets (misroute counting and load reports), a
//! Distributor, a load collector and an Assigner service (on the in-memory store, or on
//! etcd with a standby), and frontends whose `SteadyChannel`s send keyed requests with
//! Zipf popularity over named keys. Time is compressed: a step is a second where Slicer's
//! would be a minute. The hot keys move every `--shift-every` steps; on the way, the
//! Assigner is killed (and restored, or replaced by its standby on etcd), and a backend is
//! drained and then removed. Prints per step: the generation in force, imbalance (the
//! busiest backend's keyed requests over the mean), key churn, misrouted requests (served
//! by a task that did not hold the key), failed requests and p50/p99; writes an SVG.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use plotters::prelude::*;
use steady_assigner::{by_name, ReplicaLimits, TaskState as AssignerState, Tasks};
use steady_balance::{BalanceConfig, JobView, TaskState};
use steady_slice::Assignment;
use steady_slicer::assigner::{AssignerConfig, AssignerHandle, AssignerService};
use steady_slicer::load::{LoadBook, LoadCollector};
use steady_slicer::store::{AssignmentStore, EtcdConfig, EtcdStore, MemoryStore};
use steady_slicer::{Distributor, LoadReporter, MeterConfig, Slicelet};
use steady_subset::prng::{shuffle, SplitMix64};
use steady_tonic::echo::echo_client::EchoClient;
use steady_tonic::echo::echo_server::EchoServer;
use steady_tonic::echo::EchoRequest;
use steady_tonic::{SteadyChannel, TaskEndpoint};
use tokio::sync::{oneshot, watch};
use tonic::transport::{Endpoint, Server};

use crate::LabResult;

const JOB: &str = "demo";

/// Where the demo's Assigner stores assignments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DemoStore {
    /// In process: the Assigner is killed, then restored.
    Memory,
    /// etcd at `--endpoints`: two Assigners campaign; the leader is killed and the
    /// standby takes over when its lease lapses.
    Etcd,
}

/// Arguments of `steady-lab slicer`.
#[derive(Debug, Args)]
pub struct SlicerArgs {
    /// Backend tasks.
    #[arg(long, default_value_t = 6)]
    backends: u32,
    /// Frontends.
    #[arg(long, default_value_t = 4)]
    frontends: usize,
    /// Distinct keys.
    #[arg(long, default_value_t = 1000)]
    keys: usize,
    /// Zipf exponent of their popularity.
    #[arg(long, default_value_t = 1.2)]
    zipf: f64,
    /// Requests per second over all frontends.
    #[arg(long, default_value_t = 2000)]
    rate: u64,
    /// Steps (of `--step-ms` each).
    #[arg(long, default_value_t = 36)]
    steps: usize,
    /// Step length, milliseconds ("a minute" of Slicer's).
    #[arg(long, default_value_t = 1000)]
    step_ms: u64,
    /// The hot keys move every this many steps.
    #[arg(long, default_value_t = 10)]
    shift_every: usize,
    /// Most replicas per slice.
    #[arg(long, default_value_t = 3)]
    max_replicas: usize,
    /// The Assigner is killed at this step (0: never)...
    #[arg(long, default_value_t = 12)]
    kill_at: usize,
    /// ...and, on the memory store, restored at this one.
    #[arg(long, default_value_t = 16)]
    restore_at: usize,
    /// The last backend drains at this step (0: never) and is removed 4 steps later.
    #[arg(long, default_value_t = 26)]
    drain_at: usize,
    /// The assignment store.
    #[arg(long, value_enum, default_value = "memory")]
    store: DemoStore,
    /// etcd endpoints for `--store etcd`.
    #[arg(long, value_delimiter = ',')]
    endpoints: Vec<String>,
    /// Where to write the SVG.
    #[arg(long, default_value = "slicer.svg")]
    svg: PathBuf,
}

/// Zipf popularity over `keys` named keys whose ranking changes each epoch.
struct Popularity {
    cumulative: Vec<f64>,
    /// Per epoch: key of each rank.
    rankings: Mutex<Vec<Vec<usize>>>,
    epoch: AtomicU64,
}

impl Popularity {
    fn new(keys: usize, exponent: f64) -> Self {
        let weights: Vec<f64> = (1..=keys).map(|r| (r as f64).powf(-exponent)).collect();
        let total: f64 = weights.iter().sum();
        let mut sum = 0.0;
        let cumulative = weights.iter().map(|w| {
            sum += w / total;
            sum
        });
        Self { cumulative: cumulative.collect(), rankings: Mutex::new(Vec::new()), epoch: AtomicU64::new(0) }
    }

    /// The key name for a uniform draw `u` in [0, 1).
    fn key(&self, u: f64) -> String {
        let rank = self.cumulative.partition_point(|&c| c < u).min(self.cumulative.len() - 1);
        let epoch = self.epoch.load(Ordering::Relaxed) as usize;
        let mut rankings = self.rankings.lock().expect("not poisoned");
        while rankings.len() <= epoch {
            let mut order: Vec<usize> = (0..self.cumulative.len()).collect();
            shuffle(&mut order, &mut SplitMix64::new(0xD3_40 + rankings.len() as u64));
            rankings.push(order);
        }
        format!("key-{}", rankings[epoch][rank])
    }
}

/// One backend: its Slicelet, its server's stop signal, and its address.
struct Backend {
    slicelet: Slicelet,
    address: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    /// Reports flow while this is kept.
    _reporter: LoadReporter,
}

/// What the request loops recorded during a step.
#[derive(Default)]
struct StepLog {
    latencies_us: Vec<u32>,
    failed: u64,
}

/// One printed row.
struct Row {
    step: usize,
    generation: u64,
    imbalance: f64,
    churn: f64,
    requests: u64,
    misrouted: u64,
    failed: u64,
    p50_us: u32,
    p99_us: u32,
    event: String,
}

/// Runs the demo.
pub fn run(out: &mut impl Write, args: &SlicerArgs) -> LabResult {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(demo(out, args))
}

async fn serve(task: u32, slicelet: &Slicelet) -> std::io::Result<(SocketAddr, oneshot::Sender<()>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(
        Server::builder()
            .layer(slicelet.layer())
            .add_service(EchoServer::new(steady_tonic::demo::EchoTask(task)))
            .serve_with_incoming_shutdown(tokio_stream::wrappers::TcpListenerStream::new(listener), async {
                let _ = stopped.await;
            }),
    );
    Ok((address, stop))
}

/// The control plane: Distributor and load collector served on one address, and the
/// store the Assigners use.
struct Control {
    distributor: Distributor,
    book: LoadBook,
    address: SocketAddr,
    store: Arc<dyn AssignmentStore>,
    endpoints: Vec<String>,
}

impl Control {
    async fn start(args: &SlicerArgs) -> Result<Self, Box<dyn std::error::Error>> {
        let distributor = Distributor::new();
        let book = LoadBook::new();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        tokio::spawn(
            Server::builder()
                .add_service(distributor.service())
                .add_service(LoadCollector::new(book.clone()).service())
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let store: Arc<dyn AssignmentStore> = match args.store {
            DemoStore::Memory => Arc::new(MemoryStore::new()),
            DemoStore::Etcd => {
                if args.endpoints.is_empty() {
                    return Err("--store etcd needs --endpoints".into());
                }
                Arc::new(EtcdStore::connect(etcd_config(&args.endpoints)).await?)
            }
        };
        Ok(Self { distributor, book, address, store, endpoints: args.endpoints.clone() })
    }

    fn endpoint(&self) -> Endpoint {
        Endpoint::from_shared(format!("http://{}", self.address)).expect("a valid address")
    }

    /// An Assigner named `candidate`; on etcd with a connection of its own, as on
    /// another machine.
    async fn assigner(
        &self,
        candidate: &str,
        config: &AssignerConfig,
        tasks: watch::Receiver<Tasks>,
    ) -> Result<AssignerHandle, Box<dyn std::error::Error>> {
        let store: Arc<dyn AssignmentStore> = if self.endpoints.is_empty() {
            self.store.clone()
        } else {
            Arc::new(EtcdStore::connect(etcd_config(&self.endpoints)).await?)
        };
        let algorithm = by_name("weighted-move").expect("a known assigner");
        Ok(AssignerService::new(
            JOB,
            candidate,
            Arc::from(algorithm),
            store,
            self.distributor.clone(),
            self.book.clone(),
        )
        .config(config.clone())
        .spawn(tasks))
    }
}

fn etcd_config(endpoints: &[String]) -> EtcdConfig {
    EtcdConfig::new(endpoints.to_vec())
        .lease_ttl(Duration::from_secs(2))
        .request_timeout(Duration::from_secs(2))
}

async fn demo(out: &mut impl Write, args: &SlicerArgs) -> LabResult {
    if args.backends < 2 || args.frontends == 0 || args.keys == 0 {
        return Err("--backends must be at least 2, --frontends and --keys at least 1".into());
    }
    let step = Duration::from_millis(args.step_ms.max(100));
    let control = Control::start(args).await?;
    let mut backends = Vec::new();
    for task in 0..args.backends {
        // Rates decay over two steps: Slicer's window is five minutes, with steps of one.
        let slicelet =
            Slicelet::with_meter(task, MeterConfig { half_life: step * 2, ..MeterConfig::default() })?;
        let (address, stop) = serve(task, &slicelet).await?;
        slicelet.follow(steady_tonic::watch_assignments(control.endpoint(), JOB, Default::default()));
        let reporter = slicelet.report_to(control.endpoint(), JOB, step / 4);
        backends.push(Backend { slicelet, address, stop: Some(stop), _reporter: reporter });
    }

    let config = AssignerConfig {
        cadence: step,
        min_interval: step / 2,
        stale_after: step * 3,
        replicas: ReplicaLimits::new(1, args.max_replicas)?,
        ..AssignerConfig::default()
    };
    let (tasks, tasks_rx) = watch::channel(Tasks::serving(0..args.backends)?);
    let mut leader = Some(control.assigner("assigner-a", &config, tasks_rx.clone()).await?);
    let standby = match args.store {
        DemoStore::Etcd => Some(control.assigner("assigner-b", &config, tasks_rx.clone()).await?),
        DemoStore::Memory => None,
    };

    let endpoints: Vec<TaskEndpoint> = backends
        .iter()
        .map(|b| Endpoint::from_shared(format!("http://{}", b.address)).map(TaskEndpoint))
        .collect::<Result<_, _>>()?;
    let all = JobView::serving(endpoints);
    let (job, views) = watch::channel(all.clone());
    let popularity = Arc::new(Popularity::new(args.keys, args.zipf));
    let log = Arc::new(Mutex::new(StepLog::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let loops_per_frontend = 4usize;
    let period =
        Duration::from_secs_f64((args.frontends * loops_per_frontend) as f64 / args.rate.max(1) as f64);
    let mut loops = Vec::new();
    for m in 0..args.frontends {
        let channel =
            SteadyChannel::builder(BalanceConfig::new(m, args.backends as usize)).from_job(views.clone())?;
        channel.follow_assignments(steady_tonic::watch_assignments(
            control.endpoint(),
            JOB,
            Default::default(),
        ));
        for l in 0..loops_per_frontend {
            let (channel, log, stop, popularity) =
                (channel.clone(), log.clone(), stop.clone(), popularity.clone());
            let mut rng = SplitMix64::new((m * 64 + l) as u64);
            loops.push(tokio::spawn(async move {
                let mut client = EchoClient::new(channel);
                let mut tick = tokio::time::interval(period);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                while !stop.load(Ordering::Relaxed) {
                    tick.tick().await;
                    let key = popularity.key((rng.next() >> 11) as f64 / (1u64 << 53) as f64);
                    let mut request = tonic::Request::new(EchoRequest { payload: vec![1; 32] });
                    request.metadata_mut().insert("x-slice-key", key.parse().expect("ascii key"));
                    let start = Instant::now();
                    let ok = client.echo(request).await.is_ok();
                    let mut log = log.lock().expect("not poisoned");
                    if ok {
                        log.latencies_us.push(start.elapsed().as_micros().min(u32::MAX as u128) as u32);
                    } else {
                        log.failed += 1;
                    }
                }
            }));
        }
    }

    writeln!(out, "# steady-lab slicer: {} backends, {} frontends, {} keys Zipf {}, {} req/s, steps of {:?}, {:?} store", args.backends, args.frontends, args.keys, args.zipf, args.rate, step, args.store)?;
    writeln!(
        out,
        "{:>4} {:>5} {:>9} {:>8} {:>8} {:>9} {:>7} {:>7} {:>7}  event",
        "step", "gen", "imbalance", "churn", "requests", "misrouted", "failed", "p50 µs", "p99 µs"
    )?;
    let mut rows = Vec::new();
    let mut previous: Option<Assignment> = None;
    let mut counts: Vec<(u64, u64)> =
        backends.iter().map(|b| (b.slicelet.keyed_requests(), b.slicelet.misrouted())).collect();
    let last = args.backends as usize - 1;
    let mut killed_at: Option<Instant> = None;
    let mut failover: Option<Duration> = None;
    let mut leader_generation = 0;
    for s in 0..args.steps {
        let mut event = String::new();
        if s > 0 && s % args.shift_every.max(1) == 0 {
            popularity.epoch.fetch_add(1, Ordering::Relaxed);
            event.push_str("hot keys move; ");
        }
        if s == args.kill_at && args.kill_at > 0 {
            if let Some(handle) = leader.take() {
                leader_generation = handle.stats().generation();
                handle.kill().await;
                killed_at = Some(Instant::now());
                event.push_str("assigner killed; ");
            }
        }
        if s == args.restore_at && args.store == DemoStore::Memory && leader.is_none() && args.kill_at > 0 {
            leader = Some(control.assigner("assigner-a2", &config, tasks_rx.clone()).await?);
            event.push_str("assigner restored; ");
        }
        if s == args.drain_at && args.drain_at > 0 {
            tasks.send_modify(|t| *t = drain(t, last as u32, AssignerState::Draining));
            event.push_str(&format!("task {last} drains; "));
        }
        if s == args.drain_at + 4 && args.drain_at > 0 {
            tasks.send_modify(|t| *t = drain(t, last as u32, AssignerState::Gone));
            job.send_replace(all.clone().with_state(last, TaskState::Gone));
            event.push_str(&format!("task {last} removed; "));
        }
        tokio::time::sleep(step).await;
        if let (Some(at), None, Some(standby)) = (killed_at, failover, &standby) {
            if standby.stats().published() > 0 && standby.stats().generation() > leader_generation {
                failover = Some(at.elapsed());
                event.push_str("standby leads; ");
            }
        }
        if s == args.drain_at + 6 && args.drain_at > 0 {
            if let Some(stop) = backends[last].stop.take() {
                let _ = stop.send(());
            }
        }
        let now: Vec<(u64, u64)> =
            backends.iter().map(|b| (b.slicelet.keyed_requests(), b.slicelet.misrouted())).collect();
        let served: Vec<u64> = now.iter().zip(&counts).map(|(n, c)| n.0 - c.0).collect();
        let misrouted: u64 = now.iter().zip(&counts).map(|(n, c)| n.1 - c.1).sum();
        counts = now;
        let serving: Vec<f64> = served
            .iter()
            .enumerate()
            .filter(|&(t, _)| !(args.drain_at > 0 && s >= args.drain_at && t == last))
            .map(|(_, &n)| n as f64)
            .collect();
        let mean = serving.iter().sum::<f64>() / serving.len().max(1) as f64;
        let imbalance = if mean > 0.0 { serving.iter().copied().fold(0.0, f64::max) / mean } else { 0.0 };
        let current = control.distributor.current(JOB);
        let churn = match (&previous, &current) {
            (Some(p), Some(c)) if c.generation() != p.generation() => p.diff(c).key_churn(),
            _ => 0.0,
        };
        let taken = std::mem::take(&mut *log.lock().expect("not poisoned"));
        let mut latencies = taken.latencies_us;
        latencies.sort_unstable();
        let row = Row {
            step: s,
            generation: current.as_ref().map_or(0, Assignment::generation),
            imbalance,
            churn,
            requests: served.iter().sum(),
            misrouted,
            failed: taken.failed,
            p50_us: steady_tonic::demo::percentile(&latencies, 0.5),
            p99_us: steady_tonic::demo::percentile(&latencies, 0.99),
            event: event.trim_end_matches("; ").to_owned(),
        };
        writeln!(
            out,
            "{:>4} {:>5} {:>9.3} {:>7.2}% {:>8} {:>9} {:>7} {:>7} {:>7}  {}",
            row.step,
            row.generation,
            row.imbalance,
            row.churn * 100.0,
            row.requests,
            row.misrouted,
            row.failed,
            row.p50_us,
            row.p99_us,
            row.event
        )?;
        previous = current;
        rows.push(row);
    }
    stop.store(true, Ordering::Relaxed);
    for l in loops {
        let _ = tokio::time::timeout(Duration::from_secs(5), l).await;
    }
    summarise(out, &rows, args, failover, &control)?;
    draw(&args.svg, &rows)?;
    writeln!(out, "# wrote {}", args.svg.display())?;
    Ok(())
}

/// `tasks` with `task` in `state`.
fn drain(tasks: &Tasks, task: u32, state: AssignerState) -> Tasks {
    Tasks::new(tasks.iter().map(|(t, s)| (t, if t == task { state } else { s })))
        .expect("the same task indices")
}

/// The summary lines: imbalance before and after rebalancing, misroutes per
/// reassignment, failures, failover.
fn summarise(
    out: &mut impl Write,
    rows: &[Row],
    args: &SlicerArgs,
    failover: Option<Duration>,
    control: &Control,
) -> LabResult {
    let shifts: Vec<usize> = (1..args.steps).filter(|s| s % args.shift_every.max(1) == 0).collect();
    for &shift in &shifts {
        let at = |s: usize| rows.get(s).map_or(f64::NAN, |r| r.imbalance);
        let settled = (shift..rows.len().min(shift + args.shift_every)).find(|&s| rows[s].imbalance < 1.2);
        writeln!(
            out,
            "# shift at step {shift}: imbalance {:.2} in the step before, {:.2} right after, under 1.2 after {}",
            at(shift - 1),
            at(shift),
            settled.map_or("never".into(), |s| format!("{} steps", s - shift + 1)),
        )?;
    }
    let requests: u64 = rows.iter().map(|r| r.requests).sum();
    let misrouted: u64 = rows.iter().map(|r| r.misrouted).sum();
    let generations = rows.last().map_or(0, |r| r.generation);
    writeln!(
        out,
        "# requests {requests}, misrouted {misrouted} ({:.4}%), {:.1} per new generation; failed {}",
        100.0 * misrouted as f64 / requests.max(1) as f64,
        misrouted as f64 / generations.max(1) as f64,
        rows.iter().map(|r| r.failed).sum::<u64>(),
    )?;
    writeln!(out, "# load reports accepted {}, dropped {}", control.book.accepted(), control.book.dropped())?;
    if let Some(f) = failover {
        writeln!(
            out,
            "# failover: the standby published {:.2} s after the leader was killed (lease 2 s)",
            f.as_secs_f64()
        )?;
    }
    Ok(())
}

/// Imbalance, misroutes and failures per step.
fn draw(path: &PathBuf, rows: &[Row]) -> LabResult {
    let root = SVGBackend::new(path, (1200, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(600);
    let steps = rows.len().max(2) as f64;
    let y_max = rows.iter().map(|r| r.imbalance).fold(2.0, f64::max) * 1.1;
    let mut chart = ChartBuilder::on(&left)
        .caption("Imbalance per step (busiest backend / mean)", ("sans-serif", 17))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d(0f64..steps - 1.0, 0f64..y_max)?;
    chart.configure_mesh().x_desc("step").label_style(("sans-serif", 14)).draw()?;
    chart.draw_series(LineSeries::new(
        rows.iter().map(|r| (r.step as f64, r.imbalance)),
        GREEN.stroke_width(3),
    ))?;
    let y_max = rows.iter().map(|r| (r.misrouted + r.failed) as f64).fold(10.0, f64::max) * 1.1;
    let mut chart = ChartBuilder::on(&right)
        .caption("Misrouted (blue) and failed (red) requests per step", ("sans-serif", 17))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d(0f64..steps - 1.0, 0f64..y_max)?;
    chart.configure_mesh().x_desc("step").label_style(("sans-serif", 14)).draw()?;
    chart.draw_series(LineSeries::new(
        rows.iter().map(|r| (r.step as f64, r.misrouted as f64)),
        BLUE.stroke_width(3),
    ))?;
    chart.draw_series(LineSeries::new(
        rows.iter().map(|r| (r.step as f64, r.failed as f64)),
        RED.stroke_width(3),
    ))?;
    root.present()?;
    Ok(())
}
