//! `steady-lab zones`: routing across three zones, on real tonic servers.
//!
//! Twelve echo backends on loopback, four in each of zones a, b and c; frontends 6/3/3
//! (demand 50/25/25%: every frontend sends the same open-loop rate). Three strategies
//! run side by side on the same backends, each with unkeyed traffic and keyed traffic
//! (an assignment of 24 slices, each with one replica in every zone):
//!
//! * **zone-unaware**: plain Rocksteadier over the whole job, `k = 4`;
//! * **one channel per zone**: each frontend sees only its zone's 4 backends (renumbered
//!   by zone index, its zone index as frontend index), `k = 4`: all of them, no spill;
//! * **zone-aware**: `BalanceConfig::new(zone index, 4).with_zones(..)` over the whole job,
//!   whose tasks carry their zone.
//!
//! Through five phases: steady state; zone a's backends all killed (the views still say
//! they serve); back; zone b's frontends doubled (3 -> 6, the others told with
//! `set_frontend_zones`); zone c's backends halved (4 -> 2). Prints a table per phase
//! (cross-zone share against the lowest possible, busiest backend / mean, failed
//! requests, connections per frontend and opened by the change) and writes a figure per
//! phase; with `--json`, every row.
//!
//! `--placement` runs keyed placement phases instead ([`placement`]): assignments made by
//! the Assigner under three placements, through zone a's outage.

use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Args;
use serde::{Deserialize, Serialize};
use steady_balance::MemberState;
use steady_tonic::SteadyChannel;

use crate::LabResult;

mod fleet;
mod load;
pub(crate) mod lowest;
mod placement;
mod report;

use fleet::{backend_of, zone_of_backend, Backends, Strategy, Traffic, FRONTENDS};
use load::{Load, Recorder};

/// Arguments of `steady-lab zones`.
#[derive(Debug, Args)]
pub struct ZonesArgs {
    /// A test-sized run: 4 s phases, 10 requests per second per frontend (with
    /// --placement, 20 slices per task).
    #[arg(long)]
    quick: bool,
    /// Seconds each phase lasts (the first one is left out of the cross-zone share and
    /// the balance, while the change takes effect).
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Requests per second each frontend sends (open loop).
    #[arg(long, default_value_t = 50.0)]
    rate: f64,
    /// Each request's service time on its backend, in microseconds.
    #[arg(long, default_value_t = 2_000)]
    work_us: u64,
    /// Turns the balancer's probation off (`SlowStart::with_probation(false)`) in every
    /// strategy: a member reconnected after its connection broke takes its slow start's
    /// share at once instead of one request first.
    #[arg(long)]
    no_probation: bool,
    /// Where to write the figures, created if needed [default: zones-figures/ in the
    /// lab's output folder, `target/steady-lab/` or $STEADY_LAB_OUT; `docs/figures` to
    /// regenerate the docs' figures].
    #[arg(long)]
    figures: Option<PathBuf>,
    /// Also write every row as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Keyed placement phases instead: zone-aware keyed frontends following the
    /// Assigner's weighted-move under three placements (2 replicas with no constraint, 2
    /// spread over zones, a replica per zone) through zone a's outage: steady, zone a
    /// killed (its tasks gone 1 s later), back.
    #[arg(long)]
    placement: bool,
    /// With --placement: the keyed frontends of each source in zones a, b and c, as
    /// A/B/C, each 1 to 12 [default: 6/3/3].
    #[arg(long, value_name = "A/B/C")]
    frontends: Option<String>,
    /// With --placement: milliseconds from zone a's death until its tasks leave the
    /// registry and the Assigners (the lease expiry) [default: 1000; at most the phase].
    #[arg(long, value_name = "MS")]
    detection_ms: Option<u64>,
}

/// The settings of a run.
#[derive(Debug, Clone, Copy)]
struct Settings {
    phase: Duration,
    warmup: Duration,
    rate: f64,
    work: Duration,
    probation: bool,
}

impl ZonesArgs {
    fn settings(&self) -> Result<Settings, String> {
        let mut s = Settings {
            phase: Duration::from_secs(self.seconds),
            warmup: Duration::from_secs(2),
            rate: self.rate,
            work: Duration::from_micros(self.work_us),
            probation: !self.no_probation,
        };
        if self.quick {
            s = Settings { phase: Duration::from_secs(4), warmup: Duration::from_secs(1), rate: 10.0, ..s };
        }
        if !(2..=600).contains(&s.phase.as_secs()) {
            return Err("--seconds must be between 2 and 600".to_owned());
        }
        if !(s.rate.is_finite() && s.rate >= 1.0 && s.rate <= 5_000.0) {
            return Err("--rate must be between 1 and 5,000".to_owned());
        }
        if s.work > Duration::from_secs(1) {
            return Err("--work-us must be at most 1,000,000".to_owned());
        }
        Ok(s)
    }

    /// The placement experiment's setup, with the run's settings `s`.
    fn setup(&self, s: &Settings) -> Result<placement::Setup, String> {
        if !self.placement && self.frontends.is_some() {
            return Err("--frontends needs --placement".to_owned());
        }
        if !self.placement && self.detection_ms.is_some() {
            return Err("--detection-ms needs --placement".to_owned());
        }
        let frontends = match &self.frontends {
            None => FRONTENDS,
            Some(given) => {
                let counts: Vec<usize> = given.split('/').filter_map(|n| n.trim().parse().ok()).collect();
                match <[usize; 3]>::try_from(counts) {
                    Ok(f) if f.iter().all(|n| (1..=12).contains(n)) => f,
                    _ => return Err("--frontends must be three counts A/B/C, each 1 to 12".to_owned()),
                }
            }
        };
        let detection = self.detection_ms.map_or(placement::DETECTION, Duration::from_millis);
        if detection >= s.phase {
            return Err("--detection-ms must be shorter than a phase".to_owned());
        }
        // A quick run's Assigners start from 20 slices per task (a debug build runs
        // weighted-move over 1,200 slices in tens of milliseconds, on the runtime that
        // sends the requests); a full run's from weighted-move's 100.
        let slices_per_task = if self.quick { 20 } else { steady_assigner::initial::SLICES_PER_TASK };
        Ok(placement::Setup { frontends, slices_per_task, detection })
    }
}

/// The experiment's phases, in order; each keeps the changes before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Phase {
    /// Backends 4/4/4, frontends 6/3/3.
    Steady,
    /// Zone a's servers stopped; the views still say they serve.
    ZoneDown,
    /// Zone a's servers started again on their ports.
    ZoneBack,
    /// Zone b's frontends 3 -> 6.
    FrontendsDoubled,
    /// Zone c's backends 4 -> 2 (its zone indices 2 and 3 leave the views).
    BackendsHalved,
}

impl Phase {
    pub(crate) const ALL: [Phase; 5] =
        [Phase::Steady, Phase::ZoneDown, Phase::ZoneBack, Phase::FrontendsDoubled, Phase::BackendsHalved];

    pub(crate) fn describe(self) -> &'static str {
        match self {
            Phase::Steady => "steady state: backends 4/4/4, frontends 6/3/3",
            Phase::ZoneDown => "zone a's 4 backends killed (not drained: the views still say they serve)",
            Phase::ZoneBack => "zone a's backends back (restarted on their ports, same views)",
            Phase::FrontendsDoubled => "zone b's frontends doubled, 3 -> 6 (frontends 6/6/3)",
            Phase::BackendsHalved => "zone c's backends halved, 4 -> 2 (backends 4/4/2, frontends 6/6/3)",
        }
    }

    /// The file of its figure.
    pub(crate) fn figure(self) -> String {
        let n = Phase::ALL.iter().position(|&p| p == self).unwrap_or(0) + 1;
        let name =
            serde_json::to_value(self).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default();
        format!("zones-{n}-{name}.svg")
    }
}

/// One strategy's result for one kind of traffic in one phase.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Outcome {
    pub(crate) phase: Phase,
    pub(crate) strategy: Strategy,
    pub(crate) traffic: Traffic,
    /// Answers after the phase's first second.
    pub(crate) requests: u64,
    /// Their share served by a backend in another zone than the frontend's.
    pub(crate) cross_zone: f64,
    /// The same over the phase's second half (once slow start and backoffs are over).
    pub(crate) cross_zone_second_half: f64,
    /// The same in each second of the phase, the first included (NaN: no answer).
    pub(crate) cross_zone_per_second: Vec<f64>,
    /// The lowest cross-zone share the phase's demand and capacity allow with every
    /// serving backend (keyed: every serving replica of a slice) taking an even share.
    pub(crate) lowest: Option<f64>,
    /// Requests of the busiest serving backend over the mean of the serving backends.
    pub(crate) busiest_over_mean: f64,
    /// Failed requests in the phase, and after its first second.
    pub(crate) failed: u64,
    pub(crate) failed_after_first_second: u64,
    /// Connections open per frontend at the phase's end (mean), and of them to another
    /// zone.
    pub(crate) connections: f64,
    pub(crate) cross_zone_connections: f64,
    /// The most connections to another zone one frontend had open at the phase's end.
    pub(crate) most_cross_zone_connections: usize,
    /// Members on probation at the phase's end (all frontends): reconnected after a
    /// broken connection, held back until a probe succeeds.
    pub(crate) on_probation: usize,
    /// Connections opened in the phase by the frontends that were there before it, and
    /// by the frontends it started.
    pub(crate) opened: u64,
    pub(crate) opened_by_new: u64,
    /// Answers after the first second, by backend.
    pub(crate) per_backend: Vec<u64>,
    /// Whether each backend served (in the views, its server up) in the phase.
    pub(crate) serving: Vec<bool>,
}

/// One frontend.
struct Frontend {
    zone: usize,
    channel: SteadyChannel,
}

/// The frontends of one strategy and one kind of traffic.
struct Group {
    strategy: Strategy,
    traffic: Traffic,
    frontends: Vec<Frontend>,
    recorder: Arc<Mutex<Recorder>>,
}

impl Group {
    /// Connections open by one frontend, and of them to another zone (its members and
    /// affinity connections, by job-wide task).
    fn connections(&self, f: &Frontend) -> (u64, usize) {
        let stats = f.channel.stats();
        let global = |t: usize| if self.strategy == Strategy::PerZone { backend_of(f.zone, t) } else { t };
        let mut tasks: Vec<usize> = stats
            .members
            .iter()
            .map(|m| global(m.task))
            .chain(stats.affinity.iter().map(|&t| global(t)))
            .collect();
        tasks.sort_unstable();
        tasks.dedup();
        (stats.connections_open, tasks.iter().filter(|&&t| zone_of_backend(t) != f.zone).count())
    }
}

/// Runs the experiment.
pub fn run(out: &mut impl Write, args: &ZonesArgs) -> LabResult {
    let settings = args.settings()?;
    let setup = args.setup(&settings)?;
    if args.placement {
        let dir = crate::output::or_default(&args.figures, "zones-figures")?;
        return placement::run(out, &settings, setup, &dir, args.json.as_deref());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let outcomes = runtime.block_on(experiment(&settings))?;
    report::print(out, &settings, &outcomes)?;
    let dir = crate::output::or_default(&args.figures, "zones-figures")?;
    for file in report::draw(&dir, &outcomes)? {
        writeln!(out, "# wrote {}", file.display())?;
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&outcomes)?)?;
        writeln!(out, "# wrote {}", path.display())?;
    }
    Ok(())
}

/// The experiment while it runs: the backends, the frontends of every group and their load.
struct Fleet {
    backends: Backends,
    groups: Vec<Group>,
    load: Load,
    rate: f64,
    /// Frontends each zone has now.
    frontends: [usize; 3],
    /// Frontends started so far (the next one's global index).
    started: usize,
}

impl Fleet {
    /// Grows `zone` to `size` frontends in every group, each sending load. The frontends
    /// already there are told the new sizes first (zone-aware), as a registry's watchers
    /// would be.
    fn grow(&mut self, zone: usize, size: usize) -> Result<(), Box<dyn std::error::Error>> {
        let old = self.frontends[zone];
        self.frontends[zone] = size;
        for g in self.groups.iter().filter(|g| g.strategy == Strategy::ZoneAware) {
            for f in &g.frontends {
                f.channel.set_frontend_zones(fleet::frontend_zones(self.frontends));
            }
        }
        for (g, group) in self.groups.iter_mut().enumerate() {
            for (n, index) in (old..size).enumerate() {
                let channel = self.backends.frontend(
                    group.strategy,
                    group.traffic,
                    zone,
                    index,
                    self.started + n,
                    self.frontends,
                )?;
                let seed = 0x2035_u64 ^ ((g as u64) << 32) ^ ((zone as u64) << 16) ^ index as u64;
                self.load.start(
                    channel.clone(),
                    zone,
                    group.traffic,
                    self.rate,
                    group.recorder.clone(),
                    seed,
                );
                group.frontends.push(Frontend { zone, channel });
            }
        }
        self.started += size.saturating_sub(old);
        Ok(())
    }
}

async fn experiment(s: &Settings) -> Result<Vec<Outcome>, Box<dyn std::error::Error>> {
    let backends = Backends::start(s.work, s.probation).await?;
    let groups: Vec<Group> = Strategy::ALL
        .iter()
        .flat_map(|&strategy| Traffic::ALL.map(|traffic| (strategy, traffic)))
        .map(|(strategy, traffic)| Group {
            strategy,
            traffic,
            frontends: Vec::new(),
            recorder: Arc::new(Mutex::new(Recorder::new(backends.count()))),
        })
        .collect();
    let mut fleet =
        Fleet { backends, groups, load: Load::new(), rate: s.rate, frontends: [0; 3], started: 0 };
    for (zone, &n) in FRONTENDS.iter().enumerate() {
        fleet.grow(zone, n)?;
    }
    tokio::time::sleep(s.warmup).await;

    let mut outcomes = Vec::new();
    for phase in Phase::ALL {
        eprintln!("# zones: {}", phase.describe());
        let opened_before: Vec<Vec<u64>> = fleet
            .groups
            .iter()
            .map(|g| g.frontends.iter().map(|f| f.channel.stats().connections_opened).collect())
            .collect();
        let started = tokio::time::Instant::now();
        for g in &fleet.groups {
            g.recorder.lock().expect("not poisoned").begin_phase();
        }
        match phase {
            Phase::Steady => {}
            Phase::ZoneDown => fleet.backends.kill(0).await,
            Phase::ZoneBack => fleet.backends.restart(0).await,
            Phase::FrontendsDoubled => fleet.grow(1, FRONTENDS[1] * 2)?,
            Phase::BackendsHalved => fleet.backends.resize(2, 2)?,
        }
        eprintln!("#   change made in {} ms", started.elapsed().as_millis());
        tokio::time::sleep_until(started + s.phase).await;
        let count = fleet.backends.count();
        let serving: Vec<bool> = (0..count).map(|b| fleet.backends.serving(b)).collect();
        let zones: Vec<(usize, usize)> = (0..3)
            .map(|z| {
                (fleet.frontends[z], (0..count).filter(|&b| zone_of_backend(b) == z && serving[b]).count())
            })
            .collect();
        let lowest = lowest::lowest_cross_zone(&zones);
        // Keyed requests can only go to their slice's replicas: a zone's capacity for a
        // slice is its serving replicas of it (every slice weighs the same).
        let slices = fleet.backends.serving_replicas_by_zone();
        let keyed_lowest = slices
            .iter()
            .map(|replicas| {
                let zones: Vec<(usize, usize)> = (0..3).map(|z| (fleet.frontends[z], replicas[z])).collect();
                lowest::lowest_cross_zone(&zones)
            })
            .sum::<Option<f64>>()
            .map(|sum| sum / slices.len().max(1) as f64);
        for (g, before) in fleet.groups.iter().zip(&opened_before) {
            let lowest = if g.traffic == Traffic::Keyed { keyed_lowest } else { lowest };
            let mut counts =
                g.recorder.lock().expect("not poisoned").phases().last().cloned().unwrap_or_default();
            // Answers in the moment since the phase ended are not a second of it.
            counts.per_second.truncate(s.phase.as_secs() as usize);
            outcomes.push(outcome(phase, g, &counts, before, &serving, lowest));
        }
    }
    fleet.load.stop().await;
    Ok(outcomes)
}

/// The row of `group` in `phase`.
fn outcome(
    phase: Phase,
    group: &Group,
    counts: &load::PhaseCounts,
    opened_before: &[u64],
    serving: &[bool],
    lowest: Option<f64>,
) -> Outcome {
    let backends = serving.len();
    let per_backend: Vec<u64> = (0..backends).map(|b| counts.served.iter().map(|z| z[b]).sum()).collect();
    let requests: u64 = per_backend.iter().sum();
    let crossed: u64 = counts
        .served
        .iter()
        .enumerate()
        .flat_map(|(zone, row)| row.iter().enumerate().filter(move |(b, _)| zone_of_backend(*b) != zone))
        .map(|(_, &n)| n)
        .sum();
    let live: Vec<u64> = per_backend.iter().zip(serving).filter(|(_, &s)| s).map(|(&n, _)| n).collect();
    let mean = live.iter().sum::<u64>() as f64 / live.len().max(1) as f64;
    let busiest = live.iter().copied().max().unwrap_or(0) as f64;
    let share = |s: &[[u64; 2]]| {
        let (crossed, answered) = s.iter().fold((0, 0), |(c, a), x| (c + x[0], a + x[1]));
        if answered == 0 {
            f64::NAN
        } else {
            crossed as f64 / answered as f64
        }
    };
    let half = counts.per_second.len() / 2;
    let on_probation = group
        .frontends
        .iter()
        .flat_map(|f| f.channel.stats().members)
        .filter(|m| matches!(m.state, MemberState::Probation { .. }))
        .count();
    let connections: Vec<(u64, usize)> = group.frontends.iter().map(|f| group.connections(f)).collect();
    let n = connections.len().max(1) as f64;
    let opened_now: Vec<u64> = group.frontends.iter().map(|f| f.channel.stats().connections_opened).collect();
    let opened: u64 = opened_now.iter().zip(opened_before).map(|(now, before)| now - before).sum();
    let opened_by_new: u64 = opened_now.iter().skip(opened_before.len()).sum();
    Outcome {
        phase,
        strategy: group.strategy,
        traffic: group.traffic,
        requests,
        cross_zone: if requests == 0 { f64::NAN } else { crossed as f64 / requests as f64 },
        cross_zone_second_half: share(&counts.per_second[half..]),
        cross_zone_per_second: counts.per_second.iter().map(|s| share(std::slice::from_ref(s))).collect(),
        lowest,
        busiest_over_mean: if mean > 0.0 { busiest / mean } else { f64::NAN },
        failed: counts.failed,
        failed_after_first_second: counts.failed_late,
        connections: connections.iter().map(|c| c.0 as f64).sum::<f64>() / n,
        cross_zone_connections: connections.iter().map(|c| c.1 as f64).sum::<f64>() / n,
        most_cross_zone_connections: connections.iter().map(|c| c.1).max().unwrap_or(0),
        on_probation,
        opened,
        opened_by_new,
        per_backend,
        serving: serving.to_vec(),
    }
}
