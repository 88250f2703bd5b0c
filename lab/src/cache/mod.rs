//! `steady-lab cache`: what keyed routing buys, on real tonic servers.
//!
//! Eight backends each cache values in a bounded LRU; a miss reads a database server
//! with a fixed read latency and a concurrency limit; each request also holds one of a
//! backend's workers for a fixed time, so an imbalanced backend queues. Four frontends on
//! `SteadyChannel` send keys with Zipf(1) popularity. Each strategy (unkeyed p2c, static
//! hashing, consistent hashing, Rudolph's in-process rotation, the Slicer loop with one
//! replica and with up to three) runs on a fresh fleet with the same seed, through the
//! same phases:
//!
//! * **reshuffled**: an open loop at a fixed rate, the popularity ranking redrawn every
//!   `--reshuffle-every` (Rudolph's stress case);
//! * **steady**: the same rate, one ranking throughout;
//! * **closed**: a fixed number of callers per frontend, reshuffled keys (throughput);
//! * **restart**: the steady open loop while every backend in turn drains through
//!   discovery, restarts with an empty cache and rejoins.
//!
//! Prints a table per phase (req/s, p50/p90/p99, hit rate, database reads per second,
//! misroutes, failures, key affinity, each backend's p95) and the restart's seconds;
//! writes the figures (SVG) and, with `--json`, every figure's data.

use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Args;
use serde::{Deserialize, Deserializer, Serialize};

use steady_balance::{KeyedLoadBound, KeyedSpill};

use crate::slicer_demo::workload::Popularity;
use crate::LabResult;

mod backend;
mod fleet;
mod hashing;
mod load;
mod report;

use backend::{BackendConfig, DatabaseConfig};
use fleet::{Fleet, FleetConfig, Strategy};
use load::{Offered, Recorder, Traffic};

/// Arguments of `steady-lab cache`.
#[derive(Debug, Args)]
pub struct CacheArgs {
    /// A small, fast run (seconds, for the test suite): 4 backends, 2 frontends, 1,000
    /// keys, the reshuffled and restart phases only.
    #[arg(long)]
    quick: bool,
    /// Strategies to run (default: all).
    #[arg(long, value_enum, value_delimiter = ',')]
    strategies: Vec<Strategy>,
    /// Phases to run (default: reshuffled, steady, closed, restart).
    #[arg(long, value_enum, value_delimiter = ',')]
    phases: Vec<Phase>,
    /// Backend tasks.
    #[arg(long, default_value_t = 8)]
    backends: u32,
    /// Frontends.
    #[arg(long, default_value_t = 4)]
    frontends: usize,
    /// Distinct keys.
    #[arg(long, default_value_t = 5_000)]
    keys: usize,
    /// Zipf exponent of their popularity.
    #[arg(long, default_value_t = 1.0)]
    zipf: f64,
    /// Entries each backend's cache holds.
    #[arg(long, default_value_t = 250)]
    cache_entries: usize,
    /// Requests a backend works on at once.
    #[arg(long, default_value_t = 3)]
    workers: usize,
    /// Work per request at a backend, µs (a worker is held this long).
    #[arg(long, default_value_t = 2_000)]
    work_us: u64,
    /// The database's read latency, µs.
    #[arg(long, default_value_t = 1_000)]
    db_latency_us: u64,
    /// Reads the database serves at once.
    #[arg(long, default_value_t = 8)]
    db_concurrency: usize,
    /// Requests per second over all frontends (open loop).
    #[arg(long, default_value_t = 5_000.0)]
    rate: f64,
    /// Callers per frontend (closed loop).
    #[arg(long, default_value_t = 6)]
    callers: usize,
    /// Seconds measured per phase.
    #[arg(long, default_value_t = 15)]
    seconds: u64,
    /// Seconds of traffic before measuring starts.
    #[arg(long, default_value_t = 2)]
    warmup: u64,
    /// Seconds between reshuffles of the key ranking.
    #[arg(long, default_value_t = 10)]
    reshuffle_every: u64,
    /// Milliseconds between assignment runs (the Assigner's cadence, Rudolph's period).
    #[arg(long, default_value_t = 1_000)]
    assign_ms: u64,
    /// Bounded-load keyed routing for the Slicer strategies' frontends (not with handover)
    /// (`BalanceConfig::keyed_load_bound`): `FACTOR:FLOOR` (a replica with more than
    /// FACTOR times the mean requests in flight, plus FLOOR, hands keyed requests to the
    /// next slices' replicas), `FACTOR:FLOOR:subset` (to the least loaded of the subset),
    /// or `off`.
    #[arg(long, default_value = "1.5:2")]
    keyed_bound: String,
    /// Milliseconds a backend drains before it restarts, and again after it rejoins.
    #[arg(long, default_value_t = 750)]
    restart_ms: u64,
    /// Where to write the figures, created if needed [default: cache-figures/ in the
    /// lab's output folder, `target/steady-lab/` or $STEADY_LAB_OUT; `docs/figures` to
    /// regenerate the docs' figures].
    #[arg(long)]
    figures: Option<PathBuf>,
    /// Also write every result as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Run nothing: draw the figures of a run saved with `--json`.
    #[arg(long)]
    redraw: Option<PathBuf>,
}

impl CacheArgs {
    /// Where the figures go: `--figures`, else the lab's output folder.
    fn figures_dir(&self) -> std::io::Result<PathBuf> {
        crate::output::or_default(&self.figures, "cache-figures")
    }

    /// The settings in force: `--quick` replaces the sizes and times.
    fn settings(&self) -> Settings {
        let mut s = Settings {
            strategies: if self.strategies.is_empty() {
                Strategy::ALL.to_vec()
            } else {
                self.strategies.clone()
            },
            fleet: FleetConfig {
                backends: self.backends,
                frontends: self.frontends,
                backend: BackendConfig {
                    handover_grace: None,
                    cache_entries: self.cache_entries,
                    workers: self.workers,
                    work: Duration::from_micros(self.work_us),
                },
                database: DatabaseConfig {
                    read_latency: Duration::from_micros(self.db_latency_us),
                    concurrency: self.db_concurrency,
                },
                assign_every: Duration::from_millis(self.assign_ms.max(10)),
                keyed_bound: None,
            },
            keys: self.keys,
            zipf: self.zipf,
            rate: self.rate,
            callers: self.callers,
            measure: Duration::from_secs(self.seconds.max(1)),
            warmup: Duration::from_secs(self.warmup),
            reshuffle_every: Duration::from_secs(self.reshuffle_every.max(1)),
            restart: Duration::from_millis(self.restart_ms),
            phases: if self.phases.is_empty() { Phase::ALL.to_vec() } else { self.phases.clone() },
        };
        if self.quick {
            s.fleet.backends = 4;
            s.fleet.frontends = 2;
            s.fleet.backend.cache_entries = 100;
            s.fleet.assign_every = Duration::from_millis(300);
            s.keys = 1_000;
            s.rate = 400.0;
            s.measure = Duration::from_secs(3);
            s.warmup = Duration::from_secs(1);
            s.reshuffle_every = Duration::from_secs(2);
            s.restart = Duration::from_millis(400);
            if self.phases.is_empty() {
                s.phases = vec![Phase::Reshuffled, Phase::Restart];
            }
        }
        s
    }
}

/// Reads `--keyed-bound`: `off`, `FACTOR:FLOOR` or `FACTOR:FLOOR:subset`, the values
/// checked as the balancer checks them.
fn parse_keyed_bound(text: &str) -> Result<Option<KeyedLoadBound>, String> {
    if text == "off" {
        return Ok(None);
    }
    let usage = || format!("--keyed-bound {text:?}: expected off, FACTOR:FLOOR or FACTOR:FLOOR:subset");
    let parts: Vec<&str> = text.split(':').collect();
    let (factor, floor, spill) = match parts[..] {
        [factor, floor] => (factor, floor, KeyedSpill::Neighbour),
        [factor, floor, "subset"] => (factor, floor, KeyedSpill::Subset),
        _ => return Err(usage()),
    };
    let bound =
        KeyedLoadBound::new(factor.parse().map_err(|_| usage())?, floor.parse().map_err(|_| usage())?)
            .with_spill(spill);
    steady_balance::BalanceConfig::new(0, 1)
        .with_keyed_load_bound(bound)
        .validate()
        .map_err(|e| format!("--keyed-bound: {e}"))?;
    Ok(Some(bound))
}

/// The settings of a run.
#[derive(Debug, Clone)]
struct Settings {
    strategies: Vec<Strategy>,
    fleet: FleetConfig,
    keys: usize,
    zipf: f64,
    rate: f64,
    callers: usize,
    measure: Duration,
    warmup: Duration,
    reshuffle_every: Duration,
    restart: Duration,
    phases: Vec<Phase>,
}

impl Settings {
    /// Refuses settings the experiment cannot run with, naming the flag.
    fn validate(&self) -> Result<(), String> {
        let f = &self.fleet;
        let problem = if !(2..=64).contains(&f.backends) {
            "--backends must be between 2 and 64"
        } else if !(1..=64).contains(&f.frontends) {
            "--frontends must be between 1 and 64"
        } else if !(1..=10_000_000).contains(&self.keys) {
            "--keys must be between 1 and 10,000,000"
        } else if !(self.zipf.is_finite() && self.zipf >= 0.0) {
            "--zipf must be a number at least 0"
        } else if !(self.rate.is_finite() && self.rate > 0.0 && self.rate <= 1e6) {
            "--rate must be more than 0 and at most 1,000,000"
        } else if f.backend.cache_entries == 0 || f.backend.workers == 0 || f.database.concurrency == 0 {
            "--cache-entries, --workers and --db-concurrency must be at least 1"
        } else if !(1..=10_000).contains(&self.callers) {
            "--callers must be between 1 and 10,000"
        } else {
            return Ok(());
        };
        Err(problem.to_owned())
    }
}

/// The phases each strategy runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
enum Phase {
    /// Open loop, the key ranking redrawn every `--reshuffle-every` seconds.
    Reshuffled,
    /// Open loop, one ranking.
    Steady,
    /// Closed loop, reshuffled keys.
    Closed,
    /// Open loop, one ranking, every backend restarted in turn.
    Restart,
}

impl Phase {
    const ALL: [Phase; 4] = [Phase::Reshuffled, Phase::Steady, Phase::Closed, Phase::Restart];

    fn reshuffles(self) -> bool {
        matches!(self, Phase::Reshuffled | Phase::Closed)
    }

    fn describe(self, s: &Settings) -> String {
        let keys = format!("{} keys, Zipf {}", s.keys, s.zipf);
        let every = s.reshuffle_every.as_secs();
        match self {
            Phase::Reshuffled => format!("{keys} reshuffled every {every} s, open loop at {} req/s", s.rate),
            Phase::Steady => format!("{keys}, one ranking, open loop at {} req/s", s.rate),
            Phase::Closed => format!(
                "{keys} reshuffled every {every} s, closed loop of {} callers",
                s.callers * s.fleet.frontends
            ),
            Phase::Restart => format!(
                "{keys}, one ranking, open loop at {} req/s; each backend in turn drains (then a {} ms grace), restarts empty, rejoins",
                s.rate,
                s.restart.as_millis()
            ),
        }
    }
}

/// One strategy's result in one phase.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Outcome {
    strategy: String,
    phase: Phase,
    seconds: f64,
    answered: u64,
    failed: u64,
    requests_per_second: f64,
    p50_ms: f64,
    p90_ms: f64,
    p99_ms: f64,
    #[serde(deserialize_with = "nan_if_null")]
    hit_rate: f64,
    db_reads_per_second: f64,
    /// Keyed requests served by a backend the shared assignment did not name; `None`
    /// where there is no shared assignment (p2c, Rudolph's per-frontend ones).
    misrouted: Option<u64>,
    /// For each key, the share of its requests answered by its most common backend.
    #[serde(deserialize_with = "nan_if_null")]
    key_affinity: f64,
    /// Each backend's p95 latency, ms.
    backend_p95_ms: Vec<f64>,
    /// The hit rate in each second measured (NaN in a second without a lookup).
    #[serde(deserialize_with = "nans_if_null")]
    hit_rate_per_second: Vec<f64>,
    /// Failed requests in each second measured.
    failed_per_second: Vec<u64>,
    /// Misrouted keyed requests in each second measured (empty in runs saved before it).
    #[serde(default)]
    misrouted_per_second: Vec<u64>,
    /// Cache entries backends loaded from each other while warming (handover).
    #[serde(default)]
    warmed: u64,
    /// Keyed requests the frontends' load bound sent off their slice's replicas
    /// (`--keyed-bound`; 0 in runs saved before it).
    #[serde(default)]
    spilled: u64,
}

/// JSON writes NaN as `null`: read it back as NaN.
fn nan_if_null<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

fn nans_if_null<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
    Ok(Vec::<Option<f64>>::deserialize(d)?.into_iter().map(|x| x.unwrap_or(f64::NAN)).collect())
}

/// Runs the experiment.
pub fn run(out: &mut impl Write, args: &CacheArgs) -> LabResult {
    if let Some(saved) = &args.redraw {
        let outcomes: Vec<Outcome> = serde_json::from_str(&std::fs::read_to_string(saved)?)?;
        for file in report::draw(&args.figures_dir()?, &outcomes)? {
            writeln!(out, "# wrote {}", file.display())?;
        }
        return Ok(());
    }
    let mut settings = args.settings();
    settings.validate()?;
    settings.fleet.keyed_bound = parse_keyed_bound(&args.keyed_bound)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let outcomes = runtime.block_on(async {
        let mut outcomes = Vec::new();
        for &phase in &settings.phases {
            for &strategy in &settings.strategies {
                eprintln!("# cache: {} / {:?}", strategy.name(), phase);
                outcomes.push(measure(strategy, phase, &settings).await?);
            }
        }
        Ok::<_, Box<dyn std::error::Error>>(outcomes)
    })?;
    report::print(out, &settings, &outcomes)?;
    for file in report::draw(&args.figures_dir()?, &outcomes)? {
        writeln!(out, "# wrote {}", file.display())?;
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&outcomes)?)?;
        writeln!(out, "# wrote {}", path.display())?;
    }
    Ok(())
}

/// Runs `strategy` through `phase` on a fresh fleet.
async fn measure(
    strategy: Strategy,
    phase: Phase,
    s: &Settings,
) -> Result<Outcome, Box<dyn std::error::Error>> {
    let mut fleet = Fleet::start(strategy, &s.fleet).await?;
    let popularity = Arc::new(Popularity::new(s.keys, s.zipf));
    let recorder = Arc::new(Mutex::new(Recorder::new(s.keys, s.fleet.backends as usize)));
    let offered = match phase {
        Phase::Closed => Offered::Closed { callers: s.callers },
        _ => Offered::Open { rate: s.rate },
    };
    let traffic = Traffic::start(
        &fleet.channels,
        offered,
        strategy.keyed(),
        popularity.clone(),
        recorder.clone(),
        0x5EED,
    );
    tokio::time::sleep(s.warmup).await;

    // Measuring: the counters at the start, then a sample each second.
    let counters = fleet.counters();
    let start_reads = fleet.database.reads();
    let start_misrouted = fleet.misrouted();
    let start_spilled = fleet.spilled();
    recorder.lock().expect("not poisoned").start_measuring();
    let started = tokio::time::Instant::now();
    // The restart phase lasts as long as the restarts take (at least `measure`), and two
    // seconds more; the others `measure`.
    let restarting = Arc::new(std::sync::atomic::AtomicBool::new(phase == Phase::Restart));
    let sampler = {
        let (counters, popularity, restarting) = (counters.clone(), popularity.clone(), restarting.clone());
        let (reshuffles, every, measure) = (phase.reshuffles(), s.reshuffle_every, s.measure);
        tokio::spawn(async move {
            let mut samples = vec![counters.hits_misses()];
            let mut misrouted = vec![counters.misrouted()];
            let mut ticks =
                tokio::time::interval_at(started + Duration::from_secs(1), Duration::from_secs(1));
            let mut next_shuffle = every;
            let mut at = Duration::ZERO;
            let mut end = measure;
            while at < end {
                ticks.tick().await;
                at += Duration::from_secs(1);
                samples.push(counters.hits_misses());
                misrouted.push(counters.misrouted());
                if restarting.load(std::sync::atomic::Ordering::Relaxed) {
                    end = end.max(at + Duration::from_secs(2));
                }
                if reshuffles && at >= next_shuffle && at < end {
                    popularity.epoch.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    next_shuffle += every;
                }
            }
            (samples, misrouted)
        })
    };
    let start_warmed = fleet.warmed();
    if phase == Phase::Restart {
        let done = restart_each(&mut fleet, s.restart).await;
        restarting.store(false, std::sync::atomic::Ordering::Relaxed);
        done?;
    }
    let (samples, misrouted_samples) = sampler.await?;
    let seconds = started.elapsed().as_secs_f64();
    let window = samples.len() - 1;
    let reads = fleet.database.reads() - start_reads;
    let misrouted = fleet.misrouted() - start_misrouted;
    let spilled = fleet.spilled() - start_spilled;
    traffic.stop().await;

    let mut recorder = std::mem::replace(&mut *recorder.lock().expect("not poisoned"), Recorder::new(0, 0));
    let (first, last) = (samples[0], samples[samples.len() - 1]);
    let hit_rate_per_second = samples.windows(2).map(|w| hit_rate(w[0], w[1])).collect();
    let mut latencies = std::mem::take(&mut recorder.latencies_us);
    latencies.sort_unstable();
    let ms = |p: f64| f64::from(steady_testing::percentile(&latencies, p)) / 1000.0;
    Ok(Outcome {
        strategy: strategy.name().to_owned(),
        phase,
        seconds,
        answered: latencies.len() as u64,
        failed: recorder.failures(),
        // Answers within the window: a backlog served after it does not count as throughput
        // (its latencies do count above).
        requests_per_second: recorder.answered_per_second.iter().take(window).sum::<u64>() as f64
            / window as f64,
        p50_ms: ms(0.5),
        p90_ms: ms(0.9),
        p99_ms: ms(0.99),
        hit_rate: hit_rate(first, last),
        db_reads_per_second: reads as f64 / seconds,
        misrouted: strategy.shared_assignment().then_some(misrouted),
        key_affinity: recorder.key_affinity(),
        backend_p95_ms: std::mem::take(&mut recorder.per_backend_us)
            .into_iter()
            .map(|mut v| {
                v.sort_unstable();
                f64::from(steady_testing::percentile(&v, 0.95)) / 1000.0
            })
            .collect(),
        hit_rate_per_second,
        failed_per_second: std::mem::take(&mut recorder.failed_per_second),
        misrouted_per_second: misrouted_samples.windows(2).map(|w| w[1] - w[0]).collect(),
        warmed: fleet.warmed() - start_warmed,
        spilled,
    })
}

/// Hits over lookups between two `(hits, misses)` samples.
fn hit_rate(from: (u64, u64), to: (u64, u64)) -> f64 {
    let (hits, misses) = (to.0 - from.0, to.1 - from.1);
    if hits + misses == 0 {
        return f64::NAN;
    }
    hits as f64 / (hits + misses) as f64
}

/// Every backend in turn, as a rolling restart with readiness gates: drains through
/// discovery and, once no frontend sends it new requests, for `pause` more (the grace
/// period); restarts with an empty cache; rejoins, and once every frontend is connected
/// to it again, the next one waits `pause`.
async fn restart_each(fleet: &mut Fleet, pause: Duration) -> LabResult {
    for i in 0..fleet.backends.len() {
        let task = fleet.backends[i].task;
        fleet.set_state(task, false);
        fleet.wait_until_released(task).await?;
        fleet.wait_for_members(task, false).await?;
        tokio::time::sleep(pause).await;
        fleet.backends[i].restart().await?;
        fleet.set_state(task, true);
        fleet.wait_for_members(task, true).await?;
        tokio::time::sleep(pause).await;
    }
    Ok(())
}
