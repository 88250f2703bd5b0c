//! Every request waits at most its one budget, whatever happens to the members it tries,
//! and never waits for what cannot come. On tokio's paused clock, so times are exact.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use steady_balance::{Balance, BalanceConfig, BalanceError, JobView, NoReplicaPolicy, TaskState};
use steady_slice::{Assignment, Slice, SliceKey};
use steady_subset::{Algorithm, Subsetting};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_stream::wrappers::WatchStream;
use tower::{service_fn, BoxError, Service, ServiceExt};

/// A request: which slice key it carries (`None`: unkeyed), and whether the backend
/// should hold it forever (to load a member).
#[derive(Debug, Clone, Copy)]
struct Req {
    key: Option<SliceKey>,
    hold: bool,
}

/// A connection: never ready, refusing every request at readiness, or answering with its
/// task index (and holding the requests marked `hold`).
#[derive(Debug, Clone, Copy)]
enum Conn {
    NeverReady,
    Refusing,
    Answering(usize),
}

impl Service<Req> for Conn {
    type Response = usize;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<usize, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        match self {
            Conn::NeverReady => Poll::Pending,
            Conn::Refusing => Poll::Ready(Err("connection closed".into())),
            Conn::Answering(_) => Poll::Ready(Ok(())),
        }
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let Conn::Answering(task) = *self else { unreachable!("called without readiness") };
        Box::pin(async move {
            if req.hold {
                std::future::pending::<()>().await;
            }
            Ok(task)
        })
    }
}

type Keyed = Balance<Conn, fn(&Req) -> Option<SliceKey>>;

/// A balancer over `view` whose connection to task `t` is `conn(t)`.
fn balancer(
    config: BalanceConfig,
    view: JobView<usize>,
    conn: impl Fn(usize) -> Conn + Copy + Send + Sync + 'static,
) -> (Keyed, watch::Sender<JobView<usize>>) {
    let (job, views) = watch::channel(view);
    let connector = service_fn(move |task: usize| async move { Ok::<_, BoxError>(conn(task)) });
    let key: fn(&Req) -> Option<SliceKey> = |req| req.key;
    (Balance::new(config, connector, WatchStream::new(views)).unwrap().with_key_extractor(key), job)
}

fn subset(m: usize, n: usize, k: usize) -> Vec<usize> {
    Algorithm::default().subset(m, n, k).unwrap()
}

fn unkeyed() -> Req {
    Req { key: None, hold: false }
}

#[tokio::test(start_paused = true)]
async fn a_request_over_never_ready_members_waits_its_budget_once() {
    let wait = Duration::from_secs(1);
    let config = BalanceConfig::new(0, 3).with_no_backend_wait(wait);
    let (b, _job) = balancer(config, JobView::serving(0..3), |_| Conn::NeverReady);
    assert!(b.wait_for_members(3, Duration::from_secs(1)).await);
    let start = Instant::now();
    let err = b.clone().oneshot(unkeyed()).await.unwrap_err();
    // It tried members in turn (each stayed not ready), all within one budget.
    assert_eq!(start.elapsed(), wait);
    assert_eq!(err.downcast_ref::<BalanceError>(), Some(&BalanceError::NoReadyBackends { waited: wait }));
}

#[tokio::test(start_paused = true)]
async fn a_request_that_waited_for_a_member_has_only_the_rest_of_its_budget_for_readiness() {
    let wait = Duration::from_secs(1);
    let config = BalanceConfig::new(0, 1).with_no_backend_wait(wait);
    // The job is empty at first: the request waits for a member to exist...
    let (b, job) = balancer(config, JobView::serving(0..0), |_| Conn::NeverReady);
    let start = Instant::now();
    let request = tokio::spawn(b.clone().oneshot(unkeyed()));
    tokio::time::sleep(Duration::from_millis(600)).await;
    // ...which comes, but never becomes ready.
    job.send_replace(JobView::serving(0..1));
    let err = request.await.unwrap().unwrap_err();
    assert_eq!(start.elapsed(), wait, "{err}");
    assert_eq!(err.downcast_ref::<BalanceError>(), Some(&BalanceError::NoReadyBackends { waited: wait }));
}

/// Job 0..5: frontend 0's subset of 2 answers; `away` (outside the subset) is draining.
fn keyed_setup(policy: NoReplicaPolicy) -> (Keyed, watch::Sender<JobView<usize>>, Vec<usize>, usize) {
    let members = subset(0, 5, 2);
    let away = (0..5).find(|t| !members.contains(t)).unwrap();
    let view = JobView::serving(0..5).with_state(away, TaskState::Draining);
    let config =
        BalanceConfig::new(0, 2).with_no_replica(policy).with_affinity_wait(Duration::from_millis(250));
    let (b, job) = balancer(config, view, Conn::Answering);
    (b, job, members, away)
}

#[tokio::test(start_paused = true)]
async fn a_keyed_request_whose_replicas_cannot_come_does_not_wait_for_them() {
    for policy in [NoReplicaPolicy::FallBackToSubset, NoReplicaPolicy::Fail] {
        let (b, _job, members, away) = keyed_setup(policy);
        assert!(b.wait_for_members(2, Duration::from_secs(1)).await);
        // Every key's only replica is draining: no connection to it will ever be asked for.
        let (_a, assignments) = watch::channel(Assignment::single(1, vec![away as u32]).unwrap());
        b.follow_assignment_watch(assignments);
        tokio::time::sleep(Duration::from_millis(1)).await;
        let start = Instant::now();
        let result = b.clone().oneshot(Req { key: Some(SliceKey(7)), hold: false }).await;
        assert_eq!(start.elapsed(), Duration::ZERO, "{policy:?}: waited for a replica that cannot come");
        match policy {
            NoReplicaPolicy::FallBackToSubset => assert!(members.contains(&result.unwrap())),
            _ => assert!(matches!(
                result.unwrap_err().downcast_ref::<BalanceError>(),
                Some(BalanceError::NoReplica { generation: 1, .. })
            )),
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_fallen_back_keyed_request_moves_to_another_member_like_any_other() {
    let members = subset(0, 5, 2);
    let (refusing, answering) = (members[0], members[1]);
    let away = (0..5).find(|t| !members.contains(t)).unwrap();
    let view = JobView::serving(0..5).with_state(away, TaskState::Draining);
    let conn = move |t| if t == refusing { Conn::Refusing } else { Conn::Answering(t) };
    let (b, _job) = balancer(BalanceConfig::new(0, 2), view, conn);
    assert!(b.wait_for_members(2, Duration::from_secs(1)).await);
    // Keys below 2^63 belong to the answering member, the rest to the draining task.
    let assignment = Assignment::new(
        1,
        vec![
            Slice::new(SliceKey(0), vec![answering as u32]),
            Slice::new(SliceKey(1 << 63), vec![away as u32]),
        ],
    )
    .unwrap();
    let (_a, assignments) = watch::channel(assignment);
    b.follow_assignment_watch(assignments);
    tokio::time::sleep(Duration::from_millis(1)).await;
    // One request held on the answering member loads it, so the next pick prefers the other.
    let held = tokio::spawn(b.clone().oneshot(Req { key: Some(SliceKey(1)), hold: true }));
    tokio::time::sleep(Duration::from_millis(1)).await;
    // A key of the draining task's slice falls back to the subset, picks the idle (refusing)
    // member, which cannot take it, and moves on to the answering one.
    let served = b.clone().oneshot(Req { key: Some(SliceKey(u64::MAX)), hold: false }).await;
    assert_eq!(served.unwrap(), answering);
    // Counted once, where it was sent; the refusal at readiness is no failed call.
    let stats = b.stats();
    assert_eq!((stats.requests, stats.failures, stats.keyed_fallbacks), (2, 0, 1), "{stats:?}");
    held.abort();
}

#[tokio::test(start_paused = true)]
async fn a_keyed_request_whose_only_replica_refuses_it_falls_back_to_the_subset() {
    let members = subset(0, 5, 2);
    let replica = (0..5).find(|t| !members.contains(t)).unwrap();
    let conn = move |t| if t == replica { Conn::Refusing } else { Conn::Answering(t) };
    let (b, _job) = balancer(BalanceConfig::new(0, 2), JobView::serving(0..5), conn);
    assert!(b.wait_for_members(2, Duration::from_secs(1)).await);
    let (_a, assignments) = watch::channel(Assignment::single(1, vec![replica as u32]).unwrap());
    b.follow_assignment_watch(assignments);
    tokio::time::sleep(Duration::from_millis(1)).await;
    // The replica gets an affinity connection, which refuses the request at readiness:
    // with no other replica, the policy sends it to the subset.
    let served = b.clone().oneshot(Req { key: Some(SliceKey(3)), hold: false }).await.unwrap();
    assert!(members.contains(&served), "{served}");
}

#[tokio::test(start_paused = true)]
async fn without_affinity_connections_a_keyed_request_does_not_wait_for_a_replica_outside_the_subset() {
    let members = subset(0, 5, 2);
    let outside = (0..5).find(|t| !members.contains(t)).unwrap();
    let config = BalanceConfig::new(0, 2).with_affinity(0, Duration::from_secs(60));
    let (b, _job) = balancer(config, JobView::serving(0..5), Conn::Answering);
    assert!(b.wait_for_members(2, Duration::from_secs(1)).await);
    let (_a, assignments) = watch::channel(Assignment::single(1, vec![outside as u32]).unwrap());
    b.follow_assignment_watch(assignments);
    tokio::time::sleep(Duration::from_millis(1)).await;
    let start = Instant::now();
    let served = b.clone().oneshot(Req { key: Some(SliceKey(3)), hold: false }).await.unwrap();
    assert_eq!(start.elapsed(), Duration::ZERO, "waited for a connection that is never made");
    assert!(members.contains(&served));
}
