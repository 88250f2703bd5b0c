//! The demo's control plane and backends: the Distributor and load collector on one
//! address, the assignment store, the Assigners, and echo servers with Slicelets.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use steady_assigner::{by_name, Tasks};
use steady_slicelet::Slicelet;
use steady_slicer::assigner_service::{AssignerConfig, AssignerHandle, AssignerService};
use steady_slicer::load::{LoadBook, LoadCollector};
use steady_slicer::store::{AssignmentStore, EtcdConfig, EtcdStore, MemoryStore};
use steady_slicer::Distributor;
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
    address: SocketAddr,
    /// The shared in-memory store; `None` on etcd.
    store: Option<Arc<dyn AssignmentStore>>,
    endpoints: Vec<String>,
}

impl ControlPlane {
    pub(crate) async fn start(
        store: DemoStore,
        endpoints: &[String],
    ) -> Result<Self, Box<dyn std::error::Error>> {
        let distributor = Distributor::new();
        let book = LoadBook::new();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let collector = LoadCollector::new(book.clone());
        tokio::spawn(
            Server::builder()
                .add_service(distributor.service())
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
        Ok(Self { distributor, book, collector, address, store, endpoints: endpoints.to_vec() })
    }

    pub(crate) fn endpoint(&self) -> Endpoint {
        Endpoint::from_shared(format!("http://{}", self.address)).expect("a valid address")
    }

    /// An Assigner named `candidate`; on etcd with a connection of its own, as on
    /// another machine.
    pub(crate) async fn assigner(
        &self,
        candidate: &str,
        config: &AssignerConfig,
        tasks: watch::Receiver<Tasks>,
    ) -> Result<AssignerHandle, Box<dyn std::error::Error>> {
        let store: Arc<dyn AssignmentStore> = match &self.store {
            Some(shared) => shared.clone(),
            None => Arc::new(EtcdStore::connect(etcd_config(&self.endpoints)).await?),
        };
        let algorithm = by_name("weighted-move").expect("a known assigner");
        Ok(AssignerService::new(
            JOB,
            candidate,
            Arc::from(algorithm),
            store,
            self.distributor.clone(),
            self.book.clone(),
        )
        .config(config.clone())?
        .spawn(tasks))
    }
}

fn etcd_config(endpoints: &[String]) -> EtcdConfig {
    EtcdConfig::new(endpoints.to_vec())
        .lease_ttl(Duration::from_secs(2))
        .request_timeout(Duration::from_secs(2))
}
