//! One strategy's fleet: the database, the backends with their Slicelets, the control
//! plane, the frontends' channels and whatever makes their assignments.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::ValueEnum;
use steady_assigner::ReplicaLimits;
use steady_balance::{BalanceConfig, JobView, KeyedLoadBound, TaskState};
use steady_local::{LocalAssignments, LocalHandle};
use steady_slicelet::{LoadReporter, MeterConfig, Slicelet};
use steady_slicer::assigner_service::{follow_job, AssignerConfig};
use steady_slicer_server::fleet::FleetHandle;
use steady_testing::holds_within;
use steady_tonic::{SteadyChannel, TaskEndpoint};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::transport::Endpoint;

use super::backend::{Backend, BackendConfig, DatabaseConfig, DatabaseServer};
use super::hashing;
use crate::slicer_demo::control::ControlPlane;
use crate::slicer_demo::{DemoStore, JOB};

/// How frontends pick the backend for a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Strategy {
    /// No key: power of two choices over the least loaded (Rudolph's round-robin column).
    P2c,
    /// One equal range of the key space per task of the job, fixed.
    StaticHashing,
    /// A ring of 100 virtual nodes per serving task, rebuilt when one drains or returns.
    ConsistentHashing,
    /// Rudolph's mode: each frontend runs the rotation over its own counts (steady-local).
    Rudolph,
    /// The Slicer loop: Slicelets report load, an Assigner runs weighted-move, one replica.
    Slicer,
    /// The same with hot slices replicated (up to 3 replicas).
    SlicerReplicated,
    /// Slicer, 1 replica, with handover: moves in two steps (the new owner warms from the
    /// old one first), the old owner answers through a grace period, then refuses and
    /// the frontends route again; a draining owner keeps its keys until they move.
    SlicerHandover,
}

impl Strategy {
    pub(crate) const ALL: [Strategy; 7] = [
        Strategy::P2c,
        Strategy::StaticHashing,
        Strategy::ConsistentHashing,
        Strategy::Rudolph,
        Strategy::Slicer,
        Strategy::SlicerReplicated,
        Strategy::SlicerHandover,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Strategy::P2c => "p2c (unkeyed)",
            Strategy::StaticHashing => "static hashing",
            Strategy::ConsistentHashing => "consistent hashing",
            Strategy::Rudolph => "Rudolph (in process)",
            Strategy::Slicer => "Slicer, 1 replica",
            Strategy::SlicerReplicated => "Slicer, <=3 replicas",
            Strategy::SlicerHandover => "Slicer, 1 replica, handover",
        }
    }

    /// Whether moves are handed over (see [`Strategy::SlicerHandover`]).
    pub(crate) fn handover(self) -> bool {
        self == Strategy::SlicerHandover
    }

    /// Whether requests carry their key for routing.
    pub(crate) fn keyed(self) -> bool {
        self != Strategy::P2c
    }

    /// Whether every backend knows the assignment the frontends route by, so that
    /// misroutes can be counted (Rudolph's frontends each have their own).
    pub(crate) fn shared_assignment(self) -> bool {
        !matches!(self, Strategy::P2c | Strategy::Rudolph)
    }

    fn slicer_replicas(self) -> Option<usize> {
        match self {
            Strategy::Slicer | Strategy::SlicerHandover => Some(1),
            Strategy::SlicerReplicated => Some(3),
            _ => None,
        }
    }
}

/// Sizes and timings of a fleet.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FleetConfig {
    pub(crate) backends: u32,
    pub(crate) frontends: usize,
    pub(crate) backend: BackendConfig,
    pub(crate) database: DatabaseConfig,
    /// How often assignments are remade (the Assigner's cadence, Rudolph's period).
    pub(crate) assign_every: Duration,
    /// The Slicer strategies' frontends' load bound (`--keyed-bound`).
    pub(crate) keyed_bound: Option<KeyedLoadBound>,
}

/// A running fleet for one strategy.
pub(crate) struct Fleet {
    pub(crate) strategy: Strategy,
    pub(crate) database: DatabaseServer,
    pub(crate) backends: Vec<Backend>,
    pub(crate) channels: Vec<SteadyChannel>,
    job: watch::Sender<JobView<TaskEndpoint>>,
    _control: ControlPlane,
    _assigner: Option<FleetHandle>,
    _reporters: Vec<LoadReporter>,
    _local: Vec<LocalHandle>,
    hashing: Option<JoinHandle<()>>,
}

impl Fleet {
    /// Starts the servers and frontends of `strategy` and waits until every frontend
    /// routes by an assignment (keyed strategies) and every backend accepts connections.
    pub(crate) async fn start(
        strategy: Strategy,
        config: &FleetConfig,
    ) -> Result<Self, Box<dyn std::error::Error>> {
        let control = ControlPlane::start(DemoStore::Memory, &[], Duration::from_secs(1)).await?;
        let database = DatabaseServer::start(config.database).await?;
        let replicas = strategy.slicer_replicas();
        // Handover: the new owner warms for half an assignment period; the old one
        // answers for as long after the switch, then refuses.
        let warm_up = config.assign_every / 4;
        let backend_config = super::backend::BackendConfig {
            handover_grace: strategy.handover().then_some(warm_up),
            ..config.backend
        };
        let peers: super::backend::Peers = Arc::default();
        let mut backends = Vec::new();
        let mut reporters = Vec::new();
        for task in 0..config.backends {
            let meter = MeterConfig { half_life: config.assign_every * 2, ..MeterConfig::default() };
            let slicelet = Slicelet::with_meter(task, meter)?;
            if strategy.shared_assignment() {
                slicelet.follow(steady_tonic::watch_assignments(
                    control.endpoint(),
                    JOB,
                    Default::default(),
                )?);
            }
            if replicas.is_some() {
                reporters.push(slicelet.report_to(control.endpoint(), JOB, config.assign_every / 4));
            }
            backends
                .push(Backend::start(task, backend_config, database.address, slicelet, peers.clone()).await?);
        }
        *peers.write().expect("not poisoned") = backends.iter().map(|b| b.address).collect();
        let endpoints: Vec<TaskEndpoint> = backends
            .iter()
            .map(|b| Endpoint::from_shared(format!("http://{}", b.address)).map(TaskEndpoint))
            .collect::<Result<_, _>>()?;
        // One discovery view: the frontends follow it, and the assigners' task set is made
        // from it, as an Assigner fed by `steady-discovery` would be.
        let (job, views) = watch::channel(JobView::serving(endpoints));
        let tasks_rx = follow_job(views.clone());

        let mut hashing = None;
        let mut assigner = None;
        match strategy {
            Strategy::StaticHashing => {
                control.distributor.publish(JOB, hashing::static_hashing(config.backends));
            }
            Strategy::ConsistentHashing => {
                let (distributor, mut tasks_rx) = (control.distributor.clone(), tasks_rx.clone());
                hashing = Some(tokio::spawn(async move {
                    let mut generation = 1;
                    loop {
                        let ring = hashing::consistent_hashing(&tasks_rx.borrow_and_update(), generation);
                        if let Some(ring) = ring {
                            distributor.publish(JOB, ring);
                            generation += 1;
                        }
                        if tasks_rx.changed().await.is_err() {
                            return;
                        }
                    }
                }));
            }
            Strategy::Slicer | Strategy::SlicerReplicated | Strategy::SlicerHandover => {
                let config = AssignerConfig {
                    cadence: config.assign_every,
                    min_interval: config.assign_every / 4,
                    stale_after: config.assign_every * 3,
                    replicas: ReplicaLimits::new(1, replicas.unwrap_or(1))?,
                    handover: strategy.handover().then_some(warm_up),
                    ..AssignerConfig::default()
                };
                assigner = Some(control.assigner("cache-assigner", &config, tasks_rx.clone()).await?);
            }
            Strategy::P2c | Strategy::Rudolph => {}
        }
        let mut channels = Vec::new();
        let mut local = Vec::new();
        for m in 0..config.frontends {
            let mut balance =
                BalanceConfig::new(m, config.backends as usize).with_keyed_to_draining(strategy.handover());
            // Not with handover: its backends refuse misroutes, and a spilled request that
            // reaches a backend already on a newer generation is refused, then fails if its
            // one reroute is refused too (the rolling restart failed requests so).
            if let (Some(bound), Some(_), false) = (config.keyed_bound, replicas, strategy.handover()) {
                balance = balance.with_keyed_load_bound(bound);
            }
            let channel = SteadyChannel::builder(balance).from_job(views.clone())?;
            match strategy {
                Strategy::P2c => {}
                Strategy::Rudolph => local.push(
                    LocalAssignments::rudolph()
                        .every(config.assign_every)
                        .start(channel.balance(), tasks_rx.clone())?,
                ),
                _ => channel.follow_assignments(steady_tonic::watch_assignments(
                    control.endpoint(),
                    JOB,
                    Default::default(),
                )?),
            }
            channels.push(channel);
        }
        let fleet = Self {
            strategy,
            database,
            backends,
            channels,
            job,
            _control: control,
            _assigner: assigner,
            _reporters: reporters,
            _local: local,
            hashing,
        };
        fleet.ready().await?;
        Ok(fleet)
    }

    /// Waits (at most 10 s) until every frontend follows an assignment, when keyed, and
    /// every backend's server answers.
    async fn ready(&self) -> Result<(), Box<dyn std::error::Error>> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let assigned = !self.strategy.keyed()
            || holds_within(Duration::from_secs(10), || {
                self.channels.iter().all(|c| c.stats().assignment_generation.is_some())
            })
            .await;
        if !assigned {
            return Err(format!("{}: a frontend got no assignment in 10 s", self.strategy.name()).into());
        }
        for b in &self.backends {
            while tokio::net::TcpStream::connect(b.address).await.is_err() {
                if Instant::now() > deadline {
                    return Err(format!("backend {} does not accept connections", b.task).into());
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        Ok(())
    }

    /// Discovery puts `task` serving or draining (the frontends see it, and the assigners'
    /// task set follows).
    pub(crate) fn set_state(&self, task: u32, serving: bool) {
        let state = if serving { TaskState::Serving } else { TaskState::Draining };
        self.job.send_modify(|v| *v = v.clone().with_state(task as usize, state));
    }

    /// Waits (at most 10 s) until every frontend has `task` among the members it sends
    /// to (`member`) or none has.
    pub(crate) async fn wait_for_members(&self, task: u32, member: bool) -> Result<(), String> {
        let is_member = |c: &SteadyChannel| c.stats().members.iter().any(|m| m.task == task as usize);
        if holds_within(Duration::from_secs(10), || self.channels.iter().all(|c| is_member(c) == member))
            .await
        {
            return Ok(());
        }
        let what = if member { "took back" } else { "let go of" };
        Err(format!("{}: not every frontend {what} task {task} in 10 s", self.strategy.name()))
    }

    /// Keyed requests the frontends' load bound spilled so far.
    pub(crate) fn spilled(&self) -> u64 {
        self.channels.iter().map(|c| c.stats().keyed_spilled).sum()
    }

    /// Misrouted keyed requests the backends counted so far.
    pub(crate) fn misrouted(&self) -> u64 {
        self.counters().misrouted()
    }

    /// Cache entries backends loaded from each other while warming ranges.
    pub(crate) fn warmed(&self) -> u64 {
        self.backends.iter().map(|b| b.counts.warmed.load(std::sync::atomic::Ordering::Relaxed)).sum()
    }

    /// With handover, waits (at most 10 s) until the Assigner has moved every slice off
    /// `task` and every frontend routes by that generation or a later one, so that no
    /// keyed request goes to it any more. At once for the other strategies.
    pub(crate) async fn wait_until_released(&self, task: u32) -> Result<(), String> {
        if !self.strategy.handover() {
            return Ok(());
        }
        let slicelet = &self.backends[task as usize].slicelet;
        let timeout = |what: &str| format!("{}: task {task} {what} in 10 s", self.strategy.name());
        tokio::time::timeout(Duration::from_secs(10), slicelet.wait_until_released())
            .await
            .map_err(|_| timeout("was not released"))?;
        let released = slicelet.generation();
        let learnt = || self.channels.iter().all(|c| c.balance().assignment_generation() >= released);
        if !holds_within(Duration::from_secs(10), learnt).await {
            return Err(timeout("was released, but not every frontend learnt it"));
        }
        Ok(())
    }

    /// The counters a per-second sampler reads, without borrowing the fleet.
    pub(crate) fn counters(&self) -> Counters {
        Counters {
            caches: self.backends.iter().map(|b| b.counts.clone()).collect(),
            slicelets: self.backends.iter().map(|b| b.slicelet.clone()).collect(),
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        if let Some(h) = self.hashing.take() {
            h.abort();
        }
    }
}

/// Shared handles on the backends' cache counters.
#[derive(Clone)]
pub(crate) struct Counters {
    caches: Vec<Arc<super::backend::CacheCounts>>,
    slicelets: Vec<Slicelet>,
}

impl Counters {
    pub(crate) fn hits_misses(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        self.caches.iter().fold((0, 0), |(h, m), c| (h + c.hits.load(Relaxed), m + c.misses.load(Relaxed)))
    }

    /// Keyed requests the backends counted as misrouted.
    pub(crate) fn misrouted(&self) -> u64 {
        self.slicelets.iter().map(Slicelet::misrouted).sum()
    }
}
