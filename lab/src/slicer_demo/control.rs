//! The demo's control plane and backends: the Distributor and load collector on one
//! address, the assignment store, the Assigners (one-job fleet instances, as the
//! `steady-slicer` binary runs), and echo servers with Slicelets.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use steady_assigner::Tasks;
use steady_slicelet::Slicelet;
use steady_slicer::assigner_service::{AssignerConfig, AssignerStats};
use steady_slicer::autosharding::Autosharding;
use steady_slicer::fleet::Instance;
use steady_slicer::load::{LoadBook, LoadCollector};
use steady_slicer::specs::{JobConfig, TaskSource};
use steady_slicer::store::{AssignmentStore, EtcdConfig, EtcdStore, MemoryStore};
use steady_slicer::Distributor;
use steady_slicer_server::fleet::{Fleet, FleetHandle, FleetStatus};
use steady_testing::echo::echo_server::EchoServer;
use steady_testing::echo::EchoTask;
use steady_testing::loopback::{Loopback, ServerGuard};
use tokio::sync::watch;
use tonic::transport::{Endpoint, Server};

use super::{DemoStore, JOB};

/// Echo task `task` behind its Slicelet's layer, on a loopback port, until the guard is
/// dropped.
pub(super) async fn serve(task: u32, slicelet: &Slicelet) -> (SocketAddr, ServerGuard) {
    let port = Loopback::bind().await;
    let address = port.addr();
    let server = port.serve_with(|incoming, stopped| {
        Server::builder()
            .layer(slicelet.layer())
            .add_service(EchoServer::new(EchoTask(task)))
            .serve_with_incoming_shutdown(incoming, stopped)
    });
    (address, server)
}

/// The control plane: Distributor and load collector served on one address, and the
/// store the Assigners use.
#[derive(Debug)]
pub(crate) struct ControlPlane {
    pub(crate) distributor: Distributor,
    pub(super) book: LoadBook,
    pub(super) collector: LoadCollector,
    pub(super) autosharding: Autosharding,
    address: SocketAddr,
    /// The shared in-memory store; `None` on etcd.
    store: Option<Arc<dyn AssignmentStore>>,
    endpoints: Vec<String>,
}

impl ControlPlane {
    /// Serves the Distributor's Watch, gRPC's autosharding protocol (A119: clients' load
    /// reports, asked every `report_interval`, go to the book) and the load collector.
    pub(crate) async fn start(
        store: DemoStore,
        endpoints: &[String],
        report_interval: Duration,
    ) -> Result<Self, Box<dyn std::error::Error>> {
        let distributor = Distributor::new();
        let book = LoadBook::new();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let collector = LoadCollector::new(book.clone());
        let autosharding = Autosharding::new(distributor.clone())
            .with_client_load(book.clone())
            .with_report_interval(report_interval)
            .with_known_jobs(|job| job == JOB);
        tokio::spawn(
            Server::builder()
                .add_service(distributor.service())
                .add_service(autosharding.service())
                .add_service(collector.service())
                .serve_with_incoming(
                    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
                ),
        );
        // On etcd each Assigner connects on its own (see `assigner`); in memory they share.
        let store = match store {
            DemoStore::Memory => Some(Arc::new(MemoryStore::new()) as Arc<dyn AssignmentStore>),
            DemoStore::Etcd if endpoints.is_empty() => return Err("--store etcd needs --endpoints".into()),
            DemoStore::Etcd => None,
        };
        Ok(Self { distributor, book, collector, autosharding, address, store, endpoints: endpoints.to_vec() })
    }

    pub(crate) fn endpoint(&self) -> Endpoint {
        Endpoint::from_shared(format!("http://{}", self.address)).expect("a valid address")
    }

    /// An Assigner named `candidate`: a one-job fleet instance of the control plane
    /// (`steady_slicer_server::fleet`), as `steady-slicer --job` runs, on the demo's
    /// tasks and with its compressed time; on etcd with a connection of its own, as on
    /// another machine.
    pub(crate) async fn assigner(
        &self,
        candidate: &str,
        config: &AssignerConfig,
        tasks: watch::Receiver<Tasks>,
    ) -> Result<FleetHandle, Box<dyn std::error::Error>> {
        let store: Arc<dyn AssignmentStore> = match &self.store {
            Some(shared) => shared.clone(),
            None => Arc::new(EtcdStore::connect(etcd_config(&self.endpoints)).await?),
        };
        let count = u32::try_from(tasks.borrow().iter().count())?;
        let job = JobConfig::new(JOB, TaskSource::Count(count));
        let me = Instance { address: self.address.to_string(), pages: None };
        // The demo's Assigner configuration, whole: steps of a second, not minutes.
        let demo = config.clone();
        Ok(Fleet::new(candidate, me, store, self.distributor.clone(), self.book.clone())
            .jobs(vec![job])
            .tasks_from(JOB, tasks)
            .tune(move |_, config| config.clone_from(&demo))
            .spawn())
    }
}

/// The statistics of the demo job's Assigner in `fleet`, once it runs.
pub(super) fn stats(fleet: &FleetHandle) -> Option<Arc<AssignerStats>> {
    fleet.status().borrow().jobs.get(JOB).and_then(|job| job.assigner.clone())
}

/// What the pages show: the status of the fleet instance sent last on the returned
/// sender (the leader's; replaced when another Assigner takes over), kept current by a
/// task that ends with the receiver.
pub(super) fn shown(
    first: watch::Receiver<Arc<FleetStatus>>,
) -> (watch::Sender<watch::Receiver<Arc<FleetStatus>>>, watch::Receiver<Arc<FleetStatus>>) {
    let (shown, shown_rx) = watch::channel(first.borrow().clone());
    let (source, mut sources) = watch::channel(first);
    tokio::spawn(async move {
        loop {
            let mut current = sources.borrow_and_update().clone();
            shown.send_replace(current.borrow_and_update().clone());
            tokio::select! {
                changed = sources.changed() => if changed.is_err() { return },
                changed = current.changed() => {
                    // That instance stopped: wait for the next one sent.
                    if changed.is_err() && sources.changed().await.is_err() {
                        return;
                    }
                }
                () = shown.closed() => return,
            }
        }
    });
    (source, shown_rx)
}

fn etcd_config(endpoints: &[String]) -> EtcdConfig {
    EtcdConfig::new(endpoints.to_vec())
        .lease_ttl(Duration::from_secs(2))
        .request_timeout(Duration::from_secs(2))
}
