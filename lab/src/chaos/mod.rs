//! `steady-lab chaos`: a soak of the whole system on real processes while a schedule of
//! faults runs, with invariants checked throughout and a verdict at the end
//! (`docs/failures.md`, "The chaos soak").
//!
//! The fleet: a three-member etcd cluster; two `steady-slicer` instances (the real
//! binary, `--store etcd`, following the backend job in the etcd registry; one leads,
//! the other stands by, both serve the Watch and accept load reports); backend tasks,
//! each a process of its own (`steady-lab chaos-backend`: an echo server behind its
//! Slicelet, registered at a fixed index, following and reporting to both instances);
//! and frontends in the lab's process, `SteadyChannel`s following the registry and both
//! instances' assignments, sending keyed and unkeyed requests at a fixed rate, each with
//! a deadline.
//!
//! With `--tls` the instances and backends serve mutual TLS only ([`pki`]), and the
//! frontends, backends and monitors present client certificates.
//!
//! The schedule ([`schedule`]) kills, drains and stalls backends, kills the leading
//! instance and etcd members, rotates every certificate to a new CA (on TLS), over and
//! over; the monitors ([`monitor`], [`prober`]) watch coverage,
//! the frontends' generations, the control tasks' liveness and every process's memory;
//! the invariants ([`invariants`]) and their bounds turn what they saw into a verdict.
//! A violated invariant is a non-zero exit.

use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;

use crate::LabResult;

pub(crate) mod backend;
mod invariants;
mod load;
mod memory;
mod monitor;
mod pki;
mod prober;
mod processes;
mod report;
mod roster;
mod schedule;

use invariants::Observations;
use schedule::Fault;

/// The soak's job.
const JOB: &str = "chaos";
/// How long the fleet may take to come up (etcd, the instances, a first assignment
/// everywhere).
const START_WITHIN: Duration = Duration::from_secs(60);

/// Arguments of `steady-lab chaos`.
#[derive(Debug, Args)]
pub struct ChaosArgs {
    /// How long the schedule runs, minutes.
    #[arg(long, conflicts_with = "seconds")]
    minutes: Option<u64>,
    /// How long the schedule runs, seconds (default: 5 minutes).
    #[arg(long)]
    seconds: Option<u64>,
    /// Run the faults this many times over and stop, however long that takes (instead of
    /// a duration).
    #[arg(long, conflicts_with_all = ["minutes", "seconds"])]
    rounds: Option<u32>,
    /// Backend tasks (processes), at least 3.
    #[arg(long, default_value_t = 4)]
    backends: u32,
    /// Frontends (channels in the lab's process).
    #[arg(long, default_value_t = 3)]
    frontends: usize,
    /// Keyed requests a second per frontend.
    #[arg(long, default_value_t = 40)]
    keyed_rate: u32,
    /// Unkeyed requests a second per frontend.
    #[arg(long, default_value_t = 20)]
    unkeyed_rate: u32,
    /// Distinct keys (Zipf popularity, the ranking moving every 10 s).
    #[arg(long, default_value_t = 1000)]
    keys: usize,
    /// Each request's deadline, milliseconds.
    #[arg(long, default_value_t = 1000)]
    deadline_ms: u64,
    /// Load without faults before the schedule starts, seconds.
    #[arg(long, default_value_t = 5)]
    warm_up: u64,
    /// Run the instances and backends on mutual TLS only, with certificates of a CA made
    /// for the run (etcd stays plaintext). Needed by cert-rotate.
    #[arg(long)]
    tls: bool,
    /// The faults, run in this order over and over (cert-rotate, with --tls only, is not
    /// in the default list).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "backend-kill,backend-drain,backend-stall,slicer-kill,etcd-kill"
    )]
    faults: Vec<Fault>,
    /// The steady-slicer binary (default: `STEADY_SLICER_BIN`, else the one built next
    /// to this executable).
    #[arg(long)]
    slicer_bin: Option<PathBuf>,
    /// Where the processes' logs go (default: a fresh temporary directory, removed after a
    /// run whose invariants held).
    #[arg(long)]
    dir: Option<PathBuf>,
}

/// Runs the soak.
pub fn run(out: &mut impl Write, args: &ChaosArgs) -> LabResult {
    let seconds = args.minutes.map_or(args.seconds.unwrap_or(300), |m| m.saturating_mul(60));
    if seconds == 0
        || args.rounds == Some(0)
        || args.backends < 3
        || args.frontends == 0
        || args.deadline_ms == 0
    {
        return Err(
            "--seconds (or --minutes, --rounds) and --frontends at least 1, --backends at least 3".into()
        );
    }
    if args.keyed_rate == 0 && args.unkeyed_rate == 0 {
        return Err("--keyed-rate or --unkeyed-rate must be above 0".into());
    }
    if args.faults.contains(&Fault::CertRotate) && !args.tls {
        return Err(
            "--faults cert-rotate needs --tls (a plaintext fleet has no certificate to rotate)".into()
        );
    }
    let slicer_bin = processes::slicer_binary(args.slicer_bin.as_deref())?;
    let dir = match &args.dir {
        Some(dir) => dir.clone(),
        None => std::env::temp_dir().join(format!("steady-chaos-{}", std::process::id())),
    };
    std::fs::create_dir_all(&dir)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let mut fleet = processes::Fleet::start(JOB, args.backends, &dir, slicer_bin, args.tls)?;
    let etcd = fleet.etcd.endpoints();
    let slicers = fleet.slicer_endpoints();
    writeln!(
        out,
        "# steady-lab chaos: {} of faults ({}); etcd x{}, steady-slicer x{}, {} backends, {} frontends x ({} keyed + {} unkeyed) req/s, deadline {} ms{}; logs in {}",
        match args.rounds {
            Some(rounds) => format!("{rounds} round(s)"),
            None => format!("{seconds} s"),
        },
        args.faults.iter().map(|f| f.name()).collect::<Vec<_>>().join(", "),
        etcd.len(),
        slicers.len(),
        args.backends,
        args.frontends,
        args.keyed_rate,
        args.unkeyed_rate,
        args.deadline_ms,
        if args.tls { ", mutual TLS" } else { "" },
        dir.display()
    )?;
    out.flush()?;

    // Up: every backend registered, a first assignment stored and held everywhere.
    let (published, follower) = runtime.block_on(monitor::follow_store(&etcd, JOB))?;
    let newest =
        || published.lock().unwrap_or_else(|p| p.into_inner()).newest.as_ref().map(|a| a.generation());
    let ready = |fleet: &processes::Fleet| {
        let members = fleet.roster.lock();
        newest().is_some_and(|g| {
            members.backends.iter().all(|m| m.beat.is_some_and(|b| b.generation >= g))
                && members.slicers.iter().all(|m| m.life == roster::Life::Up)
        })
    };
    if !runtime.block_on(steady_testing::holds_within(START_WITHIN, || ready(&fleet))) {
        return Err(format!("the fleet did not come up: see {}", dir.display()).into());
    }
    let frontends = runtime.block_on(load::Frontends::start(
        &etcd,
        JOB,
        &slicers,
        args.frontends,
        args.backends as usize,
        Duration::from_millis(args.deadline_ms),
        fleet.client.clone(),
    ))?;
    let first = newest().unwrap_or(0);
    if !runtime.block_on(steady_testing::holds_within(START_WITHIN, || {
        frontends.generations().iter().all(|g| *g >= first)
    })) {
        return Err("the frontends did not follow the first assignment".into());
    }

    let deadline = Duration::from_millis(args.deadline_ms);
    let traffic = {
        let _entered = runtime.enter();
        load::start(&frontends, args.keyed_rate, args.unkeyed_rate, args.keys, deadline)
    };
    let began = Instant::now();
    writeln!(
        out,
        "# load from {:.1} s on the logs' clock; times below count from there",
        processes::since_start().as_secs_f64()
    )?;
    let observations = Arc::new(Mutex::new(Observations::default()));
    let channels = frontends.channels.clone();
    let generations: monitor::Generations =
        Box::new(move || channels.iter().map(|c| c.balance().assignment_generation().unwrap_or(0)).collect());
    let metrics = fleet.slicers.iter().map(|s| s.metrics).collect();
    let (served, watchers) = {
        let _entered = runtime.enter();
        monitor::watch_distributors(&slicers, JOB, fleet.client.as_ref())?
    };
    let monitors = monitor::Monitors::start(
        fleet.roster.clone(),
        published.clone(),
        generations,
        served,
        metrics,
        observations.clone(),
        began,
    );
    std::thread::sleep(Duration::from_secs(args.warm_up));
    // With --rounds the rounds end the schedule, not the clock.
    let until =
        Instant::now() + Duration::from_secs(if args.rounds.is_some() { 365 * 86_400 } else { seconds });
    let limit = args.rounds.map(|r| r as usize * args.faults.len());
    let load = schedule::Load {
        keyed: f64::from(args.keyed_rate) * args.frontends as f64,
        unkeyed: f64::from(args.unkeyed_rate) * args.frontends as f64,
        deadline,
        backends: args.backends,
        replicas: processes::REPLICAS,
    };
    let injected = schedule::Schedule::new(&mut fleet, &runtime, &traffic.windows, &published, began, load)
        .run(&args.faults, until, limit, out)?;

    let windows = runtime.block_on(traffic.finish(deadline + Duration::from_secs(2)));
    monitors.stop();
    let observations = std::mem::take(&mut *observations.lock().unwrap_or_else(|p| p.into_inner()));
    let lives = observations.memory.judge();
    let rows = invariants::judge(&observations, &injected, &windows, &lives);
    report::faults(out, &injected, &windows)?;
    report::memory(out, &lives)?;
    let violated = report::invariants(out, &rows)?;
    writeln!(
        out,
        "\nverdict: {}",
        if violated == 0 { "every invariant held".to_owned() } else { format!("{violated} violated") }
    )?;
    out.flush()?;

    follower.abort();
    for watcher in watchers {
        watcher.abort();
    }
    runtime.block_on(async { drop(frontends) });
    drop(fleet);
    runtime.shutdown_timeout(Duration::from_secs(2));
    if violated > 0 {
        return Err(format!(
            "chaos: {violated} of {} invariants violated; logs in {}",
            rows.len(),
            dir.display()
        )
        .into());
    }
    if args.dir.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}
