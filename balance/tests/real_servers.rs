//! The balancer over real HTTP/2 servers on 127.0.0.1: resizing under load, planned
//! removal, a killed backend, an empty job, a subset-size change, and many concurrent
//! requests. Every server and loop here is bounded in count and time.

mod support;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use steady_balance::{Balance, BalanceConfig, BalanceError, JobView, TaskState};
use steady_slice::{Assignment, Slice, SliceKey};
use steady_subset::{Algorithm, Subsetting};
use steady_testing::eventually;
use support::{connector, header_key, keyed_request, request, start_servers, task_of, TestServer, H2};
use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;
use tower::ServiceExt;

fn view(servers: &[TestServer], size: usize) -> JobView<SocketAddr> {
    JobView::serving(servers[..size].iter().map(|s| s.addr))
}

/// Steady load: `concurrency` loops sending requests of `delay_ms` until stopped.
struct Load {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicUsize>,
    failed: Arc<AtomicUsize>,
    /// When each failed request was sent.
    failures_sent_at: Arc<Mutex<Vec<Instant>>>,
    loops: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(balance: &Balance<H2>, concurrency: usize, delay_ms: u64) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicUsize::new(0));
        let failed = Arc::new(AtomicUsize::new(0));
        let failures_sent_at = Arc::new(Mutex::new(Vec::new()));
        let loops = (0..concurrency)
            .map(|_| {
                let (b, stop, ok, failed) = (balance.clone(), stop.clone(), ok.clone(), failed.clone());
                let failures_sent_at = failures_sent_at.clone();
                tokio::spawn(async move {
                    // Bounded: at most 10,000 requests per loop.
                    for _ in 0..10_000 {
                        if stop.load(Ordering::SeqCst) {
                            break;
                        }
                        let sent_at = Instant::now();
                        let result = match b.clone().oneshot(request(delay_ms)).await {
                            Ok(response) => task_of(response).await.map(|_| ()),
                            Err(e) => Err(e),
                        };
                        match result {
                            Ok(()) => ok.fetch_add(1, Ordering::SeqCst),
                            Err(_) => {
                                failures_sent_at.lock().unwrap().push(sent_at);
                                failed.fetch_add(1, Ordering::SeqCst)
                            }
                        };
                    }
                })
            })
            .collect();
        Self { stop, ok, failed, failures_sent_at, loops }
    }

    fn succeeded(&self) -> usize {
        self.ok.load(Ordering::SeqCst)
    }

    /// Waits (bounded) until `n` more requests have succeeded than now: the load ran on.
    async fn run_on_for(&self, n: usize) {
        let target = self.succeeded() + n;
        eventually("the load to run on", || self.succeeded() >= target).await;
    }

    /// Stops the loops and returns (succeeded, failed).
    async fn stop(self) -> (usize, usize) {
        let (ok, failed, _) = self.stop_and_time_failures().await;
        (ok, failed)
    }

    /// Stops the loops and returns (succeeded, failed, when each failed request was sent).
    async fn stop_and_time_failures(self) -> (usize, usize, Vec<Instant>) {
        self.stop.store(true, Ordering::SeqCst);
        for l in self.loops {
            l.await.unwrap();
        }
        let sent_at = std::mem::take(&mut *self.failures_sent_at.lock().unwrap());
        (self.ok.load(Ordering::SeqCst), self.failed.load(Ordering::SeqCst), sent_at)
    }
}

fn subset(m: usize, n: usize, k: usize) -> Vec<usize> {
    Algorithm::default().subset(m, n, k).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resizing_under_load_opens_only_the_subset_change() {
    let servers = start_servers(16).await;
    let (m, k) = (3, 4);
    let (job, views) = watch::channel(view(&servers, 10));
    let balance = Balance::new(BalanceConfig::new(m, k), connector(), WatchStream::new(views)).unwrap();
    eventually("the first subset", || balance.stats().members.len() == k).await;
    let load = Load::start(&balance, 8, 1);
    let mut size = 10;
    for next in [11, 12, 16, 15, 12, 10, 13] {
        let accepted_before: usize = servers.iter().map(TestServer::accepted).sum();
        let old: HashSet<usize> = subset(m, size, k).into_iter().collect();
        let new: HashSet<usize> = subset(m, next, k).into_iter().collect();
        job.send_replace(view(&servers, next));
        eventually("the new subset", || {
            let s = balance.stats();
            s.subset == subset(m, next, k) && s.members.len() == k
        })
        .await;
        // Connections the servers saw opened: exactly the members that joined. A member
        // counts once its client side is connected, which can be just before the server's
        // accept loop counts it: wait for the servers' count, then check it is exact.
        let joined = new.difference(&old).count();
        let accepted = || servers.iter().map(TestServer::accepted).sum::<usize>() - accepted_before;
        eventually("the servers to accept the joined members", || accepted() >= joined).await;
        assert_eq!(accepted(), joined, "{size} -> {next}");
        // Members that left close their connection once their requests finish.
        eventually("connections of departed members to close", || {
            servers.iter().enumerate().all(|(i, s)| s.open() == usize::from(new.contains(&i)))
        })
        .await;
        size = next;
    }
    let (ok, failed) = load.stop().await;
    assert_eq!(failed, 0, "a planned resize loses no request");
    assert!(ok > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planned_removal_loses_no_request() {
    let servers = start_servers(4).await;
    let (job, views) = watch::channel(view(&servers, 4));
    let balance = Balance::new(BalanceConfig::new(0, 4), connector(), WatchStream::new(views)).unwrap();
    eventually("all four members", || balance.stats().members.len() == 4).await;
    let load = Load::start(&balance, 32, 20);
    eventually("requests on the member to drain", || servers[2].requests() > 0).await;
    job.send_replace(view(&servers, 4).with_state(2, TaskState::Draining));
    eventually("the drained connection to close", || servers[2].open() == 0).await;
    let after_close = servers[2].requests();
    // A hundred requests more, none of which may reach it.
    load.run_on_for(100).await;
    let (ok, failed) = load.stop().await;
    assert_eq!(failed, 0, "draining loses no request");
    assert!(ok > 100);
    assert_eq!(servers[2].requests(), after_close, "no request reaches a drained backend");
    assert_eq!(
        balance.stats().members.iter().map(|m| m.task).collect::<HashSet<_>>(),
        HashSet::from([0, 1, 3])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_backend_fails_only_the_requests_on_it() {
    let servers = start_servers(4).await;
    let (_job, views) = watch::channel(view(&servers, 4));
    let balance = Balance::new(BalanceConfig::new(0, 3), connector(), WatchStream::new(views)).unwrap();
    eventually("three members", || balance.stats().members.len() == 3).await;
    let victim = balance.stats().members[0].task;
    let load = Load::start(&balance, 24, 50);
    // Every loop has its request in flight: from now on a request starts only when another
    // ends, so the victim's count stays put until the kill.
    eventually("the load at full concurrency", || {
        balance.stats().members.iter().map(|m| m.in_flight).sum::<usize>() == 24
    })
    .await;
    let in_flight_on_victim =
        balance.stats().members.iter().find(|m| m.task == victim).map_or(0, |m| m.in_flight);
    servers[victim].kill();
    // The stand-in (the fourth server) takes over.
    eventually("a stand-in", || {
        let s = balance.stats();
        s.members.len() == 3 && s.members.iter().all(|m| m.task != victim)
    })
    .await;
    let ejected = Instant::now();
    // A hundred requests more, all sent after the ejection.
    load.run_on_for(100).await;
    let (ok, failed, failures_sent_at) = load.stop_and_time_failures().await;
    let stats = balance.stats();
    // Every failure was a call on the killed backend: the survivors failed nothing. (The
    // balancer may count more failures than callers saw: a request the dead connection
    // refused before sending it moves to another member and succeeds.)
    assert!(stats.members.iter().all(|m| m.failures == 0), "{stats:?}");
    assert!(stats.failures as usize >= failed);
    // The requests that failed were those in flight there when it died (give or take one
    // sent into the dead connection before the client saw it close).
    assert!(
        failed >= 1 && failed <= in_flight_on_victim + 1,
        "{failed} failed, {in_flight_on_victim} in flight"
    );
    // Nothing failed once it was out of rotation.
    let late: Vec<Duration> =
        failures_sent_at.iter().filter(|&&t| t > ejected).map(|&t| t - ejected).collect();
    assert!(late.is_empty(), "requests sent after the ejection failed, sent {late:?} after it");
    assert!(ok > 100);
    assert_eq!(stats.ejections, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_job_fails_fast() {
    let (_job, views) = watch::channel(JobView::<SocketAddr>::default());
    let wait = Duration::from_millis(100);
    let balance = Balance::new(
        BalanceConfig::new(0, 3).with_no_backend_wait(wait),
        connector(),
        WatchStream::new(views),
    )
    .unwrap();
    let start = Instant::now();
    let err = balance.oneshot(request(0)).await.unwrap_err();
    let took = start.elapsed();
    assert!(took >= wait && took < wait + Duration::from_millis(400), "{took:?}");
    // The error says how long the request really waited: the configured wait, and no more
    // than the call took.
    match err.downcast_ref::<BalanceError>() {
        Some(BalanceError::NoReadyBackends { waited }) => {
            assert!(*waited >= wait && *waited <= took, "{waited:?}")
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changing_k_connects_and_disconnects_only_the_difference() {
    let servers = start_servers(12).await;
    let (_job, views) = watch::channel(view(&servers, 12));
    let balance = Balance::new(BalanceConfig::new(5, 3), connector(), WatchStream::new(views)).unwrap();
    eventually("three members", || balance.stats().members.len() == 3).await;
    // A connection is up on the client's side before the server's accept loop has counted
    // it: wait for the servers to see it, then check that no more came.
    let accepted = || servers.iter().map(TestServer::accepted).sum::<usize>();
    eventually("three connections accepted", || accepted() >= 3).await;
    assert_eq!(accepted(), 3);
    balance.set_subset_size(7).unwrap();
    eventually("seven members", || balance.stats().members.len() == 7).await;
    eventually("seven connections accepted", || accepted() >= 7).await;
    assert_eq!(accepted(), 7, "growing k only opens the new members");
    balance.set_subset_size(2).unwrap();
    let keep: HashSet<usize> = subset(5, 12, 2).into_iter().collect();
    eventually("five connections to close", || {
        servers.iter().enumerate().all(|(i, s)| s.open() == usize::from(keep.contains(&i)))
    })
    .await;
    assert_eq!(accepted(), 7, "shrinking k opens nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_concurrent_requests_complete() {
    let servers = start_servers(4).await;
    let (_job, views) = watch::channel(view(&servers, 4));
    // Requests in flight as the load: the even spread asserted below is its property.
    // Peak EWMA (the default) follows each member's recent latency, which these requests'
    // own delays (0 to 2 ms) make differ by several times.
    let config = BalanceConfig::new(0, 4)
        .with_no_backend_wait(Duration::from_secs(10))
        .with_load(steady_balance::Load::InFlight);
    let balance = Balance::new(config, connector(), WatchStream::new(views)).unwrap();
    eventually("all four members", || balance.stats().members.len() == 4).await;
    let calls: Vec<_> = (0..5_000)
        .map(|i| {
            let b = balance.clone();
            tokio::spawn(async move { task_of(b.oneshot(request(i % 3)).await?).await })
        })
        .collect();
    let all =
        tokio::time::timeout(Duration::from_secs(30), futures_util::future::join_all(calls)).await.unwrap();
    let mut per_task = [0usize; 4];
    for r in all {
        per_task[r.unwrap().unwrap()] += 1;
    }
    assert_eq!(per_task.iter().sum::<usize>(), 5_000);
    assert!(per_task.iter().all(|&n| n > 500), "{per_task:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_traffic_reaches_only_the_assigned_servers() {
    let servers = start_servers(8).await;
    let (_job, views) = watch::channel(view(&servers, 8));
    let balance = Balance::new(BalanceConfig::new(1, 2), connector(), WatchStream::new(views))
        .unwrap()
        .with_key_extractor(header_key as fn(&http::Request<_>) -> Option<SliceKey>);
    let slices = vec![
        Slice::new(SliceKey(0), vec![0, 5]),
        Slice::new(SliceKey(1 << 62), vec![6]),
        Slice::new(SliceKey(1 << 63), vec![2, 3, 7]),
        Slice::new(SliceKey(3 << 62), vec![4]),
    ];
    let assignment = Assignment::new(1, slices).unwrap();
    let (_tx, rx) = watch::channel(assignment.clone());
    balance.follow_assignment_watch(rx);
    eventually("the assignment", || balance.stats().assignment_generation == Some(1)).await;
    for i in 0..400 {
        let key = format!("user-{i}");
        let task = task_of(balance.clone().oneshot(keyed_request(&key)).await.unwrap()).await.unwrap();
        let replicas = assignment.slice_for(SliceKey::of(&key)).replicas();
        assert!(replicas.contains(&(task as u32)), "{key} answered by {task}, not by {replicas:?}");
    }
    // What each server recorded: only keys of the slices it serves, and 400 in all.
    let mut received = 0;
    for server in &servers {
        for key in server.stats.keys.lock().unwrap().iter() {
            let replicas = assignment.slice_for(SliceKey::of(key)).replicas();
            assert!(replicas.contains(&(server.task as u32)), "server {} got {key}", server.task);
            received += 1;
        }
    }
    assert_eq!(received, 400);
    assert_eq!(balance.stats().keyed_fallbacks, 0);
}
