//! Unary RPC throughput and latency over loopback: the steady channel against plain
//! tonic channels, side by side in one run.
//!
//! `cargo run --release -p steady-benches --bin rpc-throughput -- [--threads 1] [--seconds 1]
//! [--runs 3] [--concurrency 1,16,256] [--clients rr4,steady,balance_list,single]
//! [--scenario equal|slow|failing|erroring|flaky|blackhole|all-flaky|stalls] [--hedge-delay-us N]`
//!
//! Four echo servers (64-byte payloads) run on a runtime of their own; the client
//! runtime has `--threads` worker threads (1 gives steadier figures on a shared
//! 2-core machine). `--scenario` says how the servers behave:
//! * `equal` (the default) — four equal echo servers;
//! * `slow` — task 0 answers every call 20 ms late (a sleep in its handler), the other
//!   three are the plain echo servers;
//! * `failing` — task 0 fails every call at the transport: its listener accepts each
//!   connection and resets it at once (`SO_LINGER` 0, then close), so clients see
//!   connection errors, never a gRPC status from a server.
//! * `erroring` — task 0 answers every call `UNAVAILABLE` at once (a backend whose
//!   database is gone: up, but useless);
//! * `flaky` — task 0 answers half its calls (at random) `UNAVAILABLE`;
//! * `blackhole` — task 0 accepts calls and never answers; every call of every client
//!   carries a 100 ms deadline (`Request::set_timeout`);
//! * `all-flaky` — every server answers 30% of its calls (at random) `UNAVAILABLE` (a
//!   fault they share: none of them is an outlier);
//! * `stalls` — task 0 answers 1% of its calls (at random) 50 ms late, the rest at once
//!   (a garbage collection, a page fault, a lock: the tail hedging is for); the other
//!   three are the plain echo servers.
//!
//! Clients:
//! * `rr4` — 4 plain `Channel`s picked by an atomic round-robin counter (the floor);
//! * `steady` — a `SteadyChannel` over the 4 servers (k = 4);
//! * `balance_list` — tonic's `Channel::balance_list` over the same 4;
//! * `single` — one plain `Channel` to one good server (task 0 with `equal`, else task 1);
//! * `steady_hedged` (not run unless named) — a `SteadyChannel` of its own (k = 4) behind
//!   `steady_tonic::hedge::HedgeLayer`, hedging the echo method: at most 3 attempts,
//!   `UNAVAILABLE` non-fatal (the next attempt goes at once), the default budget (10% of
//!   requests plus 10 a second over 10 s). Its hedging delay, per concurrency, is 1.25x
//!   the median p99 of three quarter-round warm-ups of `steady` at that concurrency
//!   (rounded up to 100 µs; `steady` must be listed before it), or `--hedge-delay-us`
//!   when given: a little above the
//!   p99 without hedging, so that about 1% of requests would hedge if latencies were
//!   independent, and a stall of 50 ms is cut to about that delay plus one round trip.
//!   A fixed delay cannot be right for every concurrency: with one client thread the
//!   p99 grows with the loops queued on it.
//!
//! Each client is `--concurrency` loops, each sending one request after another. A
//! request that fails counts as a failed attempt and the loop goes on to the next
//! request (no retry; it yields to the runtime first, so that errors returned at once
//! cannot hog a thread).
//!
//! For each concurrency, every client first warms up for a quarter round; then come
//! `--runs` rounds of `--seconds` each. Within a round every client runs once, in an
//! order rotated from round to round, so that the machine's drift (this machine's
//! throughput moves by tens of percent over minutes) hits all clients alike. Clients
//! keep their connections (and the steady channel its ejections) from round to round.
//! Columns, per client and concurrency:
//! * `req/s` — successful requests per second, the median over rounds;
//! * `p50 µs`, `p99 µs` — latency of the successful requests of the median round;
//! * `failed` — failed requests, summed over the `--runs` rounds (warm-up excluded; a
//!   line after the table gives the warm-up's failures);
//! * `bad %` — the bad server's share over those rounds: of the successful requests,
//!   the share task 0 served (`equal`, `slow`: 25% is an even spread); in the other
//!   scenarios, the share of all attempts that failed;
//! * `min srv %` — the smallest share of attempts any one server got (attempts are
//!   attributed by the replying task, or the task a failure's status names; failures
//!   with no status, such as timeouts, count for task 0);
//! * `vs rr4`, `vs bl` — the median over rounds of the client's `req/s` divided by that
//!   of `rr4` and of `balance_list` in the same round;
//! * `cpu µs/r` — CPU time the process spent per attempt (median over rounds);
//! * `p99.9 µs` — the 99.9th percentile of the median round;
//! * `extra %` — attempts sent beyond one per request, over the requests, summed over
//!   the rounds (`steady_hedged`'s extra attempts; `-` for clients that send each
//!   request once).
//!
//! Two more clients compare the load signals in the same rounds (not run unless named
//! in `--clients`): `steady_inflight` (requests in flight) and `steady_ewma` (Peak EWMA
//! latency times requests in flight, `Load::peak_ewma()`); `steady` runs the default.
//!
//! For a quieter measurement, run the servers in a process of their own on another core:
//! `taskset -c 1 rpc-throughput --serve [--scenario S]` prints their addresses (task 0
//! first); then `taskset -c 0 rpc-throughput --threads 1 --scenario S --connect
//! ADDR,ADDR,ADDR,ADDR`. The CPU column is then the client's own cost per attempt.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use steady_balance::{BalanceConfig, Load};
use steady_testing::echo::echo_client::EchoClient;
use steady_testing::echo::echo_server::{Echo, EchoServer};
use steady_testing::echo::{EchoReply, EchoRequest};
use steady_testing::loopback::Loopback;
use steady_testing::{holds_within, percentile};
use steady_tonic::hedge::{Hedge, HedgeConfig, HedgeLayer, HedgingPolicy};
use steady_tonic::SteadyChannel;
use tonic::body::Body;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Response, Status};
use tower::{BoxError, Layer, Service, ServiceExt};

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
    /// How the servers behave (task 0 is the odd one out).
    scenario: Scenario,
    /// `steady_hedged`'s hedging delay; `None`: from `steady`'s warm-up p99.
    hedge_delay: Option<Duration>,
}

/// How the four servers behave.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Scenario {
    /// Four equal echo servers.
    Equal,
    /// Task 0 answers every call [`SLOW_DELAY`] late.
    Slow,
    /// Task 0 resets every connection it accepts.
    Failing,
    /// Task 0 answers every call `UNAVAILABLE`.
    Erroring,
    /// Task 0 answers half its calls `UNAVAILABLE`.
    Flaky,
    /// Task 0 never answers; calls carry [`DEADLINE`].
    Blackhole,
    /// Every server answers 30% of its calls `UNAVAILABLE`.
    AllFlaky,
    /// Task 0 answers [`STALL_SHARE`] of its calls [`STALL`] late.
    Stalls,
}

/// How late the stalling server's stalled calls are answered.
const STALL: Duration = Duration::from_millis(50);

/// The share of its calls the stalling server stalls.
const STALL_SHARE: f64 = 0.01;

/// The deadline every call carries in the `blackhole` scenario.
const DEADLINE: Duration = Duration::from_millis(100);

/// How late the slow server answers.
const SLOW_DELAY: Duration = Duration::from_millis(20);

impl Scenario {
    fn parse(value: &str) -> Scenario {
        match value {
            "equal" => Scenario::Equal,
            "slow" => Scenario::Slow,
            "failing" => Scenario::Failing,
            "erroring" => Scenario::Erroring,
            "flaky" => Scenario::Flaky,
            "blackhole" => Scenario::Blackhole,
            "all-flaky" => Scenario::AllFlaky,
            "stalls" => Scenario::Stalls,
            other => panic!(
                "unknown scenario {other}; the scenarios are equal, slow, failing, erroring, flaky, blackhole, all-flaky, stalls"
            ),
        }
    }

    /// The share of calls server `task` fails with `UNAVAILABLE` (`None`: never fails).
    fn failure_share(self, task: u32) -> Option<f64> {
        match (self, task) {
            (Scenario::Erroring, 0) => Some(1.0),
            (Scenario::Flaky, 0) => Some(0.5),
            (Scenario::AllFlaky, _) => Some(0.3),
            _ => None,
        }
    }

    /// The task a `single` client talks to: a good server.
    fn single_task(self) -> usize {
        if matches!(self, Scenario::Equal | Scenario::AllFlaky) {
            0
        } else {
            1
        }
    }
}

fn options() -> Options {
    let mut o = Options {
        threads: 1,
        seconds: 1.0,
        runs: 3,
        serve: false,
        connect: None,
        concurrency: vec![1, 16, 256],
        clients: CLIENTS[..4].iter().map(ToString::to_string).collect(),
        scenario: Scenario::Equal,
        hedge_delay: None,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    for pair in args.chunks(2) {
        let value = pair.get(1).map(String::as_str).unwrap_or("");
        match pair[0].as_str() {
            "--threads" => o.threads = value.parse().expect("--threads N"),
            "--seconds" => o.seconds = value.parse().expect("--seconds S"),
            "--runs" => o.runs = value.parse().expect("--runs N"),
            "--scenario" => o.scenario = Scenario::parse(value),
            "--hedge-delay-us" => {
                o.hedge_delay = Some(Duration::from_micros(value.parse().expect("--hedge-delay-us N")))
            }
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

/// An echo service that answers every call `delay` late.
struct SlowEcho {
    task: u32,
    delay: Duration,
}

#[tonic::async_trait]
impl Echo for SlowEcho {
    async fn echo(&self, request: Request<EchoRequest>) -> Result<Response<EchoReply>, Status> {
        tokio::time::sleep(self.delay).await;
        Ok(Response::new(EchoReply { payload: request.into_inner().payload, task: self.task }))
    }
}

/// An echo service that answers [`STALL_SHARE`] of its calls (at random) [`STALL`] late.
struct StallingEcho {
    task: u32,
    calls: AtomicUsize,
}

#[tonic::async_trait]
impl Echo for StallingEcho {
    async fn echo(&self, request: Request<EchoRequest>) -> Result<Response<EchoReply>, Status> {
        let call = self.calls.fetch_add(1, Ordering::Relaxed) as u64;
        let draw = steady_subset::hash::mix64(call ^ (u64::from(self.task) << 40) ^ 0x57a1) >> 11;
        if (draw as f64) < STALL_SHARE * (1u64 << 53) as f64 {
            tokio::time::sleep(STALL).await;
        }
        Ok(Response::new(EchoReply { payload: request.into_inner().payload, task: self.task }))
    }
}

/// Serves [`SlowEcho`] on 127.0.0.1 (until the process exits).
async fn serve_slow(task: u32, delay: Duration) -> SocketAddr {
    Loopback::bind().await.serve(EchoServer::new(SlowEcho { task, delay })).detach()
}

/// An echo service that fails a share of its calls with `UNAVAILABLE` (naming its task),
/// at random, or never answers (`share` `None`).
struct FaultyEcho {
    task: u32,
    share: Option<f64>,
    calls: AtomicUsize,
}

#[tonic::async_trait]
impl Echo for FaultyEcho {
    async fn echo(&self, request: Request<EchoRequest>) -> Result<Response<EchoReply>, Status> {
        let Some(share) = self.share else { return std::future::pending().await };
        let call = self.calls.fetch_add(1, Ordering::Relaxed) as u64;
        let draw = steady_subset::hash::mix64(call ^ (u64::from(self.task) << 40)) >> 11;
        if (draw as f64) < share * (1u64 << 53) as f64 {
            return Err(Status::unavailable(format!("task {}", self.task)));
        }
        Ok(Response::new(EchoReply { payload: request.into_inner().payload, task: self.task }))
    }
}

/// Serves [`FaultyEcho`] on 127.0.0.1 (until the process exits).
async fn serve_faulty(task: u32, share: Option<f64>) -> SocketAddr {
    let echo = FaultyEcho { task, share, calls: AtomicUsize::new(0) };
    Loopback::bind().await.serve(EchoServer::new(echo)).detach()
}

/// A listener on 127.0.0.1 that accepts every connection and resets it at once
/// (`SO_LINGER` 0, then close: the peer gets an RST), until the process exits.
async fn serve_resetting() -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    let _ = stream.set_zero_linger();
                    drop(stream);
                }
                // Out of descriptors, say: do not spin on the error.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    });
    Ok(addr)
}

/// Starts the four servers on a runtime thread of their own; task 0 behaves as
/// `scenario` says.
fn start_servers(scenario: Scenario) -> Vec<SocketAddr> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        rt.block_on(async move {
            let mut addrs = Vec::new();
            let mut servers = Vec::new();
            for task in 0..4 {
                let addr = match (task, scenario) {
                    (0, Scenario::Slow) => serve_slow(task, SLOW_DELAY).await,
                    (0, Scenario::Stalls) => {
                        let echo = StallingEcho { task, calls: AtomicUsize::new(0) };
                        Loopback::bind().await.serve(EchoServer::new(echo)).detach()
                    }
                    (0, Scenario::Failing) => serve_resetting().await.expect("bind 127.0.0.1"),
                    (0, Scenario::Blackhole) => serve_faulty(task, None).await,
                    (task, scenario) if scenario.failure_share(task).is_some() => {
                        serve_faulty(task, scenario.failure_share(task)).await
                    }
                    _ => {
                        let (addr, server) = steady_testing::echo::serve_echo(task).await;
                        servers.push(server);
                        addr
                    }
                };
                addrs.push(addr);
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
    /// Successful requests per second.
    rate: f64,
    /// Every successful request's latency in µs, sorted.
    latencies: Vec<u32>,
    /// Requests that failed.
    failed: u64,
    /// Successful requests that task 0 served.
    from_task0: u64,
    /// Attempts per server (see the `min srv %` column).
    per_task: [u64; 4],
    /// CPU time this process spent per attempt, in µs (with `--connect`, the client's
    /// own cost; otherwise clients and servers together).
    cpu_us: Option<f64>,
}

/// What one loop of a round measured.
#[derive(Default)]
struct Loop {
    latencies: Vec<u32>,
    failed: u64,
    from_task0: u64,
    per_task: [u64; 4],
}

/// The task a failure's status names (`task N`), else 0 (timeouts, transport errors).
fn failed_task(status: &Status) -> usize {
    status
        .message()
        .strip_prefix("task ")
        .and_then(|t| t.parse().ok())
        .filter(|&t: &usize| t < 4)
        .unwrap_or(0)
}

/// How long past a round's end its loops may take to finish their last request
/// before they are abandoned (each counting one failed request).
const GRACE: Duration = Duration::from_secs(10);

/// The clients, in the order a round runs them (rotated from round to round).
const CLIENTS: [&str; 7] =
    ["rr4", "steady", "balance_list", "single", "steady_inflight", "steady_ewma", "steady_hedged"];

/// The echo method's path, which `steady_hedged` hedges.
const ECHO: &str = "/steady.echo.v1.Echo/Echo";

/// `steady_hedged`'s hedge over `channel`, with `delay`.
fn hedged(channel: SteadyChannel, delay: Duration) -> Hedge {
    let policy = HedgingPolicy::new(3, delay)
        .and_then(|p| p.with_non_fatal_codes([Code::Unavailable]))
        .expect("a valid hedging policy");
    let config = HedgeConfig::new().method(ECHO, policy).expect("the echo method's path");
    HedgeLayer::new(config).layer(channel)
}

/// One round: `concurrency` loops for `seconds`.
async fn round<T>(
    client: EchoClient<T>,
    concurrency: usize,
    seconds: f64,
    deadline_each: Option<Duration>,
) -> Round
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
                let mut own = Loop::default();
                while Instant::now() < deadline {
                    let t = Instant::now();
                    let mut request = Request::new(EchoRequest { payload: vec![7; 64] });
                    if let Some(each) = deadline_each {
                        request.set_timeout(each);
                    }
                    match client.echo(request).await {
                        Ok(reply) => {
                            own.latencies.push(t.elapsed().as_micros() as u32);
                            let task = reply.into_inner().task;
                            own.from_task0 += u64::from(task == 0);
                            own.per_task[(task as usize).min(3)] += 1;
                        }
                        Err(status) => {
                            own.failed += 1;
                            own.per_task[failed_task(&status)] += 1;
                            // An error may come back without the call ever waiting:
                            // let the other loops run before the next attempt.
                            tokio::task::yield_now().await;
                        }
                    }
                }
                own
            })
        })
        .collect();
    let (mut all, mut failed, mut from_task0, mut per_task) = (Vec::new(), 0, 0, [0u64; 4]);
    for mut t in tasks {
        // A call that never ends must not hang the benchmark: abandon its loop (and
        // what it measured) after the grace period.
        match tokio::time::timeout_at((deadline + GRACE).into(), &mut t).await {
            Ok(own) => {
                let own = own.unwrap();
                all.extend(own.latencies);
                failed += own.failed;
                from_task0 += own.from_task0;
                for (total, n) in per_task.iter_mut().zip(own.per_task) {
                    *total += n;
                }
            }
            Err(_) => {
                t.abort();
                failed += 1;
                eprintln!("# a loop was still waiting on a request {GRACE:?} after the round ended");
            }
        }
    }
    let rate = all.len() as f64 / start.elapsed().as_secs_f64();
    let attempts = all.len() as u64 + failed;
    let cpu_us =
        cpu_start.zip(cpu_ns()).map(|(a, b)| b.saturating_sub(a) as f64 / 1e3 / attempts.max(1) as f64);
    all.sort_unstable();
    Round { rate, latencies: all, failed, from_task0, per_task, cpu_us }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let o = options();
    if o.serve {
        let addrs = start_servers(o.scenario);
        let list: Vec<String> = addrs.iter().map(ToString::to_string).collect();
        println!("{}", list.join(","));
        // Serve until killed (bounded: an hour at most).
        std::thread::sleep(Duration::from_secs(3600));
        return;
    }
    let scenario = o.scenario;
    let addrs = o.connect.clone().unwrap_or_else(|| start_servers(scenario));
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(o.threads).enable_all().build().unwrap();
    rt.block_on(async move {
        let endpoints: Vec<Endpoint> =
            addrs.iter().map(|a| Endpoint::from_shared(format!("http://{a}")).unwrap()).collect();
        // `steady` runs the default configuration; `steady_inflight` and `steady_ewma` pin
        // the load signal, to compare the two in the same rounds.
        let channel = |load: Option<Load>| {
            let mut config = BalanceConfig::new(0, 4);
            if let Some(load) = load {
                config = config.with_load(load);
            }
            SteadyChannel::builder(config)
                .from_endpoints(endpoints.clone())
                .expect("valid balancer configuration")
        };
        let steady = channel(None);
        let steady_inflight = channel(Some(Load::InFlight));
        let steady_ewma = channel(Some(Load::peak_ewma()));
        // `steady_hedged`'s own channel: its members' loads are its own requests'.
        let steady_for_hedge = channel(None);
        // Wait for the steady channel to connect to every server that accepts calls.
        let good = if scenario == Scenario::Failing { 3 } else { 4 };
        let deadline_each = (scenario == Scenario::Blackhole).then_some(DEADLINE);
        // At most 10 s: then measure with the members there are.
        let _ = holds_within(Duration::from_secs(10), || {
            [&steady, &steady_inflight, &steady_ewma, &steady_for_hedge]
                .iter()
                .all(|c| c.stats().members.len() >= good)
        })
        .await;
        let mut channels = Vec::new();
        for e in &endpoints {
            // The failing server may reset the connection before it is up: connect
            // lazily then (the channel reconnects on its next call).
            let channel = match e.connect().await {
                Ok(channel) => channel,
                Err(_) if scenario == Scenario::Failing => e.connect_lazy(),
                Err(e) => panic!("connect: {e}"),
            };
            channels.push(channel);
        }
        let rr = RoundRobin { channels: Arc::new(channels), next: Arc::default() };
        let balanced = Channel::balance_list(endpoints.clone().into_iter());
        let single = endpoints[scenario.single_task()].connect().await.expect("connect");
        println!(
            "# client runtime threads: {}, {} s per round, {} interleaved rounds per client, scenario {:?}",
            o.threads, o.seconds, o.runs, scenario
        );
        println!(
            "{:<14} {:>5} {:>11} {:>8} {:>8} {:>8} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8}",
            "client",
            "conc",
            "req/s",
            "p50 µs",
            "p99 µs",
            "failed",
            "bad %",
            "min srv %",
            "vs rr4",
            "vs bl",
            "cpu µs/r",
            "p99.9 µs",
            "extra %"
        );
        let clients: Vec<&str> = o.clients.iter().map(String::as_str).collect();
        let position = |name: &str| clients.iter().position(|c| *c == name);
        for &concurrency in &o.concurrency {
            let run = |name: &str, seconds: f64, hedge: Option<Hedge>| {
                let (steady, rr, balanced, single) =
                    (steady.clone(), rr.clone(), balanced.clone(), single.clone());
                let (steady_inflight, steady_ewma) = (steady_inflight.clone(), steady_ewma.clone());
                let name = name.to_string();
                async move {
                    match name.as_str() {
                        "steady" => round(EchoClient::new(steady), concurrency, seconds, deadline_each).await,
                        "steady_inflight" => {
                            round(EchoClient::new(steady_inflight), concurrency, seconds, deadline_each).await
                        }
                        "steady_ewma" => {
                            round(EchoClient::new(steady_ewma), concurrency, seconds, deadline_each).await
                        }
                        "steady_hedged" => {
                            let hedge = hedge.expect("steady_hedged's hedge is built before it runs");
                            round(EchoClient::new(hedge), concurrency, seconds, deadline_each).await
                        }
                        "rr4" => round(EchoClient::new(rr), concurrency, seconds, deadline_each).await,
                        "balance_list" => {
                            round(EchoClient::new(balanced), concurrency, seconds, deadline_each).await
                        }
                        _ => round(EchoClient::new(single), concurrency, seconds, deadline_each).await,
                    }
                }
            };
            // Warm every client up at this concurrency (h2 windows, allocator, caches).
            // What failed then is printed too: that is where a balancer learns.
            let mut warm_up_failed = Vec::new();
            // `steady_hedged`'s delay: given, or 1.25x `steady`'s warm-up p99 (see the
            // module doc); a default of 2 ms if `steady` has not warmed up before it.
            let mut hedge_delay = o.hedge_delay.unwrap_or(Duration::from_millis(2));
            let mut hedge = None;
            for name in &clients {
                if *name == "steady_hedged" {
                    hedge = Some(hedged(steady_for_hedge.clone(), hedge_delay));
                }
                let warm = run(name, o.seconds / 4.0, hedge.clone()).await;
                if *name == "steady" && o.hedge_delay.is_none() && clients.contains(&"steady_hedged") {
                    // The median p99 of three warm-ups: one alone is too short a sample
                    // on a shared machine (a hiccup of the machine is its p99).
                    let mut p99s = vec![f64::from(percentile(&warm.latencies, 0.99))];
                    for _ in 0..2 {
                        p99s.push(f64::from(percentile(&run(name, o.seconds / 4.0, None).await.latencies, 0.99)));
                    }
                    let p99 = median(p99s) as u64;
                    hedge_delay = Duration::from_micros((p99 * 5 / 4).div_ceil(100).max(1) * 100);
                }
                warm_up_failed.push(format!("{name} {}", warm.failed));
            }
            if let Some(hedge) = &hedge {
                let delay = hedge.policy(ECHO).map(HedgingPolicy::delay).unwrap_or_default();
                println!(
                    "# steady_hedged at concurrency {concurrency}: hedging delay {} µs",
                    delay.as_micros()
                );
            }
            let mut extra: Vec<Option<(u64, u64)>> = vec![None; clients.len()];
            let hedge_before = hedge.as_ref().map(Hedge::stats);
            // Round r runs the clients in an order rotated by r, so that drift in the
            // machine's speed hits every client alike; ratios are taken within a round.
            let mut rounds: Vec<Vec<Round>> = vec![Vec::new(); clients.len()];
            for r in 0..o.runs {
                for i in 0..clients.len() {
                    let c = (i + r) % clients.len();
                    let before = hedge.as_ref().filter(|_| clients[c] == "steady_hedged").map(Hedge::stats);
                    rounds[c].push(run(clients[c], o.seconds, hedge.clone()).await);
                    if let (Some(before), Some(hedge)) = (before, &hedge) {
                        let after = hedge.stats();
                        let (e, n) = extra[c].get_or_insert((0, 0));
                        *e += after.extra_attempts - before.extra_attempts;
                        *n += after.hedged_requests - before.hedged_requests;
                    }
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
                let failed: u64 = rounds[c].iter().map(|r| r.failed).sum();
                let succeeded: u64 = rounds[c].iter().map(|r| r.latencies.len() as u64).sum();
                let from_task0: u64 = rounds[c].iter().map(|r| r.from_task0).sum();
                // Task 0's share of the successes (equal, slow), else the failed share of all attempts.
                let bad = if matches!(scenario, Scenario::Equal | Scenario::Slow | Scenario::Stalls) {
                    from_task0 as f64 / succeeded.max(1) as f64
                } else {
                    failed as f64 / (failed + succeeded).max(1) as f64
                };
                let per_task = rounds[c].iter().fold([0u64; 4], |mut sum, r| {
                    for (s, n) in sum.iter_mut().zip(r.per_task) {
                        *s += n;
                    }
                    sum
                });
                let attempts: u64 = per_task.iter().sum();
                let min_share = *per_task.iter().min().unwrap_or(&0) as f64 / attempts.max(1) as f64;
                println!(
                    "{:<14} {:>5} {:>11.0} {:>8} {:>8} {:>8} {:>6.1} {:>9.1} {:>9} {:>9} {:>9} {:>9} {:>8}",
                    name,
                    concurrency,
                    rate,
                    percentile(latencies, 0.5),
                    percentile(latencies, 0.99),
                    failed,
                    bad * 100.0,
                    min_share * 100.0,
                    ratio_to(position("rr4")),
                    ratio_to(position("balance_list")),
                    cpu.map_or("-".to_string(), |c| format!("{c:.2}")),
                    percentile(latencies, 0.999),
                    extra[c].map_or("-".to_string(), |(e, n)| format!(
                        "{:.2}",
                        e as f64 * 100.0 / n.max(1) as f64
                    ))
                );
            }
            println!("# failed in the warm-up (not in the table): {}", warm_up_failed.join(", "));
            if let (Some(before), Some(hedge)) = (hedge_before, &hedge) {
                let after = hedge.stats();
                let requests = after.hedged_requests - before.hedged_requests;
                let extra = after.extra_attempts - before.extra_attempts;
                println!(
                    "# steady_hedged over the rounds: {requests} requests, {extra} extra attempts ({:.2}%), {} refused by the budget, {} with no other member, {} won by an extra attempt",
                    extra as f64 * 100.0 / requests.max(1) as f64,
                    after.refused_by_budget - before.refused_by_budget,
                    after.no_other_member - before.no_other_member,
                    after.hedges_won - before.hedges_won,
                );
            }
        }
    });
}
