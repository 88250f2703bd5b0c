//! `steady-slicer`: an instance of a fleet that serves every job of a spec store, or one
//! job's Assigner and Distributor, against an assignment store.
//!
//! ```text
//! steady-slicer --fleet --store etcd --endpoints https://etcd-0:2379 --etcd-ca etcd-ca.pem \
//!     --candidate slicer-0 --listen 0.0.0.0:50070 --advertise slicer-0.control:50070
//! steady-slicer --fleet --specs-dir /etc/steady/jobs --listen 127.0.0.1:50070
//! steady-slicer --job users --tasks 8 --listen 127.0.0.1:50070 --store memory
//! steady-slicer --job users --tasks 8 --listen 127.0.0.1:50070 --store etcd \
//!     --endpoints http://127.0.0.1:2379 --candidate assigner-a
//! steady-slicer --job users --tasks 8 --listen 10.0.0.5:50070 \
//!     --tls-cert slicer.pem --tls-key slicer.key --tls-client-ca fleet-ca.pem \
//!     --reporter-names '{job}-{task}.users.svc'
//! steady-slicer --job users --tasks 8 --store etcd --endpoints https://etcd-0:2379 \
//!     --etcd-ca etcd-ca.pem --etcd-cert slicer-etcd.pem --etcd-key slicer-etcd.key \
//!     --etcd-user steady-slicer --etcd-password-file /run/secrets/etcd-password
//! steady-slicer --job users --registry http://etcd-0:2379 --store etcd --endpoints http://etcd-0:2379
//! steady-slicer --job users --registry https://etcd-0:2379 --store etcd --endpoints https://etcd-0:2379 \
//!     --etcd-ca etcd-ca.pem --etcd-user steady-slicer --etcd-password-file /run/secrets/etcd-password
//! steady-slicer --job users --dns users.prod.svc.cluster.local.
//! steady-slicer --job users --registry http://etcd-0:2379 --store etcd --endpoints http://etcd-0:2379 \
//!     --spec users-spec.json
//! ```
//!
//! With `--fleet` the instance serves every job whose spec (`steady_slicer::specs`) is
//! in the store (`--store etcd`: beside the assignments; `--store memory`: the
//! `<job>.json` files of `--specs-dir`, read every second and on SIGHUP): every job's
//! Watch and load reports here, and the Assigners of the jobs the spread gives this
//! instance among the live ones (`--candidate` is its name; its membership records
//! `--advertise`). Specs are managed while it runs (`steadyctl`); the per-job flags below
//! are refused beside it. `docs/fleet.md` is the operator's guide. Without `--fleet`,
//! `--job` and its flags make a one-job fleet of this instance alone.
//!
//! With `--spec FILE` the job spec (JSON, `steady_assigner::JobSpec`, docs/placement.md)
//! gives the replicas per slice (so `--max-replicas` is refused beside it), the placement
//! constraints (replicas spread over zones or racks, a replica per zone), the goals
//! (weighted-move's imbalance threshold and churn budget) and task profiles (racks,
//! capacities, zones for tasks discovery puts in none). A bad spec is one line naming the
//! field; a spec the tasks cannot meet is a warning, and the Assigner publishes the best
//! assignment they allow, naming the missed constraint on its status line, page and
//! metrics.
//!
//! The backend job is `--tasks N` (tasks `0..N`, all serving, for good), or followed through
//! discovery: `--registry URLS`, the etcd registry of `--job` (tasks registered under
//! `/steady/jobs/<job>/tasks/<i>`: a task that drains or leaves there loses its slices at
//! once, one that registers gets some), or `--dns NAME`, a name re-resolved on a period with
//! indices from StatefulSet-style ordinals (`users-3`). Exactly one of the three.
//!
//! With `--consistency exclusive` the job is in exclusive mode (`docs/exclusive.md`): no
//! Slicelet believes it owns a key the stored assignment does not give it. Each new
//! generation is published, recalled from the job's Slicelets (which hold the one in
//! force on etcd leases of their own) and then granted, so it needs `--store etcd`, at
//! most one replica per slice (`--max-replicas 1`, or a spec that asks for no more), and
//! the Slicelets of the job running in exclusive mode too. A job that is exclusive in the
//! store refuses an Assigner run without the flag (its writes fail, naming the mode).
//!
//! With `--tls-cert` and `--tls-key` it serves over TLS. With `--tls-client-ca` it also
//! verifies client certificates (required of every peer with `--require-client-cert`,
//! else of load reporters only: frontends may watch without one), and accepts a load
//! report for task `i` only from a peer whose certificate names task `i` by
//! `--reporter-names` (default `{job}-{task}`). Without a client CA it warns once at
//! start that load reports are unauthenticated.
//!
//! Certificates rotate without a restart: the three files are read again every
//! `--tls-reload-ms` (default 1000) and at once on SIGHUP, and what changed (by content:
//! a file rewritten, or a symlink swapped as Kubernetes mounts secrets) is used from the
//! next handshake on; connections already made keep theirs, with their open Watch and
//! report streams. A change that does not check (a file that does not parse, a key that
//! is not the certificate's, as while only one of the pair is written, a file missing)
//! is refused with one line on stderr, `steady-slicer: TLS: refused the new ...`, and
//! the material in force stays; each change taken is one line, `steady-slicer: TLS:
//! reloaded ...`. To rotate the client CA, give the bundle both CAs, move the clients to
//! the new one, then drop the old: its certificates are refused at their next
//! handshake. TLS sessions are never resumed, so every connection is checked against
//! the material in force.
//!
//! With `--metrics-listen ADDR` it serves Prometheus text at `/metrics` and a status page
//! at `/` (`steady_slicer_server::status`) on ADDR; a bare port means 127.0.0.1, so the pages
//! listen on loopback unless told otherwise. Its second line on stdout says where.
//!
//! Every connection to etcd, the store's (`--store etcd`, `--endpoints`) and the
//! registry's (`--registry`), is made with the same access settings: `--etcd-ca` connects
//! over TLS (`https://` endpoints), `--etcd-cert` and `--etcd-key` present a client
//! certificate (etcd's `--client-cert-auth`), and `--etcd-user` with
//! `--etcd-password-file` (the first line of the file; never a flag, which `ps` would
//! show) logs in as a user, whose role must cover the key prefix (`/steady/jobs/`) on
//! each cluster. The flags are for `--store etcd` or `--registry`; with both, the two
//! may be one cluster or two that take the same credentials. Settings etcd refuses end
//! the process at start with one line naming the cause and which connection (`store:` or
//! `--registry:`).
//!
//! Serves `AssignmentDistributor.Watch` on `--listen`, and beside it gRPC's autosharding
//! protocol (gRFC A119, `AutoshardingService.WatchShardingAssignment`: the `target` is the
//! job's name; tasks are named by the addresses they registered, on every instance, and
//! by their index for `--tasks` and for `--dns`), campaigns to be the job's one
//! Assigner in the store, and while it leads runs the chosen algorithm every cadence (and
//! at once when the task set changes), writing each new generation to the store and to
//! its Distributor. It also serves `LoadCollector.Report`, where Slicelets send their load.
//! A standby's Distributor follows the store, so every instance serves the assignment in
//! force. Prints a status line per cadence (at most one a second) on stdout; on Ctrl-C or
//! SIGTERM it resigns (and a fleet instance leaves the fleet), so that a standby leads at
//! once.
//!
//! Every argument is checked before anything starts: a value that would be refused for as
//! long as the process runs (a name no store holds, a task count past `MAX_TASK`, a job
//! whose first assignment is too large to store, an option of the other store) is one line
//! on stderr, `steady-slicer: ...`, and a non-zero exit (2 for what clap refuses, naming
//! the argument and pointing at `--help`; 1 for the rest).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::error::ErrorKind;
use clap::{CommandFactory, FromArgMatches, Parser, ValueEnum};
use steady_assigner::{
    by_name, profile_tasks, Assigner, JobSpec, ReplicaLimits, RunInput, Tasks, WeightedMove,
    WeightedMoveConfig, NAMES,
};
use steady_discovery::{dns, registry};
use steady_proto::tls::{ClientAuth, TlsIncoming};
use steady_slice::guard::Consistency;
use steady_slice::MAX_TASK;
use steady_slicer::assigner_service::{estimate, AssignerConfig};
use steady_slicer::autosharding::{Autosharding, EndpointNames};
use steady_slicer::fleet::{EtcdFleet, Instance};
use steady_slicer::load::{LoadBook, LoadCollector, ReporterNames};
use steady_slicer::specs::{EtcdSpecs, JobConfig, SpecDirectory, SpecStore, TaskSource};
use steady_slicer::store::{
    check_name, AssignmentStore, EtcdAccess, EtcdConfig, EtcdStore, MemoryStore, MAX_ASSIGNMENT_BYTES,
};
use steady_slicer::Distributor;
use steady_slicer_server::etcd_flags::EtcdFlags;
use steady_slicer_server::fleet::{Fleet, FleetHandle, FleetStatus};
use steady_slicer_server::status::{MetricsRegistry, StatusServer, StatusSources};
use steady_slicer_server::tls_files::{ReloadingTls, TlsFiles};
use tokio::sync::watch;

/// Where assignments are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum StoreKind {
    /// In this process only (one Assigner; for one machine and tests).
    Memory,
    /// In etcd (`--endpoints`): Assigners on several machines elect one writer.
    Etcd,
}

/// What a job's Slicelets may believe about the keys they hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// Affinity: after a move two tasks may serve a key for a moment.
    Eventual,
    /// Exclusive ownership, on etcd's leases (with `--store etcd`, one replica per slice).
    Exclusive,
}

impl From<Mode> for Consistency {
    fn from(mode: Mode) -> Self {
        match mode {
            Mode::Eventual => Consistency::Eventual,
            Mode::Exclusive => Consistency::Exclusive,
        }
    }
}

/// Run the control plane: one job's Assigner and Distributor (`--job`), or an instance of
/// a fleet that serves every job of a spec store (`--fleet`).
#[derive(Debug, Parser)]
#[command(name = "steady-slicer", version, about)]
#[command(group = clap::ArgGroup::new("backends").required(true).multiple(false))]
struct Cli {
    /// The backend job (or `--fleet`: every job of the spec store).
    #[arg(long, required_unless_present = "fleet")]
    job: Option<String>,
    /// Serve every job of the spec store (on etcd with `--store etcd`, else the files of
    /// `--specs-dir`), each job's Assigner on the live instance the spread names; the
    /// instance's name is `--candidate`.
    #[arg(
        long,
        group = "backends",
        conflicts_with_all = ["job", "algorithm", "cadence_ms", "max_replicas", "spec", "consistency"]
    )]
    fleet: bool,
    /// The job specs of a fleet on the memory store: `<job>.json` files, read again every
    /// second and on SIGHUP (with `--fleet --store memory`).
    #[arg(long, value_name = "DIR", requires = "fleet")]
    specs_dir: Option<PathBuf>,
    /// The address other instances and operators reach this one's gRPC services at, as
    /// its fleet membership records it (with `--fleet`; default: the bound `--listen`
    /// address); its pages are recorded on the same host.
    #[arg(long, value_name = "ADDR", requires = "fleet")]
    advertise: Option<String>,
    /// The job's tasks, `0..TASKS`, all serving (or follow the job: `--registry`, `--dns`).
    #[arg(long, group = "backends")]
    tasks: Option<u32>,
    /// Follow the job's tasks in the etcd registry at these endpoints (reached with the
    /// `--etcd-*` settings, as the store is).
    #[arg(long, group = "backends", value_delimiter = ',', value_name = "URLS")]
    registry: Vec<String>,
    /// Follow the job's tasks by resolving this DNS name (indices from host-name ordinals).
    #[arg(long, group = "backends", value_name = "NAME")]
    dns: Option<String>,
    /// Where to serve the Distributor.
    #[arg(long, default_value = "127.0.0.1:50070")]
    listen: SocketAddr,
    /// The assignment store.
    #[arg(long, value_enum, default_value = "memory")]
    store: StoreKind,
    /// etcd endpoints (with `--store etcd`), e.g. http://127.0.0.1:2379.
    #[arg(long, value_delimiter = ',')]
    endpoints: Vec<String>,
    /// This Assigner's name in the election (with `--fleet`, the instance's name in the
    /// fleet: one per instance).
    #[arg(long, default_value = "assigner")]
    candidate: String,
    /// The algorithm (weighted-move, rotation, lpt, static, consistent, ...).
    #[arg(long, default_value = "weighted-move")]
    algorithm: String,
    /// Milliseconds between runs (at least 10).
    #[arg(long, default_value_t = 10_000)]
    cadence_ms: u64,
    /// Most replicas per slice (default 1; a --spec gives its own).
    #[arg(long, conflicts_with = "spec")]
    max_replicas: Option<usize>,
    /// The job spec (JSON): replicas, placement constraints, goals, task profiles
    /// (`steady_assigner::JobSpec`; docs/placement.md).
    #[arg(long, value_name = "FILE")]
    spec: Option<PathBuf>,
    /// The job's consistency mode (`exclusive` needs `--store etcd` and one replica per
    /// slice; docs/exclusive.md).
    #[arg(long, value_enum, default_value = "eventual")]
    consistency: Mode,
    /// The etcd lease of the election, seconds (with `--store etcd`; default 5).
    #[arg(long)]
    lease_ttl_secs: Option<u64>,
    /// Serve /metrics (Prometheus text) and the status page / here: ADDR, or a port on
    /// 127.0.0.1.
    #[arg(long, value_name = "ADDR", value_parser = loopback_unless_told)]
    metrics_listen: Option<SocketAddr>,

    // Reaching etcd: the store's and the registry's connections alike (with `--store etcd`
    // or `--registry`; checked by `check_etcd_access`).
    #[command(flatten)]
    etcd: EtcdFlags,

    // Serving over TLS (checked by `check_tls`).
    /// Serve over TLS with this certificate chain (PEM; with `--tls-key`).
    #[arg(long, value_name = "FILE")]
    tls_cert: Option<PathBuf>,
    /// The private key of `--tls-cert` (PEM).
    #[arg(long, value_name = "FILE")]
    tls_key: Option<PathBuf>,
    /// Verify client certificates against this CA (PEM), and accept load reports only from
    /// the task a certificate names (see `--reporter-names`).
    #[arg(long, value_name = "FILE")]
    tls_client_ca: Option<PathBuf>,
    /// Refuse every peer without a client certificate, watchers too (with `--tls-client-ca`).
    #[arg(long)]
    require_client_cert: bool,
    /// Which certificate name (DNS SAN) may report for which task: `{task}` is the index,
    /// `{job}` the job, the rest literal (with `--tls-client-ca`).
    #[arg(long, value_name = "PATTERN", default_value = "{job}-{task}")]
    reporter_names: String,
    /// Milliseconds between two reads of the TLS files, 10 to 3,600,000 (a change is used
    /// from the next handshake; SIGHUP reads them at once).
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    tls_reload_ms: u64,
}

type Failure = Box<dyn std::error::Error + Send + Sync>;

/// `PORT` (on 127.0.0.1) or `HOST:PORT`.
fn loopback_unless_told(value: &str) -> Result<SocketAddr, String> {
    if let Ok(port) = value.parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    value.parse().map_err(|_| format!("{value:?} is neither a port nor an address (127.0.0.1:9464)"))
}

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
    // (Only for arguments that take a value: clap refuses the setting on a switch.)
    let command = Cli::command().mut_args(|arg| {
        if arg.get_action().takes_values() {
            arg.allow_negative_numbers(true)
        } else {
            arg
        }
    });
    let parsed = command.try_get_matches().and_then(|mut matches| Cli::from_arg_matches_mut(&mut matches));
    match parsed {
        Ok(cli) => cli,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => e.exit(),
        Err(e) => {
            eprintln!("steady-slicer: {}", steady_slicer_server::cli::one_line(&e, "steady-slicer"));
            std::process::exit(e.exit_code());
        }
    }
}

/// What the checked command line asks for.
struct Checked {
    /// One job (`--job`), or a fleet (`--fleet`).
    mode: Serving,
    tls: ServingTls,
    /// How to reach etcd: the store (with `--store etcd`) and the registry (`--registry`).
    etcd_access: EtcdAccess,
}

/// What the instance serves.
enum Serving {
    /// One job, for good: a one-job fleet of this instance alone.
    Job {
        config: Box<JobConfig>,
        /// Why the spec cannot be met by the `--tasks` given (warned about at the check).
        infeasible: Option<steady_assigner::Infeasible>,
    },
    /// Every job of the spec store.
    Fleet,
}

/// How the binary serves: its TLS material (kept in line with its files), and who may
/// report load.
struct ServingTls {
    /// `None`: plaintext.
    server: Option<ReloadingTls>,
    /// `None`: any peer may report for any task.
    reporters: Option<ReporterNames>,
}

/// Checks every argument before anything starts (the etcd options' ranges are checked by
/// `EtcdStore::connect`, before it connects, and what etcd thinks of the credentials by
/// its first read): each refusal here would otherwise repeat for as long as the process
/// runs, serving nothing while an error counter moves.
fn check(cli: &Cli) -> Result<Checked, Failure> {
    check_name("candidate", &cli.candidate).map_err(|e| format!("--candidate: {e}"))?;
    match cli.store {
        StoreKind::Memory if !cli.endpoints.is_empty() => {
            return Err("--endpoints is for --store etcd".into())
        }
        StoreKind::Memory if cli.lease_ttl_secs.is_some() => {
            return Err("--lease-ttl-secs is for --store etcd".into())
        }
        StoreKind::Etcd if cli.endpoints.is_empty() => return Err("--store etcd needs --endpoints".into()),
        StoreKind::Memory if cli.consistency == Mode::Exclusive => {
            return Err(
                "--consistency exclusive needs --store etcd (exclusive mode runs on etcd's leases)".into()
            )
        }
        _ => {}
    }
    let mode = match &cli.job {
        Some(job) => check_job(cli, job)?,
        None => {
            if cli.store == StoreKind::Etcd && cli.specs_dir.is_some() {
                return Err(
                    "--specs-dir is for --store memory (on etcd the specs are kept beside the assignments)"
                        .into(),
                );
            }
            if cli.store == StoreKind::Memory && cli.specs_dir.is_none() {
                return Err("--fleet with --store memory needs --specs-dir (where its job specs are)".into());
            }
            if let Some(name) = &cli.candidate.contains('/').then_some(&cli.candidate) {
                return Err(format!("--candidate {name:?}: an instance's name has no '/'").into());
            }
            Serving::Fleet
        }
    };
    let tls = check_tls(cli)?;
    let etcd_access = check_etcd_access(cli)?;
    Ok(Checked { mode, tls, etcd_access })
}

/// Checks `--job`'s options and makes its spec.
fn check_job(cli: &Cli, job: &str) -> Result<Serving, Failure> {
    check_name("job", job).map_err(|e| format!("--job: {e}"))?;
    let spec = match &cli.spec {
        None => None,
        Some(path) => {
            let text =
                std::fs::read_to_string(path).map_err(|e| format!("--spec {}: {e}", path.display()))?;
            let spec: JobSpec =
                serde_json::from_str(&text).map_err(|e| format!("--spec {}: {e}", path.display()))?;
            Some(spec)
        }
    };
    let assigner: Box<dyn Assigner + Send + Sync> = match (&spec, cli.algorithm.as_str()) {
        // The spec's goals configure weighted-move (its suppression threshold and budget).
        (Some(spec), "weighted-move") => Box::new(
            WeightedMove::new(spec.weighted_move(WeightedMoveConfig::default()))
                .map_err(|e| format!("--spec: {e}"))?,
        ),
        _ => by_name(&cli.algorithm).ok_or_else(|| {
            format!("--algorithm: unknown algorithm {:?}: one of {}", cli.algorithm, NAMES.join(", "))
        })?,
    };
    let tasks = match cli.tasks {
        // Checked before the task set is built: `Tasks` would list every task first.
        Some(n) if n == 0 || n > MAX_TASK + 1 => {
            return Err(format!("--tasks {n}: it must be 1 to {} (tasks 0..TASKS)", MAX_TASK + 1).into())
        }
        Some(n) => Some(Tasks::serving(0..n)?),
        None => None,
    };
    if cli.dns.as_deref() == Some("") {
        return Err("--dns: a name to resolve, e.g. users.prod.svc.cluster.local.".into());
    }
    let replicas =
        ReplicaLimits::new(1, cli.max_replicas.unwrap_or(1)).map_err(|e| format!("--max-replicas: {e}"))?;
    let mut config = AssignerConfig {
        cadence: Duration::from_millis(cli.cadence_ms),
        replicas,
        consistency: cli.consistency.into(),
        ..AssignerConfig::default()
    };
    if let Some(spec) = &spec {
        config = config.with_spec(spec);
    }
    config.validate().map_err(|e| match e.field {
        "cadence" => format!("--cadence-ms: {e}"),
        "replicas" if spec.is_none() => format!("--max-replicas with --consistency exclusive: {e}"),
        _ => format!("--spec: {e}"),
    })?;
    // The first run's assignment (every task serving, no load reported yet) must fit in the
    // store, or every write would be refused: the slices grow with the tasks. (A job that
    // discovery gives is not known yet: an assignment too large is refused by the store
    // and counted as the Assigner's error.)
    let mut infeasible = None;
    if let Some(tasks) = &tasks {
        let load = estimate(&[], &[], None, &tasks.serving_ids());
        let profiled = profile_tasks(&config.task_rules, tasks.clone())?;
        let first = assigner
            .assign(&RunInput {
                previous: None,
                tasks: &profiled,
                load: &load,
                replicas: config.replicas,
                placement: &config.placement,
            })
            .map_err(|e| format!("--algorithm {}: its first run failed: {e}", cli.algorithm))?;
        // An infeasible placement is not refused (the tasks that would meet it may come):
        // the Assigner publishes the best assignment it can and says what it misses.
        if let Some(why) = &first.report.infeasible {
            eprintln!(
                "steady-slicer: warning: --spec: {why}; the best assignment the tasks allow is published"
            );
        }
        infeasible.clone_from(&first.report.infeasible);
        let bytes = first.assignment.encode().len();
        if bytes > MAX_ASSIGNMENT_BYTES {
            return Err(format!(
                "--tasks {} with --algorithm {}: the first assignment has {} slices, {bytes} bytes encoded, above \
                 the store's limit of {MAX_ASSIGNMENT_BYTES}; use fewer tasks or another algorithm",
                cli.tasks.unwrap_or_default(),
                cli.algorithm,
                first.assignment.slices().len()
            )
            .into());
        }
    }
    let source = match (cli.tasks, &cli.dns) {
        (Some(n), _) => TaskSource::Count(n),
        (None, Some(name)) => TaskSource::Dns(name.clone()),
        (None, None) => TaskSource::Registry { endpoints: cli.registry.clone() },
    };
    let mut job = JobConfig::new(job, source);
    job.algorithm.clone_from(&cli.algorithm);
    job.cadence = config.cadence;
    job.consistency = config.consistency;
    job.lease_ttl = Duration::from_secs(cli.lease_ttl_secs.unwrap_or(5));
    job.spec = spec.unwrap_or_else(|| JobSpec { replicas, ..JobSpec::default() });
    // What the checks above leave (a registry endpoint that is no URL, say).
    job.validate().map_err(|e| format!("--job {}: {e}", job.job))?;
    Ok(Serving::Job { config: Box::new(job), infeasible })
}

/// How to reach etcd, for the store and the registry alike: files read now, so that a
/// missing or unreadable one is one line before anything starts; the flags only with
/// `--store etcd` or `--registry` (an etcd to reach), and in pairs.
fn check_etcd_access(cli: &Cli) -> Result<EtcdAccess, Failure> {
    if cli.store != StoreKind::Etcd && cli.registry.is_empty() {
        if let Some(flag) = cli.etcd.first_given() {
            return Err(format!("{flag} is for --store etcd or --registry (an etcd to reach)").into());
        }
        return Ok(EtcdAccess::new());
    }
    Ok(cli.etcd.access()?)
}

/// The serving TLS options: files read and parsed now, so that a missing or unreadable
/// file (or one that holds no certificate or key, or a key that is not the
/// certificate's) is one line before anything starts.
fn check_tls(cli: &Cli) -> Result<ServingTls, Failure> {
    if !(10..=3_600_000).contains(&cli.tls_reload_ms) {
        return Err(format!("--tls-reload-ms {}: it must be 10 to 3,600,000", cli.tls_reload_ms).into());
    }
    let (cert, key) = match (&cli.tls_cert, &cli.tls_key) {
        (Some(cert), Some(key)) => (cert.clone(), key.clone()),
        (None, None) => {
            if cli.tls_client_ca.is_some() {
                return Err("--tls-client-ca needs --tls-cert and --tls-key".into());
            }
            if cli.require_client_cert {
                return Err("--require-client-cert needs --tls-client-ca".into());
            }
            return Ok(ServingTls { server: None, reporters: None });
        }
        (Some(_), None) => return Err("--tls-cert needs --tls-key".into()),
        (None, Some(_)) => return Err("--tls-key needs --tls-cert".into()),
    };
    let mut reporters = None;
    match &cli.tls_client_ca {
        Some(_) => {
            let names =
                ReporterNames::pattern(&cli.reporter_names).map_err(|e| format!("--reporter-names: {e}"))?;
            reporters = Some(names);
        }
        None if cli.require_client_cert => return Err("--require-client-cert needs --tls-client-ca".into()),
        None => {}
    }
    let client_auth = if cli.require_client_cert { ClientAuth::Required } else { ClientAuth::Optional };
    let files = TlsFiles { cert, key, client_ca: cli.tls_client_ca.clone(), client_auth };
    let server = ReloadingTls::load(files)?;
    // Built once here, so that a provider without a safe protocol version fails now.
    server.server_config().map_err(|e| format!("--tls-cert/--tls-key: {e}"))?;
    Ok(ServingTls { server: Some(server), reporters })
}

/// Keeps the serving TLS in line with its files: reads them every `period` and on each
/// of `hangups` (SIGHUP), logging each change taken or refused; a SIGHUP also reads a
/// fleet's spec directory again (`specs`). Never ends; an error reading a file is a
/// refusal, logged, and the material in force stays.
async fn reload_tls(
    mut tls: ReloadingTls,
    period: Duration,
    mut hangups: Option<tokio::signal::unix::Signal>,
    specs: Option<SpecStore>,
) {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await; // The first tick is now: the files were just read.
    loop {
        let (signals_ended, hung_up) = {
            let hangup = async {
                match hangups.as_mut() {
                    Some(signals) => signals.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = tick.tick() => (false, false),
                received = hangup => (received.is_none(), received.is_some()),
            }
        };
        if let (true, Some(specs)) = (hung_up, &specs) {
            specs.reload();
        }
        if signals_ended {
            // No more SIGHUPs can come (the runtime's signal driver is gone): the period
            // goes on alone rather than reading the files in a loop.
            hangups = None;
        }
        // Small files, read off the runtime's threads. A panic in the check (none is
        // known) is caught there: the material in force stays and the reading goes on.
        let checked = tokio::task::spawn_blocking(move || {
            let events = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| tls.check()));
            (tls, events)
        })
        .await;
        match checked {
            Ok((checked, Ok(events))) => {
                tls = checked;
                for event in events {
                    eprintln!("steady-slicer: {event}");
                }
            }
            Ok((checked, Err(_))) => {
                tls = checked;
                eprintln!(
                    "steady-slicer: TLS: reading the files failed; still serving with the material in force"
                );
            }
            // The closure catches its panics, so the task is not lost unless the runtime
            // shuts down.
            Err(error) => {
                eprintln!(
                    "steady-slicer: TLS: the reloading stopped ({error}); serving with the material in force"
                );
                return;
            }
        }
    }
}

/// Checks that `--registry` or `--dns` answers for `job`, so that a source that cannot be
/// read is one line before anything else happens (the fleet then follows it, retrying).
/// The registry is reached with `access`, the store's own settings.
async fn check_backend_source(cli: &Cli, job: &str, access: &EtcdAccess) -> Result<(), Failure> {
    if let Some(name) = &cli.dns {
        // The port is not used: the Assigner needs the tasks' indices and states only.
        dns::discover(dns::DnsConfig::new(name.clone(), 1))
            .await
            .map_err(|e| format!("--dns {name}: {e}"))?;
    } else if !cli.registry.is_empty() {
        let config = registry::RegistryConfig::new(cli.registry.clone()).access(access.clone());
        let etcd = registry::Registry::connect(config).await.map_err(|e| format!("--registry: {e}"))?;
        registry::watch_job(&etcd, job).await.map_err(|e| format!("--registry: {e}"))?;
    }
    Ok(())
}

/// The store, and its etcd connection when it is on etcd.
async fn connect_store(
    cli: &Cli,
    access: EtcdAccess,
) -> Result<(Arc<dyn AssignmentStore>, Option<EtcdStore>), Failure> {
    Ok(match cli.store {
        StoreKind::Memory => (Arc::new(MemoryStore::new()), None),
        StoreKind::Etcd => {
            let ttl = Duration::from_secs(cli.lease_ttl_secs.unwrap_or(5));
            // A fleet instance leads many jobs: one session lease for all its elections.
            let config =
                EtcdConfig::new(cli.endpoints.clone()).lease_ttl(ttl).access(access).session_lease(cli.fleet);
            let etcd = EtcdStore::connect(config).await?;
            (Arc::new(etcd.clone()), Some(etcd))
        }
    })
}

async fn run(cli: Cli, checked: Checked) -> Result<(), Failure> {
    let Checked { mode, tls, etcd_access } = checked;
    // SIGHUP reloads the TLS files (and a fleet's spec directory): taken over first, so
    // that a SIGHUP sent once the process has said where it serves never ends it (the
    // signal's default).
    let hangups = if tls.server.is_some() || cli.specs_dir.is_some() {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(signals) => Some(signals),
            Err(error) => {
                eprintln!("steady-slicer: warning: SIGHUP cannot reload the TLS files or specs ({error}); they are still read on their period");
                None
            }
        }
    } else {
        None
    };
    // The backend job, first: a source that cannot be read is one line before anything
    // else happens.
    if let Serving::Job { config, .. } = &mode {
        check_backend_source(&cli, &config.job, &etcd_access).await?;
    }
    let (store, etcd) = connect_store(&cli, etcd_access.clone()).await?;
    // Bind first: a process that cannot serve must not campaign (and then lead).
    let listener = tokio::net::TcpListener::bind(cli.listen).await?;
    let bound = listener.local_addr()?;
    if tls.reporters.is_none() {
        eprintln!(
            "steady-slicer: warning: load reports are unauthenticated: any peer that reaches {bound} may report \
             load for any task (serve with --tls-cert, --tls-key and --tls-client-ca to accept reports only \
             from the task a client certificate names)",
        );
    }
    let pages = match cli.metrics_listen {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr).await.map_err(|e| format!("--metrics-listen {addr}: {e}"))?,
        ),
        None => None,
    };
    let distributor = Distributor::new();
    let book = LoadBook::new();
    let me = Instance {
        address: cli.advertise.clone().unwrap_or_else(|| bound.to_string()),
        pages: pages.as_ref().map(|p| p.local_addr()).transpose()?.map(|a| advertised_pages(&cli, a)),
    };
    let names = EndpointNames::new();
    let fleet = Fleet::new(&cli.candidate, me.clone(), store, distributor.clone(), book.clone())
        .registry_access(etcd_access)
        .endpoint_names(names.clone())
        .on_event(|event| eprintln!("steady-slicer: {event}"));
    let mut membership = None;
    let mut specs = None;
    let (fleet, single) = match mode {
        Serving::Job { config, infeasible } => {
            let (job, consistency) = (config.job.clone(), config.consistency);
            println!(
                "steady-slicer: job {job} on {bound} ({:?} store), candidate {}, {consistency}",
                cli.store, cli.candidate,
            );
            let cadence = config.cadence;
            (fleet.jobs(vec![*config]), Some((job, cadence, consistency, infeasible)))
        }
        Serving::Fleet => {
            let fleet = match (&etcd, &cli.specs_dir) {
                (Some(etcd), _) => {
                    let keys = EtcdFleet::new(etcd);
                    membership =
                        Some(keys.join(&cli.candidate, &me).await.map_err(|e| format!("--candidate: {e}"))?);
                    fleet
                        .specs(SpecStore::Etcd(EtcdSpecs::of(etcd)))
                        .members(keys.watch_instances())
                        .run_requests(keys.watch_run_requests())
                }
                (None, Some(dir)) => {
                    let directory = SpecDirectory::open(dir, Duration::from_secs(1))
                        .map_err(|e| format!("--specs-dir {}: {e}", dir.display()))?;
                    let store = SpecStore::Directory(directory);
                    specs = Some(store.clone());
                    fleet.specs(store)
                }
                (None, None) => unreachable!("checked: a memory fleet has --specs-dir"),
            };
            println!(
                "steady-slicer: fleet instance {} on {bound} ({:?} store), advertised as {}",
                cli.candidate, cli.store, me.address,
            );
            (fleet, None)
        }
    };
    let fleet = fleet.spawn();
    // A119 streams may name any job with a spec, published yet or not. Clients' load
    // reports go to the book, beside the Slicelets'.
    let specified = fleet.status();
    let autosharding = Autosharding::new(distributor.clone())
        .with_client_load(book.clone())
        .with_endpoint_names(names)
        .with_known_jobs(move |job| specified.borrow().jobs.contains_key(job));
    let mut collector = LoadCollector::new(book.clone());
    if let Some(names) = tls.reporters {
        collector = collector.authorize_reporters(names);
    }
    if let Some(pages) = pages {
        let store = match cli.store {
            StoreKind::Memory => "memory".to_owned(),
            StoreKind::Etcd => format!("etcd at {}", cli.endpoints.join(", ")),
        };
        serve_pages(pages, &cli.candidate, store, &distributor, &autosharding, &collector, fleet.status())?;
    }
    let router = tonic::transport::Server::builder()
        .add_service(distributor.service())
        .add_service(autosharding.service())
        .add_service(collector.service());
    let server: std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<(), tonic::transport::Error>> + Send>,
    > = match tls.server {
        // TLS through a listener of our own, whose certificate and client CA are
        // replaced as the files change (tonic's own TLS is fixed once built).
        Some(files) => {
            let config = files.server_config()?;
            tokio::spawn(reload_tls(files, Duration::from_millis(cli.tls_reload_ms), hangups, specs));
            Box::pin(router.serve_with_incoming(TlsIncoming::new(listener, config)))
        }
        None => {
            if let Some(specs) = specs {
                tokio::spawn(reload_specs(specs, hangups));
            }
            Box::pin(router.serve_with_incoming(
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            ))
        }
    };
    let status = async {
        match &single {
            Some((job, cadence, consistency, infeasible)) => {
                job_status(&fleet, &distributor, &book, job, *cadence, *consistency, infeasible.clone()).await
            }
            None => fleet_status(&fleet, &book).await,
        }
    };
    // Ctrl-C or SIGTERM (systemd's, Kubernetes' stop): resign and leave before exiting.
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signals) => {
                signals.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    let outcome: Result<(), Failure> = tokio::select! {
        served = server => served.map_err(Into::into),
        () = status => Err("the fleet's control task stopped".into()),
        _ = tokio::signal::ctrl_c() => Ok(()),
        () = terminate => Ok(()),
    };
    // Resign every job led here, so that the next owners lead at once; then leave.
    fleet.stop().await;
    if let Some(membership) = membership {
        membership.leave().await;
    }
    outcome?;
    Ok(())
}

/// Where the pages bound at `bound` are reached: on `--advertise`'s host when it is given
/// (the instance is reached there), else at the bound address.
fn advertised_pages(cli: &Cli, bound: SocketAddr) -> String {
    match cli.advertise.as_deref().and_then(|a| a.rsplit_once(':')) {
        Some((host, _)) => format!("{host}:{}", bound.port()),
        None => bound.to_string(),
    }
}

/// The status pages (`--metrics-listen`), served on `listener`.
fn serve_pages(
    listener: tokio::net::TcpListener,
    instance: &str,
    store: String,
    distributor: &Distributor,
    autosharding: &Autosharding,
    collector: &LoadCollector,
    fleet: watch::Receiver<Arc<FleetStatus>>,
) -> Result<(), Failure> {
    let registry = MetricsRegistry::new();
    let meter = registry.meter();
    distributor.observe_metrics(&meter);
    autosharding.observe_metrics(&meter);
    collector.observe_metrics(&meter);
    steady_slicer_server::status::observe_fleet(&meter, fleet.clone(), instance);
    let sources = StatusSources {
        instance: instance.to_owned(),
        store,
        distributor: distributor.clone(),
        collector: collector.clone(),
        fleet,
        autosharding: Some(autosharding.clone()),
    };
    println!("steady-slicer: status page http://{0}/ and metrics http://{0}/metrics", listener.local_addr()?);
    tokio::spawn(async move {
        if let Err(error) = StatusServer::new(sources, registry).serve(listener).await {
            eprintln!("steady-slicer: the status pages stopped: {error}");
        }
    });
    Ok(())
}

/// Reads the spec directory again at once on each SIGHUP (without TLS files to reload).
async fn reload_specs(specs: SpecStore, mut hangups: Option<tokio::signal::unix::Signal>) {
    let Some(signals) = hangups.as_mut() else { return };
    while signals.recv().await.is_some() {
        specs.reload();
    }
}

/// A line per cadence (at most one a second) on one job: its generation, its Assigner's
/// counters here, the reports. Ends when the fleet's control task does.
async fn job_status(
    fleet: &FleetHandle,
    distributor: &Distributor,
    book: &LoadBook,
    job: &str,
    cadence: Duration,
    consistency: Consistency,
    infeasible: Option<steady_assigner::Infeasible>,
) {
    let mut tick = tokio::time::interval(cadence.max(Duration::from_secs(1)));
    // Already warned about at the check (with --tasks).
    let mut last_infeasible = infeasible;
    let status = fleet.status();
    loop {
        tick.tick().await;
        if !fleet.is_running() {
            return;
        }
        let stats = status.borrow().jobs.get(job).and_then(|j| j.assigner.clone());
        let s = stats.unwrap_or_default();
        let placement = s.placement();
        // The reason a spec cannot be met, once each time it changes (the Assigner's
        // own log line goes to tracing, which this binary does not print).
        if placement.infeasible != last_infeasible {
            match &placement.infeasible {
                Some(why) => eprintln!(
                    "steady-slicer: warning: --spec: {why}; the best assignment the tasks allow is published"
                ),
                None if last_infeasible.is_some() => {
                    eprintln!("steady-slicer: the placement can be met again")
                }
                None => {}
            }
            last_infeasible.clone_from(&placement.infeasible);
        }
        let missed: String =
            placement.violations.iter().map(|v| format!(" violated {} {}", v.constraint, v.slices)).collect();
        let recalls = match consistency {
            Consistency::Exclusive => {
                format!(" recalls {} pending {}", s.recalls(), u8::from(s.recall_pending()))
            }
            Consistency::Eventual => String::new(),
        };
        println!(
            "generation {} published {} runs {} leading-terms {} conflicts {} errors {} reports accepted {} dropped {}{recalls}{missed}",
            distributor.current(job).map_or(0, |a| a.generation()),
            s.published(),
            s.runs(),
            s.terms(),
            s.conflicts(),
            s.errors(),
            book.accepted(),
            book.dropped(),
        );
    }
}

/// A line every 10 seconds on a fleet instance: the jobs, those whose Assigner runs and
/// leads here, the live instances, the reports. Ends when the control task does.
async fn fleet_status(fleet: &FleetHandle, book: &LoadBook) {
    let mut tick = tokio::time::interval(Duration::from_secs(10));
    let status = fleet.status();
    loop {
        tick.tick().await;
        if !fleet.is_running() {
            return;
        }
        let now = status.borrow().clone();
        let here = now.jobs.values().filter(|j| j.assigner.is_some()).count();
        let leading =
            now.jobs.values().filter(|j| j.assigner.as_ref().is_some_and(|s| s.is_leading())).count();
        println!(
            "jobs {} here {here} leading {leading} instances {} reports accepted {} dropped {}",
            now.jobs.len(),
            now.instances.len(),
            book.accepted(),
            book.dropped(),
        );
    }
}
