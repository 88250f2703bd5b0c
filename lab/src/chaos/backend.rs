//! `steady-lab chaos-backend` (hidden): one backend task of the chaos soak, in a process
//! of its own so that the schedule can kill it (SIGKILL) and stall it (SIGSTOP).
//!
//! A tonic echo server behind its Slicelet's layer (misroutes are served and counted, the
//! default), registered in the etcd registry at its fixed index `--task` (a StatefulSet
//! ordinal: a restarted task takes its index back at once, overwriting its dead
//! predecessor's key), following the assignments of every `steady-slicer` instance
//! (`watch_assignments_any`: whichever has the newest) and reporting its load to each of
//! them (a standby drops the reports until it leads, but its streams are open already
//! when it takes over).
//!
//! It talks to the lab over its standard streams. It prints `ready addr=A` once it
//! serves and is registered, then `beat gen=G reports=R state=S` every 250 ms (the
//! generation it holds, the load reports its reporters sent, `serving` or `draining`);
//! it reads commands, one a line, on stdin: `drain`, `undrain`, and `rotate`. It
//! ends when stdin closes (the lab is gone) or its stdout does. A registration that etcd
//! lost (its lease lapsed while the task was stalled, say) is taken back
//! (`Registration::reclaim`), keeping its state.
//!
//! With `--tls-dir` it runs on mutual TLS with the files the lab writes there
//! (`super::pki`): it serves with its certificate (`<job>-<task>.pem`), requires a client
//! certificate of the bundle (`ca.pem`), and presents its certificate to the instances
//! (the Watch and the load reports, which accept reports only from the task it names).
//! `rotate` reads the files again: the next handshakes, served or made, use them; the
//! connections open keep theirs. It answers `done rotate`, or `failed rotate: why` with
//! the material in force kept. On a plaintext fleet `rotate` has nothing to do.

use std::io::{BufRead, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use steady_core::Backoff;
use steady_discovery::registry::{Registration, Registry, RegistryConfig, RegistryError};
use steady_proto::tls::rustls::server::danger::ClientCertVerifier;
use steady_proto::tls::{server_config, ClientAuth, ClientCas, ClientTlsSource, ServerIdentity, TlsIncoming};
use steady_proto::WatchEndpoint;
use steady_slicelet::Slicelet;
use steady_testing::echo::echo_server::EchoServer;
use steady_testing::echo::EchoTask;
use steady_testing::loopback::Loopback;
use tokio::sync::mpsc;
use tonic::transport::{Endpoint, Server};

use super::pki;
use crate::LabResult;

/// How often the task says it is alive.
const BEAT: Duration = Duration::from_millis(250);
/// How long it keeps trying to register at start (etcd may be missing a member).
const REGISTER_WITHIN: Duration = Duration::from_secs(30);

/// Arguments of `steady-lab chaos-backend`.
#[derive(Debug, Args)]
pub struct BackendArgs {
    /// The etcd cluster's endpoints (comma separated).
    #[arg(long, value_delimiter = ',', required = true)]
    etcd: Vec<String>,
    /// The job.
    #[arg(long)]
    job: String,
    /// This task's index (fixed: a restart takes it back).
    #[arg(long)]
    task: u32,
    /// The control plane's instances (`http://host:port`, comma separated).
    #[arg(long, value_delimiter = ',', required = true)]
    slicers: Vec<String>,
    /// The registry lease's TTL, seconds.
    #[arg(long, default_value_t = 5)]
    registry_ttl: u64,
    /// How often load is reported, milliseconds.
    #[arg(long, default_value_t = 500)]
    report_ms: u64,
    /// Run on mutual TLS with the files in this directory (see the module's doc); the
    /// `--slicers` are then `https://` addresses.
    #[arg(long)]
    tls_dir: Option<PathBuf>,
}

/// A backend's TLS material, replaceable from its files.
struct Tls {
    dir: PathBuf,
    /// Its identity's name (`<job>-<task>`): what the instances accept its reports as.
    name: String,
    identity: ServerIdentity,
    clients: ClientCas,
    client: ClientTlsSource,
}

impl Tls {
    fn load(dir: &Path, name: String) -> Result<Self, Box<dyn std::error::Error>> {
        let (cert, key) = pki::files(dir, &name);
        let identity = ServerIdentity::from_pem(&std::fs::read(cert)?, &std::fs::read(key)?)?;
        let clients = ClientCas::from_pem(&std::fs::read(dir.join("ca.pem"))?, ClientAuth::Required)?;
        let client = ClientTlsSource::new(pki::client_from_files(dir, &name)?)?;
        Ok(Self { dir: dir.to_owned(), name, identity, clients, client })
    }

    /// Reads the files again. All three pieces are read and checked before any replaces
    /// what is in force: a bad file leaves the old material whole.
    fn reload(&self) -> Result<(), Box<dyn std::error::Error>> {
        let (cert, key) = pki::files(&self.dir, &self.name);
        let (cert, key, bundle) =
            (std::fs::read(cert)?, std::fs::read(key)?, std::fs::read(self.dir.join("ca.pem"))?);
        let identity = ServerIdentity::from_pem(&cert, &key)?;
        let clients = ClientCas::from_pem(&bundle, ClientAuth::Required)?;
        let client = pki::client_from_files(&self.dir, &self.name)?;
        ClientTlsSource::new(client.clone())?;
        // Checked: the replacements below take what was just built from the same bytes.
        drop((identity, clients));
        self.identity.replace_pem(&cert, &key)?;
        self.clients.replace_pem(&bundle)?;
        self.client.replace(client)?;
        Ok(())
    }

    /// The TLS connections to a fresh loopback port, served with this material as it
    /// is at each handshake; the port's address.
    async fn incoming(&self) -> Result<(SocketAddr, TlsIncoming), Box<dyn std::error::Error>> {
        let verifier: Arc<dyn ClientCertVerifier> = Arc::new(self.clients.clone());
        let config = server_config(Arc::new(self.identity.clone()), Some(verifier))?;
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        Ok((listener.local_addr()?, TlsIncoming::new(listener, config)))
    }
}

/// A command from the lab.
enum Command {
    Drain,
    Undrain,
    Rotate,
}

pub(crate) fn run(args: &BackendArgs) -> LabResult {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(serve(args))
}

async fn serve(args: &BackendArgs) -> LabResult {
    let slicelet = Slicelet::new(args.task);
    let tls = match &args.tls_dir {
        Some(dir) => Some(Tls::load(dir, format!("{}-{}", args.job, args.task))?),
        None => None,
    };
    let slicers: Vec<Endpoint> =
        args.slicers.iter().map(|s| Endpoint::from_shared(s.clone())).collect::<Result<_, _>>()?;
    let targets = slicers.iter().map(|e| {
        let target = WatchEndpoint::new(e.clone());
        match &tls {
            Some(tls) => target.tls(tls.client.clone()),
            None => target,
        }
    });
    let source = steady_proto::watch_assignments_any(targets, args.job.as_str(), Default::default())?;
    let _follow = slicelet.follow(source);
    let every = Duration::from_millis(args.report_ms);
    let reporters = slicers
        .into_iter()
        .map(|e| match &tls {
            Some(tls) => {
                slicelet.report_to_tls(e, tls.client.clone(), args.job.as_str(), every, Backoff::default())
            }
            None => Ok(slicelet.report_to(e, args.job.as_str(), every)),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let router = Server::builder().layer(slicelet.layer()).add_service(EchoServer::new(EchoTask(args.task)));
    let (addr, _server) =
        match &tls {
            Some(tls) => {
                let (addr, incoming) = tls.incoming().await?;
                // Served until the process ends.
                tokio::spawn(async move {
                    if let Err(error) = router.serve_with_incoming(incoming).await {
                        eprintln!("chaos-backend: the server stopped: {error}");
                    }
                });
                (addr, None)
            }
            None => {
                let port = Loopback::bind().await;
                let addr = port.addr();
                (
                    addr,
                    Some(port.serve_with(|incoming, stopped| {
                        router.serve_with_incoming_shutdown(incoming, stopped)
                    })),
                )
            }
        };
    let config = RegistryConfig::new(args.etcd.clone())
        .lease_ttl(Duration::from_secs(args.registry_ttl))
        .request_timeout(Duration::from_secs(2));
    let mut registration = register(config, &args.job, args.task as usize, &addr.to_string()).await?;
    let mut out = std::io::stdout();
    writeln!(out, "ready addr={addr}")?;
    out.flush()?;

    let mut commands = read_commands();
    let mut beat = tokio::time::interval(BEAT);
    loop {
        tokio::select! {
            command = commands.recv() => {
                let Some(command) = command else { break };
                let (what, done) = match command {
                    Command::Drain => ("drain", write_state(&registration, true).await.map_err(|e| e.to_string())),
                    Command::Undrain => {
                        ("undrain", write_state(&registration, false).await.map_err(|e| e.to_string()))
                    }
                    Command::Rotate => ("rotate", tls.as_ref().map_or(Ok(()), Tls::reload).map_err(|e| e.to_string())),
                };
                match done {
                    Ok(()) => writeln!(out, "done {what}")?,
                    Err(error) => writeln!(out, "failed {what}: {error}")?,
                }
            }
            () = registration.lost() => {
                writeln!(out, "lost registration: reclaiming")?;
                registration = reclaim(&registration).await;
                writeln!(out, "reclaimed index={}", registration.index())?;
            }
            _ = beat.tick() => {
                let reports: u64 = reporters.iter().map(|r| r.reports_sent()).sum();
                writeln!(
                    out,
                    "beat gen={} reports={reports} state={}",
                    slicelet.generation().unwrap_or(0),
                    if registration.state() == steady_core::TaskState::Draining { "draining" } else { "serving" },
                )?;
            }
        }
        out.flush()?;
    }
    // The lab is gone: leave the registry at once rather than a TTL later.
    let _ = tokio::time::timeout(Duration::from_secs(1), registration.release()).await;
    Ok(())
}

/// Registers task `index` at `address`, retrying while etcd does not answer.
async fn register(
    config: RegistryConfig,
    job: &str,
    index: usize,
    address: &str,
) -> Result<Registration, Box<dyn std::error::Error>> {
    let deadline = tokio::time::Instant::now() + REGISTER_WITHIN;
    loop {
        let attempt = match Registry::connect(config.clone()).await {
            Ok(registry) => registry.register(job, index, address).await,
            Err(error) => Err(error),
        };
        match attempt {
            Ok(registration) => return Ok(registration),
            // Only etcd's silence is worth waiting out.
            Err(RegistryError::Unavailable(_)) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(error) => return Err(format!("task {index}: cannot register: {error}").into()),
        }
    }
}

/// Drains the task in the registry, or makes it serve again, retrying (for up to
/// [`REGISTER_WITHIN`]) while etcd does not answer: `Registration::drain` leaves the
/// state unknown then, and asks for a retry. (A member of the cluster that came back
/// can fail one request with the connect error of its outage: etcd-client's connection
/// to it reports it to the next request that picks it.)
async fn write_state(registration: &Registration, drain: bool) -> Result<(), RegistryError> {
    let deadline = tokio::time::Instant::now() + REGISTER_WITHIN;
    loop {
        let done = if drain { registration.drain().await } else { registration.undrain().await };
        match done {
            Err(RegistryError::Unavailable(_)) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            done => return done,
        }
    }
}

/// The registration taken back after etcd lost it, retrying until etcd answers.
async fn reclaim(lost: &Registration) -> Registration {
    loop {
        match lost.reclaim().await {
            Ok(registration) => return registration,
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// The lab's commands, read from stdin by a thread of their own; the channel closes when
/// stdin does.
fn read_commands() -> mpsc::UnboundedReceiver<Command> {
    let (send, receive) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            let command = match line.trim() {
                "drain" => Command::Drain,
                "undrain" => Command::Undrain,
                "rotate" => Command::Rotate,
                _ => continue,
            };
            if send.send(command).is_err() {
                break;
            }
        }
    });
    receive
}
