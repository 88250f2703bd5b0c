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
//! it reads commands, one a line, on stdin: `drain`, `undrain`, and `rotate` (the hook
//! for certificates rotated: acknowledged, nothing to rotate on a plaintext fleet). It
//! ends when stdin closes (the lab is gone) or its stdout does. A registration that etcd
//! lost (its lease lapsed while the task was stalled, say) is taken back
//! (`Registration::reclaim`), keeping its state.

use std::io::{BufRead, Write};
use std::time::Duration;

use clap::Args;
use steady_discovery::registry::{Registration, Registry, RegistryConfig, RegistryError};
use steady_slicelet::Slicelet;
use steady_testing::echo::echo_server::EchoServer;
use steady_testing::echo::EchoTask;
use steady_testing::loopback::Loopback;
use tokio::sync::mpsc;
use tonic::transport::{Endpoint, Server};

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
    let slicers: Vec<Endpoint> =
        args.slicers.iter().map(|s| Endpoint::from_shared(s.clone())).collect::<Result<_, _>>()?;
    let source = steady_proto::watch_assignments_any(slicers.clone(), args.job.as_str(), Default::default())?;
    let _follow = slicelet.follow(source);
    let every = Duration::from_millis(args.report_ms);
    let reporters: Vec<_> =
        slicers.into_iter().map(|e| slicelet.report_to(e, args.job.as_str(), every)).collect();
    let port = Loopback::bind().await;
    let addr = port.addr();
    let layer = slicelet.layer();
    let task = args.task;
    let _server = port.serve_with(|incoming, stopped| {
        Server::builder()
            .layer(layer)
            .add_service(EchoServer::new(EchoTask(task)))
            .serve_with_incoming_shutdown(incoming, stopped)
    });
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
                    Command::Drain => ("drain", write_state(&registration, true).await),
                    Command::Undrain => ("undrain", write_state(&registration, false).await),
                    Command::Rotate => ("rotate", Ok(())),
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
