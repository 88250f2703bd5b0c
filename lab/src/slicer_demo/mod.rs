//! `steady-lab slicer`: the keyed Slicer loop end to end on real tonic servers.
//!
//! Starts backend echo servers with Slicelets (misroute counting and load reports), a
//! Distributor, a load collector and an Assigner (a one-job instance of the control
//! plane's fleet, as `steady-slicer --job` runs; on the in-memory store, or on etcd with a
//! standby instance), and frontends whose `SteadyChannel`s send keyed requests with
//! Zipf popularity over named keys. Time is compressed: a step is a second where Slicer's
//! would be a minute. The hot keys move every `--shift-every` steps; on the way, the
//! Assigner is killed (and restored, or replaced by its standby on etcd), and a backend is
//! drained and then removed. Prints per step: the generation in force, imbalance (the
//! busiest backend's keyed requests over the mean), key churn, misrouted requests (served
//! by a task that did not hold the key), failed requests and p50/p99; writes an SVG.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use steady_assigner::{ReplicaLimits, TaskState as AssignerState, Tasks};
use steady_balance::{BalanceConfig, JobView, TaskState};
use steady_slice::Assignment;
use steady_slicelet::{LoadReporter, MeterConfig, Slicelet};
use steady_slicer::assigner_service::AssignerConfig;
use steady_subset::prng::SplitMix64;
use steady_testing::echo::echo_client::EchoClient;
use steady_testing::echo::EchoRequest;
use steady_testing::loopback::ServerGuard;
use steady_testing::{holds_within, percentile};
use steady_tonic::{AutoshardingConfig, SteadyChannel, TaskEndpoint};
use tokio::sync::watch;
use tonic::transport::Endpoint;

use crate::LabResult;

pub(crate) mod control;
mod summary;
pub(crate) mod workload;

use control::ControlPlane;
use workload::Popularity;

/// The demo's job name.
pub(crate) const JOB: &str = "demo";
/// The instance the status pages name.
const PAGES_INSTANCE: &str = "the demo's assigners";

/// Where the demo's Assigner stores assignments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DemoStore {
    /// In process: the Assigner is killed, then restored.
    Memory,
    /// etcd at `--endpoints`: two Assigners campaign; the leader is killed and the
    /// standby takes over when its lease lapses.
    Etcd,
}

/// Where the demo's Assigner learns the load from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LoadFrom {
    /// The backends' Slicelets report what they served (steady's load reports).
    Slicelets,
    /// The frontends report what they sent, per key range, on gRPC's autosharding
    /// protocol (gRFC A119), which they also follow assignments on; the backends report
    /// nothing.
    Clients,
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
    /// Where the status page (`/`) and Prometheus metrics (`/metrics`) are served while the
    /// demo runs (printed at start).
    #[arg(long, default_value = "127.0.0.1:0")]
    metrics_listen: std::net::SocketAddr,
    /// The assignment store.
    #[arg(long, value_enum, default_value = "memory")]
    store: DemoStore,
    /// Where the load comes from: the backends' Slicelets, or the frontends over gRPC's
    /// autosharding protocol (A119), whose assignments they then follow.
    #[arg(long, value_enum, default_value = "slicelets")]
    load_from: LoadFrom,
    /// etcd endpoints for `--store etcd`.
    #[arg(long, value_delimiter = ',')]
    endpoints: Vec<String>,
    /// Where to write the SVG [default: slicer.svg in the lab's output folder,
    /// `target/steady-lab/` or $STEADY_LAB_OUT].
    #[arg(long)]
    svg: Option<PathBuf>,
}

/// One backend: its Slicelet, its server (stopped when dropped), and its address.
struct Backend {
    slicelet: Slicelet,
    address: SocketAddr,
    stop: Option<ServerGuard>,
    /// Reports flow while this is kept (none when the clients report the load).
    _reporter: Option<LoadReporter>,
}

/// What the request loops recorded during a step.
#[derive(Default)]
struct StepLog {
    latencies_us: Vec<u32>,
    failed: u64,
}

/// One printed row.
#[derive(Debug)]
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

async fn demo(out: &mut impl Write, args: &SlicerArgs) -> LabResult {
    if args.backends < 2 || args.frontends == 0 || args.keys == 0 {
        return Err("--backends must be at least 2, --frontends and --keys at least 1".into());
    }
    let step = Duration::from_millis(args.step_ms.max(100));
    // Client reports cover a second each (the shortest interval a client takes): the
    // Slicelets' rates decay over two steps.
    let control = ControlPlane::start(args.store, &args.endpoints, step.max(Duration::from_secs(1))).await?;
    let mut backends = Vec::new();
    for task in 0..args.backends {
        // Rates decay over two steps: Slicer's window is five minutes, with steps of one.
        let slicelet =
            Slicelet::with_meter(task, MeterConfig { half_life: step * 2, ..MeterConfig::default() })?;
        let (address, stop) = control::serve(task, &slicelet).await;
        slicelet.follow(steady_tonic::watch_assignments(control.endpoint(), JOB, Default::default())?);
        let reporter = (args.load_from == LoadFrom::Slicelets)
            .then(|| slicelet.report_to(control.endpoint(), JOB, step / 4));
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
    let first = control.assigner("assigner-a", &config, tasks_rx.clone()).await?;
    // The standby starts once the first one leads, so that the one killed is the leader.
    let leads = |fleet: &steady_slicer_server::fleet::FleetHandle| {
        control::stats(fleet).is_some_and(|s| s.terms() > 0)
    };
    if !holds_within(Duration::from_secs(10), || leads(&first)).await {
        return Err("the first assigner never led".into());
    }
    // The pages, for as long as the demo runs: the leader's instance, replaced when
    // another Assigner takes over.
    let registry = steady_slicer_server::status::MetricsRegistry::new();
    let meter = registry.meter();
    control.distributor.observe_metrics(&meter);
    control.collector.observe_metrics(&meter);
    let (shown, shown_rx) = control::shown(first.status());
    steady_slicer_server::status::observe_fleet(&meter, shown_rx.clone(), PAGES_INSTANCE);
    let pages = tokio::net::TcpListener::bind(args.metrics_listen).await?;
    let at = pages.local_addr()?;
    writeln!(out, "status page: http://{at}/   metrics: http://{at}/metrics   (while the demo runs)")?;
    let sources = steady_slicer_server::status::StatusSources {
        instance: PAGES_INSTANCE.to_owned(),
        store: format!("{:?}", args.store).to_lowercase(),
        distributor: control.distributor.clone(),
        collector: control.collector.clone(),
        fleet: shown_rx,
        autosharding: Some(control.autosharding.clone()),
    };
    let _pages = AbortOnDrop(tokio::spawn(async move {
        let _ = steady_slicer_server::status::StatusServer::new(sources, registry).serve(pages).await;
    }));
    let mut leader = Some(first);
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
        match args.load_from {
            LoadFrom::Slicelets => channel.follow_assignments(steady_tonic::watch_assignments(
                control.endpoint(),
                JOB,
                Default::default(),
            )?),
            // The channel reports its keyed requests at the interval the server asks.
            LoadFrom::Clients => {
                channel.follow_autosharding(control.endpoint(), JOB, AutoshardingConfig::default())?;
            }
        }
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

    writeln!(out, "# steady-lab slicer: {} backends, {} frontends, {} keys Zipf {}, {} req/s, steps of {:?}, {:?} store, load from {:?}", args.backends, args.frontends, args.keys, args.zipf, args.rate, step, args.store, args.load_from)?;
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
    for s in 0..args.steps {
        let mut event = String::new();
        if s > 0 && s % args.shift_every.max(1) == 0 {
            popularity.epoch.fetch_add(1, Ordering::Relaxed);
            event.push_str("hot keys move; ");
        }
        if s == args.kill_at && args.kill_at > 0 {
            if let Some(handle) = leader.take() {
                handle.kill().await;
                killed_at = Some(Instant::now());
                event.push_str("assigner killed; ");
            }
        }
        if s == args.restore_at && args.store == DemoStore::Memory && leader.is_none() && args.kill_at > 0 {
            let restored = control.assigner("assigner-a2", &config, tasks_rx.clone()).await?;
            shown.send_replace(restored.status());
            leader = Some(restored);
            event.push_str("assigner restored; ");
        }
        if s == args.drain_at && args.drain_at > 0 {
            tasks.send_modify(|t| *t = drain(t, last as u32, AssignerState::Draining));
            event.push_str(&format!("task {last} drains; "));
        }
        if s == args.drain_at.saturating_add(4) && args.drain_at > 0 {
            tasks.send_modify(|t| *t = drain(t, last as u32, AssignerState::Gone));
            job.send_replace(all.clone().with_state(last, TaskState::Gone));
            event.push_str(&format!("task {last} removed; "));
        }
        // The step's traffic flows; meanwhile, watch (every 10 ms) for the standby to lead.
        let step_end = tokio::time::Instant::now() + step;
        while let Some(left) = step_end.checked_duration_since(tokio::time::Instant::now()) {
            tokio::time::sleep(left.min(Duration::from_millis(10))).await;
            if let (Some(at), None, Some(standby)) = (killed_at, failover, &standby) {
                if leads(standby) {
                    shown.send_replace(standby.status());
                    failover = Some(at.elapsed());
                    event.push_str("standby leads; ");
                }
            }
        }
        if s == args.drain_at.saturating_add(6) && args.drain_at > 0 {
            drop(backends[last].stop.take());
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
        // No traffic in a step: no imbalance to speak of (NaN, never "settled").
        let imbalance =
            if mean > 0.0 { serving.iter().copied().fold(0.0, f64::max) / mean } else { f64::NAN };
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
            p50_us: percentile(&latencies, 0.5),
            p99_us: percentile(&latencies, 0.99),
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
    summary::summarise(out, &rows, args, failover, &control)?;
    let svg = crate::output::or_default(&args.svg, "slicer.svg")?;
    summary::draw(&svg, &rows)?;
    writeln!(out, "# wrote {}", svg.display())?;
    Ok(())
}

/// `tasks` with `task` in `state`.
fn drain(tasks: &Tasks, task: u32, state: AssignerState) -> Tasks {
    Tasks::new(tasks.iter().map(|(t, s)| (t, if t == task { state } else { s })))
        .expect("the same task indices")
}

/// Aborts the task when dropped: the pages end with the demo.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
