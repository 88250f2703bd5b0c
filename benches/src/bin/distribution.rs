//! Assignment distribution at scale: the time from `Distributor::publish` to the last of
//! thousands of watchers, each on a connection of its own (as that many frontends would
//! be), and the CPU and memory it costs; steady's `Distributor` (each generation encoded
//! once at publication) against the baseline of the same Watch RPC on the generated
//! service, where every stream converts and encodes the assignment itself (how the
//! Distributor worked before).
//!
//! `cargo run --release -p steady-benches --bin distribution -- [--watchers 5000]
//! [--slices 1000,15000] [--generations 3]`
//!
//! The watchers count the messages they receive and do not decode them (that would be
//! the frontends' CPU, not the distributor's, and here it shares the machine). Both
//! servers and all watchers share this process: the CPU column is the whole process's
//! (`/proc/self/stat`), for the same watchers receiving the same bytes, so the
//! difference between the two rows is the server's encoding. The memory column is the
//! process's resident memory after the watchers connected and a generation reached them,
//! over the watchers: an upper bound on the server's memory per watcher (it includes the
//! watcher side).

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Buf;
use futures_util::Stream;
use steady_proto::assignment::assignment_distributor_server::{
    AssignmentDistributor, AssignmentDistributorServer,
};
use steady_proto::assignment::{AssignmentUpdate, WatchRequest};
use steady_slice::{Assignment, Slice, SliceKey};
use steady_slicer::Distributor;
use steady_testing::eventually_within;
use steady_testing::loopback::Loopback;
use tokio::sync::watch;
use tonic::codec::{Codec, DecodeBuf, Decoder};
use tonic::transport::Endpoint;
use tonic::{Request, Response, Status};

const JOB: &str = "users";

/// The baseline: the generated service, each stream converting and encoding.
#[derive(Clone)]
struct PerStream(watch::Sender<Option<Assignment>>);

type UpdateStream = Pin<Box<dyn Stream<Item = Result<AssignmentUpdate, Status>> + Send>>;

#[tonic::async_trait]
impl AssignmentDistributor for PerStream {
    type WatchStream = UpdateStream;

    async fn watch(&self, request: Request<WatchRequest>) -> Result<Response<UpdateStream>, Status> {
        let known = request.into_inner().known_generation;
        let mut updates = self.0.subscribe();
        updates.mark_changed();
        let stream = futures_util::stream::unfold((updates, known), |(mut updates, known)| async move {
            loop {
                updates.changed().await.ok()?;
                let newer = updates.borrow_and_update().clone().filter(|a| a.generation() > known);
                if let Some(a) = newer {
                    let g = a.generation();
                    return Some((Ok(AssignmentUpdate::from(&a)), (updates, g)));
                }
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }
}

/// Watchers' codec: requests encoded by prost, responses counted, not decoded.
#[derive(Clone, Copy, Default)]
struct Counting;

#[derive(Clone, Copy, Default)]
struct Skip;

impl Decoder for Skip {
    type Item = usize;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<usize>, Status> {
        let n = src.remaining();
        src.advance(n);
        Ok(Some(n))
    }
}

impl Codec for Counting {
    type Encode = WatchRequest;
    type Decode = usize;
    type Encoder = tonic_prost::ProstEncoder<WatchRequest>;
    type Decoder = Skip;

    fn encoder(&mut self) -> Self::Encoder {
        tonic_prost::ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        Skip
    }
}

/// What the watchers saw of the generation in flight.
#[derive(Default)]
struct Arrivals {
    received: AtomicUsize,
    last: Mutex<Option<Instant>>,
    bytes: AtomicU64,
}

/// Serves `distributor` on loopback until the process exits.
async fn serve_steady(distributor: &Distributor) -> SocketAddr {
    Loopback::bind().await.serve(distributor.service()).detach()
}

/// Serves the per-stream baseline on loopback until the process exits.
async fn serve_baseline(per_stream: &PerStream) -> SocketAddr {
    Loopback::bind().await.serve(AssignmentDistributorServer::new(per_stream.clone())).detach()
}

/// Opens `n` watchers of `addr`, each on its own connection; they record into `arrivals`.
async fn watchers(addr: SocketAddr, n: usize, arrivals: Arc<Arrivals>) -> Vec<tokio::task::JoinHandle<()>> {
    let mut handles = Vec::with_capacity(n);
    let opened = Arc::new(AtomicUsize::new(0));
    for batch in (0..n).collect::<Vec<_>>().chunks(100) {
        let mut connecting = Vec::new();
        for _ in batch {
            let endpoint = Endpoint::from_shared(format!("http://{addr}")).unwrap().tcp_nodelay(true);
            connecting.push(tokio::spawn(async move { endpoint.connect().await.expect("connects") }));
        }
        for c in connecting {
            let channel = c.await.unwrap();
            let (arrivals, opened) = (arrivals.clone(), opened.clone());
            handles.push(tokio::spawn(async move {
                let mut grpc = tonic::client::Grpc::new(channel);
                grpc.ready().await.unwrap();
                let path =
                    http::uri::PathAndQuery::from_static("/steady.assignment.v1.AssignmentDistributor/Watch");
                let request = Request::new(WatchRequest { job: JOB.to_owned(), known_generation: 0 });
                let mut stream = grpc.server_streaming(request, path, Counting).await.unwrap().into_inner();
                opened.fetch_add(1, Ordering::Relaxed);
                while let Ok(Some(bytes)) = stream.message().await {
                    let now = Instant::now();
                    arrivals.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
                    let mut last = arrivals.last.lock().unwrap();
                    *last = Some(last.map_or(now, |l| l.max(now)));
                    drop(last);
                    arrivals.received.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
    }
    while opened.load(Ordering::Relaxed) < n {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    handles
}

fn assignment(generation: u64, slices: usize, tasks: u32) -> Assignment {
    let step = u64::MAX / slices as u64;
    let slices = (0..slices)
        .map(|i| Slice::new(SliceKey(i as u64 * step), vec![(i as u32 + generation as u32) % tasks]))
        .collect();
    Assignment::new(generation, slices).unwrap()
}

/// User + system CPU time of this process.
fn cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
    // After the command name: state is field 3, utime 14, stime 15 (1-based over the line).
    let ticks = |i: usize| fields.get(i - 3).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    Duration::from_millis((ticks(14) + ticks(15)) * 10)
}

/// Resident memory of this process, bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn arg<T: std::str::FromStr>(name: &str, default: T) -> T {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let watchers_n: usize = arg("--watchers", 5000);
    let generations: u64 = arg("--generations", 3);
    let slices: Vec<usize> =
        arg("--slices", "1000,15000".to_owned()).split(',').filter_map(|s| s.trim().parse().ok()).collect();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async move {
        println!("# distribution: {watchers_n} watchers, one connection each; {generations} generations per row (the median shown)");
        println!("| server | slices | message bytes | publish to last watcher, ms | process CPU per generation, ms | RSS per watcher, KiB |");
        println!("|---|---:|---:|---:|---:|---:|");
        for &n in &slices {
            for server in ["per-stream encoding (baseline)", "steady Distributor (encoded once)"] {
                let arrivals = Arc::new(Arrivals::default());
                let before = rss();
                let baseline = PerStream(watch::Sender::new(None));
                let distributor = Distributor::new();
                let publish = |a: Assignment| {
                    if server.starts_with("per-stream") {
                        baseline.0.send_replace(Some(a));
                    } else {
                        distributor.publish(JOB, a);
                    }
                };
                let addr = if server.starts_with("per-stream") {
                    serve_baseline(&baseline).await
                } else {
                    serve_steady(&distributor).await
                };
                let handles = watchers(addr, watchers_n, arrivals.clone()).await;
                let (mut times, mut cpus) = (Vec::new(), Vec::new());
                let mut message = 0;
                let mut rss_after = 0;
                for g in 1..=generations {
                    let expected = watchers_n * g as usize;
                    let (cpu0, t0, bytes0) = (cpu(), Instant::now(), arrivals.bytes.load(Ordering::Relaxed));
                    publish(assignment(g, n, 300));
                    let what = format!("generation {g} to reach every watcher");
                    eventually_within(Duration::from_secs(120), &what, || {
                        arrivals.received.load(Ordering::Relaxed) >= expected
                    })
                    .await;
                    let last = arrivals.last.lock().unwrap().unwrap();
                    times.push(last.duration_since(t0).as_secs_f64() * 1e3);
                    cpus.push(cpu().saturating_sub(cpu0).as_secs_f64() * 1e3);
                    message = (arrivals.bytes.load(Ordering::Relaxed) - bytes0) / watchers_n as u64;
                    if g == 1 {
                        rss_after = rss();
                    }
                }
                times.sort_by(f64::total_cmp);
                cpus.sort_by(f64::total_cmp);
                let per_watcher = rss_after.saturating_sub(before) as f64 / watchers_n as f64 / 1024.0;
                println!(
                    "| {server} | {n} | {message} | {:.0} | {:.0} | {per_watcher:.1} |",
                    times[times.len() / 2],
                    cpus[cpus.len() / 2]
                );
                for h in handles {
                    h.abort();
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    });
}
