//! Failures handled as production balancers handle them: outlier ejection on classified
//! outcomes, growing ejection times, the panic threshold, slow start and probation. On
//! tokio's paused clock, against connections whose answers each test sets per task.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use steady_balance::{
    Balance, BalanceConfig, BalanceStats, Classify, FailureRate, JobView, Load, MemberState, Outcome,
    OutlierDetection, SlowStart,
};
use steady_testing::holds_within;
use tokio::sync::watch;
use tokio::time::Instant;
use tower::{service_fn, BoxError, Service, ServiceExt};

/// How a backend task answers.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Answers {
    Fine,
    /// This share of calls (a fixed pseudo-random pattern) is a server fault.
    Faults(f64),
    /// Every call gets an application error (`NOT_FOUND`, say).
    AppErrors,
    /// Calls fail at the transport, and new connections are refused.
    Broken,
    /// Calls wait until the fleet's release signal.
    Held,
}

/// What a call came to.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Reply {
    Ok(usize),
    Fault(usize),
    AppError(usize),
}

/// Faults are server faults; application errors are answers.
#[derive(Debug, Clone, Copy)]
struct ByReply;

impl Classify<Reply, BoxError> for ByReply {
    fn classify(&self, reply: &Reply) -> Option<Outcome> {
        Some(if matches!(reply, Reply::Fault(_)) { Outcome::Fault } else { Outcome::Success })
    }
}

/// The backend job: how each task answers, and the calls each received.
#[derive(Clone)]
struct Fleet {
    answers: Arc<Mutex<Vec<Answers>>>,
    calls: Arc<Vec<AtomicU64>>,
    release: watch::Receiver<bool>,
}

impl Fleet {
    fn set(&self, task: usize, answers: Answers) {
        self.answers.lock().unwrap()[task] = answers;
    }

    fn calls(&self, task: usize) -> u64 {
        self.calls[task].load(Ordering::SeqCst)
    }

    fn all_calls(&self) -> Vec<u64> {
        (0..self.calls.len()).map(|t| self.calls(t)).collect()
    }
}

/// One connection to one task of the [`Fleet`].
#[derive(Clone)]
struct Conn {
    task: usize,
    fleet: Fleet,
}

impl Service<u32> for Conn {
    type Response = Reply;
    type Error = BoxError;
    type Future = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Reply, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), BoxError>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: u32) -> Self::Future {
        let (task, f) = (self.task, self.fleet.clone());
        Box::pin(async move {
            let n = f.calls[task].fetch_add(1, Ordering::SeqCst);
            let answers = f.answers.lock().unwrap()[task];
            match answers {
                Answers::Fine => Ok(Reply::Ok(task)),
                Answers::Faults(share) => {
                    let draw = steady_subset::hash::mix64(n ^ ((task as u64) << 40)) >> 11;
                    let fault = (draw as f64) < share * (1u64 << 53) as f64;
                    Ok(if fault { Reply::Fault(task) } else { Reply::Ok(task) })
                }
                Answers::AppErrors => Ok(Reply::AppError(task)),
                Answers::Broken => Err("connection reset".into()),
                Answers::Held => {
                    let mut release = f.release.clone();
                    let _ = release.wait_for(|r| *r).await;
                    Ok(Reply::Ok(task))
                }
            }
        })
    }
}

type Balancer = Balance<Conn, steady_balance::NoKey, ByReply>;

/// A balancer over `size` tasks (all fine), classifying with [`ByReply`], with its
/// stats, the fleet, and the sender that releases held calls.
fn start(
    config: BalanceConfig,
    size: usize,
) -> (Balancer, impl Fn() -> BalanceStats, Fleet, watch::Sender<bool>) {
    let (release_tx, release) = watch::channel(false);
    let fleet = Fleet {
        answers: Arc::new(Mutex::new(vec![Answers::Fine; size])),
        calls: Arc::new((0..size).map(|_| AtomicU64::new(0)).collect()),
        release,
    };
    let f = fleet.clone();
    let connector = service_fn(move |task: usize| {
        let fleet = f.clone();
        async move {
            if fleet.answers.lock().unwrap()[task] == Answers::Broken {
                return Err::<Conn, BoxError>("connection refused".into());
            }
            Ok(Conn { task, fleet })
        }
    });
    // The job never changes: a source that yields one view and ends.
    let views = futures_util::stream::iter([JobView::serving(0..size)]);
    let balance = Balance::new(config, connector, views).unwrap().with_classifier(ByReply);
    let stats = {
        let b = balance.clone();
        move || b.stats()
    };
    (balance, stats, fleet, release_tx)
}

/// Sends `n` requests one after another, yielding between them so the control task
/// runs (as it would beside concurrent requests); returns the replies.
async fn send<B>(balance: &B, n: usize) -> Vec<Result<Reply, String>>
where
    B: Service<u32, Response = Reply, Error = BoxError> + Clone,
{
    let mut replies = Vec::with_capacity(n);
    for _ in 0..n {
        replies.push(balance.clone().oneshot(0).await.map_err(|e| e.to_string()));
        tokio::task::yield_now().await;
    }
    replies
}

fn faults(replies: &[Result<Reply, String>]) -> usize {
    replies.iter().filter(|r| matches!(r, Ok(Reply::Fault(_)))).count()
}

/// The tests' configuration: no slow start (tested on its own), and requests in flight
/// as the load: on the paused clock every call takes no time, so Peak EWMA would compare
/// the estimate of a member that only failed (never timed) against exact zeros, and never
/// pick it again.
fn config(k: usize) -> BalanceConfig {
    BalanceConfig::new(0, k).with_slow_start(SlowStart::disabled()).with_load(Load::InFlight)
}

#[tokio::test(start_paused = true)]
async fn a_member_answering_faults_is_ejected_after_a_run_and_a_stand_in_keeps_the_subset_size() {
    let (balance, stats, fleet, _release) = start(config(3), 6);
    assert!(balance.wait_for_members(3, Duration::from_secs(1)).await);
    let subset = stats().subset;
    let bad = subset[0];
    fleet.set(bad, Answers::Faults(1.0));
    let replies = send(&balance, 300).await;
    let s = stats();
    assert_eq!(s.ejected, vec![bad], "{s:?}");
    assert_eq!(s.outlier_ejections_consecutive, 1);
    assert_eq!(s.ejections, 0, "a server fault is no transport failure");
    // Without ejection a third of the calls would fail (100). A run of five ejects once
    // the others' answers make it stand out (usually the first run here, with two other
    // members); 30 leaves room for how picks happen to spread.
    assert!(faults(&replies) <= 30, "{} faults", faults(&replies));
    // The stand-in: the subset keeps three members in rotation, and the ejected one's
    // connection stays open.
    assert!(balance.wait_for_members(3, Duration::from_secs(1)).await);
    let s = stats();
    assert_eq!(s.subset.len(), 4, "{s:?}");
    assert!(!s.members.iter().any(|m| m.task == bad));
    assert_eq!(s.connections_open, 4);
    let after = fleet.calls(bad);
    send(&balance, 300).await;
    assert_eq!(fleet.calls(bad), after, "an ejected member gets no request");
}

#[tokio::test(start_paused = true)]
async fn application_answers_never_eject() {
    let (balance, stats, fleet, _release) = start(config(3), 3);
    assert!(balance.wait_for_members(3, Duration::from_secs(1)).await);
    fleet.set(1, Answers::AppErrors);
    for _ in 0..3 {
        send(&balance, 500).await;
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    let s = stats();
    assert!(s.ejected.is_empty() && s.outlier_ejections_consecutive + s.outlier_ejections_failure_rate == 0);
    assert!(fleet.calls(1) > 300, "{:?}", fleet.all_calls());
}

#[tokio::test(start_paused = true)]
async fn a_fleet_failing_alike_keeps_every_member() {
    let (balance, stats, fleet, _release) = start(config(4), 4);
    assert!(balance.wait_for_members(4, Duration::from_secs(1)).await);
    for task in 0..4 {
        fleet.set(task, Answers::Faults(0.3));
    }
    let mut replies = Vec::new();
    for _ in 0..20 {
        replies.extend(send(&balance, 1000).await);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let s = stats();
    assert_eq!(s.outlier_ejections_consecutive + s.outlier_ejections_failure_rate, 0, "{s:?}");
    let calls = fleet.all_calls();
    let total: u64 = calls.iter().sum();
    for (task, c) in calls.iter().enumerate() {
        assert!(*c as f64 >= 0.15 * total as f64, "task {task}: {calls:?}");
    }
    // About 30% failed: no worse than a blind spread.
    let failed = faults(&replies) as f64 / replies.len() as f64;
    assert!((0.27..0.33).contains(&failed), "{failed}");
}

#[tokio::test(start_paused = true)]
async fn the_failure_rate_detector_ejects_a_member_failing_half_its_calls_but_not_one_failing_a_tenth() {
    let outliers = OutlierDetection::default()
        .with_consecutive_failures(None)
        .with_failure_rate(Some(FailureRate::new(0.3, 50)));
    let (balance, stats, fleet, _release) = start(config(4).with_outliers(outliers), 4);
    assert!(balance.wait_for_members(4, Duration::from_secs(1)).await);
    fleet.set(0, Answers::Faults(0.5));
    fleet.set(1, Answers::Faults(0.1));
    send(&balance, 800).await;
    assert!(stats().ejected.is_empty(), "nothing before the interval ends");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let s = stats();
    assert_eq!(s.ejected, vec![0], "{s:?}");
    assert_eq!(s.outlier_ejections_failure_rate, 1);
    // Too few calls in an interval say nothing: task 1 stays, with fewer than 50 calls
    // per interval too.
    fleet.set(0, Answers::Fine);
    fleet.set(2, Answers::Faults(1.0));
    send(&balance, 40).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(stats().ejected, vec![0]);
}

#[tokio::test(start_paused = true)]
async fn ejection_time_grows_with_each_ejection_up_to_the_cap_and_is_forgiven_in_rotation() {
    let outliers = OutlierDetection::default()
        .with_ejection(Duration::from_secs(1), Duration::from_millis(2500))
        .with_interval(Duration::from_millis(100));
    let (balance, stats, fleet, _release) = start(config(3).with_outliers(outliers), 3);
    assert!(balance.wait_for_members(3, Duration::from_secs(1)).await);
    fleet.set(0, Answers::Faults(1.0));
    // Ejects task 0 (sending until it is), then times how long it stays out.
    let ejection = || async {
        let mut sent = 0;
        while !stats().ejected.contains(&0) {
            send(&balance, 10).await;
            sent += 10;
            assert!(sent < 5000, "never ejected: {:?}", stats());
        }
        let from = Instant::now();
        assert!(holds_within(Duration::from_secs(10), || !stats().ejected.contains(&0)).await);
        from.elapsed()
    };
    let lengths = [ejection().await, ejection().await, ejection().await, ejection().await];
    let expected = [1000, 2000, 2500, 2500];
    for (length, ms) in lengths.iter().zip(expected) {
        let ms = Duration::from_millis(ms);
        assert!(
            *length >= ms - Duration::from_millis(20) && *length <= ms + Duration::from_millis(20),
            "{lengths:?}"
        );
    }
    // In rotation and answering well for four base ejection times: all forgiven, and the
    // next ejection is a first one again.
    fleet.set(0, Answers::Fine);
    for _ in 0..45 {
        send(&balance, 10).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    fleet.set(0, Answers::Faults(1.0));
    let again = ejection().await;
    assert!(again <= Duration::from_millis(1020), "{again:?}");
}

#[tokio::test(start_paused = true)]
async fn ejection_stops_at_the_panic_threshold_and_past_it_ejected_members_serve_again() {
    // Eight members, at most a quarter (two) ejected.
    let outliers = OutlierDetection::default().with_max_ejected_share(0.25);
    let (balance, stats, fleet, _release) = start(config(8).with_outliers(outliers), 8);
    assert!(balance.wait_for_members(8, Duration::from_secs(1)).await);
    for task in 0..3 {
        fleet.set(task, Answers::Faults(1.0));
    }
    for _ in 0..5 {
        send(&balance, 400).await;
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    let s = stats();
    assert_eq!(s.ejected.len(), 2, "{s:?}");
    assert!(!s.panic);
    // A third member out (its connection breaks, and reconnecting fails): past the
    // threshold. The two ejected serve again rather than leave five members to carry all.
    fleet.set(7, Answers::Broken);
    send(&balance, 100).await;
    assert!(holds_within(Duration::from_secs(1), || stats().panic).await, "{:?}", stats());
    let s = stats();
    assert_eq!(s.panics, 1);
    for task in &s.ejected {
        assert!(s.members.iter().any(|m| m.task == *task), "{s:?}");
    }
    let before: Vec<u64> = s.ejected.iter().map(|&t| fleet.calls(t)).collect();
    send(&balance, 400).await;
    let after: Vec<u64> = s.ejected.iter().map(|&t| fleet.calls(t)).collect();
    assert!(before.iter().zip(&after).all(|(b, a)| a > b), "{before:?} {after:?}");
}

#[tokio::test(start_paused = true)]
async fn a_member_joining_while_requests_flow_ramps_up_over_the_window() {
    let slow_start = SlowStart::default().with_window(Duration::from_secs(5), 0.1);
    let (balance, stats, fleet, _release) = start(BalanceConfig::new(0, 2).with_slow_start(slow_start), 3);
    assert!(balance.wait_for_members(2, Duration::from_secs(1)).await);
    assert!(
        stats().members.iter().all(|m| m.state == MemberState::Serving),
        "the first members open at once"
    );
    send(&balance, 100).await;
    balance.set_subset_size(3).unwrap();
    assert!(balance.wait_for_members(3, Duration::from_secs(1)).await);
    let joined = *stats().subset.last().unwrap();
    let state = stats().members.iter().find(|m| m.task == joined).unwrap().state;
    assert_eq!(state, MemberState::SlowStart { percent: 9 }, "10% of the picks, rounded down");
    let before = fleet.calls(joined);
    send(&balance, 3000).await;
    let early = (fleet.calls(joined) - before) as f64 / 3000.0;
    assert!(early < 0.1, "a third would be a full share: {early}");
    tokio::time::sleep(Duration::from_millis(5100)).await;
    assert!(stats().members.iter().all(|m| m.state == MemberState::Serving));
    let before = fleet.calls(joined);
    send(&balance, 3000).await;
    let late = (fleet.calls(joined) - before) as f64 / 3000.0;
    assert!(late > 0.25, "{late}");
}

#[tokio::test(start_paused = true)]
async fn a_member_reconnected_after_a_broken_connection_gets_one_request_first() {
    let (balance, stats, fleet, release) = start(BalanceConfig::new(0, 2), 2);
    assert!(balance.wait_for_members(2, Duration::from_secs(1)).await);
    send(&balance, 10).await;
    // Task 0's connection breaks; it is back once it has been reconnected (a held call
    // answers when released).
    fleet.set(0, Answers::Broken);
    while stats().ejections == 0 {
        send(&balance, 1).await;
    }
    fleet.set(0, Answers::Held);
    assert!(
        holds_within(Duration::from_secs(5), || stats().members.iter().any(|m| m.task == 0)).await,
        "{:?}",
        stats()
    );
    let state = |s: &BalanceStats| s.members.iter().find(|m| m.task == 0).map(|m| m.state);
    assert_eq!(state(&stats()), Some(MemberState::Probation { probe_sent: false }));
    // Many requests at once: one (the probe) goes to task 0 and waits there; the rest go
    // to task 1.
    let before = fleet.calls(0);
    let mut held = Vec::new();
    for _ in 0..50 {
        let b = balance.clone();
        held.push(tokio::spawn(async move { b.oneshot(0).await.map_err(|e| e.to_string()) }));
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(fleet.calls(0) - before, 1, "{:?}", stats());
    assert_eq!(state(&stats()), Some(MemberState::Probation { probe_sent: true }));
    release.send_replace(true);
    for h in held {
        assert!(h.await.unwrap().is_ok());
    }
    // The probe succeeded: slow start.
    assert!(matches!(state(&stats()), Some(MemberState::SlowStart { .. })), "{:?}", stats());
}

#[tokio::test(start_paused = true)]
async fn keyed_requests_leave_an_ejected_replica_for_the_slice_s_other_replicas() {
    // Replicas 2 and 3 of the one slice sit outside the subset (k = 2: tasks of its own).
    let (balance, stats, fleet, _release) = start(config(2), 4);
    assert!(balance.wait_for_members(2, Duration::from_secs(1)).await);
    let outside: Vec<u32> = (0..4u32).filter(|t| !stats().subset.contains(&(*t as usize))).collect();
    let (_assignments, rx) = watch::channel(steady_balance::Assignment::single(1, outside.clone()).unwrap());
    balance.follow_assignment_watch(rx);
    let keyed = balance.clone().with_key_extractor(|_: &u32| Some(steady_balance::SliceKey(42)));
    let bad = outside[0] as usize;
    fleet.set(bad, Answers::Faults(1.0));
    let replies = send(&keyed, 400).await;
    let s = stats();
    assert_eq!(s.ejected, vec![bad], "{s:?}");
    // Once out, the slice's other replica takes every keyed request (none falls back).
    let last: Vec<usize> = replies[300..]
        .iter()
        .map(|r| match r {
            Ok(Reply::Ok(t) | Reply::Fault(t) | Reply::AppError(t)) => *t,
            Err(e) => panic!("{e}"),
        })
        .collect();
    assert!(last.iter().all(|&t| t == outside[1] as usize), "{last:?}");
    assert_eq!(s.keyed_fallbacks, 0);
    // Half would fail without ejection (200); bounded as in the unkeyed test.
    assert!(faults(&replies) <= 40, "{}", faults(&replies));
}
