//! `steady-lab zones --placement`: what a placement buys through a whole zone's outage,
//! on the same twelve real servers.
//!
//! Three assignment sources run side by side, each the Assigner's weighted-move run in
//! process under its own placement ([`Source`]): two replicas per slice with no
//! constraint (the baseline), two replicas spread over zones, and a replica in every
//! zone. Each has its own zone-aware keyed frontends, 6/3/3 by default, following its
//! assignments on a watch channel as they would follow the Assigner's Watch stream; a
//! keyed request whose slice has no ready replica fails (`NoReplicaPolicy::Fail`).
//!
//! Three phases: steady state; zone a's servers killed, and a detection delay later
//! ([`Setup::detection`], 1 s by default, standing for the registry's lease expiry) zone
//! a's tasks leave the views and are marked gone in every Assigner's task set, which runs
//! and publishes; zone a back (its servers restarted
//! on their ports, in the views and serving again at once, as tasks that register on
//! start, and a run). Besides, every Assigner runs on a [`CADENCE`] after its last run.
//!
//! Measured per source and phase: the slices of the assignment in force with no live
//! replica (right after the change, and at the phase's end: after the Assigner's runs),
//! failed keyed requests (all, and after the phase's first second), the cross-zone share
//! of keyed requests (after the first second, over the second half, by frontend zone)
//! against the lowest the assignment allows, and every run's report.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use steady_assigner::Load as KeyLoad;
use tokio::time::Instant;

use super::fleet::{zone_of_backend, Backends, Traffic, BACKENDS_PER_ZONE};
use super::load::{Load, PhaseCounts, Recorder};
use super::{Phase, Settings};
use crate::LabResult;

mod report;
mod source;

pub(crate) use source::Source;
use source::{keyed_lowest, without_live_replica, Lost, Run, SourceAssigner, Trigger};

/// The default detection delay ([`Setup::detection`]).
pub(crate) const DETECTION: Duration = Duration::from_secs(1);
/// Time between two runs of an Assigner when nothing changes (the Assigner service's
/// shortest interval between publications; its default cadence is 10 s): zone a's tasks
/// get their load back within the churn budget of each run.
pub(crate) const CADENCE: Duration = Duration::from_secs(1);

/// The phases of the placement experiment, in order.
pub(crate) const PHASES: [Phase; 3] = [Phase::Steady, Phase::ZoneDown, Phase::ZoneBack];

/// The placement experiment's phase descriptions.
pub(crate) fn describe(phase: Phase) -> &'static str {
    match phase {
        Phase::Steady => "steady state: backends 4/4/4",
        Phase::ZoneDown => {
            "zone a's 4 backends killed; detected later (they leave the views and the Assigners' task sets, which run)"
        }
        Phase::ZoneBack => "zone a's backends back (restarted, in the views and serving again), the Assigners run",
        _ => "",
    }
}

/// One source's result in one phase.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Row {
    pub(crate) phase: Phase,
    pub(crate) source: Source,
    /// The frontends in each zone.
    pub(crate) frontends: [usize; 3],
    /// Keyed requests answered after the phase's first second.
    pub(crate) requests: u64,
    /// Failed keyed requests in the phase, and after its first second.
    pub(crate) failed: u64,
    pub(crate) failed_after_first_second: u64,
    /// The share of the answers after the first second served in another zone than the
    /// frontend's, over the phase's second half, and by the frontend's zone (NaN: no
    /// answer).
    pub(crate) cross_zone: f64,
    pub(crate) cross_zone_second_half: f64,
    pub(crate) cross_zone_by_zone: [f64; 3],
    /// The cross-zone share in each second of the phase, the first included.
    pub(crate) cross_zone_per_second: Vec<f64>,
    /// Answers in each second of the phase.
    pub(crate) answered_per_second: Vec<u64>,
    /// Failed requests in each second of the phase.
    pub(crate) failed_per_second: Vec<u64>,
    /// The lowest cross-zone share the assignment in force at the phase's end allows
    /// (each slice's requests spread evenly over its live replicas).
    pub(crate) lowest: Option<f64>,
    /// Answers of the busiest live backend over the mean of the live ones.
    pub(crate) busiest_over_mean: f64,
    /// Slices of the assignment in force at the phase's end.
    pub(crate) slices: usize,
    /// Slices of the assignment in force with no live replica right after the phase's
    /// change, and at its end (after the Assigner's runs).
    pub(crate) without_live_replica_at_change: Lost,
    pub(crate) without_live_replica_at_end: Lost,
    /// The Assigner's runs in the phase (the steady phase's first: the initial run).
    pub(crate) runs: Vec<Run>,
}

/// One source's frontends and what they recorded.
struct Group {
    assigner: SourceAssigner,
    recorder: Arc<Mutex<Recorder>>,
    /// Each phase's runs, and the phase's lost slices at its change.
    runs: Vec<Run>,
    at_change: Lost,
}

/// What the placement experiment runs with besides the zones experiment's settings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Setup {
    /// Keyed frontends of each source in each zone.
    pub(crate) frontends: [usize; 3],
    /// Slices per task of the initial assignments.
    pub(crate) slices_per_task: usize,
    /// How long after zone a's servers die its tasks leave the registry (their leases
    /// expire) and the Assigners hear of it: the window in which only the assignment in
    /// force can save a slice. The registry's default lease is 10 s (etcd raises any
    /// below about 2 s), so a real outage lasts longer than the default 1 s here; the
    /// spread placements lose nothing either way, the baseline's failures grow with it.
    pub(crate) detection: Duration,
}

/// Runs the placement experiment.
pub(crate) fn run(
    out: &mut impl Write,
    s: &Settings,
    setup: Setup,
    figures: &std::path::Path,
    json: Option<&std::path::Path>,
) -> LabResult {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let rows = runtime.block_on(experiment(s, setup))?;
    report::print(out, s, setup, &rows)?;
    let file = report::draw(figures, &rows, setup.detection)?;
    writeln!(out, "# wrote {}", file.display())?;
    if let Some(path) = json {
        std::fs::write(path, serde_json::to_string_pretty(&rows)?)?;
        writeln!(out, "# wrote {}", path.display())?;
    }
    Ok(())
}

async fn experiment(s: &Settings, setup: Setup) -> Result<Vec<Row>, Box<dyn std::error::Error>> {
    let frontends = setup.frontends;
    let mut backends = Backends::start(s.work, s.probation).await?;
    // Every frontend sends uniformly random keys at the same rate: the Assigners' load.
    let total: f64 = frontends.iter().sum::<usize>() as f64 * s.rate;
    let key_load = KeyLoad::none().with_uniform(total)?;
    let mut load = Load::new();
    let mut groups = Vec::new();
    for (g, source) in Source::ALL.into_iter().enumerate() {
        let (assigner, initial) = SourceAssigner::start(source, key_load.clone(), setup.slices_per_task)?;
        let recorder = Arc::new(Mutex::new(Recorder::new(backends.count())));
        for (zone, &n) in frontends.iter().enumerate() {
            for index in 0..n {
                let channel = backends.keyed_frontend(zone, index, frontends, assigner.subscribe())?;
                let seed = 0x2036_u64 ^ ((g as u64) << 32) ^ ((zone as u64) << 16) ^ index as u64;
                load.start(channel, zone, Traffic::Keyed, s.rate, recorder.clone(), seed);
            }
        }
        groups.push(Group { assigner, recorder, runs: vec![initial], at_change: Lost::default() });
    }
    tokio::time::sleep(s.warmup).await;

    let mut rows = Vec::new();
    for phase in PHASES {
        eprintln!("# zones --placement: {}", describe(phase));
        let started = Instant::now();
        for g in &groups {
            g.recorder.lock().expect("not poisoned").begin_phase();
        }
        let at_ms = || started.elapsed().as_millis() as u64;
        match phase {
            Phase::ZoneDown => backends.kill(0).await,
            Phase::ZoneBack => {
                backends.restart(0).await;
                backends.show(0, BACKENDS_PER_ZONE);
            }
            _ => {}
        }
        eprintln!("#   change made in {} ms", started.elapsed().as_millis());
        for g in &mut groups {
            g.at_change = without_live_replica(g.assigner.current(), |t| backends.live(t));
        }
        if phase == Phase::ZoneBack {
            run_all(&mut groups, &backends, Trigger::Tasks, at_ms(), |a| a.set_zone_serving(0, true))?;
        }
        let mut next_run = started + CADENCE;
        let mut detection = (phase == Phase::ZoneDown).then_some(started + setup.detection);
        let end = started + s.phase;
        loop {
            let next = detection.map_or(next_run, |d| d.min(next_run));
            if next >= end {
                break;
            }
            tokio::time::sleep_until(next).await;
            if detection == Some(next) {
                // The leases of zone a's tasks expired: the views drop them, the
                // Assigners hear they are gone.
                detection = None;
                backends.show(0, 0);
                run_all(&mut groups, &backends, Trigger::Tasks, at_ms(), |a| a.set_zone_serving(0, false))?;
                next_run = next + CADENCE;
            } else {
                run_all(&mut groups, &backends, Trigger::Cadence, at_ms(), |_| {})?;
                next_run += CADENCE;
            }
        }
        tokio::time::sleep_until(end).await;
        for g in &mut groups {
            let counts =
                g.recorder.lock().expect("not poisoned").phases().last().cloned().unwrap_or_default();
            rows.push(row(phase, g, &counts, frontends, &backends, s));
        }
    }
    load.stop().await;
    Ok(rows)
}

/// Tells every Assigner of a change (`change`), then runs each; the runs' reports go to
/// their groups.
fn run_all(
    groups: &mut [Group],
    backends: &Backends,
    trigger: Trigger,
    at_ms: u64,
    change: impl Fn(&mut SourceAssigner),
) -> Result<(), Box<dyn std::error::Error>> {
    // A run takes milliseconds (tens in a debug build): not worth a thread of its own,
    // but the runtime's other worker goes on sending requests meanwhile.
    tokio::task::block_in_place(|| {
        for g in groups.iter_mut() {
            change(&mut g.assigner);
            let run = g.assigner.run(trigger, at_ms, |t| backends.live(t))?;
            g.runs.push(run);
        }
        Ok(())
    })
}

/// The row of group `g` in `phase`; takes its runs.
fn row(
    phase: Phase,
    g: &mut Group,
    counts: &PhaseCounts,
    frontends: [usize; 3],
    backends: &Backends,
    s: &Settings,
) -> Row {
    let live = |t: usize| backends.live(t);
    let share =
        |crossed: u64, answered: u64| if answered == 0 { f64::NAN } else { crossed as f64 / answered as f64 };
    let by_zone: Vec<(u64, u64)> = counts
        .served
        .iter()
        .enumerate()
        .map(|(zone, row)| {
            let crossed =
                row.iter().enumerate().filter(|(b, _)| zone_of_backend(*b) != zone).map(|(_, n)| n).sum();
            (crossed, row.iter().sum())
        })
        .collect();
    let (crossed, requests) = by_zone.iter().fold((0, 0), |(c, a), z| (c + z.0, a + z.1));
    let seconds = s.phase.as_secs() as usize;
    // Answers in the moment since the phase ended are not a second of it.
    let per_second = &counts.per_second[..counts.per_second.len().min(seconds)];
    let half = per_second.len() / 2;
    let (c2, a2) = per_second[half..].iter().fold((0, 0), |(c, a), x| (c + x[0], a + x[1]));
    let per_backend: Vec<u64> =
        (0..backends.count()).map(|b| counts.served.iter().map(|z| z[b]).sum()).collect();
    let served: Vec<u64> = (0..backends.count()).filter(|&b| live(b)).map(|b| per_backend[b]).collect();
    let mean = served.iter().sum::<u64>() as f64 / served.len().max(1) as f64;
    let busiest = served.iter().copied().max().unwrap_or(0) as f64;
    let mut failed_per_second = counts.failed_per_second.clone();
    failed_per_second.resize(seconds, 0);
    let assignment = g.assigner.current();
    Row {
        phase,
        source: g.assigner.source(),
        frontends,
        requests,
        failed: counts.failed,
        failed_after_first_second: counts.failed_late,
        cross_zone: share(crossed, requests),
        cross_zone_second_half: share(c2, a2),
        cross_zone_by_zone: [0, 1, 2].map(|z| share(by_zone[z].0, by_zone[z].1)),
        cross_zone_per_second: per_second.iter().map(|x| share(x[0], x[1])).collect(),
        answered_per_second: per_second.iter().map(|x| x[1]).collect(),
        failed_per_second,
        lowest: keyed_lowest(assignment, frontends, live),
        busiest_over_mean: if mean > 0.0 { busiest / mean } else { f64::NAN },
        slices: assignment.slices().len(),
        without_live_replica_at_change: g.at_change,
        without_live_replica_at_end: without_live_replica(assignment, live),
        runs: std::mem::take(&mut g.runs),
    }
}
