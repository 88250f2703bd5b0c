//! `steady-slicer`: one job's Assigner and Distributor, against an assignment store.
//!
//! ```text
//! steady-slicer --job users --tasks 8 --listen 127.0.0.1:50070 --store memory
//! steady-slicer --job users --tasks 8 --listen 127.0.0.1:50070 --store etcd \
//!     --endpoints http://127.0.0.1:2379 --candidate assigner-a
//! ```
//!
//! Serves `AssignmentDistributor.Watch` on `--listen`, campaigns to be the job's one
//! Assigner in the store, and while it leads runs the chosen algorithm every cadence (and
//! at once when the task set changes), writing each new generation to the store and to
//! its Distributor. It also serves `LoadCollector.Report`, where Slicelets send their load.
//! A standby's Distributor follows the store, so every instance serves the assignment in
//! force. Prints a status line per cadence (at most one a second) on stdout; on Ctrl-C it
//! resigns, so that a standby leads at once.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use futures_util::StreamExt;
use steady_assigner::{by_name, ReplicaLimits, Tasks, NAMES};
use steady_slicer::assigner::{AssignerConfig, AssignerService};
use steady_slicer::load::{LoadBook, LoadCollector};
use steady_slicer::store::{AssignmentStore, EtcdConfig, EtcdStore, MemoryStore};
use steady_slicer::Distributor;
use tokio::sync::watch;

/// Where assignments are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum StoreKind {
    /// In this process only (one Assigner; for one machine and tests).
    Memory,
    /// In etcd (`--endpoints`): Assigners on several machines elect one writer.
    Etcd,
}

/// Run one job's Assigner and Distributor against an assignment store.
#[derive(Debug, Parser)]
#[command(name = "steady-slicer", version, about)]
struct Cli {
    /// The backend job.
    #[arg(long)]
    job: String,
    /// The job's tasks, `0..TASKS`, all serving.
    #[arg(long)]
    tasks: u32,
    /// Where to serve the Distributor.
    #[arg(long, default_value = "127.0.0.1:50070")]
    listen: SocketAddr,
    /// The assignment store.
    #[arg(long, value_enum, default_value = "memory")]
    store: StoreKind,
    /// etcd endpoints (with `--store etcd`), e.g. http://127.0.0.1:2379.
    #[arg(long, value_delimiter = ',')]
    endpoints: Vec<String>,
    /// This Assigner's name in the election.
    #[arg(long, default_value = "assigner")]
    candidate: String,
    /// The algorithm (weighted-move, rotation, lpt, static, consistent, ...).
    #[arg(long, default_value = "weighted-move")]
    algorithm: String,
    /// Milliseconds between runs (at least 10).
    #[arg(long, default_value_t = 10_000)]
    cadence_ms: u64,
    /// Most replicas per slice.
    #[arg(long, default_value_t = 1)]
    max_replicas: usize,
    /// The etcd lease of the election, seconds.
    #[arg(long, default_value_t = 5)]
    lease_ttl_secs: u64,
}

type Failure = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run(Cli::parse()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("steady-slicer: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<(), Failure> {
    let assigner = by_name(&cli.algorithm)
        .ok_or_else(|| format!("unknown algorithm {:?}: one of {}", cli.algorithm, NAMES.join(", ")))?;
    if cli.tasks == 0 {
        return Err("--tasks must be at least 1".into());
    }
    let tasks = Tasks::serving(0..cli.tasks)?;
    let store: Arc<dyn AssignmentStore> = match cli.store {
        StoreKind::Memory => Arc::new(MemoryStore::new()),
        StoreKind::Etcd => {
            if cli.endpoints.is_empty() {
                return Err("--store etcd needs --endpoints".into());
            }
            let config =
                EtcdConfig::new(cli.endpoints.clone()).lease_ttl(Duration::from_secs(cli.lease_ttl_secs));
            Arc::new(EtcdStore::connect(config).await?)
        }
    };
    let config = AssignerConfig {
        cadence: Duration::from_millis(cli.cadence_ms),
        replicas: ReplicaLimits::new(1, cli.max_replicas)?,
        ..AssignerConfig::default()
    };
    config.validate()?;
    // Bind first: a process that cannot serve must not campaign (and then lead).
    let listener = tokio::net::TcpListener::bind(cli.listen).await?;
    let distributor = Distributor::new();
    let book = LoadBook::new();
    // The backup distribution path: whoever writes, this Distributor follows the store.
    let mut follow = store.watch(&cli.job, 0)?;
    let follower = distributor.clone();
    let job = cli.job.clone();
    tokio::spawn(async move {
        while let Some(item) = follow.next().await {
            if let Ok(a) = item {
                follower.publish(&job, a);
            }
        }
    });
    let (_tasks_tx, tasks_rx) = watch::channel(tasks);
    let service = AssignerService::new(
        &cli.job,
        &cli.candidate,
        Arc::from(assigner),
        store,
        distributor.clone(),
        book.clone(),
    )
    .config(config.clone())?
    .spawn(tasks_rx);
    println!(
        "steady-slicer: job {} on {} ({:?} store), candidate {}",
        cli.job,
        listener.local_addr()?,
        cli.store,
        cli.candidate
    );
    let server = tonic::transport::Server::builder()
        .add_service(distributor.service())
        .add_service(LoadCollector::new(book.clone()).service())
        .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener));
    let status = async {
        // At most one line a second, whatever the cadence.
        let mut tick = tokio::time::interval(config.cadence.max(Duration::from_secs(1)));
        loop {
            tick.tick().await;
            if !service.is_running() {
                return;
            }
            let s = service.stats();
            println!(
                "generation {} published {} runs {} leading-terms {} conflicts {} errors {} reports accepted {} dropped {}",
                distributor.current(&cli.job).map_or(0, |a| a.generation()),
                s.published(),
                s.runs(),
                s.terms(),
                s.conflicts(),
                s.errors(),
                book.accepted(),
                book.dropped(),
            );
        }
    };
    let outcome: Result<(), Failure> = tokio::select! {
        served = server => served.map_err(Into::into),
        () = status => Err("the assigner service stopped".into()),
        _ = tokio::signal::ctrl_c() => Ok(()),
    };
    // Resign, so that a standby leads at once.
    service.stop().await;
    outcome?;
    Ok(())
}
