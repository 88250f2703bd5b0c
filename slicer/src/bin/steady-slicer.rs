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
//!
//! Every argument is checked before anything starts: a value that would be refused for as
//! long as the process runs (a name no store holds, a task count past `MAX_TASK`, a job
//! whose first assignment is too large to store, an option of the other store) is one line
//! on stderr, `steady-slicer: ...`, and a non-zero exit (2 for what clap refuses, naming
//! the argument and pointing at `--help`; 1 for the rest).

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::error::ErrorKind;
use clap::{CommandFactory, FromArgMatches, Parser, ValueEnum};
use futures_util::StreamExt;
use steady_assigner::{by_name, Assigner, ReplicaLimits, RunInput, Tasks, NAMES};
use steady_slice::MAX_TASK;
use steady_slicer::assigner::{estimate, AssignerConfig, AssignerService};
use steady_slicer::load::{LoadBook, LoadCollector};
use steady_slicer::store::{
    check_name, AssignmentStore, EtcdConfig, EtcdStore, MemoryStore, MAX_ASSIGNMENT_BYTES,
};
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
    /// The etcd lease of the election, seconds (with `--store etcd`; default 5).
    #[arg(long)]
    lease_ttl_secs: Option<u64>,
}

type Failure = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = parse_args();
    let checked = match check(&cli) {
        Ok(checked) => checked,
        Err(e) => return fail(&e),
    };
    match run(cli, checked).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e),
    }
}

fn fail(error: &Failure) -> ExitCode {
    eprintln!("steady-slicer: {error}");
    ExitCode::FAILURE
}

/// The command line, or the process ends: `--help` and `--version` print as usual, and
/// anything clap refuses (an unknown flag, a value that does not parse, a missing
/// argument) is one line on stderr and exit code 2.
fn parse_args() -> Cli {
    // A negative number is a value (`--tasks -1` is a bad `--tasks`, not an unknown flag).
    let command = Cli::command().mut_args(|arg| arg.allow_negative_numbers(true));
    let parsed = command.try_get_matches().and_then(|mut matches| Cli::from_arg_matches_mut(&mut matches));
    match parsed {
        Ok(cli) => cli,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => e.exit(),
        Err(e) => {
            eprintln!("steady-slicer: {}", steady_slicer::cli::one_line(&e, "steady-slicer"));
            std::process::exit(e.exit_code());
        }
    }
}

/// What the checked command line asks for.
struct Checked {
    assigner: Box<dyn Assigner + Send + Sync>,
    tasks: Tasks,
    config: AssignerConfig,
}

/// Checks every argument before anything starts (the etcd options are checked by
/// `EtcdStore::connect`, before it connects): each refusal here would otherwise repeat for
/// as long as the process runs, serving nothing while an error counter moves.
fn check(cli: &Cli) -> Result<Checked, Failure> {
    check_name("job", &cli.job).map_err(|e| format!("--job: {e}"))?;
    check_name("candidate", &cli.candidate).map_err(|e| format!("--candidate: {e}"))?;
    let assigner = by_name(&cli.algorithm).ok_or_else(|| {
        format!("--algorithm: unknown algorithm {:?}: one of {}", cli.algorithm, NAMES.join(", "))
    })?;
    // Checked before the task set is built: `Tasks` would list every task first.
    if cli.tasks == 0 || cli.tasks > MAX_TASK + 1 {
        return Err(
            format!("--tasks {}: it must be 1 to {} (tasks 0..TASKS)", cli.tasks, MAX_TASK + 1).into()
        );
    }
    let tasks = Tasks::serving(0..cli.tasks)?;
    match cli.store {
        StoreKind::Memory if !cli.endpoints.is_empty() => {
            return Err("--endpoints is for --store etcd".into())
        }
        StoreKind::Memory if cli.lease_ttl_secs.is_some() => {
            return Err("--lease-ttl-secs is for --store etcd".into())
        }
        StoreKind::Etcd if cli.endpoints.is_empty() => return Err("--store etcd needs --endpoints".into()),
        _ => {}
    }
    let replicas = ReplicaLimits::new(1, cli.max_replicas).map_err(|e| format!("--max-replicas: {e}"))?;
    let config = AssignerConfig {
        cadence: Duration::from_millis(cli.cadence_ms),
        replicas,
        ..AssignerConfig::default()
    };
    config.validate().map_err(|e| format!("--cadence-ms: {e}"))?;
    // The first run's assignment (every task serving, no load reported yet) must fit in the
    // store, or every write would be refused: the slices grow with the tasks.
    let load = estimate(&[], None, &tasks.serving_ids());
    let first = assigner
        .assign(&RunInput { previous: None, tasks: &tasks, load: &load, replicas })
        .map_err(|e| format!("--algorithm {}: its first run failed: {e}", cli.algorithm))?;
    let bytes = first.assignment.encode().len();
    if bytes > MAX_ASSIGNMENT_BYTES {
        return Err(format!(
            "--tasks {} with --algorithm {}: the first assignment has {} slices, {bytes} bytes encoded, above the \
             store's limit of {MAX_ASSIGNMENT_BYTES}; use fewer tasks or another algorithm",
            cli.tasks,
            cli.algorithm,
            first.assignment.slices().len()
        )
        .into());
    }
    Ok(Checked { assigner, tasks, config })
}

async fn run(cli: Cli, checked: Checked) -> Result<(), Failure> {
    let Checked { assigner, tasks, config } = checked;
    let store: Arc<dyn AssignmentStore> = match cli.store {
        StoreKind::Memory => Arc::new(MemoryStore::new()),
        StoreKind::Etcd => {
            let ttl = Duration::from_secs(cli.lease_ttl_secs.unwrap_or(5));
            Arc::new(EtcdStore::connect(EtcdConfig::new(cli.endpoints.clone()).lease_ttl(ttl)).await?)
        }
    };
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
