//! Zone-aware routing: subsets drawn per zone, requests that stay in their zone while it
//! has the capacity and spill in proportion when it has not, a zone killed under load,
//! keyed requests that prefer their zone, and views without zones routed as before.
//! Real HTTP/2 servers on 127.0.0.1 (bounded in count and time), and a property test
//! of the per-zone subsets on mock connections.

mod support;

use std::collections::{BTreeMap, HashSet};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use steady_balance::{Balance, BalanceConfig, JobView, Locality, Zone, ZoneRouting, ZoneSizes};
use steady_slice::{Assignment, Slice, SliceKey};
use steady_subset::{Algorithm, Subsetting};
use steady_testing::eventually;
use support::{connector, header_key, keyed_request, request, start_servers, task_of, TestServer, H2};
use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;
use tower::{service_fn, ServiceExt};

const ZONES: [&str; 3] = ["a", "b", "c"];

fn zone(label: &str) -> Zone {
    Zone::new(label).unwrap()
}

/// Frontends per zone.
fn frontends(a: usize, b: usize, c: usize) -> ZoneSizes {
    ZoneSizes::new().with(zone("a"), a).with(zone("b"), b).with(zone("c"), c)
}

/// The zone of server `i` of `per_zone`-server zones a, b, c (job indices zone by zone).
fn zone_of(i: usize, per_zone: usize) -> &'static str {
    ZONES[i / per_zone]
}

/// The job: every server serving, server `i` at zone index `i % per_zone` of its zone.
fn zoned_view(servers: &[TestServer], per_zone: usize) -> JobView<SocketAddr> {
    let view = JobView::serving(servers.iter().map(|s| s.addr));
    (0..servers.len())
        .fold(view, |view, i| view.with_locality(i, Locality::new(zone(zone_of(i, per_zone)), i % per_zone)))
}

fn zone_aware(zone_label: &str, index: usize, k: usize, sizes: ZoneSizes) -> BalanceConfig {
    BalanceConfig::new(index, k).with_zones(ZoneRouting::new(zone(zone_label), sizes))
}

/// Sends `n` requests from `concurrency` loops; returns the requests each task answered.
async fn send(balance: &Balance<H2>, n: usize, concurrency: usize) -> BTreeMap<usize, usize> {
    let answered: Arc<Mutex<BTreeMap<usize, usize>>> = Arc::default();
    let next = Arc::new(AtomicUsize::new(0));
    let loops: Vec<_> = (0..concurrency)
        .map(|_| {
            let (b, answered, next) = (balance.clone(), answered.clone(), next.clone());
            tokio::spawn(async move {
                while next.fetch_add(1, Ordering::SeqCst) < n {
                    let response = b.clone().oneshot(request(0)).await.expect("a request failed");
                    let task = task_of(response).await.expect("a response failed");
                    *answered.lock().unwrap().entry(task).or_default() += 1;
                }
            })
        })
        .collect();
    for l in loops {
        l.await.unwrap();
    }
    let answered = answered.lock().unwrap().clone();
    answered
}

/// The share of `answered` requests that each zone's servers took.
fn zone_shares(answered: &BTreeMap<usize, usize>, per_zone: usize) -> BTreeMap<&'static str, f64> {
    let total: usize = answered.values().sum();
    let mut shares = BTreeMap::new();
    for (&task, &n) in answered {
        *shares.entry(zone_of(task, per_zone)).or_default() += n as f64 / total as f64;
    }
    shares
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_stay_in_a_zone_that_has_the_capacity_and_nothing_crosses() {
    let servers = start_servers(12).await;
    let (_job, views) = watch::channel(zoned_view(&servers, 4));
    // Frontends 3/3/3, backends 4/4/4: every zone covers its demand.
    let config = zone_aware("b", 1, 3, frontends(3, 3, 3));
    let balance = Balance::new(config, connector(), WatchStream::new(views)).unwrap();
    eventually("three members", || balance.stats().members.len() == 3).await;
    let answered = send(&balance, 300, 8).await;
    assert!(answered.keys().all(|&t| zone_of(t, 4) == "b"), "{answered:?}");
    let stats = balance.stats();
    assert!(stats.spill.is_empty() && stats.local_share_ppm == 1_000_000, "{stats:?}");
    // The subset is Rocksteadier's for zone index 1 over zone b's four backends (job 4..8).
    let want: Vec<usize> = Algorithm::default().subset(1, 4, 3).unwrap().into_iter().map(|i| 4 + i).collect();
    assert_eq!(stats.subset, want);
    // No connection to another zone was ever opened.
    for (i, server) in servers.iter().enumerate() {
        if zone_of(i, 4) != "b" {
            assert_eq!(server.accepted(), 0, "server {i} of zone {}", zone_of(i, 4));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zone_short_of_backends_spills_its_excess_in_proportion_to_the_surplus() {
    let servers = start_servers(12).await;
    let (_job, views) = watch::channel(zoned_view(&servers, 4));
    // Frontends 6/3/3 (demand 50/25/25%), backends 4/4/4 (a third each): zone a keeps
    // two thirds of its requests and spills a sixth to each of b and c.
    let config = zone_aware("a", 0, 4, frontends(6, 3, 3));
    let balance = Balance::new(config, connector(), WatchStream::new(views)).unwrap();
    eventually("a's four members and b's and c's", || {
        let s = balance.stats();
        s.members.len() == 12 && s.spill.iter().all(|z| z.members.len() == 4)
    })
    .await;
    let stats = balance.stats();
    assert_eq!(stats.local_share_ppm, 666_667);
    let spill: Vec<(&str, u32)> = stats.spill.iter().map(|z| (z.zone.as_str(), z.share_ppm)).collect();
    assert_eq!(spill, [("b", 166_667), ("c", 166_667)]);
    let answered = send(&balance, 20_000, 16).await;
    let shares = zone_shares(&answered, 4);
    for (zone, want) in [("a", 2.0 / 3.0), ("b", 1.0 / 6.0), ("c", 1.0 / 6.0)] {
        let got = shares.get(zone).copied().unwrap_or(0.0);
        assert!((got - want).abs() < 0.02, "zone {zone}: {got:.3} of the requests, {want:.3} computed");
    }
    // A zone's frontends double elsewhere (c: 3 -> 6): demand 40/20/40%, and a and c
    // both fall short; b alone has a surplus and takes all that spills.
    balance.set_frontend_zones(frontends(6, 3, 6));
    eventually("spill to b only", || {
        let s = balance.stats();
        s.spill.len() == 1 && s.spill[0].zone == zone("b")
    })
    .await;
    let stats = balance.stats();
    // a keeps capacity / demand = (1/3) / (2/5) = 5/6.
    assert_eq!((stats.local_share_ppm, stats.spill[0].share_ppm), (833_333, 166_667));
}

/// Load that keeps `concurrency` requests in flight and records when each failed one
/// was sent.
struct Load {
    stop: Arc<AtomicBool>,
    failed_at: Arc<Mutex<Vec<Instant>>>,
    answered: Arc<Mutex<Vec<usize>>>,
    loops: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(balance: &Balance<H2>, concurrency: usize, delay_ms: u64) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let failed_at: Arc<Mutex<Vec<Instant>>> = Arc::default();
        let answered: Arc<Mutex<Vec<usize>>> = Arc::default();
        let loops = (0..concurrency)
            .map(|_| {
                let (b, stop, failed_at, answered) =
                    (balance.clone(), stop.clone(), failed_at.clone(), answered.clone());
                tokio::spawn(async move {
                    // Bounded: at most 20,000 requests per loop.
                    for _ in 0..20_000 {
                        if stop.load(Ordering::SeqCst) {
                            break;
                        }
                        let sent_at = Instant::now();
                        let result = match b.clone().oneshot(request(delay_ms)).await {
                            Ok(response) => task_of(response).await,
                            Err(e) => Err(e),
                        };
                        match result {
                            Ok(task) => answered.lock().unwrap().push(task),
                            Err(_) => failed_at.lock().unwrap().push(sent_at),
                        }
                    }
                })
            })
            .collect();
        Self { stop, failed_at, answered, loops }
    }

    fn answered(&self) -> usize {
        self.answered.lock().unwrap().len()
    }

    /// Stops the loops; returns the tasks that answered, in order, and when each failed
    /// request was sent.
    async fn stop(self) -> (Vec<usize>, Vec<Instant>) {
        self.stop.store(true, Ordering::SeqCst);
        for l in self.loops {
            l.await.unwrap();
        }
        let answered = std::mem::take(&mut *self.answered.lock().unwrap());
        let failed_at = std::mem::take(&mut *self.failed_at.lock().unwrap());
        (answered, failed_at)
    }
}

/// The test servers' connector, slowed by `delay` for the addresses in `slow`.
fn slowed_connector(
    slow: Arc<Mutex<HashSet<SocketAddr>>>,
    delay: Duration,
) -> impl tower::Service<
    SocketAddr,
    Response = H2,
    Error = tower::BoxError,
    Future = std::pin::Pin<Box<dyn std::future::Future<Output = Result<H2, tower::BoxError>> + Send>>,
> + Send
       + 'static {
    service_fn(move |addr: SocketAddr| {
        let slow = slow.lock().unwrap().contains(&addr);
        Box::pin(async move {
            if slow {
                tokio::time::sleep(delay).await;
            }
            connector().oneshot(addr).await
        }) as std::pin::Pin<Box<dyn std::future::Future<Output = Result<H2, tower::BoxError>> + Send>>
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zone_killed_under_load_spills_everything_and_its_return_brings_requests_home() {
    let mut servers = start_servers(12).await;
    let (job, views) = watch::channel(zoned_view(&servers, 4));
    let slow: Arc<Mutex<HashSet<SocketAddr>>> = Arc::default();
    let connector = slowed_connector(slow.clone(), Duration::from_millis(300));
    // Frontends 3/3/3: everything local while zone a serves.
    let config = zone_aware("a", 0, 4, frontends(3, 3, 3)).with_no_backend_wait(Duration::from_millis(200));
    let balance = Balance::new(config, connector, WatchStream::new(views)).unwrap();
    eventually("a's four members", || balance.stats().members.len() == 4).await;
    let load = Load::start(&balance, 24, 20);
    eventually("the load at full concurrency", || {
        balance.stats().members.iter().map(|m| m.in_flight).sum::<usize>() == 24
    })
    .await;
    // Zone a's backends die (not drained: the view still says they serve).
    let killed_at = Instant::now();
    for server in &servers[..4] {
        server.kill();
    }
    eventually("everything spilled to b and c", || {
        let s = balance.stats();
        s.local_share_ppm == 0 && s.spill.len() == 2 && s.members.iter().all(|m| zone_of(m.task, 4) != "a")
    })
    .await;
    let spilled_at = Instant::now();
    // The spill took over within the first second.
    assert!(
        spilled_at - killed_at < Duration::from_secs(1),
        "spilled {:?} after the kill",
        spilled_at - killed_at
    );
    let answered_before = load.answered();
    eventually("200 requests answered in b and c", || load.answered() >= answered_before + 200).await;

    // Zone a comes back (new processes at new ports, the same zone indices), slow to
    // connect: requests keep going to b and c until a's connections are ready (make
    // before break), then come home, and the cross-zone connections close.
    for (i, slot) in servers.iter_mut().enumerate().take(4) {
        *slot = TestServer::start(i).await;
        slow.lock().unwrap().insert(slot.addr);
    }
    job.send_replace(zoned_view(&servers, 4));
    eventually("local routing restored", || {
        let s = balance.stats();
        s.spill.is_empty() && s.members.len() == 4 && s.members.iter().all(|m| zone_of(m.task, 4) == "a")
    })
    .await;
    let answered_home = load.answered();
    eventually("200 requests answered at home", || load.answered() >= answered_home + 200).await;
    let (answered, failed_at) = load.stop().await;
    // Only requests in flight on the killed backends (or sent into their connections
    // before the client saw them close) failed: none sent after the spill took over, not
    // while the zone came back.
    let late = failed_at.iter().filter(|&&t| t > spilled_at).count();
    assert_eq!(late, 0, "{late} requests sent after the spill failed ({} in all)", failed_at.len());
    // b and c share the spilled requests evenly (a half each, give or take).
    let spilled: Vec<usize> = answered[answered_before..answered_before + 200].to_vec();
    let in_b = spilled.iter().filter(|&&t| zone_of(t, 4) == "b").count() as f64 / spilled.len() as f64;
    assert!((0.3..=0.7).contains(&in_b), "{in_b:.2} of the spilled requests went to b");
    // Once at home, requests stay there: the last hundred answered all came from a (the
    // first ones after the change may be requests still in flight elsewhere).
    let last = &answered[answered.len() - 100..];
    assert!(last.iter().all(|&t| zone_of(t, 4) == "a"), "{last:?}");
    let open_elsewhere = || servers[4..].iter().map(TestServer::open).sum::<usize>();
    eventually("no connection to b or c", || open_elsewhere() == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_members_with_healthy_stand_ins_keep_requests_in_the_zone() {
    // Zone a has 8 backends, b and c 4; k = 4. Three of a's four primaries die: three
    // stand-ins from a take their place, and nothing spills.
    let mut servers = start_servers(8).await;
    for i in 8..16 {
        servers.push(TestServer::start(i).await);
    }
    let view = (0..16).fold(JobView::serving(servers.iter().map(|s| s.addr)), |view, i| {
        let (zone_label, index) = if i < 8 { ("a", i) } else { (ZONES[1 + (i - 8) / 4], (i - 8) % 4) };
        view.with_locality(i, Locality::new(zone(zone_label), index))
    });
    let (_job, views) = watch::channel(view);
    let balance =
        Balance::new(zone_aware("a", 0, 4, frontends(1, 1, 1)), connector(), WatchStream::new(views))
            .unwrap();
    eventually("a's four members", || balance.stats().members.len() == 4).await;
    let primaries: Vec<usize> = balance.stats().subset;
    // Each dead primary is known dead once a request fails on it: load finds them.
    let load = Load::start(&balance, 8, 2);
    for &t in &primaries[..3] {
        servers[t].kill();
    }
    eventually("three stand-ins in a", || {
        let s = balance.stats();
        let members: Vec<usize> = s.members.iter().map(|m| m.task).collect();
        s.spill.is_empty()
            && members.len() == 4
            && members.iter().all(|&t| t < 8 && !primaries[..3].contains(&t))
    })
    .await;
    let _ = load.stop().await;
    let answered = send(&balance, 200, 8).await;
    assert!(answered.keys().all(|&t| t < 8), "{answered:?}");
    assert_eq!(balance.stats().local_share_ppm, 1_000_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_requests_prefer_the_replica_in_their_zone() {
    let servers = start_servers(6).await;
    let (job, views) = watch::channel(zoned_view(&servers, 2));
    // One slice, replicated on task 0 (zone a), task 2 (zone b) and task 4 (zone c).
    let assignment = Assignment::new(1, vec![Slice::new(SliceKey(0), vec![0, 2, 4])]).unwrap();
    let (_assignments, assignment_rx) = watch::channel(assignment);
    let balance =
        Balance::new(zone_aware("b", 0, 2, frontends(1, 1, 1)), connector(), WatchStream::new(views))
            .unwrap()
            .with_key_extractor(header_key);
    balance.follow_assignment_watch(assignment_rx);
    eventually("the assignment in force", || balance.stats().assignment_generation == Some(1)).await;
    for key in 0..100 {
        let response = balance.clone().oneshot(keyed_request(&format!("key-{key}"))).await.unwrap();
        assert_eq!(task_of(response).await.unwrap(), 2, "key-{key}");
    }
    // Zone b's replica drains: the other zones' replicas serve (a, c).
    job.send_replace(zoned_view(&servers, 2).with_state(2, steady_balance::TaskState::Draining));
    eventually("b's replica out of the table", || balance.stats().members.iter().all(|m| m.task != 2)).await;
    let mut tasks = HashSet::new();
    for key in 0..100 {
        let response = balance.clone().oneshot(keyed_request(&format!("key-{key}"))).await.unwrap();
        tasks.insert(task_of(response).await.unwrap());
    }
    assert!(tasks.is_subset(&HashSet::from([0, 4])) && !tasks.is_empty(), "{tasks:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_view_without_zones_routes_a_zone_aware_frontend_by_its_index_in_the_frontend_job() {
    let servers = start_servers(10).await;
    let (_job, views) = watch::channel(JobView::serving(servers.iter().map(|s| s.addr)));
    // Frontend 1 of zone b, after zone a's 6: frontend 7 of the whole job.
    let balance =
        Balance::new(zone_aware("b", 1, 4, frontends(6, 3, 3)), connector(), WatchStream::new(views))
            .unwrap();
    eventually("four members", || balance.stats().members.len() == 4).await;
    let stats = balance.stats();
    assert_eq!(stats.subset, Algorithm::default().subset(7, 10, 4).unwrap());
    assert!(stats.spill.is_empty(), "{stats:?}");
}

/// A view of zones with `sizes[z]` backends each: zone z's i-th backend at job index
/// `100 * z + i` (holes between the zones), so that zone and job indices differ and a
/// zone's resize moves no other zone's tasks.
fn zones_of(sizes: &[usize]) -> JobView<usize> {
    let mut view = JobView::serving(0..100 * sizes.len());
    for (z, &size) in sizes.iter().enumerate() {
        for i in 0..100 {
            let t = 100 * z + i;
            view = if i < size {
                view.with_locality(t, Locality::new(zone(ZONES[z]), i))
            } else {
                view.with_state(t, steady_balance::TaskState::Gone)
            };
        }
    }
    view
}

/// The subset of `size` members a zone-aware balancer settles on for `view`
/// (connections always succeed), once they are all connected.
fn settled_subset(config: BalanceConfig, view: JobView<usize>, size: usize) -> Vec<usize> {
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap();
    runtime.block_on(async move {
        let connector = service_fn(|_: usize| async {
            Ok::<_, Infallible>(service_fn(|_: u32| async { Ok::<u32, Infallible>(0) }))
        });
        let (_views, rx) = watch::channel(view);
        let balance = Balance::new(config, connector, WatchStream::new(rx)).unwrap();
        eventually("the subset connected", || balance.stats().members.len() == size).await;
        balance.stats().subset
    })
}

/// Frontend `m`'s subset of size `k` over a zone of `n` backends, as job indices of
/// zone a (`0..n`).
fn rocksteadier(m: usize, n: usize, k: usize) -> Vec<usize> {
    Algorithm::default().subset(m, n, k).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Inside its zone a frontend's subset is the algorithm's over that zone (its zone
    /// index against the zone's size), so balance, diversity and churn are plain
    /// Rocksteadier's there: a resize of its own zone opens what Rocksteadier's opens,
    /// and a resize of another zone changes nothing.
    #[test]
    fn the_subset_is_rocksteadier_over_the_zone_and_other_zones_cannot_move_it(
        sizes in prop::collection::vec(1usize..60, 3),
        zone_index in 0usize..40,
        k in 1usize..8,
        resized in 1usize..60,
    ) {
        // Zone a's demand is tiny next to its capacity: nothing spills.
        let frontends = frontends(1, 100_000, 100_000);
        let config = BalanceConfig::new(zone_index, k).with_zones(ZoneRouting::new(zone("a"), frontends));
        let before = settled_subset(config.clone(), zones_of(&sizes), k.min(sizes[0]));
        prop_assert_eq!(&before, &rocksteadier(zone_index, sizes[0], k));
        // Another zone resized: the same subset.
        let other = settled_subset(config.clone(), zones_of(&[sizes[0], resized, sizes[2]]), k.min(sizes[0]));
        prop_assert_eq!(&other, &before);
        // Its own zone resized: Rocksteadier's subset for the new size, so the same churn.
        let own = settled_subset(config, zones_of(&[resized, sizes[1], sizes[2]]), k.min(resized));
        prop_assert_eq!(own, rocksteadier(zone_index, resized, k));
    }
}
