//! `steady-lab consistent`: the availability benchmark of exclusive ownership (Slicer's
//! consistency benchmark, OSDI 2016, at our scale; `docs/exclusive.md`, "The availability
//! benchmark").
//!
//! Starts a real etcd (or uses `--endpoints`), then runs the same workload once per mode,
//! one after another, each on a fresh job and a fresh runtime: `exclusive` (the lease
//! protocol with the bridge), `exclusive-no-bridge` (without it) and `eventual` (today's
//! affinity). Each run has backends (tonic echo servers behind their Slicelets' layers,
//! refusing misroutes with the typed status), a Distributor and a load collector, the
//! load-driven Assigner service on etcd (a run a second, one replica per slice), and
//! frontends whose `SteadyChannel`s send keyed requests open loop with Zipf popularity
//! over a few thousand keys whose ranking moves every `--shift-every` seconds. Prints a
//! row per mode: what became of the requests (satisfied, refused, rerouted, failed),
//! latency, the generations published, the recalls and the keys moved per change.

use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, ValueEnum};
use steady_slice::guard::Consistency;
use steady_slice::Assignment;
use steady_testing::percentile;

use crate::slicer_demo::workload::Popularity;
use crate::LabResult;

mod fleet;
mod owner;
mod table;
mod traffic;

use fleet::Fleet;
use table::Row;

/// How the job's ownership is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// The lease protocol, with the bridge: unchanged slices stay owned across a change.
    Exclusive,
    /// The lease protocol without the bridge: every key pauses at every change.
    ExclusiveNoBridge,
    /// Today's affinity: Slicelets follow the Distributor, and misroutes are refused.
    Eventual,
}

impl Mode {
    fn consistency(self) -> Consistency {
        match self {
            Mode::Exclusive | Mode::ExclusiveNoBridge => Consistency::Exclusive,
            Mode::Eventual => Consistency::Eventual,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Mode::Exclusive => "exclusive",
            Mode::ExclusiveNoBridge => "exclusive-no-bridge",
            Mode::Eventual => "eventual",
        }
    }
}

/// Arguments of `steady-lab consistent`.
#[derive(Debug, Args)]
pub struct ConsistentArgs {
    /// Frontends, each with its own channel.
    #[arg(long, default_value_t = 8)]
    frontends: usize,
    /// Backend tasks.
    #[arg(long, default_value_t = 16)]
    backends: u32,
    /// Seconds of load per mode.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// The modes to run, in order.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "exclusive,exclusive-no-bridge,eventual")]
    modes: Vec<Mode>,
    /// The hot set moves every this many seconds.
    #[arg(long, default_value_t = 5)]
    shift_every: u64,
    /// Requests a second per frontend, open loop.
    #[arg(long, default_value_t = 250)]
    rate: u32,
    /// Distinct keys.
    #[arg(long, default_value_t = 4000)]
    keys: usize,
    /// Zipf exponent of their popularity.
    #[arg(long, default_value_t = 1.0)]
    zipf: f64,
    /// Each request's deadline, milliseconds.
    #[arg(long, default_value_t = 1000)]
    deadline_ms: u64,
    /// An etcd cluster to use instead of starting one (`http://host:port`, comma
    /// separated); each run takes a job name of its own.
    #[arg(long, value_delimiter = ',')]
    endpoints: Vec<String>,
}

/// Runs the benchmark.
pub fn run(out: &mut impl Write, args: &ConsistentArgs) -> LabResult {
    if args.backends < 2 || args.frontends == 0 || args.keys == 0 || args.rate == 0 || args.seconds == 0 {
        return Err(
            "--backends must be at least 2; --frontends, --keys, --rate and --seconds at least 1".into()
        );
    }
    if args.modes.is_empty() || args.deadline_ms == 0 || args.shift_every == 0 {
        return Err("--modes needs at least one mode; --deadline-ms and --shift-every at least 1".into());
    }
    // Kept until the end: dropping it stops the server.
    let mut started = None;
    let endpoints = if args.endpoints.is_empty() {
        let etcd = steady_testing::Etcd::start().ok_or(
            "etcd is not installed: `steady-lab consistent` starts a real etcd (Debian's etcd-server, \
             `apt-get install etcd-server`; or set STEADY_ETCD_BIN), or give one with --endpoints",
        )?;
        let endpoint = etcd.endpoint();
        started = Some(etcd);
        vec![endpoint]
    } else {
        args.endpoints.clone()
    };
    writeln!(
        out,
        "# steady-lab consistent: {} backends, {} frontends x {} req/s open loop, {} keys Zipf {}, hot set moves every {} s, deadline {} ms, {} s per mode; etcd at {}",
        args.backends,
        args.frontends,
        args.rate,
        args.keys,
        args.zipf,
        args.shift_every,
        args.deadline_ms,
        args.seconds,
        endpoints.join(","),
    )?;
    table::header(out)?;
    out.flush()?;
    // Unique across runs on one etcd: the process and the start time.
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis();
    let mut rows = Vec::new();
    for (i, &mode) in args.modes.iter().enumerate() {
        let job = format!("consistent-{}-{}-{stamp}-{i}", mode.name(), std::process::id());
        // A runtime per mode: whatever a run leaves behind ends with it.
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
        let row = runtime.block_on(run_mode(mode, job, &endpoints, args));
        runtime.shutdown_timeout(Duration::from_secs(2));
        let row = row?;
        table::row(out, &row)?;
        out.flush()?;
        rows.push(row);
    }
    table::summary(out, &rows)?;
    drop(started);
    Ok(())
}

/// One mode's run on a fresh job.
async fn run_mode(
    mode: Mode,
    job: String,
    endpoints: &[String],
    args: &ConsistentArgs,
) -> Result<Row, Box<dyn std::error::Error>> {
    let fleet = Fleet::start(mode, job, endpoints, args.backends, args.frontends).await?;
    fleet.ready(Duration::from_secs(20)).await?;
    let stats = fleet.assigner.shared_stats();
    let (published_before, recalls_before) = (stats.published(), stats.recalls());
    let popularity = Arc::new(Popularity::new(args.keys, args.zipf));
    let deadline = Duration::from_millis(args.deadline_ms);
    let traffic = traffic::start(&fleet.frontends, popularity.clone(), f64::from(args.rate), deadline);

    // While the load runs: move the hot set on schedule; note each new generation's moved
    // keys and each recall's time (every 10 ms: publications are a second apart at least).
    let start = tokio::time::Instant::now();
    let end = start + Duration::from_secs(args.seconds);
    let shift = Duration::from_secs(args.shift_every);
    let mut next_shift = start + shift;
    let mut previous: Option<Assignment> = fleet.distributor.current(&fleet.job);
    let mut churn = Vec::new();
    let mut recall_times = Vec::new();
    let mut recalls_seen = recalls_before;
    while tokio::time::Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(10)).await;
        if tokio::time::Instant::now() >= next_shift {
            popularity.epoch.fetch_add(1, Ordering::Relaxed);
            next_shift += shift;
        }
        let current = fleet.distributor.current(&fleet.job);
        if let (Some(p), Some(c)) = (&previous, &current) {
            if c.generation() != p.generation() {
                churn.push(p.diff(c).key_churn());
            }
        }
        if current.is_some() {
            previous = current;
        }
        let recalls = stats.recalls();
        if recalls > recalls_seen {
            recalls_seen = recalls;
            if let Some(took) = stats.last_recall() {
                recall_times.push(took);
            }
        }
    }
    // Every request ends by its deadline; a little more for the last answers to land.
    let tally = traffic.finish(deadline + Duration::from_secs(2)).await;
    let totals = fleet.totals();
    let exclusive = mode.consistency() == Consistency::Exclusive;
    let generations = stats.published() - published_before;
    let recalls = stats.recalls() - recalls_before;
    fleet.stop().await;

    let mut latencies = tally.latencies_us.clone();
    latencies.sort_unstable();
    recall_times.sort_unstable();
    let refusals = totals.layer_refusals + totals.late_refusals;
    Ok(Row {
        mode,
        requests: tally.requests(),
        satisfied: tally.satisfied,
        refused: tally.refused,
        // A refusal ends its request or sends it again once.
        rerouted: refusals.saturating_sub(tally.refused),
        unowned: totals.unowned,
        overlaps: totals.overlaps,
        timed_out: tally.timed_out,
        failed: tally.failed,
        p50_us: percentile(&latencies, 0.5),
        p99_us: percentile(&latencies, 0.99),
        generations,
        recalls: exclusive.then_some(recalls),
        recall_p50: recall_times.get(recall_times.len() / 2).copied(),
        recall_max: recall_times.last().copied(),
        churn: (!churn.is_empty()).then(|| churn.iter().sum::<f64>() / churn.len() as f64),
    })
}
