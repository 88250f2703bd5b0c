//! The operator's program: the control plane of one backend job on etcd. It follows the
//! job's tasks in the etcd registry, campaigns to be the job's one Assigner, turns the
//! Slicelets' load reports into assignments, stores each in etcd and serves it to every
//! watcher (frontends and backends).
//!
//! ```sh
//! cargo run -p steady-examples --example operator -- http://127.0.0.1:2379 127.0.0.1:50070 assigner-a
//! ```
//!
//! Arguments: etcd's endpoint, where to serve the Distributor and the load collector, and
//! this instance's name in the election. Run two with different names: one leads, the
//! other stands by and serves the stored assignment, and leads within a lease's time when
//! the first stops. Stops (and resigns) on Ctrl-C. The `steady-slicer` binary is this
//! program with its options on the command line.
//!
//! With `TLS_CERT`, `TLS_KEY` and `CLIENT_CA` set (PEM files) it serves over TLS, verifies
//! client certificates, and takes a load report for task `i` only from a backend whose
//! certificate is named `users-i`; frontends may watch without a certificate.

use std::error::Error;
use std::sync::Arc;

use futures_util::StreamExt;
use steady_assigner::WeightedMove;
use steady_discovery::registry::{self, Registry, RegistryConfig};
use steady_slicer::assigner_service::{follow_job, AssignerService};
use steady_slicer::load::{LoadBook, LoadCollector, ReporterNames};
use steady_slicer::store::{AssignmentStore, EtcdConfig, EtcdStore};
use steady_slicer::Distributor;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};

/// The backend job's name: its tasks register under it in etcd.
const JOB: &str = "users";

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error + Send + Sync>> {
    let mut args = std::env::args().skip(1);
    let etcd = args.next().unwrap_or_else(|| "http://127.0.0.1:2379".to_owned());
    let listen = args.next().unwrap_or_else(|| "127.0.0.1:50070".to_owned()).parse()?;
    let candidate = args.next().unwrap_or_else(|| "assigner-a".to_owned());

    // Where assignments live, and where the backend job's tasks register.
    let store: Arc<dyn AssignmentStore> =
        Arc::new(EtcdStore::connect(EtcdConfig::new([etcd.clone()])).await?);
    let registry = Registry::connect(RegistryConfig::new([etcd])).await?;
    let backends = registry::watch_job(&registry, JOB).await?;

    // Serve whatever the store holds, whoever wrote it (the backup path while another
    // instance leads).
    let distributor = Distributor::new();
    let mut stored = store.watch(JOB, 0)?;
    let follower = distributor.clone();
    tokio::spawn(async move {
        while let Some(item) = stored.next().await {
            if let Ok(assignment) = item {
                follower.publish(JOB, assignment);
            }
        }
    });

    // The Assigner: weighted-move on the reported load, at once when a task drains or joins.
    let book = LoadBook::new();
    let service = AssignerService::new(
        JOB,
        candidate.as_str(),
        Arc::new(WeightedMove::default()),
        store,
        distributor.clone(),
        book.clone(),
    )
    .spawn(follow_job(backends.views()));

    println!("operator {candidate}: job {JOB}, serving on {listen}");
    let mut server = Server::builder();
    let mut collector = LoadCollector::new(book);
    if let (Ok(cert), Ok(key), Ok(ca)) =
        (std::env::var("TLS_CERT"), std::env::var("TLS_KEY"), std::env::var("CLIENT_CA"))
    {
        let (cert, key, ca) = (std::fs::read(cert)?, std::fs::read(key)?, std::fs::read(ca)?);
        let tls = ServerTlsConfig::new()
            .identity(Identity::from_pem(cert, key))
            .client_ca_root(Certificate::from_pem(ca))
            .client_auth_optional(true); // frontends may watch without a certificate
        server = server.tls_config(tls)?;
        collector = collector.authorize_reporters(ReporterNames::pattern("{job}-{task}")?);
    }
    server
        .add_service(distributor.service())
        .add_service(collector.service())
        .serve_with_shutdown(listen, async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    // Resign, so that a standby leads at once.
    service.stop().await;
    Ok(())
}
