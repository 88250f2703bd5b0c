//! One mode's fleet: the control plane (a Distributor and a load collector on one
//! loopback address, the Assigner service on etcd), the backends (tonic echo servers
//! behind their Slicelets' layers, refusing misroutes) and the frontends' channels.

use std::sync::Arc;
use std::time::Duration;

use steady_assigner::{by_name, ReplicaLimits, Tasks};
use steady_balance::{BalanceConfig, JobView};
use steady_slice::guard::{Consistency, Hold};
use steady_slicelet::{ExclusiveConfig, LeaseHolder, LoadReporter, MeterConfig, OnMisroute, Slicelet};
use steady_slicer::assigner_service::{AssignerConfig, AssignerHandle, AssignerService};
use steady_slicer::load::{LoadBook, LoadCollector};
use steady_slicer::store::{EtcdConfig, EtcdStore};
use steady_slicer::Distributor;
use steady_testing::echo::echo_server::EchoServer;
use steady_testing::loopback::{Loopback, ServerGuard};
use steady_tonic::{SteadyChannel, TaskEndpoint};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::transport::{Endpoint, Server};

use super::owner::{OwnerCounts, OwnerEcho};
use super::Mode;

/// The Slicelets' load meters halve every this long: the hot set moves every few
/// seconds, and the Assigner should see it move.
const HALF_LIFE: Duration = Duration::from_secs(2);
/// How often each backend reports its load.
const REPORT_EVERY: Duration = Duration::from_millis(250);
/// How long the Assigner waits for one recall before leaving it to its next settle
/// (nobody dies here: a recall takes a few etcd round trips).
const RECALL_TIMEOUT: Duration = Duration::from_secs(5);

/// The Assigner's settings: load-driven, a run a second, one replica per slice.
fn assigner_config(consistency: Consistency) -> Result<AssignerConfig, Box<dyn std::error::Error>> {
    Ok(AssignerConfig {
        cadence: Duration::from_secs(1),
        min_interval: Duration::from_secs(1),
        stale_after: Duration::from_secs(3),
        replicas: ReplicaLimits::new(1, 1)?,
        consistency,
        ..AssignerConfig::default()
    })
}

/// One backend task.
struct Backend {
    slicelet: Slicelet,
    counts: Arc<OwnerCounts>,
    server: ServerGuard,
    /// Exclusive modes: the Slicelet's leases and hold on etcd.
    holder: Option<LeaseHolder>,
    /// Eventual mode: the Slicelet following the Distributor.
    follow: Option<JoinHandle<()>>,
    /// Load reports flow while this is kept.
    _reporter: LoadReporter,
}

/// What the backends' counters add up to.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct BackendTotals {
    /// Refused by a Slicelet's layer ([`Slicelet::misroutes_rejected`]).
    pub(super) layer_refusals: u64,
    /// Refused by a handler whose key handle was gone.
    pub(super) late_refusals: u64,
    /// Answered by a backend that did not hold the key.
    pub(super) unowned: u64,
    /// Answered while another backend also held the key.
    pub(super) overlaps: u64,
}

/// One mode's fleet, for one job.
pub(super) struct Fleet {
    pub(super) job: String,
    pub(super) distributor: Distributor,
    pub(super) assigner: AssignerHandle,
    pub(super) frontends: Vec<SteadyChannel>,
    backends: Vec<Backend>,
    control: ServerGuard,
    /// Kept: the Assigner's task set and the frontends' job view end with them.
    _tasks: watch::Sender<Tasks>,
    _views: watch::Sender<JobView<TaskEndpoint>>,
}

impl Fleet {
    /// Starts `backends` backends, the Assigner and `frontends` channels for `job` in
    /// `mode`, on the etcd cluster at `etcd`.
    pub(super) async fn start(
        mode: Mode,
        job: String,
        etcd: &[String],
        backends: u32,
        frontends: usize,
    ) -> Result<Self, Box<dyn std::error::Error>> {
        let consistency = mode.consistency();
        // The control plane: the Distributor and the load collector on one address.
        let distributor = Distributor::new();
        let book = LoadBook::new();
        let collector = LoadCollector::new(book.clone());
        let port = Loopback::bind().await;
        let control_endpoint = Endpoint::from_shared(format!("http://{}", port.addr()))?;
        let (served, collected) = (distributor.service(), collector.service());
        let control = port.serve_with(|incoming, stopped| {
            Server::builder()
                .add_service(served)
                .add_service(collected)
                .serve_with_incoming_shutdown(incoming, stopped)
        });

        let meter = MeterConfig { half_life: HALF_LIFE, ..MeterConfig::default() };
        let slicelets: Vec<Slicelet> =
            (0..backends).map(|t| Slicelet::build(t, meter, consistency)).collect::<Result<_, _>>()?;
        let fleet: Arc<[Slicelet]> = slicelets.clone().into();
        let mut started = Vec::new();
        for (task, slicelet) in (0..backends).zip(slicelets) {
            let counts = Arc::new(OwnerCounts::default());
            let echo = OwnerEcho {
                task,
                slicelet: slicelet.clone(),
                fleet: fleet.clone(),
                exclusive: consistency == Consistency::Exclusive,
                counts: counts.clone(),
            };
            let layer = slicelet.layer().on_misroute(OnMisroute::Reject);
            let server = Loopback::bind().await.serve_with(|incoming, stopped| {
                Server::builder()
                    .layer(layer)
                    .add_service(EchoServer::new(echo))
                    .serve_with_incoming_shutdown(incoming, stopped)
            });
            let (holder, follow) = match mode {
                Mode::Eventual => {
                    let source = steady_tonic::watch_assignments(
                        control_endpoint.clone(),
                        job.as_str(),
                        Default::default(),
                    )?;
                    (None, Some(slicelet.follow(source)))
                }
                Mode::Exclusive | Mode::ExclusiveNoBridge => {
                    // A connection of its own, as on another machine.
                    let client = etcd_client::Client::connect(etcd, None).await?;
                    let config = ExclusiveConfig::default().bridge(mode == Mode::Exclusive);
                    (Some(slicelet.hold_leases(client, job.as_str(), config)?), None)
                }
            };
            let reporter = slicelet.report_to(control_endpoint.clone(), job.as_str(), REPORT_EVERY);
            started.push(Backend { slicelet, counts, server, holder, follow, _reporter: reporter });
        }

        let store = EtcdStore::connect(
            EtcdConfig::new(etcd.to_vec())
                .lease_ttl(Duration::from_secs(2))
                .request_timeout(Duration::from_secs(2))
                .recall_timeout(RECALL_TIMEOUT),
        )
        .await?;
        let (tasks, tasks_rx) = watch::channel(Tasks::serving(0..backends)?);
        let algorithm = by_name("weighted-move").ok_or("the weighted-move assigner is missing")?;
        let assigner = AssignerService::new(
            job.as_str(),
            "lab",
            Arc::from(algorithm),
            Arc::new(store),
            distributor.clone(),
            book,
        )
        .config(assigner_config(consistency)?)?
        .spawn(tasks_rx);

        let endpoints: Vec<TaskEndpoint> = started
            .iter()
            .map(|b| Endpoint::from_shared(format!("http://{}", b.server.addr())).map(TaskEndpoint))
            .collect::<Result<_, _>>()?;
        let (views, views_rx) = watch::channel(JobView::serving(endpoints));
        let mut channels = Vec::new();
        for m in 0..frontends {
            let channel = SteadyChannel::builder(BalanceConfig::new(m, backends as usize))
                .from_job(views_rx.clone())?;
            channel.follow_assignments(steady_tonic::watch_assignments(
                control_endpoint.clone(),
                job.as_str(),
                Default::default(),
            )?);
            channels.push(channel);
        }
        Ok(Self {
            job,
            distributor,
            assigner,
            frontends: channels,
            backends: started,
            control,
            _tasks: tasks,
            _views: views,
        })
    }

    /// Waits (at most `within`) until the first generation is in force everywhere: the
    /// Distributor has it, every frontend routes by it, and every backend holds it (an
    /// exclusive Slicelet holds it in etcd).
    pub(super) async fn ready(&self, within: Duration) -> Result<(), Box<dyn std::error::Error>> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(generation) = self.distributor.current(&self.job).map(|a| a.generation()) {
                let routed =
                    self.frontends.iter().all(|c| c.balance().assignment_generation() >= Some(generation));
                let held = self.backends.iter().all(|b| match b.holder {
                    Some(_) => matches!(b.slicelet.hold(), Some(Hold::Full(g)) if g >= generation),
                    None => b.slicelet.generation() >= Some(generation),
                });
                if routed && held {
                    return Ok(());
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(format!(
                    "job {}: the first assignment was not in force within {within:?}",
                    self.job
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The backends' counters, summed.
    pub(super) fn totals(&self) -> BackendTotals {
        use std::sync::atomic::Ordering::Relaxed;
        let mut t = BackendTotals::default();
        for b in &self.backends {
            t.layer_refusals += b.slicelet.misroutes_rejected();
            t.late_refusals += b.counts.late_refusals.load(Relaxed);
            t.unowned += b.counts.unowned.load(Relaxed);
            t.overlaps += b.counts.overlaps.load(Relaxed);
        }
        t
    }

    /// Stops everything, in order: the Assigner resigns, the Slicelets give their leases
    /// up, the servers stop.
    pub(super) async fn stop(self) {
        self.assigner.stop().await;
        for backend in self.backends {
            if let Some(holder) = backend.holder {
                let _ = tokio::time::timeout(Duration::from_secs(2), holder.stop()).await;
            }
            if let Some(follow) = backend.follow {
                follow.abort();
            }
            drop(backend.server);
        }
        drop(self.control);
    }
}
