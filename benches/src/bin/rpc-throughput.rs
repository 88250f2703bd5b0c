//! Unary RPC throughput and latency over loopback: the steady channel against plain
//! tonic channels, side by side in one run.
//!
//! `cargo run --release -p steady-benches --bin rpc-throughput -- [--threads 1] [--seconds 1] [--runs 3]`
//!
//! `STEADY_LOAD=ewma` makes the steady channel balance by Peak EWMA latency instead of
//! in-flight counts.
//!
//! For a quieter measurement, run the servers in a process of their own on another core:
//! `taskset -c 1 rpc-throughput --serve` prints their addresses; then
//! `taskset -c 0 rpc-throughput --threads 1 --connect ADDR,ADDR,ADDR,ADDR`.
//!
//! Four echo servers (64-byte payloads) run on a runtime of their own; the client
//! runtime has `--threads` worker threads (1 gives steadier figures on a shared
//! 2-core machine). For each client and concurrency (1, 16, 256) it runs `--runs`
//! rounds of `--seconds` each and prints the median throughput and the p50/p99
//! latency of the median round, with the ratio to the 4-channel round-robin floor.
//! Clients:
//! * `steady` — a `SteadyChannel` over the 4 servers (k = 4);
//! * `rr4` — 4 plain `Channel`s picked by an atomic round-robin counter (the floor);
//! * `balance_list` — tonic's `Channel::balance_list` over the same 4;
//! * `single` — one plain `Channel` to one server.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use steady_balance::BalanceConfig;
use steady_tonic::echo::echo_client::EchoClient;
use steady_tonic::echo::EchoRequest;
use steady_tonic::SteadyChannel;
use tonic::body::Body;
use tonic::transport::{Channel, Endpoint};
use tower::{BoxError, Service, ServiceExt};

/// Four channels, picked in turn by a shared counter.
#[derive(Clone)]
struct RoundRobin {
    channels: Arc<Vec<Channel>>,
    next: Arc<AtomicUsize>,
}

impl Service<http::Request<Body>> for RoundRobin {
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<http::Response<Body>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.channels.len();
        let channel = self.channels[i].clone();
        Box::pin(async move { channel.oneshot(req).await.map_err(BoxError::from) })
    }
}

struct Options {
    threads: usize,
    seconds: f64,
    runs: usize,
    /// Only run the servers, printing their addresses, until killed.
    serve: bool,
    /// Use servers already running at these addresses (from `--serve`).
    connect: Option<Vec<SocketAddr>>,
}

fn options() -> Options {
    let mut o = Options { threads: 1, seconds: 1.0, runs: 3, serve: false, connect: None };
    let args: Vec<String> = std::env::args().skip(1).collect();
    for pair in args.chunks(2) {
        let value = pair.get(1).map(String::as_str).unwrap_or("");
        match pair[0].as_str() {
            "--threads" => o.threads = value.parse().expect("--threads N"),
            "--seconds" => o.seconds = value.parse().expect("--seconds S"),
            "--runs" => o.runs = value.parse().expect("--runs N"),
            "--serve" => {
                o.serve = true;
                // A flag: re-read the next word as an option.
                if !value.is_empty() {
                    panic!("--serve takes no value; put it last");
                }
            }
            "--connect" => {
                o.connect =
                    Some(value.split(',').map(|a| a.parse().expect("--connect ADDR,ADDR,...")).collect())
            }
            other => panic!("unknown option {other}"),
        }
    }
    o
}

/// Starts the four servers on a runtime thread of their own.
fn start_servers() -> Vec<SocketAddr> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        rt.block_on(async move {
            let mut addrs = Vec::new();
            let mut stops = Vec::new();
            for task in 0..4 {
                let (addr, stop) = steady_tonic::demo::serve_echo(task).await.expect("bind 127.0.0.1");
                addrs.push(addr);
                stops.push(stop);
            }
            tx.send(addrs).unwrap();
            // Serve until the process exits.
            std::future::pending::<()>().await;
        });
    });
    rx.recv().unwrap()
}

/// One round: `concurrency` loops for `seconds`; returns (requests per second, latencies µs).
async fn round<T>(client: EchoClient<T>, concurrency: usize, seconds: f64) -> (f64, Vec<u32>)
where
    T: tonic::client::GrpcService<Body> + Clone + Send + 'static,
    T::Future: Send,
    T::Error: Into<BoxError>,
    T::ResponseBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    <T::ResponseBody as http_body::Body>::Error: Into<BoxError> + Send,
{
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let start = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let mut client = client.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                while Instant::now() < deadline {
                    let t = Instant::now();
                    client.echo(EchoRequest { payload: vec![7; 64] }).await.expect("echo");
                    latencies.push(t.elapsed().as_micros() as u32);
                }
                latencies
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let rate = all.len() as f64 / start.elapsed().as_secs_f64();
    all.sort_unstable();
    (rate, all)
}

fn pct(sorted: &[u32], p: f64) -> u32 {
    sorted.get(((sorted.len().max(1) - 1) as f64 * p).round() as usize).copied().unwrap_or(0)
}

fn main() {
    let o = options();
    if o.serve {
        let addrs = start_servers();
        let list: Vec<String> = addrs.iter().map(ToString::to_string).collect();
        println!("{}", list.join(","));
        // Serve until killed (bounded: an hour at most).
        std::thread::sleep(Duration::from_secs(3600));
        return;
    }
    let addrs = o.connect.clone().unwrap_or_else(start_servers);
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(o.threads).enable_all().build().unwrap();
    rt.block_on(async move {
        let endpoints: Vec<Endpoint> =
            addrs.iter().map(|a| Endpoint::from_shared(format!("http://{a}")).unwrap()).collect();
        // STEADY_LOAD=ewma: Peak EWMA instead of in-flight counts (an experiment switch).
        let mut config = BalanceConfig::new(0, 4);
        if std::env::var("STEADY_LOAD").as_deref() == Ok("ewma") {
            config = config.with_load(steady_balance::Load::PeakEwma {
                decay: Duration::from_secs(1),
                default_rtt: Duration::from_millis(1),
            });
        }
        let steady = SteadyChannel::builder(config).from_endpoints(endpoints.clone());
        let start = Instant::now();
        while steady.stats().members.len() < 4 && start.elapsed() < Duration::from_secs(10) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let mut channels = Vec::new();
        for e in &endpoints {
            channels.push(e.connect().await.expect("connect"));
        }
        let rr = RoundRobin { channels: Arc::new(channels), next: Arc::default() };
        let balanced = Channel::balance_list(endpoints.clone().into_iter());
        let single = endpoints[0].connect().await.expect("connect");
        println!(
            "# client runtime threads: {}, {} s per round, median of {} rounds",
            o.threads, o.seconds, o.runs
        );
        println!(
            "{:<14} {:>5} {:>11} {:>8} {:>8} {:>9}",
            "client", "conc", "req/s", "p50 µs", "p99 µs", "vs rr4"
        );
        for concurrency in [1usize, 16, 256] {
            let mut floor = 0.0;
            for name in ["rr4", "steady", "balance_list", "single"] {
                let mut rounds = Vec::new();
                for _ in 0..o.runs {
                    let r = match name {
                        "steady" => round(EchoClient::new(steady.clone()), concurrency, o.seconds).await,
                        "rr4" => round(EchoClient::new(rr.clone()), concurrency, o.seconds).await,
                        "balance_list" => {
                            round(EchoClient::new(balanced.clone()), concurrency, o.seconds).await
                        }
                        _ => round(EchoClient::new(single.clone()), concurrency, o.seconds).await,
                    };
                    rounds.push(r);
                }
                rounds.sort_by(|a, b| a.0.total_cmp(&b.0));
                let (rate, latencies) = &rounds[rounds.len() / 2];
                if name == "rr4" {
                    floor = *rate;
                }
                println!(
                    "{:<14} {:>5} {:>11.0} {:>8} {:>8} {:>8.2}x",
                    name,
                    concurrency,
                    rate,
                    pct(latencies, 0.5),
                    pct(latencies, 0.99),
                    rate / floor
                );
            }
        }
    });
}
