//! Unary RPC throughput and latency over loopback: the steady channel against plain
//! tonic channels, side by side in one run.
//!
//! `cargo run --release -p steady-benches --bin rpc-throughput -- [--threads 1] [--seconds 1]
//! [--runs 3] [--concurrency 1,16,256] [--clients rr4,steady,balance_list,single]`
//!
//! Four echo servers (64-byte payloads) run on a runtime of their own; the client
//! runtime has `--threads` worker threads (1 gives steadier figures on a shared
//! 2-core machine). Clients:
//! * `rr4` — 4 plain `Channel`s picked by an atomic round-robin counter (the floor);
//! * `steady` — a `SteadyChannel` over the 4 servers (k = 4);
//! * `balance_list` — tonic's `Channel::balance_list` over the same 4;
//! * `single` — one plain `Channel` to one server.
//!
//! For each concurrency, every client first warms up for a quarter round; then come
//! `--runs` rounds of `--seconds` each. Within a round every client runs once, in an
//! order rotated from round to round, so that the machine's drift (this machine's
//! throughput moves by tens of percent over minutes) hits all clients alike. Per
//! client it prints the median throughput, p50/p99 latency of its median round, the
//! median over rounds of its throughput ratio to `rr4` and to `balance_list` in the
//! same round, and the CPU time the process spent per request.
//!
//! `STEADY_LOAD=ewma` makes the steady channel balance by Peak EWMA latency instead of
//! in-flight counts.
//!
//! For a quieter measurement, run the servers in a process of their own on another core:
//! `taskset -c 1 rpc-throughput --serve` prints their addresses; then
//! `taskset -c 0 rpc-throughput --threads 1 --connect ADDR,ADDR,ADDR,ADDR`. The CPU
//! column is then the client's own cost per request.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use steady_balance::BalanceConfig;
use steady_tonic::demo::percentile;
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
    /// The concurrency levels to measure.
    concurrency: Vec<usize>,
    /// The clients to run (ratios need `rr4` and `balance_list` among them).
    clients: Vec<String>,
}

fn options() -> Options {
    let mut o = Options {
        threads: 1,
        seconds: 1.0,
        runs: 3,
        serve: false,
        connect: None,
        concurrency: vec![1, 16, 256],
        clients: CLIENTS.iter().map(ToString::to_string).collect(),
    };
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
            "--clients" => o.clients = value.split(',').map(ToString::to_string).collect(),
            "--concurrency" => {
                o.concurrency = value.split(',').map(|c| c.parse().expect("--concurrency N,N,...")).collect()
            }
            "--connect" => {
                o.connect =
                    Some(value.split(',').map(|a| a.parse().expect("--connect ADDR,ADDR,...")).collect())
            }
            other => panic!("unknown option {other}"),
        }
    }
    if let Some(unknown) = o.clients.iter().find(|c| !CLIENTS.contains(&c.as_str())) {
        panic!("unknown client {unknown}; the clients are {CLIENTS:?}");
    }
    if o.runs == 0 || o.concurrency.contains(&0) || o.seconds.is_nan() || o.seconds <= 0.0 {
        panic!("--runs, --concurrency and --seconds must be positive");
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

/// Nanoseconds this process's live threads have run on a CPU (Linux: the sum of
/// `/proc/self/task/*/schedstat`); `None` elsewhere. Threads that exit are not
/// counted (the runtimes' worker threads live for the whole run).
fn cpu_ns() -> Option<u64> {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
        total += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(total)
}

/// What one round measured.
#[derive(Clone)]
struct Round {
    /// Requests per second.
    rate: f64,
    /// Every request's latency in µs, sorted.
    latencies: Vec<u32>,
    /// CPU time this process spent per request, in µs (with `--connect`, the client's
    /// own cost; otherwise clients and servers together).
    cpu_us: Option<f64>,
}

/// The clients, in the order a round runs them (rotated from round to round).
const CLIENTS: [&str; 4] = ["rr4", "steady", "balance_list", "single"];

/// One round: `concurrency` loops for `seconds`.
async fn round<T>(client: EchoClient<T>, concurrency: usize, seconds: f64) -> Round
where
    T: tonic::client::GrpcService<Body> + Clone + Send + 'static,
    T::Future: Send,
    T::Error: Into<BoxError>,
    T::ResponseBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    <T::ResponseBody as http_body::Body>::Error: Into<BoxError> + Send,
{
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let start = Instant::now();
    let cpu_start = cpu_ns();
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
    let cpu_us =
        cpu_start.zip(cpu_ns()).map(|(a, b)| b.saturating_sub(a) as f64 / 1e3 / all.len().max(1) as f64);
    all.sort_unstable();
    Round { rate, latencies: all, cpu_us }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
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
            "# client runtime threads: {}, {} s per round, {} interleaved rounds per client",
            o.threads, o.seconds, o.runs
        );
        println!(
            "{:<14} {:>5} {:>11} {:>8} {:>8} {:>9} {:>9} {:>9}",
            "client", "conc", "req/s", "p50 µs", "p99 µs", "vs rr4", "vs bl", "cpu µs/r"
        );
        let clients: Vec<&str> = o.clients.iter().map(String::as_str).collect();
        let position = |name: &str| clients.iter().position(|c| *c == name);
        for &concurrency in &o.concurrency {
            let run = |name: &str, seconds: f64| {
                let (steady, rr, balanced, single) =
                    (steady.clone(), rr.clone(), balanced.clone(), single.clone());
                let name = name.to_string();
                async move {
                    match name.as_str() {
                        "steady" => round(EchoClient::new(steady), concurrency, seconds).await,
                        "rr4" => round(EchoClient::new(rr), concurrency, seconds).await,
                        "balance_list" => round(EchoClient::new(balanced), concurrency, seconds).await,
                        _ => round(EchoClient::new(single), concurrency, seconds).await,
                    }
                }
            };
            // Warm every client up at this concurrency (h2 windows, allocator, caches).
            for name in &clients {
                run(name, o.seconds / 4.0).await;
            }
            // Round r runs the clients in an order rotated by r, so that drift in the
            // machine's speed hits every client alike; ratios are taken within a round.
            let mut rounds: Vec<Vec<Round>> = vec![Vec::new(); clients.len()];
            for r in 0..o.runs {
                for i in 0..clients.len() {
                    let c = (i + r) % clients.len();
                    rounds[c].push(run(clients[c], o.seconds).await);
                }
            }
            for (c, name) in clients.iter().enumerate() {
                let ratio_to = |base: Option<usize>| {
                    base.map_or("-".to_string(), |base| {
                        let ratios = (0..o.runs).map(|r| rounds[c][r].rate / rounds[base][r].rate);
                        format!("{:.2}x", median(ratios.collect()))
                    })
                };
                let cpu = rounds[c].iter().map(|r| r.cpu_us).collect::<Option<Vec<f64>>>().map(median);
                let mut own: Vec<&Round> = rounds[c].iter().collect();
                own.sort_by(|a, b| a.rate.total_cmp(&b.rate));
                let Round { rate, latencies, .. } = own[own.len() / 2];
                println!(
                    "{:<14} {:>5} {:>11.0} {:>8} {:>8} {:>9} {:>9} {:>9}",
                    name,
                    concurrency,
                    rate,
                    percentile(latencies, 0.5),
                    percentile(latencies, 0.99),
                    ratio_to(position("rr4")),
                    ratio_to(position("balance_list")),
                    cpu.map_or("-".to_string(), |c| format!("{c:.2}"))
                );
            }
        }
    });
}
