//! The balancer's behaviour against mock connections, on tokio's paused clock.

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use steady_balance::{Backoff, Balance, BalanceConfig, BalanceError, BalanceStats, JobView, Load, TaskState};
use steady_subset::{Algorithm, DecimalRocksteadier, Rocksteadier, Subsetting};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::WatchStream;
use tower::{service_fn, BoxError, ServiceExt};
use tower_test::mock;

type Conn = mock::Mock<u32, usize>;
type Handle = mock::Handle<u32, usize>;

/// How the harness's connector misbehaves for a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// The attempt fails with an error.
    Refuse,
    /// The connector panics while connecting.
    Panic,
    /// The attempt never finishes.
    Hang,
}

/// A connector that makes a tower-test mock per connection and hands its handle (with
/// the task index) to the test; tasks listed in `faults` misbehave as listed.
struct Harness {
    views: watch::Sender<JobView<usize>>,
    handles: mpsc::UnboundedReceiver<(usize, Handle)>,
    faults: Arc<Mutex<HashMap<usize, Fault>>>,
    connects: Arc<Mutex<Vec<usize>>>,
    balance: Balance<Conn>,
}

fn harness(config: BalanceConfig, size: usize) -> Harness {
    harness_with(config, size, &[])
}

fn harness_refusing(config: BalanceConfig, size: usize, refused: &[usize]) -> Harness {
    let faults: Vec<(usize, Fault)> = refused.iter().map(|&t| (t, Fault::Refuse)).collect();
    harness_with(config, size, &faults)
}

fn harness_with(config: BalanceConfig, size: usize, faults: &[(usize, Fault)]) -> Harness {
    let (views, rx) = watch::channel(JobView::serving(0..size));
    let (tx, handles) = mpsc::unbounded_channel();
    let faults: Arc<Mutex<HashMap<usize, Fault>>> = Arc::new(Mutex::new(faults.iter().copied().collect()));
    let connects: Arc<Mutex<Vec<usize>>> = Arc::default();
    let (f, c) = (faults.clone(), connects.clone());
    let connector = service_fn(move |task: usize| {
        let (tx, f, c) = (tx.clone(), f.clone(), c.clone());
        async move {
            c.lock().unwrap().push(task);
            let fault = f.lock().unwrap().get(&task).copied();
            match fault {
                Some(Fault::Refuse) => return Err::<Conn, BoxError>("connection refused".into()),
                Some(Fault::Panic) => panic!("connector bug while connecting to task {task}"),
                Some(Fault::Hang) => std::future::pending::<()>().await,
                None => {}
            }
            let (service, handle) = mock::pair::<u32, usize>();
            let _ = tx.send((task, handle));
            Ok(service)
        }
    });
    let balance = Balance::new(config, connector, WatchStream::new(rx)).unwrap();
    Harness { views, handles, faults, connects, balance }
}

/// Lets the control task and the mocks run.
async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

/// The tasks of the routing table's members.
fn ready(s: &BalanceStats) -> HashSet<usize> {
    s.members.iter().map(|m| m.task).collect()
}

/// Frontend `m`'s subset under the default algorithm, the one `BalanceConfig::new` takes.
fn subset(m: usize, n: usize, k: usize) -> Vec<usize> {
    Algorithm::default().subset(m, n, k).unwrap()
}

#[tokio::test(start_paused = true)]
async fn connects_to_exactly_its_subset() {
    let h = harness(BalanceConfig::new(13, 5), 55);
    settle().await;
    let stats = h.balance.stats();
    assert_eq!(stats.subset, subset(13, 55, 5));
    assert_eq!(stats.connections_opened, 5);
    let mut connected = h.connects.lock().unwrap().clone();
    connected.sort_unstable();
    let mut want = subset(13, 55, 5);
    want.sort_unstable();
    assert_eq!(connected, want);
    assert_eq!(stats.members.len(), 5);
}

/// From the first release the balancer's default is decimal Rocksteadier; Rocksteadier is
/// one `with_algorithm` away, and then the balancer connects to Rocksteadier's subset.
#[tokio::test(start_paused = true)]
async fn the_default_algorithm_is_decimal_rocksteadier_and_rocksteadier_can_be_pinned() {
    let decimal = Algorithm::DecimalRocksteadier(DecimalRocksteadier::default());
    let rocksteadier = Algorithm::Rocksteadier(Rocksteadier::default());
    for (m, k) in [(0, 1), (13, 5), (4_321, 20)] {
        assert_eq!(BalanceConfig::new(m, k).algorithm, decimal, "m = {m}, k = {k}");
    }
    // Frontend 13 of 55 backends, 5 connections: the two algorithms' subsets differ.
    assert_ne!(decimal.subset(13, 55, 5).unwrap(), rocksteadier.subset(13, 55, 5).unwrap());
    for (config, algorithm) in [
        (BalanceConfig::new(13, 5), &decimal),
        (BalanceConfig::new(13, 5).with_algorithm(rocksteadier.clone()), &rocksteadier),
    ] {
        let h = harness(config, 55);
        settle().await;
        assert_eq!(h.balance.stats().subset, algorithm.subset(13, 55, 5).unwrap(), "{algorithm}");
        let mut connected = h.connects.lock().unwrap().clone();
        connected.sort_unstable();
        let mut want = algorithm.subset(13, 55, 5).unwrap();
        want.sort_unstable();
        assert_eq!(connected, want, "{algorithm}");
    }
}

#[tokio::test(start_paused = true)]
async fn an_empty_job_fails_fast_with_a_typed_error() {
    let wait = Duration::from_millis(250);
    let h = harness(BalanceConfig::new(0, 3).with_no_backend_wait(wait), 0);
    let start = tokio::time::Instant::now();
    let err = h.balance.clone().oneshot(1).await.unwrap_err();
    assert_eq!(start.elapsed(), wait);
    assert_eq!(err.downcast_ref::<BalanceError>(), Some(&BalanceError::NoReadyBackends { waited: wait }));
    assert_eq!(h.balance.stats().no_backend, 1);
}

#[tokio::test(start_paused = true)]
async fn a_request_waits_for_the_first_connection_instead_of_failing() {
    let mut h = harness(BalanceConfig::new(0, 1), 1);
    let call = tokio::spawn(h.balance.clone().oneshot(5));
    let (_, mut handle) = h.handles.recv().await.unwrap();
    let (req, respond) = handle.next_request().await.unwrap();
    assert_eq!(req, 5);
    respond.send_response(50);
    assert_eq!(call.await.unwrap().unwrap(), 50);
}

#[tokio::test(start_paused = true)]
async fn growing_and_shrinking_n_opens_and_closes_only_the_subset_change() {
    let h = harness(BalanceConfig::new(7, 10), 40);
    settle().await;
    let mut opened = h.balance.stats().connections_opened;
    let mut closed = 0;
    for (from, to) in [(40, 41), (41, 42), (42, 50), (50, 49), (49, 30), (30, 31)] {
        h.views.send_replace(JobView::serving(0..to));
        settle().await;
        let before: HashSet<usize> = subset(7, from, 10).into_iter().collect();
        let after: HashSet<usize> = subset(7, to, 10).into_iter().collect();
        let stats = h.balance.stats();
        assert_eq!(
            stats.connections_opened - opened,
            after.difference(&before).count() as u64,
            "{from}->{to}"
        );
        assert_eq!(
            stats.connections_closed - closed,
            before.difference(&after).count() as u64,
            "{from}->{to}"
        );
        assert_eq!(stats.connections_open, 10);
        opened = stats.connections_opened;
        closed = stats.connections_closed;
    }
}

#[tokio::test(start_paused = true)]
async fn the_decimal_variant_connects_to_its_subset_and_resizes_by_one_connection() {
    let algorithm = Algorithm::from_name("rocksteadier-decimal").unwrap();
    let h = harness(BalanceConfig::new(27, 12).with_algorithm(algorithm.clone()), 99);
    settle().await;
    assert_eq!(h.balance.stats().subset, algorithm.subset(27, 99, 12).unwrap());
    // Across a lot boundary (100 -> 101 adds a lot and may move the start): one new
    // connection at most per step, and exactly the subset's change.
    let mut opened = h.balance.stats().connections_opened;
    for (from, to) in [(99, 100), (100, 101), (101, 102), (102, 110), (110, 111), (111, 110)] {
        h.views.send_replace(JobView::serving(0..to));
        settle().await;
        let stats = h.balance.stats();
        assert_eq!(stats.subset, algorithm.subset(27, to, 12).unwrap(), "N={to}");
        let before: HashSet<usize> = algorithm.subset(27, from, 12).unwrap().into_iter().collect();
        let new = stats.subset.iter().filter(|t| !before.contains(t)).count() as u64;
        assert_eq!(stats.connections_opened - opened, new, "{from}->{to}");
        if from.abs_diff(to) == 1 {
            assert!(new <= 1, "{from}->{to}: {new} new connections");
        }
        opened = stats.connections_opened;
    }
}

#[tokio::test(start_paused = true)]
async fn changing_k_opens_and_closes_only_the_difference() {
    let h = harness(BalanceConfig::new(3, 4), 100);
    settle().await;
    h.balance.set_subset_size(9).unwrap();
    settle().await;
    let s = h.balance.stats();
    assert_eq!((s.connections_opened, s.connections_closed), (9, 0));
    assert_eq!(s.subset, subset(3, 100, 9));
    h.balance.set_subset_size(2).unwrap();
    settle().await;
    let s = h.balance.stats();
    assert_eq!((s.connections_opened, s.connections_closed, s.connections_open), (9, 7, 2));
    assert_eq!(s.subset, subset(3, 100, 2));
}

#[tokio::test(start_paused = true)]
async fn a_refused_member_is_retried_with_backoff_while_the_next_in_order_stands_in() {
    let backoff = Backoff { base: Duration::from_secs(1), max: Duration::from_secs(8), jitter: 0.0 };
    let order = subset(2, 30, 6);
    let bad = order[1];
    let h = harness_refusing(BalanceConfig::new(2, 5).with_backoff(backoff), 30, &[bad]);
    settle().await;
    let s = h.balance.stats();
    let ready: Vec<usize> = s.members.iter().map(|m| m.task).collect();
    assert_eq!(s.subset, [&order[..5], &order[5..6]].concat(), "stand-in is the 6th in order");
    assert_eq!(ready.len(), 5);
    assert!(!ready.contains(&bad));
    // Backoff: 1 s, then 2 s, then 4 s between attempts.
    let attempts = |h: &Harness| h.connects.lock().unwrap().iter().filter(|&&t| t == bad).count();
    let first = attempts(&h);
    tokio::time::advance(Duration::from_millis(1001)).await;
    settle().await;
    assert_eq!(attempts(&h), first + 1);
    // The next delay is 2 s: nothing at 1.5 s.
    tokio::time::advance(Duration::from_millis(1500)).await;
    settle().await;
    assert_eq!(attempts(&h), first + 1, "backoff doubles");
    // Let it in: the next attempt (at 2 s) succeeds and the stand-in leaves.
    h.faults.lock().unwrap().clear();
    tokio::time::advance(Duration::from_millis(501)).await;
    settle().await;
    let s = h.balance.stats();
    assert_eq!(s.subset, order[..5]);
    assert!(s.members.iter().any(|m| m.task == bad));
    assert_eq!(s.connections_open, 5);
}

#[tokio::test(start_paused = true)]
async fn a_failed_call_ejects_the_member_and_a_stand_in_serves() {
    let backoff = Backoff { base: Duration::from_secs(5), max: Duration::from_secs(5), jitter: 0.0 };
    let mut h = harness(BalanceConfig::new(0, 1).with_backoff(backoff).with_max_stand_ins(1), 10);
    let order = subset(0, 10, 2);
    let (task, mut handle) = h.handles.recv().await.unwrap();
    assert_eq!(task, order[0]);
    settle().await;
    let call = tokio::spawn(h.balance.clone().oneshot(1));
    let (_, respond) = handle.next_request().await.unwrap();
    respond.send_error("connection reset");
    let err = call.await.unwrap().unwrap_err();
    assert_eq!(err.to_string(), "connection reset", "the backend's own error comes back");
    // The stand-in (next in order) connects and takes the traffic.
    let (stand_in, mut handle2) = h.handles.recv().await.unwrap();
    assert_eq!(stand_in, order[1]);
    settle().await;
    let call = tokio::spawn(h.balance.clone().oneshot(2));
    let (req, respond) = handle2.next_request().await.unwrap();
    assert_eq!(req, 2);
    respond.send_response(20);
    assert_eq!(call.await.unwrap().unwrap(), 20);
    let s = h.balance.stats();
    assert_eq!((s.ejections, s.subset.clone()), (1, order.clone()));
    // After the backoff the member reconnects and the stand-in is closed.
    tokio::time::advance(Duration::from_secs(5)).await;
    let (again, _handle3) = h.handles.recv().await.unwrap();
    assert_eq!(again, order[0]);
    settle().await;
    let s = h.balance.stats();
    assert_eq!(s.subset, order[..1]);
    assert_eq!(s.members.iter().map(|m| m.task).collect::<Vec<_>>(), order[..1]);
    // Opened: member, stand-in, member again; closed: the failed one and the stand-in.
    assert_eq!((s.connections_opened, s.connections_closed, s.connections_open), (3, 2, 1));
}

#[tokio::test(start_paused = true)]
async fn a_draining_backend_finishes_its_requests_then_closes() {
    let mut h = harness(BalanceConfig::new(0, 1).with_max_stand_ins(0), 4);
    let (task, mut handle) = h.handles.recv().await.unwrap();
    settle().await;
    let in_flight = tokio::spawn(h.balance.clone().oneshot(9));
    let (req, respond) = handle.next_request().await.unwrap();
    assert_eq!(req, 9);
    // Drain the member while its request is in flight.
    h.views.send_replace(JobView::serving(0..4).with_state(task, TaskState::Draining));
    let (next, mut handle2) = h.handles.recv().await.unwrap();
    assert_ne!(next, task);
    settle().await;
    let s = h.balance.stats();
    assert_eq!((s.connections_open, s.connections_closed), (2, 0), "draining connection still open");
    // New requests go to the replacement only.
    let call = tokio::spawn(h.balance.clone().oneshot(1));
    let (_, r2) = handle2.next_request().await.unwrap();
    r2.send_response(100);
    assert_eq!(call.await.unwrap().unwrap(), 100);
    // The old request completes normally, then the connection closes.
    respond.send_response(90);
    assert_eq!(in_flight.await.unwrap().unwrap(), 90);
    settle().await;
    let s = h.balance.stats();
    assert_eq!((s.connections_open, s.connections_closed), (1, 1));
    assert_eq!(s.failures, 0);
}

#[tokio::test(start_paused = true)]
async fn dropping_the_last_handle_stops_the_control_task_and_closes_connections() {
    let (tx, rx) = watch::channel(JobView::serving(0..3));
    let alive = Arc::new(());
    let witness = alive.clone();
    let connector = service_fn(move |_task: usize| {
        let token = witness.clone();
        async move {
            Ok::<_, Infallible>(service_fn(move |_: ()| {
                let _keep = &token;
                async { Ok::<_, Infallible>(()) }
            }))
        }
    });
    let balance = Balance::new(BalanceConfig::new(0, 3), connector, WatchStream::new(rx)).unwrap();
    settle().await;
    assert_eq!(Arc::strong_count(&alive), 1 + 1 + 3, "connector and three connections");
    let clone = balance.clone();
    drop(balance);
    settle().await;
    assert_eq!(Arc::strong_count(&alive), 5, "a clone keeps it running");
    drop(clone);
    settle().await;
    assert_eq!(Arc::strong_count(&alive), 1, "everything dropped");
    drop(tx);
}

#[tokio::test(start_paused = true)]
async fn requests_spread_over_the_subset() {
    let h = harness(BalanceConfig::new(0, 4), 4);
    let mut handles = h.handles;
    settle().await;
    let mut served = vec![0usize; 4];
    let mut pending = Vec::new();
    for i in 0..400u32 {
        pending.push(tokio::spawn(h.balance.clone().oneshot(i)));
    }
    settle().await;
    let mut all = Vec::new();
    while let Ok((task, handle)) = handles.try_recv() {
        all.push((task, handle));
    }
    for (task, handle) in &mut all {
        while let Ok(Some((_, respond))) =
            tokio::time::timeout(Duration::from_millis(1), handle.next_request()).await
        {
            served[*task] += 1;
            respond.send_response(0);
        }
    }
    for p in pending {
        p.await.unwrap().unwrap();
    }
    // In-flight balancing (with the tie band of docs/balancer.md#the-tie-band) keeps each
    // of 4 members near 100. A simulation of the rule put the chance of any member beyond 100 ± 25 under
    // 1 in 100,000; random picks land beyond 100 ± 20 in about 1 run in 16.
    assert_eq!(served.iter().sum::<usize>(), 400);
    assert!(served.iter().all(|&n| (70..=130).contains(&n)), "{served:?}");
    let _ = h.views;
}

#[tokio::test(start_paused = true)]
async fn peak_ewma_steers_requests_away_from_a_slow_member() {
    let load = Load::PeakEwma { decay: Duration::from_secs(10), default_rtt: Duration::from_millis(1) };
    let mut h = harness(BalanceConfig::new(0, 2).with_load(load), 2);
    let (a, mut slow) = h.handles.recv().await.unwrap();
    let (_, mut fast) = h.handles.recv().await.unwrap();
    settle().await;
    // Send requests one at a time until each member has answered once: `a` after
    // 200 ms, the other at once.
    let (mut slow_seen, mut fast_seen) = (false, false);
    for i in 0..50 {
        if slow_seen && fast_seen {
            break;
        }
        let call = tokio::spawn(h.balance.clone().oneshot(i));
        tokio::select! {
            Some((_, respond)) = slow.next_request() => {
                tokio::time::advance(Duration::from_millis(200)).await;
                respond.send_response(0);
                slow_seen = true;
            }
            Some((_, respond)) = fast.next_request() => {
                respond.send_response(0);
                fast_seen = true;
            }
        }
        call.await.unwrap().unwrap();
    }
    assert!(slow_seen && fast_seen);
    // From now on every request goes to the fast member (answered at once).
    let mut to_slow = 0;
    for i in 0..20 {
        let call = tokio::spawn(h.balance.clone().oneshot(i));
        tokio::select! {
            Some((_, respond)) = fast.next_request() => respond.send_response(1),
            Some((_, respond)) = slow.next_request() => { to_slow += 1; respond.send_response(1) }
        }
        call.await.unwrap().unwrap();
    }
    assert_eq!(to_slow, 0, "the slow member ({a}) got requests");
}

#[tokio::test(start_paused = true)]
async fn a_failing_stand_in_is_skipped_without_churning_the_healthy_one() {
    let backoff = Backoff { base: Duration::from_secs(1), max: Duration::from_secs(60), jitter: 0.0 };
    let order = subset(0, 30, 3);
    // The member and the first stand-in both refuse connections.
    let h = harness_refusing(
        BalanceConfig::new(0, 1).with_backoff(backoff).with_max_stand_ins(2),
        30,
        &[order[0], order[1]],
    );
    for _ in 0..100 {
        tokio::time::advance(Duration::from_millis(100)).await;
        settle().await;
    }
    let connects = h.connects.lock().unwrap().clone();
    let count = |t: usize| connects.iter().filter(|&&c| c == t).count();
    // Ten seconds: the second stand-in connected once and stayed; the failing ones are
    // retried on a growing backoff (0, 1, 3, 7 s), not in a loop.
    assert_eq!(count(order[2]), 1, "{connects:?}");
    assert!(count(order[0]) <= 5 && count(order[1]) <= 5, "{connects:?}");
    let s = h.balance.stats();
    assert_eq!(s.members.iter().map(|m| m.task).collect::<Vec<_>>(), [order[2]]);
    assert_eq!((s.connections_opened, s.connections_closed), (1, 0));
}

#[tokio::test(start_paused = true)]
async fn a_backend_that_fails_every_call_is_retried_on_a_growing_backoff() {
    let backoff = Backoff { base: Duration::from_secs(1), max: Duration::from_secs(60), jitter: 0.0 };
    let (_tx, rx) = watch::channel(JobView::serving(0..1));
    let connects = Arc::new(Mutex::new(0usize));
    let c = connects.clone();
    let connector = service_fn(move |_task: usize| {
        *c.lock().unwrap() += 1;
        async {
            Ok::<_, Infallible>(service_fn(|_: u32| async { Err::<u32, BoxError>("internal error".into()) }))
        }
    });
    let balance = Balance::new(
        BalanceConfig::new(0, 1).with_backoff(backoff).with_no_backend_wait(Duration::from_millis(10)),
        connector,
        WatchStream::new(rx),
    )
    .unwrap();
    // A request every 100 ms for 6.5 s: each new connection fails its first call.
    for i in 0..65 {
        let _ = balance.clone().oneshot(i).await;
        tokio::time::advance(Duration::from_millis(100)).await;
        settle().await;
    }
    // Connections at 0, 1, 3 and 7 s (had the backoff stayed at 1 s: about 6).
    assert_eq!(*connects.lock().unwrap(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_backend_that_stays_not_ready_loses_the_request_to_another_member() {
    let mut h = harness(BalanceConfig::new(0, 2).with_no_backend_wait(Duration::from_millis(300)), 2);
    let (_, mut a) = h.handles.recv().await.unwrap();
    let (_, mut b) = h.handles.recv().await.unwrap();
    settle().await;
    // One member accepts nothing (its readiness never comes).
    a.allow(0);
    let mut calls = Vec::new();
    for i in 0..10 {
        calls.push(tokio::spawn(h.balance.clone().oneshot(i)));
    }
    settle().await;
    tokio::time::advance(Duration::from_millis(301)).await;
    settle().await;
    let mut answered = 0;
    while let Ok(Some((req, respond))) =
        tokio::time::timeout(Duration::from_millis(1), b.next_request()).await
    {
        respond.send_response(req as usize);
        answered += 1;
    }
    assert_eq!(answered, 10, "every request ends up on the ready member");
    for c in calls {
        c.await.unwrap().unwrap();
    }
    assert!(tokio::time::timeout(Duration::from_millis(1), a.next_request()).await.is_err());
}

#[tokio::test(start_paused = true)]
async fn a_connector_that_panics_costs_its_backend_a_retry_and_a_stand_in_serves() {
    let backoff = Backoff { base: Duration::from_secs(1), max: Duration::from_secs(8), jitter: 0.0 };
    let order = subset(4, 20, 4);
    let bad = order[0];
    let h = harness_with(BalanceConfig::new(4, 3).with_backoff(backoff), 20, &[(bad, Fault::Panic)]);
    settle().await;
    let s = h.balance.stats();
    assert_eq!(s.connect_failures, 1, "the panic counts as a failed attempt");
    assert_eq!(s.subset, order, "the next in order stands in");
    assert_eq!(ready(&s), order[1..].iter().copied().collect());
    // The control task lives on: once the connector behaves, the retry connects the
    // member and the stand-in leaves.
    h.faults.lock().unwrap().clear();
    tokio::time::advance(Duration::from_millis(1001)).await;
    settle().await;
    let s = h.balance.stats();
    assert_eq!(s.subset, order[..3]);
    assert!(s.members.iter().any(|m| m.task == bad));
    assert_eq!(s.connections_open, 3);
}

#[tokio::test(start_paused = true)]
async fn a_connection_attempt_that_never_finishes_times_out_and_a_stand_in_serves() {
    let order = subset(4, 20, 4);
    let stuck = order[1];
    let config = BalanceConfig::new(4, 3).with_connect_timeout(Duration::from_secs(2));
    let h = harness_with(config, 20, &[(stuck, Fault::Hang)]);
    settle().await;
    assert_eq!(h.balance.stats().members.len(), 2);
    tokio::time::advance(Duration::from_millis(1990)).await;
    settle().await;
    assert_eq!(h.balance.stats().connect_failures, 0, "still within the connect timeout");
    tokio::time::advance(Duration::from_millis(20)).await;
    settle().await;
    let s = h.balance.stats();
    assert_eq!(s.connect_failures, 1);
    assert_eq!(s.subset, order);
    assert_eq!(ready(&s), [order[0], order[2], order[3]].into_iter().collect());
}

/// A connector whose readiness never comes.
struct NeverReady;

impl tower::Service<usize> for NeverReady {
    type Response = Conn;
    type Error = BoxError;
    type Future = std::future::Ready<Result<Conn, BoxError>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), BoxError>> {
        std::task::Poll::Pending
    }

    fn call(&mut self, _: usize) -> Self::Future {
        unreachable!("never ready, so never called")
    }
}

#[tokio::test(start_paused = true)]
async fn a_connector_that_never_becomes_ready_does_not_stall_the_balancer() {
    let (views, rx) = watch::channel(JobView::serving(0..10));
    let wait = Duration::from_millis(500);
    let config =
        BalanceConfig::new(0, 2).with_connect_timeout(Duration::from_secs(1)).with_no_backend_wait(wait);
    let balance = Balance::new(config, NeverReady, WatchStream::new(rx)).unwrap();
    // Both attempts wait for readiness side by side and give up at the connect timeout.
    tokio::time::sleep(Duration::from_millis(1010)).await;
    assert_eq!(balance.stats().connect_failures, 2, "{:?}", balance.stats());
    // The control task is never held up: it follows a new view at once.
    views.send_replace(JobView::serving(0..3));
    tokio::time::sleep(Duration::from_millis(1)).await;
    let s = balance.stats();
    assert_eq!(s.subset[..2], subset(0, 3, 2)[..], "{s:?}");
    // And requests fail fast rather than hang.
    let err = balance.oneshot(1).await.unwrap_err();
    assert_eq!(err.downcast_ref::<BalanceError>(), Some(&BalanceError::NoReadyBackends { waited: wait }));
}

/// A connector that panics where it is told, or is slow to be ready and to connect.
#[derive(Default)]
struct Scripted {
    panic_in: Option<&'static str>,
    not_ready_for: Duration,
    connect_takes: Duration,
    ready_at: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl tower::Service<usize> for Scripted {
    type Response = Conn;
    type Error = BoxError;
    type Future = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Conn, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), BoxError>> {
        if self.panic_in == Some("poll_ready") {
            panic!("connector bug in poll_ready");
        }
        let wait = self.not_ready_for;
        let sleep = self.ready_at.get_or_insert_with(|| Box::pin(tokio::time::sleep(wait)));
        std::task::ready!(std::future::Future::poll(sleep.as_mut(), cx));
        self.ready_at = None;
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: usize) -> Self::Future {
        if self.panic_in == Some("call") {
            panic!("connector bug in call");
        }
        let takes = self.connect_takes;
        Box::pin(async move {
            tokio::time::sleep(takes).await;
            Ok(mock::pair::<u32, usize>().0)
        })
    }
}

#[tokio::test(start_paused = true)]
async fn a_connector_that_panics_in_poll_ready_or_call_costs_attempts_not_the_balancer() {
    for panic_in in ["poll_ready", "call"] {
        let (views, rx) = watch::channel(JobView::serving(0..10));
        let connector = Scripted { panic_in: Some(panic_in), ..Scripted::default() };
        let balance = Balance::new(BalanceConfig::new(0, 2), connector, WatchStream::new(rx)).unwrap();
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(balance.stats().connect_failures >= 2, "{panic_in}: {:?}", balance.stats());
        // The control task lives on: it follows the next view.
        views.send_replace(JobView::serving(0..3));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(balance.stats().subset[..2], subset(0, 3, 2)[..], "{panic_in}");
    }
}

#[tokio::test(start_paused = true)]
async fn readiness_and_connecting_share_one_connect_timeout() {
    let config =
        || BalanceConfig::new(0, 1).with_connect_timeout(Duration::from_secs(1)).with_max_stand_ins(0);
    let (_views, rx) = watch::channel(JobView::serving(0..1));
    // 0.6 s to be ready and 0.6 s to connect: over the 1 s budget.
    let ms = Duration::from_millis;
    let slow = Scripted { not_ready_for: ms(600), connect_takes: ms(600), ..Scripted::default() };
    let balance = Balance::new(config(), slow, WatchStream::new(rx.clone())).unwrap();
    tokio::time::sleep(ms(1050)).await;
    let s = balance.stats();
    assert_eq!((s.connections_opened, s.connect_failures), (0, 1), "{s:?}");
    // 0.3 s and 0.3 s fit.
    let quick = Scripted { not_ready_for: ms(300), connect_takes: ms(300), ..Scripted::default() };
    let balance = Balance::new(config(), quick, WatchStream::new(rx)).unwrap();
    tokio::time::sleep(ms(700)).await;
    let s = balance.stats();
    assert_eq!((s.connections_opened, s.connect_failures), (1, 0), "{s:?}");
}

/// A connector that connects one task at a time (`ConcurrencyLimit` of 1), each
/// connect taking `takes`.
fn one_at_a_time(
    takes: Duration,
) -> impl tower::Service<usize, Response = Conn, Error = BoxError, Future: Send> + Send + 'static {
    let connect = service_fn(move |_task: usize| async move {
        tokio::time::sleep(takes).await;
        Ok::<Conn, BoxError>(mock::pair::<u32, usize>().0)
    });
    tower::limit::ConcurrencyLimit::new(connect, 1)
}

#[tokio::test(start_paused = true)]
async fn a_connector_limited_to_one_connect_at_a_time_connects_the_whole_subset() {
    // Each connect takes 100 ms and the connector takes one at a time: its readiness
    // waits for the previous connect to finish.
    let connector = one_at_a_time(Duration::from_millis(100));
    let (_views, rx) = watch::channel(JobView::serving(0..10));
    let config = BalanceConfig::new(0, 4).with_connect_timeout(Duration::from_secs(1));
    let balance = Balance::new(config, connector, WatchStream::new(rx)).unwrap();
    tokio::time::sleep(Duration::from_millis(450)).await;
    let s = balance.stats();
    assert_eq!((s.connections_opened, s.connect_failures), (4, 0), "{s:?}");
    assert_eq!(s.members.len(), 4);
}

#[tokio::test(start_paused = true)]
async fn attempts_queued_for_tasks_that_left_the_subset_take_no_connector_time() {
    // One connect at a time, 150 ms each, 1 s budget: the first subset's 4 attempts
    // queue, then those 4 tasks start draining and 4 others are wanted.
    let connector = one_at_a_time(Duration::from_millis(150));
    let (views, rx) = watch::channel(JobView::serving(0..10));
    let config = BalanceConfig::new(0, 4).with_connect_timeout(Duration::from_secs(1));
    let balance = Balance::new(config, connector, WatchStream::new(rx)).unwrap();
    let before = subset(0, 10, 4);
    tokio::time::sleep(Duration::from_millis(1)).await;
    let drained = before.iter().fold(JobView::serving(0..10), |v, &t| v.with_state(t, TaskState::Draining));
    views.send_replace(drained);
    // The one attempt already connecting finishes at 150 ms; the 3 stale ones are
    // skipped, so the new 4 connect by 750 ms, within their budget (they would fail if
    // the stale ones took 450 ms of connector time first).
    tokio::time::sleep(Duration::from_millis(800)).await;
    let s = balance.stats();
    assert!(s.subset.iter().all(|t| !before.contains(t)), "{s:?}");
    assert_eq!((ready(&s), s.connect_failures), (s.subset.iter().copied().collect(), 0), "{s:?}");
}
