//! The schedule of faults: the chosen faults one after another, over and over, until the
//! soak's time is up. Each fault opens a window of the load's counts (its failed requests
//! are those sent from its start to the next fault's; the requests of the window before
//! have all ended when it begins), does its harm, waits (bounded)
//! for the fleet to recover, and lets it settle for [`SETTLE`]. The targets rotate: each
//! occurrence of a backend fault takes the next backend, every other etcd fault kills
//! the leading member.
//!
//! Fault durations are the schedule's own sleeps; what follows them waits for states.

use std::io::Write;
use std::time::{Duration, Instant};

use clap::ValueEnum;

use super::load::Windows;
use super::monitor::SharedPublished;
use super::pki::Step;
use super::prober::{self, leads};
use super::processes::{Fleet, FRONTEND};
use super::roster::Life;

/// After a fault's recovery, quiet for this long before the next.
const SETTLE: Duration = Duration::from_secs(3);
/// The longest wait for a recovery (a fault that needs longer is reported, and the
/// schedule goes on).
const RECOVERY: Duration = Duration::from_secs(20);

/// One kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Fault {
    /// A backend killed (SIGKILL) and started again 1.5 s later at its index.
    BackendKill,
    /// A backend drained in the registry for 4 s, then serving again.
    BackendDrain,
    /// A backend stalled (SIGSTOP) for 3 s, then resumed (SIGCONT).
    BackendStall,
    /// The leading steady-slicer instance killed (SIGKILL: its Assigner, Distributor and
    /// load collector at once) and started again 2 s later.
    SlicerKill,
    /// An etcd member killed and restarted on its data 3 s later: the leader every
    /// other time.
    EtcdKill,
    /// Every certificate moved to a new CA (a TLS fleet only, `--tls`), in three steps
    /// each taken by every process before the next (see `super::pki`): the bundles
    /// trust the new CA, every leaf is reissued, the old CA is dropped. Then a client
    /// presenting a certificate of the dropped CA must be refused by every server.
    CertRotate,
}

impl Fault {
    /// Its name on the command line and in the tables.
    pub(super) fn name(self) -> &'static str {
        match self {
            Fault::BackendKill => "backend-kill",
            Fault::BackendDrain => "backend-drain",
            Fault::BackendStall => "backend-stall",
            Fault::SlicerKill => "slicer-kill",
            Fault::EtcdKill => "etcd-kill",
            Fault::CertRotate => "cert-rotate",
        }
    }

    /// The most requests it may lose (failed or timed out, over its window) under `load`
    /// (see `docs/failures.md`, "The chaos soak").
    pub(super) fn lost_bound(self, load: &Load) -> u64 {
        let backends = f64::from(load.backends.max(1));
        match self {
            // The calls in flight on the killed task's connections when it dies, and those
            // sent to it before the frontends see the connections break: 50 ms of the
            // load (at least 10).
            Fault::BackendKill => (((load.keyed + load.unkeyed) * 0.05).ceil() as u64).max(10),
            // A stalled task holds every call it is sent until the call's deadline; only
            // then do timeouts reach the balancer (five in a row eject it). So at most
            // what may be routed to it within one deadline: the keyed load of the slices
            // it is a replica of, and its share of the unkeyed.
            Fault::BackendStall => {
                let keyed = load.keyed * f64::from(load.replicas) / backends;
                ((keyed + load.unkeyed / backends) * load.deadline.as_secs_f64()).ceil() as u64
            }
            // Drains move load before the task stops taking it; the control plane and etcd
            // are off the request path.
            Fault::BackendDrain | Fault::SlicerKill | Fault::EtcdKill | Fault::CertRotate => 0,
        }
    }
}

/// The load the bounds are stated for.
#[derive(Debug, Clone, Copy)]
pub(super) struct Load {
    /// Keyed requests a second, every frontend's together.
    pub(super) keyed: f64,
    /// Unkeyed requests a second, every frontend's together.
    pub(super) unkeyed: f64,
    /// Each request's deadline.
    pub(super) deadline: Duration,
    /// Backend tasks.
    pub(super) backends: u32,
    /// Replicas per slice.
    pub(super) replicas: u32,
}

/// One fault as it was done.
#[derive(Debug, Clone)]
pub(super) struct Injected {
    pub(super) fault: Fault,
    /// Its target (`backend-2`, `slicer-a`, `etcd-0 (leader)`).
    pub(super) target: String,
    /// The load's window it counts in.
    pub(super) window: usize,
    /// When it started, from the soak's start.
    pub(super) at: Duration,
    /// How long the fleet took to recover, from the fault (see [`Schedule::inject`]);
    /// `None`: not within [`RECOVERY`].
    pub(super) recovered: Option<Duration>,
    /// The most requests its window may lose.
    pub(super) bound: u64,
    /// What went wrong that the fault checks itself (a rotation: a step not taken, or
    /// a dropped CA's certificate accepted).
    pub(super) violations: Vec<String>,
}

/// The schedule's state.
pub(super) struct Schedule<'a> {
    pub(super) fleet: &'a mut Fleet,
    /// Where the probes of a rotation run.
    runtime: &'a tokio::runtime::Runtime,
    pub(super) windows: &'a Windows,
    pub(super) published: &'a SharedPublished,
    pub(super) began: Instant,
    load: Load,
    /// How many times each fault ran so far.
    done: Vec<(Fault, usize)>,
}

impl<'a> Schedule<'a> {
    pub(super) fn new(
        fleet: &'a mut Fleet,
        runtime: &'a tokio::runtime::Runtime,
        windows: &'a Windows,
        published: &'a SharedPublished,
        began: Instant,
        load: Load,
    ) -> Self {
        Self { fleet, runtime, windows, published, began, load, done: Vec::new() }
    }

    /// Runs `faults` in turn until `until`, or until `limit` faults ran, printing a line
    /// per fault to `out`.
    pub(super) fn run(
        &mut self,
        faults: &[Fault],
        until: Instant,
        limit: Option<usize>,
        out: &mut impl Write,
    ) -> Result<Vec<Injected>, Box<dyn std::error::Error>> {
        let mut injected = Vec::new();
        for fault in faults.iter().cycle() {
            if Instant::now() >= until || faults.is_empty() || limit.is_some_and(|l| injected.len() >= l) {
                break;
            }
            // Every request of the last window ends before this fault begins.
            let window = self.windows.open(self.load.deadline + Duration::from_secs(1));
            let at = self.began.elapsed();
            let mut violations = Vec::new();
            let (target, recovered) = self.inject(*fault, &mut violations)?;
            writeln!(
                out,
                "fault {:>3} at {:>6.1} s: {:<13} {:<18} recovered {}",
                injected.len() + 1,
                at.as_secs_f64(),
                fault.name(),
                target,
                recovered
                    .map_or_else(|| "not within 20 s".to_owned(), |r| format!("in {:.2} s", r.as_secs_f64()))
            )?;
            for violation in &violations {
                writeln!(out, "          violated: {violation}")?;
            }
            out.flush()?;
            let bound = fault.lost_bound(&self.load);
            injected.push(Injected { fault: *fault, target, window, at, recovered, bound, violations });
            std::thread::sleep(SETTLE);
        }
        Ok(injected)
    }

    /// How many times `fault` ran before, counting this one.
    fn nth(&mut self, fault: Fault) -> usize {
        match self.done.iter_mut().find(|(f, _)| *f == fault) {
            Some((_, n)) => {
                *n += 1;
                *n - 1
            }
            None => {
                self.done.push((fault, 1));
                0
            }
        }
    }

    /// Does `fault` and waits for the recovery: its target, and the time from the fault
    /// until a killed backend serves the newest generation again, a drained one holds no
    /// slice, a stalled one beats again, a leader leads after the leader was killed, or
    /// a killed etcd member is healthy again.
    fn inject(
        &mut self,
        fault: Fault,
        violations: &mut Vec<String>,
    ) -> Result<(String, Option<Duration>), Box<dyn std::error::Error>> {
        let nth = self.nth(fault);
        let backends = self.fleet.backend_count();
        let start = Instant::now();
        let sleep = std::thread::sleep;
        Ok(match fault {
            Fault::BackendKill => {
                let b = nth % backends;
                self.fleet.kill_backend(b);
                sleep(Duration::from_millis(1500));
                self.fleet.spawn_backend(b)?;
                let recovered = self.wait(|s| {
                    let newest = s.newest_generation();
                    let m = &s.fleet.roster.lock().backends[b];
                    m.life == Life::Up && m.beat.is_some_and(|beat| beat.generation >= newest)
                });
                (format!("backend-{b}"), recovered.then(|| start.elapsed()))
            }
            Fault::BackendDrain => {
                let b = (nth + 1) % backends;
                self.fleet.drain_backend(b, true)?;
                let recovered = self.wait(|s| {
                    let p = s.published.lock().unwrap_or_else(|p| p.into_inner());
                    p.newest.as_ref().is_some_and(|a| a.slices_of(b as u32).next().is_none())
                });
                let took = start.elapsed();
                sleep(Duration::from_secs(4).saturating_sub(took));
                self.fleet.drain_backend(b, false)?;
                (format!("backend-{b}"), recovered.then_some(took))
            }
            Fault::BackendStall => {
                let b = (nth + 2) % backends;
                self.fleet.stall_backend(b, true);
                sleep(Duration::from_secs(3));
                let resumed = Instant::now();
                self.fleet.stall_backend(b, false);
                let recovered = self.wait(|s| {
                    let m = &s.fleet.roster.lock().backends[b];
                    m.beat.is_some_and(|beat| beat.at > resumed)
                });
                (format!("backend-{b}"), recovered.then(|| start.elapsed()))
            }
            Fault::SlicerKill => {
                let metrics: Vec<_> = self.fleet.slicers.iter().map(|s| s.metrics).collect();
                let i = metrics.iter().position(|m| leads(*m)).unwrap_or(nth % metrics.len());
                self.fleet.kill_slicer(i);
                // Started again 2 s after the kill, whoever leads by then; recovered once
                // an instance leads (the standby, when the dead leader's lease lapsed).
                let (mut restarted, mut led) = (false, None);
                while start.elapsed() < RECOVERY {
                    if !restarted && start.elapsed() >= Duration::from_secs(2) {
                        self.fleet.spawn_slicer(i)?;
                        restarted = true;
                    }
                    if led.is_none() && metrics.iter().any(|m| leads(*m)) {
                        led = Some(start.elapsed());
                    }
                    if restarted && led.is_some() && self.fleet.roster.lock().slicers[i].life == Life::Up {
                        break;
                    }
                    sleep(Duration::from_millis(50));
                }
                if !restarted {
                    self.fleet.spawn_slicer(i)?;
                }
                (self.fleet.slicers[i].name.clone(), led)
            }
            Fault::EtcdKill => {
                let leader = self.fleet.etcd.wait_for_leader();
                let (member, role) = if nth % 2 == 0 {
                    (leader, "leader")
                } else {
                    ((leader + 1) % self.fleet.etcd.len(), "follower")
                };
                self.fleet.kill_etcd(member);
                sleep(Duration::from_secs(3));
                self.fleet.restart_etcd(member);
                (format!("etcd-{member} ({role})"), Some(start.elapsed()))
            }
            Fault::CertRotate => {
                let mut taken = true;
                for step in Step::ALL {
                    // Every instance serving first: one still starting has read the files
                    // already and would miss the step.
                    if !self.wait(|s| s.fleet.slicers_up()) {
                        violations.push(format!("an instance not up for step '{}'", step.name()));
                    }
                    let acks = self.fleet.rotate_certificates(step)?;
                    let answered = self.wait(|s| {
                        let members = s.fleet.roster.lock();
                        acks.iter().all(|ack| {
                            let m = &members.get(ack.group)[ack.index];
                            // A process that died meanwhile reads the files when it starts.
                            m.rotations > ack.taken
                                || m.rotations_failed > ack.refused
                                || m.life == Life::Killed
                        })
                    });
                    if !answered {
                        violations.push(format!("step '{}' not taken by every process in time", step.name()));
                    }
                    let members = self.fleet.roster.lock();
                    let refused: Vec<&str> = acks
                        .iter()
                        .map(|ack| &members.get(ack.group)[ack.index])
                        .zip(&acks)
                        .filter(|(m, ack)| m.rotations_failed > ack.refused)
                        .map(|(m, _)| m.name.as_str())
                        .collect();
                    if !refused.is_empty() {
                        violations.push(format!(
                            "{} refused the files of step '{}'",
                            refused.join(", "),
                            step.name()
                        ));
                    }
                    taken = answered && refused.is_empty();
                    if !taken {
                        break;
                    }
                }
                let recovered = taken.then(|| start.elapsed());
                if taken {
                    violations.extend(self.probe_stale()?);
                }
                (format!("CA {}", nth + 2), recovered)
            }
        })
    }

    /// Every server (instance and backend) that lets in a client certificate of the CA
    /// the last rotation dropped, or shuts out the lab's current one (which would make
    /// the first check say nothing): a line for each.
    fn probe_stale(&self) -> Result<Vec<String>, Box<dyn std::error::Error>> {
        let tls = self.fleet.tls.as_ref().ok_or("no TLS")?;
        let stale = tls.stale().ok_or("no CA dropped yet")?;
        let current = tls.client(FRONTEND)?;
        let servers: Vec<(String, String)> = {
            let members = self.fleet.roster.lock();
            let slicers = self.fleet.slicers.iter().zip(&members.slicers).filter(|(_, m)| m.life == Life::Up);
            let backends = members.backends.iter().filter(|m| m.life == Life::Up);
            slicers
                .map(|(s, m)| (m.name.clone(), s.listen.to_string()))
                .chain(backends.filter_map(|m| Some((m.name.clone(), m.addr.clone()?))))
                .collect()
        };
        let mut violations = Vec::new();
        for (name, addr) in servers {
            if self.runtime.block_on(prober::accepts(&addr, current.clone())).is_none() {
                violations.push(format!("{name} refused the current client certificate"));
            }
            if let Some(answer) = self.runtime.block_on(prober::accepts(&addr, stale.clone())) {
                violations.push(format!("{name} let in a certificate of the dropped CA ({answer})"));
            }
        }
        Ok(violations)
    }

    /// The newest generation in the store (0 before the first).
    fn newest_generation(&self) -> u64 {
        let p = self.published.lock().unwrap_or_else(|p| p.into_inner());
        p.newest.as_ref().map_or(0, |a| a.generation())
    }

    /// Waits (at most [`RECOVERY`]) until `done` holds; whether it did.
    fn wait(&self, done: impl Fn(&Self) -> bool) -> bool {
        let deadline = Instant::now() + RECOVERY;
        loop {
            if done(self) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
