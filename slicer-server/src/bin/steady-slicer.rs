//! `steady-slicer`: one job's Assigner and Distributor, against an assignment store.
//!
//! ```text
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
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::error::ErrorKind;
use clap::{CommandFactory, FromArgMatches, Parser, ValueEnum};
use futures_util::StreamExt;
use steady_assigner::{
    by_name, profile_tasks, Assigner, JobSpec, ReplicaLimits, RunInput, Tasks, WeightedMove,
    WeightedMoveConfig, NAMES,
};
use steady_discovery::{dns, registry, Discovery};
use steady_proto::tls::{ClientAuth, TlsIncoming};
use steady_slice::guard::Consistency;
use steady_slice::MAX_TASK;
use steady_slicer::assigner_service::{estimate, follow_job, AssignerConfig, AssignerService};
use steady_slicer::fleet::Instance;
use steady_slicer::load::{LoadBook, LoadCollector, ReporterNames};
use steady_slicer::specs::{JobConfig, TaskSource};
use steady_slicer::store::{
    check_name, AssignmentStore, EtcdAccess, EtcdConfig, EtcdStore, EtcdTls, MemoryStore,
    MAX_ASSIGNMENT_BYTES,
};
use steady_slicer::Distributor;
use steady_slicer_server::fleet::FleetStatus;
use steady_slicer_server::status::{observe_fleet, MetricsRegistry, StatusServer, StatusSources};
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

/// Run one job's Assigner and Distributor against an assignment store.
#[derive(Debug, Parser)]
#[command(name = "steady-slicer", version, about)]
#[command(group = clap::ArgGroup::new("backends").required(true).multiple(false))]
struct Cli {
    /// The backend job.
    #[arg(long)]
    job: String,
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
    /// This Assigner's name in the election.
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
    /// Connect to etcd (the store and the registry) over TLS, trusting this CA (PEM).
    #[arg(long, value_name = "FILE")]
    etcd_ca: Option<PathBuf>,
    /// Present this client certificate to etcd (PEM; with `--etcd-key` and `--etcd-ca`).
    #[arg(long, value_name = "FILE")]
    etcd_cert: Option<PathBuf>,
    /// The private key of `--etcd-cert` (PEM).
    #[arg(long, value_name = "FILE")]
    etcd_key: Option<PathBuf>,
    /// Log in to etcd (the store and the registry) as this user (with
    /// `--etcd-password-file`).
    #[arg(long, value_name = "USER")]
    etcd_user: Option<String>,
    /// The password of `--etcd-user`: the file's first line.
    #[arg(long, value_name = "FILE")]
    etcd_password_file: Option<PathBuf>,

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
    /// Why the spec cannot be met by the `--tasks` given (warned about at the check).
    infeasible: Option<steady_assigner::Infeasible>,
    assigner: Box<dyn Assigner + Send + Sync>,
    /// With `--tasks`; `None` when discovery gives the tasks.
    tasks: Option<Tasks>,
    config: AssignerConfig,
    tls: ServingTls,
    /// How to reach etcd: the store (with `--store etcd`) and the registry (`--registry`).
    etcd_access: EtcdAccess,
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
    check_name("job", &cli.job).map_err(|e| format!("--job: {e}"))?;
    check_name("candidate", &cli.candidate).map_err(|e| format!("--candidate: {e}"))?;
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
        let load = estimate(&[], None, &tasks.serving_ids());
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
    let tls = check_tls(cli)?;
    let etcd_access = check_etcd_access(cli)?;
    Ok(Checked { infeasible, assigner, tasks, config, tls, etcd_access })
}

/// How to reach etcd, for the store and the registry alike: files read now, so that a
/// missing or unreadable one is one line before anything starts; the flags only with
/// `--store etcd` or `--registry` (an etcd to reach), and in pairs.
fn check_etcd_access(cli: &Cli) -> Result<EtcdAccess, Failure> {
    let given = [
        ("--etcd-ca", cli.etcd_ca.is_some()),
        ("--etcd-cert", cli.etcd_cert.is_some()),
        ("--etcd-key", cli.etcd_key.is_some()),
        ("--etcd-user", cli.etcd_user.is_some()),
        ("--etcd-password-file", cli.etcd_password_file.is_some()),
    ];
    if cli.store != StoreKind::Etcd && cli.registry.is_empty() {
        if let Some((flag, _)) = given.iter().find(|(_, given)| *given) {
            return Err(format!("{flag} is for --store etcd or --registry (an etcd to reach)").into());
        }
        return Ok(EtcdAccess::new());
    }
    let mut access = EtcdAccess::new();
    match (&cli.etcd_ca, &cli.etcd_cert, &cli.etcd_key) {
        (None, None, None) => {}
        (Some(ca), cert, key) => {
            let mut tls = EtcdTls::new(read("--etcd-ca", ca)?);
            match (cert, key) {
                (Some(cert), Some(key)) => {
                    tls = tls.identity(read("--etcd-cert", cert)?, read("--etcd-key", key)?);
                }
                (None, None) => {}
                (Some(_), None) => return Err("--etcd-cert needs --etcd-key".into()),
                (None, Some(_)) => return Err("--etcd-key needs --etcd-cert".into()),
            }
            access = access.tls(tls);
        }
        (None, _, _) => return Err("--etcd-cert and --etcd-key need --etcd-ca (TLS to etcd)".into()),
    }
    match (&cli.etcd_user, &cli.etcd_password_file) {
        (Some(user), Some(file)) => {
            let password = String::from_utf8(read("--etcd-password-file", file)?)
                .map_err(|_| format!("--etcd-password-file {}: not UTF-8", file.display()))?;
            let password = password.lines().next().unwrap_or_default();
            if password.is_empty() {
                return Err(
                    format!("--etcd-password-file {}: the first line is empty", file.display()).into()
                );
            }
            access = access.user(user.as_str(), password);
        }
        (None, None) => {}
        (Some(_), None) => return Err("--etcd-user needs --etcd-password-file".into()),
        (None, Some(_)) => return Err("--etcd-password-file needs --etcd-user".into()),
    }
    Ok(access)
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
/// of `hangups` (SIGHUP), logging each change taken or refused. Never ends; an error
/// reading a file is a refusal, logged, and the material in force stays.
async fn reload_tls(
    mut tls: ReloadingTls,
    period: Duration,
    mut hangups: Option<tokio::signal::unix::Signal>,
) {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await; // The first tick is now: the files were just read.
    loop {
        let signals_ended = {
            let hangup = async {
                match hangups.as_mut() {
                    Some(signals) => signals.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = tick.tick() => false,
                received = hangup => received.is_none(),
            }
        };
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

/// The contents of the file `flag` names, or one line saying why not.
fn read(flag: &str, path: &Path) -> Result<Vec<u8>, Failure> {
    std::fs::read(path).map_err(|e| format!("{flag} {}: {e}", path.display()).into())
}

/// The Assigner's task set: `--tasks` (with the sender that keeps it), or discovery's view
/// of the job (with the source that keeps it running). The registry is reached with
/// `access`, the store's own settings.
async fn backend_job(
    cli: &Cli,
    tasks: Option<Tasks>,
    access: &EtcdAccess,
) -> Result<(Option<watch::Sender<Tasks>>, Option<Discovery>, watch::Receiver<Tasks>), Failure> {
    if let Some(tasks) = tasks {
        let (fixed, rx) = watch::channel(tasks);
        return Ok((Some(fixed), None, rx));
    }
    let discovery = if let Some(name) = &cli.dns {
        // The port is not used: the Assigner needs the tasks' indices and states only.
        dns::discover(dns::DnsConfig::new(name.clone(), 1)).await.map_err(|e| format!("--dns {name}: {e}"))?
    } else {
        let config = registry::RegistryConfig::new(cli.registry.clone()).access(access.clone());
        let etcd = registry::Registry::connect(config).await.map_err(|e| format!("--registry: {e}"))?;
        registry::watch_job(&etcd, &cli.job).await.map_err(|e| format!("--registry: {e}"))?
    };
    let tasks = follow_job(discovery.views());
    Ok((None, Some(discovery), tasks))
}

async fn run(cli: Cli, checked: Checked) -> Result<(), Failure> {
    let Checked { infeasible, assigner, tasks, config, tls, etcd_access } = checked;
    // SIGHUP reloads the TLS files: taken over first, so that a SIGHUP sent once the
    // process has said where it serves never ends it (the signal's default).
    let hangups = match &tls.server {
        Some(_) => match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(signals) => Some(signals),
            Err(error) => {
                eprintln!("steady-slicer: warning: SIGHUP cannot reload the TLS files ({error}); they are still read every --tls-reload-ms");
                None
            }
        },
        None => None,
    };
    // The backend job: fixed, or followed through discovery (kept for as long as the
    // process runs: dropping a discovery source stops it). First: a source that cannot be
    // read is one line before anything else happens.
    let (_fixed, _discovery, tasks_rx) = backend_job(&cli, tasks, &etcd_access).await?;
    let store: Arc<dyn AssignmentStore> = match cli.store {
        StoreKind::Memory => Arc::new(MemoryStore::new()),
        StoreKind::Etcd => {
            let ttl = Duration::from_secs(cli.lease_ttl_secs.unwrap_or(5));
            let config = EtcdConfig::new(cli.endpoints.clone()).lease_ttl(ttl).access(etcd_access);
            Arc::new(EtcdStore::connect(config).await?)
        }
    };
    // Bind first: a process that cannot serve must not campaign (and then lead).
    let listener = tokio::net::TcpListener::bind(cli.listen).await?;
    if tls.reporters.is_none() {
        eprintln!(
            "steady-slicer: warning: load reports are unauthenticated: any peer that reaches {} may report \
             load for any task (serve with --tls-cert, --tls-key and --tls-client-ca to accept reports only \
             from the task a client certificate names)",
            listener.local_addr()?
        );
    }
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
    let pages_tasks = tasks_rx.clone();
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
        "steady-slicer: job {} on {} ({:?} store), candidate {}, {}",
        cli.job,
        listener.local_addr()?,
        cli.store,
        cli.candidate,
        config.consistency,
    );
    let mut collector = LoadCollector::new(book.clone());
    if let Some(names) = tls.reporters {
        collector = collector.authorize_reporters(names);
    }
    if let Some(addr) = cli.metrics_listen {
        let registry = MetricsRegistry::new();
        let meter = registry.meter();
        distributor.observe_metrics(&meter);
        collector.observe_metrics(&meter);
        let store = match cli.store {
            StoreKind::Memory => "memory".to_owned(),
            StoreKind::Etcd => format!("etcd at {}", cli.endpoints.join(", ")),
        };
        let pages =
            tokio::net::TcpListener::bind(addr).await.map_err(|e| format!("--metrics-listen {addr}: {e}"))?;
        // A fleet of this one instance and its one job (the service and its statistics
        // live as long as the process, so the status never changes).
        let source = match (cli.tasks, &cli.dns) {
            (Some(n), _) => TaskSource::Count(n),
            (None, Some(name)) => TaskSource::Dns(name.clone()),
            (None, None) => TaskSource::Registry { endpoints: cli.registry.clone() },
        };
        let mut job = JobConfig::new(&cli.job, source);
        job.algorithm.clone_from(&cli.algorithm);
        job.consistency = config.consistency;
        let record = Instance {
            address: listener.local_addr()?.to_string(),
            pages: Some(format!("http://{}", pages.local_addr()?)),
        };
        let fleet = FleetStatus::one_job(&cli.candidate, record, job, service.shared_stats(), pages_tasks);
        let fleet_rx = watch::channel(Arc::new(fleet)).1;
        observe_fleet(&meter, fleet_rx.clone(), &cli.candidate);
        let sources = StatusSources {
            instance: cli.candidate.clone(),
            store,
            distributor: distributor.clone(),
            collector: collector.clone(),
            fleet: fleet_rx,
        };
        println!(
            "steady-slicer: status page http://{0}/ and metrics http://{0}/metrics",
            pages.local_addr()?
        );
        tokio::spawn(async move {
            if let Err(error) = StatusServer::new(sources, registry).serve(pages).await {
                eprintln!("steady-slicer: the status pages stopped: {error}");
            }
        });
    }
    let router = tonic::transport::Server::builder()
        .add_service(distributor.service())
        .add_service(collector.service());
    let server: std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<(), tonic::transport::Error>> + Send>,
    > = match tls.server {
        // TLS through a listener of our own, whose certificate and client CA are
        // replaced as the files change (tonic's own TLS is fixed once built).
        Some(files) => {
            let config = files.server_config()?;
            tokio::spawn(reload_tls(files, Duration::from_millis(cli.tls_reload_ms), hangups));
            Box::pin(router.serve_with_incoming(TlsIncoming::new(listener, config)))
        }
        None => Box::pin(router.serve_with_incoming(
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
        )),
    };
    let status = async {
        // At most one line a second, whatever the cadence.
        let mut tick = tokio::time::interval(config.cadence.max(Duration::from_secs(1)));
        // Already warned about at the check (with --tasks).
        let mut last_infeasible = infeasible;
        loop {
            tick.tick().await;
            if !service.is_running() {
                return;
            }
            let s = service.stats();
            let placement = s.placement();
            // The reason a spec cannot be met, once each time it changes (the Assigner's
            // own log line goes to tracing, which this binary does not print).
            if placement.infeasible != last_infeasible {
                match &placement.infeasible {
                    Some(why) => eprintln!("steady-slicer: warning: --spec: {why}; the best assignment the tasks allow is published"),
                    None if last_infeasible.is_some() => eprintln!("steady-slicer: the placement can be met again"),
                    None => {}
                }
                last_infeasible.clone_from(&placement.infeasible);
            }
            let missed: String = placement
                .violations
                .iter()
                .map(|v| format!(" violated {} {}", v.constraint, v.slices))
                .collect();
            let recalls = match config.consistency {
                Consistency::Exclusive => {
                    format!(" recalls {} pending {}", s.recalls(), u8::from(s.recall_pending()))
                }
                Consistency::Eventual => String::new(),
            };
            println!(
                "generation {} published {} runs {} leading-terms {} conflicts {} errors {} reports accepted {} dropped {}{recalls}{missed}",
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
