//! Hedging on real tonic servers on 127.0.0.1: each attempt to another member (another
//! replica for a keyed request), the budget's bound when every server fails, a losing
//! attempt cancelled on its server and in the balancer, and a method not named sent
//! once. Waits are for states, bounded; no fixed sleep.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use steady_balance::BalanceConfig;
use steady_slice::Assignment;
use steady_testing::echo::echo_client::EchoClient;
use steady_testing::echo::echo_server::{Echo, EchoServer};
use steady_testing::echo::{EchoReply, EchoRequest, KEY_HEADER};
use steady_testing::loopback::{endpoint, serve, ServerGuard};
use steady_testing::{eventually, within};
use steady_tonic::hedge::{Hedge, HedgeConfig, HedgeLayer, HedgingPolicy, RetryBudget};
use steady_tonic::SteadyChannel;
use tokio::sync::watch;
use tonic::{Code, Request, Response, Status};
use tower::Layer;

/// The echo method's path.
const ECHO: &str = "/steady.echo.v1.Echo/Echo";

/// What every server of a fleet shares: the calls they got, in order, as (payload,
/// task), the calls cancelled, and the payloads some server already took.
#[derive(Default)]
struct Log {
    calls: Mutex<Vec<(String, u32)>>,
    cancelled: Mutex<Vec<(String, u32)>>,
    seen: Mutex<HashSet<String>>,
}

impl Log {
    /// The tasks that got a call with `payload`, in order.
    fn tasks_of(&self, payload: &str) -> Vec<u32> {
        self.calls.lock().unwrap().iter().filter(|(p, _)| p == payload).map(|(_, t)| *t).collect()
    }

    fn calls(&self) -> usize {
        self.calls.lock().unwrap().len()
    }
}

/// A backend answering by its payload's prefix: `stall:` never answers; `first:` never
/// answers if it is the first call with that payload of the fleet, else answers at
/// once; `fail:` answers `UNAVAILABLE`; anything else is echoed.
#[derive(Clone)]
struct Backend {
    task: u32,
    log: Arc<Log>,
}

/// Records a call cancelled when its handler is dropped before it answered.
struct OnCancel {
    entry: Option<(String, u32)>,
    log: Arc<Log>,
}

impl Drop for OnCancel {
    fn drop(&mut self) {
        if let Some(entry) = self.entry.take() {
            self.log.cancelled.lock().unwrap().push(entry);
        }
    }
}

#[tonic::async_trait]
impl Echo for Backend {
    async fn echo(&self, request: Request<EchoRequest>) -> Result<Response<EchoReply>, Status> {
        let payload = request.into_inner().payload;
        let text = String::from_utf8_lossy(&payload).into_owned();
        self.log.calls.lock().unwrap().push((text.clone(), self.task));
        let first = self.log.seen.lock().unwrap().insert(text.clone());
        if text.starts_with("stall:") || (text.starts_with("first:") && first) {
            let _guard = OnCancel { entry: Some((text.clone(), self.task)), log: self.log.clone() };
            std::future::pending::<()>().await;
        }
        if text.starts_with("fail:") {
            return Err(Status::unavailable(format!("task {}", self.task)));
        }
        Ok(Response::new(EchoReply { payload, task: self.task }))
    }
}

struct Fleet {
    log: Arc<Log>,
    channel: SteadyChannel,
    _servers: Vec<ServerGuard>,
}

impl Fleet {
    /// `n` backends and a channel keeping all of them.
    async fn start(n: u32) -> Fleet {
        let log = Arc::new(Log::default());
        let (mut servers, mut endpoints) = (Vec::new(), Vec::new());
        for task in 0..n {
            let (addr, server) = serve(EchoServer::new(Backend { task, log: log.clone() })).await;
            servers.push(server);
            endpoints.push(endpoint(addr));
        }
        let config = BalanceConfig::new(0, n as usize);
        let channel = SteadyChannel::builder(config).from_endpoints(endpoints).unwrap();
        assert!(channel.balance().wait_for_members(n as usize, Duration::from_secs(10)).await);
        Fleet { log, channel, _servers: servers }
    }

    /// The channel, hedging the echo method with `policy` under `budget`.
    fn hedged(&self, policy: HedgingPolicy, budget: RetryBudget) -> Hedge {
        let config = HedgeConfig::new().method(ECHO, policy).unwrap().budget(budget);
        HedgeLayer::new(config).layer(self.channel.clone())
    }

    /// Requests in flight on the balancer's members, summed.
    fn in_flight(&self) -> usize {
        self.channel.stats().members.iter().map(|m| m.in_flight).sum()
    }
}

fn policy(max_attempts: u32, delay_ms: u64) -> HedgingPolicy {
    HedgingPolicy::new(max_attempts, Duration::from_millis(delay_ms)).unwrap()
}

/// Sends `payload` (with `key` as its slice key, if any) in a task of its own.
fn send(hedge: &Hedge, payload: &str, key: Option<&str>) -> tokio::task::JoinHandle<Result<u32, Status>> {
    let mut client = EchoClient::new(hedge.clone());
    let mut request = Request::new(EchoRequest { payload: payload.as_bytes().to_vec() });
    if let Some(key) = key {
        request.metadata_mut().insert(KEY_HEADER, key.parse().unwrap());
    }
    tokio::spawn(async move { client.echo(request).await.map(|r| r.into_inner().task) })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_attempt_goes_to_another_member_and_dropping_the_request_cancels_them_all() {
    let fleet = Fleet::start(4).await;
    let hedge = fleet.hedged(policy(4, 5), RetryBudget::default());
    for round in 0..5 {
        let payload = format!("stall:{round}");
        let request = send(&hedge, &payload, None);
        eventually("four attempts", || fleet.log.tasks_of(&payload).len() == 4).await;
        let mut tasks = fleet.log.tasks_of(&payload);
        tasks.sort_unstable();
        assert_eq!(tasks, vec![0, 1, 2, 3], "each attempt on another member");
        assert_eq!(fleet.in_flight(), 4);
        // No fifth attempt: there is no fifth member, and the policy allows four.
        request.abort();
        eventually("the attempts cancelled on their servers", || {
            fleet.log.cancelled.lock().unwrap().iter().filter(|(p, _)| *p == payload).count() == 4
        })
        .await;
        eventually("nothing in flight", || fleet.in_flight() == 0).await;
    }
    assert_eq!(fleet.log.calls(), 20);
    let stats = hedge.stats();
    assert_eq!((stats.hedged_requests, stats.extra_attempts, stats.hedges_won), (5, 15, 0), "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_request_hedges_only_to_its_slices_other_replicas() {
    let fleet = Fleet::start(4).await;
    let (_publish, assignments) = watch::channel(Assignment::single(1, vec![1, 2]).unwrap());
    fleet.channel.balance().follow_assignment_watch(assignments);
    eventually("the assignment", || fleet.channel.stats().assignment_generation == Some(1)).await;
    let hedge = fleet.hedged(policy(4, 5), RetryBudget::default());
    let request = send(&hedge, "stall:keyed", Some("user-7"));
    eventually("an attempt on each replica", || fleet.log.tasks_of("stall:keyed").len() == 2).await;
    eventually("the third attempt given up", || hedge.stats().no_other_member == 1).await;
    let mut tasks = fleet.log.tasks_of("stall:keyed");
    tasks.sort_unstable();
    assert_eq!(tasks, vec![1, 2], "only the slice's replicas");
    assert_eq!(hedge.stats().extra_attempts, 1);
    request.abort();
    eventually("nothing in flight", || fleet.in_flight() == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_answer_wins_and_the_losing_attempt_is_cancelled() {
    let fleet = Fleet::start(3).await;
    // Two attempts at most: a third, had the policy allowed it, would race the second's
    // answer on a loaded machine.
    let hedge = fleet.hedged(policy(2, 100), RetryBudget::default());
    for round in 0..5 {
        let payload = format!("first:{round}");
        let answer =
            within(Duration::from_secs(10), "the hedge's answer", send(&hedge, &payload, None)).await;
        let tasks = fleet.log.tasks_of(&payload);
        // The first attempt stalls; the second answers.
        assert_eq!(tasks.len(), 2, "{tasks:?}");
        assert_ne!(tasks[0], tasks[1]);
        assert_eq!(answer.unwrap().unwrap(), tasks[1], "the second attempt's answer");
        eventually("the first attempt cancelled on its server", || {
            fleet.log.cancelled.lock().unwrap().contains(&(payload.clone(), tasks[0]))
        })
        .await;
        eventually("nothing in flight", || fleet.in_flight() == 0).await;
    }
    let stats = hedge.stats();
    assert_eq!((stats.hedged_requests, stats.extra_attempts, stats.hedges_won), (5, 5, 5), "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_every_server_failing_extra_attempts_stay_within_the_budget() {
    let fleet = Fleet::start(4).await;
    // 10% of the requests, no floor, over a minute (longer than the test): the bound is
    // exactly a tenth of the requests.
    let budget = RetryBudget::new(0.1, 0, Duration::from_secs(60)).unwrap();
    let policy = policy(5, 50).with_non_fatal_codes([Code::Unavailable]).unwrap();
    let hedge = fleet.hedged(policy, budget);
    let mut client = EchoClient::new(hedge.clone());
    let requests = 300;
    for i in 0..requests {
        let request = Request::new(EchoRequest { payload: format!("fail:{i}").into_bytes() });
        let status = client.echo(request).await.unwrap_err();
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    }
    let stats = hedge.stats();
    let attempts = fleet.log.calls() as u64;
    // Every attempt accounted: what the servers got is the requests and the extra ones.
    assert_eq!(attempts, requests + stats.extra_attempts, "{stats:?}");
    // Unavailable is non-fatal: without the budget every request would try all four
    // members (900 extra attempts). With it, at most a tenth of the requests.
    assert!(stats.extra_attempts <= requests / 10, "{stats:?}");
    let withdrawn = stats.extra_attempts + stats.no_other_member;
    assert!(withdrawn >= requests / 10 - 2, "the budget is what stops them: {stats:?}");
    assert!(stats.refused_by_budget >= requests - requests / 10 - 2, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_method_not_named_is_sent_once() {
    let fleet = Fleet::start(3).await;
    // Hedges another method only: the echo method is not named.
    let config = HedgeConfig::new().method("/steady.echo.v1.Echo/Other", policy(3, 5)).unwrap();
    let unhedged = HedgeLayer::new(config).layer(fleet.channel.clone());
    let hedged = fleet.hedged(policy(3, 5), RetryBudget::default());
    let once = send(&unhedged, "stall:once", None);
    eventually("the unhedged call on its server", || fleet.log.tasks_of("stall:once").len() == 1).await;
    // The same wait for a hedged call: it has tried every member by then.
    let twice = send(&hedged, "stall:hedged", None);
    eventually("the hedged call's three attempts", || fleet.log.tasks_of("stall:hedged").len() == 3).await;
    assert_eq!(fleet.log.tasks_of("stall:once").len(), 1, "the unhedged call was sent once");
    assert_eq!(unhedged.stats().hedged_requests, 0);
    assert_eq!(unhedged.policy(ECHO), None);
    once.abort();
    twice.abort();
    eventually("nothing in flight", || fleet.in_flight() == 0).await;
}

#[test]
fn bad_policies_give_errors_naming_their_field() {
    let ms = Duration::from_millis;
    for (result, field) in [
        (HedgingPolicy::new(0, ms(5)), "hedging.max_attempts"),
        (HedgingPolicy::new(6, ms(5)), "hedging.max_attempts"),
        (HedgingPolicy::new(3, Duration::ZERO), "hedging.delay"),
        (policy(3, 5).with_non_fatal_codes([Code::Ok]), "hedging.non_fatal_codes"),
    ] {
        assert_eq!(result.unwrap_err().field(), field);
    }
    assert_eq!(HedgeConfig::new().method("Echo", policy(2, 5)).unwrap_err().field(), "hedging.method");
    assert_eq!(RetryBudget::new(2.0, 10, Duration::from_secs(10)).unwrap_err().field(), "budget.share");
    assert_eq!(RetryBudget::new(0.1, 10, Duration::ZERO).unwrap_err().field(), "budget.window");
}
