//! Keyed routing: assignments pushed to the balancer, requests routed by slice key.
//! Connections here are `service_fn`s that answer with their task index.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use steady_balance::{Balance, BalanceConfig, BalanceError, JobView, NoReplicaPolicy};
use steady_slice::{Assignment, AssignmentError, Slice, SliceKey};
use steady_subset::{Algorithm, Subsetting};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::{UnboundedReceiverStream, WatchStream};
use tower::{service_fn, BoxError, Service, ServiceExt};

/// A request: its slice key, if any.
type Req = Option<SliceKey>;

type Conn = tower::util::BoxCloneSyncService<Req, usize, Infallible>;

/// The balancer under test: keys read straight from the request.
type Keyed = Balance<Conn, fn(&Req) -> Option<SliceKey>>;

/// Connections made so far, by task.
type Connects = Arc<Mutex<Vec<usize>>>;

/// A balancer over `size` tasks whose connections answer with their task index;
/// `connects` records every connection made.
fn balancer(config: BalanceConfig, size: usize) -> (Keyed, Connects, watch::Sender<JobView<usize>>) {
    let (job, views) = watch::channel(JobView::serving(0..size));
    let connects: Arc<Mutex<Vec<usize>>> = Arc::default();
    let c = connects.clone();
    let connector = service_fn(move |task: usize| {
        c.lock().unwrap().push(task);
        async move {
            Ok::<_, Infallible>(Conn::new(service_fn(move |_: Req| async move { Ok::<_, Infallible>(task) })))
        }
    });
    let key: fn(&Req) -> Option<SliceKey> = |req| *req;
    let balance = Balance::new(config, connector, WatchStream::new(views)).unwrap().with_key_extractor(key);
    (balance, connects, job)
}

async fn settle() {
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
}

fn slice(start: u64, replicas: &[u32]) -> Slice {
    Slice::new(SliceKey(start), replicas)
}

async fn send<S, K>(b: &Balance<S, K>, req: Req) -> Result<usize, BoxError>
where
    Balance<S, K>: Service<Req, Response = usize, Error = BoxError> + Clone,
{
    b.clone().oneshot(req).await
}

#[tokio::test(start_paused = true)]
async fn keyed_requests_go_to_their_slices_replicas_and_unkeyed_ones_to_the_subset() {
    let (b, _, _job) = balancer(BalanceConfig::new(0, 2), 10);
    let subset = Algorithm::default().subset(0, 10, 2).unwrap();
    let (tx, rx) = watch::channel(Assignment::new(1, vec![slice(0, &[7]), slice(1 << 63, &[8, 9])]).unwrap());
    b.follow_assignment_watch(rx);
    settle().await;
    for _ in 0..20 {
        assert_eq!(send(&b, Some(SliceKey(5))).await.unwrap(), 7);
        assert!([8, 9].contains(&send(&b, Some(SliceKey(u64::MAX))).await.unwrap()));
        assert!(subset.contains(&send(&b, None).await.unwrap()));
    }
    let s = b.stats();
    assert_eq!(s.keyed_requests, 40, "every keyed request was routed by its key");
    assert_eq!(s.assignment_generation, Some(1));
    assert_eq!(s.affinity, [7, 8, 9].iter().copied().filter(|t| !subset.contains(t)).collect::<Vec<_>>());
    drop(tx);
}

#[tokio::test(start_paused = true)]
async fn before_any_assignment_keyed_requests_use_the_subset() {
    let (b, connects, _job) = balancer(BalanceConfig::new(3, 2), 10);
    settle().await;
    let subset = Algorithm::default().subset(3, 10, 2).unwrap();
    for k in 0..20u64 {
        assert!(subset.contains(&send(&b, Some(SliceKey(k << 58))).await.unwrap()));
    }
    assert_eq!(connects.lock().unwrap().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn newer_generations_replace_older_and_invalid_ones_change_nothing() {
    let (b, _, _job) = balancer(BalanceConfig::new(0, 1), 10);
    let (tx, rx) = mpsc::unbounded_channel::<Result<Assignment, BoxError>>();
    b.follow_assignments(UnboundedReceiverStream::new(rx));
    let key = Some(SliceKey(42));
    tx.send(Assignment::single(5, vec![4]).map_err(BoxError::from)).unwrap();
    settle().await;
    assert_eq!(send(&b, key).await.unwrap(), 4);
    // Older and equal generations are ignored.
    tx.send(Assignment::single(4, vec![5]).map_err(BoxError::from)).unwrap();
    tx.send(Assignment::single(5, vec![6]).map_err(BoxError::from)).unwrap();
    // An invalid one is rejected.
    tx.send(Assignment::new(9, vec![slice(1, &[6])]).map_err(BoxError::from)).unwrap();
    tx.send(Assignment::decode(b"garbage").map_err(BoxError::from)).unwrap();
    settle().await;
    assert_eq!(send(&b, key).await.unwrap(), 4);
    let s = b.stats();
    assert_eq!((s.assignment_generation, s.assignments_stale, s.assignments_rejected), (Some(5), 2, 2));
    // A newer valid one takes over.
    tx.send(Assignment::single(6, vec![6]).map_err(BoxError::from)).unwrap();
    settle().await;
    assert_eq!(send(&b, key).await.unwrap(), 6);
    // The source going away keeps the last good assignment in force.
    drop(tx);
    settle().await;
    assert_eq!(send(&b, key).await.unwrap(), 6);
    assert_eq!(b.stats().assignment_generation, Some(6));
}

#[tokio::test(start_paused = true)]
async fn affinity_connections_are_bounded_and_closed_when_idle() {
    let config = BalanceConfig::new(0, 1).with_affinity(2, Duration::from_secs(10));
    let (b, _, _job) = balancer(config, 20);
    let subset = Algorithm::default().subset(0, 20, 1).unwrap();
    let outside: Vec<u32> = (0..20u32).filter(|t| !subset.contains(&(*t as usize))).take(3).collect();
    // Three slices, each served by one task outside the subset.
    let a = Assignment::new(
        1,
        vec![slice(0, &[outside[0]]), slice(1 << 62, &[outside[1]]), slice(1 << 63, &[outside[2]])],
    )
    .unwrap();
    b.follow_assignments(futures_util::stream::iter([Ok::<_, AssignmentError>(a)]));
    settle().await;
    for (key, want) in [(0u64, outside[0]), (1 << 62, outside[1]), (1 << 63, outside[2])] {
        assert_eq!(send(&b, Some(SliceKey(key))).await.unwrap(), want as usize);
        tokio::time::advance(Duration::from_millis(1)).await;
    }
    settle().await;
    // At most two affinity connections: the least recently active one was closed.
    let s = b.stats();
    assert_eq!(s.affinity, {
        let mut v = vec![outside[1] as usize, outside[2] as usize];
        v.sort_unstable();
        v
    });
    assert_eq!(s.affinity_opened, 3);
    // One connection stays busy (a request a second), the other idles: after 30 s,
    // longer than the 10 s timeout, only the idle one is closed.
    for _ in 0..30 {
        assert_eq!(send(&b, Some(SliceKey(1 << 63))).await.unwrap(), outside[2] as usize);
        tokio::time::advance(Duration::from_secs(1)).await;
        settle().await;
    }
    assert_eq!(b.stats().affinity, [outside[2] as usize]);
    // Then idle too: closed.
    for _ in 0..30 {
        tokio::time::advance(Duration::from_secs(1)).await;
        settle().await;
    }
    assert!(b.stats().affinity.is_empty());
    assert_eq!(b.stats().connections_open, 1);
}

#[tokio::test(start_paused = true)]
async fn with_no_usable_replica_the_policy_decides() {
    // The replica's task is not serving: no connection can be made.
    for policy in [NoReplicaPolicy::FallBackToSubset, NoReplicaPolicy::Fail] {
        let config =
            BalanceConfig::new(0, 1).with_no_replica(policy).with_affinity_wait(Duration::from_millis(50));
        let (b, _, _job) = balancer(config, 5);
        b.follow_assignments(futures_util::stream::iter([Assignment::single(3, vec![17])]));
        settle().await;
        let result = send(&b, Some(SliceKey(1))).await;
        let subset = Algorithm::default().subset(0, 5, 1).unwrap();
        match policy {
            NoReplicaPolicy::FallBackToSubset => {
                assert_eq!(result.unwrap(), subset[0]);
                assert_eq!((b.stats().keyed_fallbacks, b.stats().keyed_requests), (1, 0));
            }
            NoReplicaPolicy::Fail => {
                let err = result.unwrap_err();
                assert_eq!(
                    err.downcast_ref::<BalanceError>(),
                    Some(&BalanceError::NoReplica { key: SliceKey(1), generation: 3 })
                );
                assert_eq!(b.stats().no_replica, 1);
            }
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_hot_slice_spreads_over_its_twenty_replicas_across_two_hundred_frontends() {
    // 200 frontends, one slice with 20 replicas, fan-out 3: every replica is chosen by
    // 30 frontends, and each frontend spreads its requests over its 3.
    let replicas: Vec<u32> = (10..30).collect();
    let assignment = Assignment::single(1, replicas.clone()).unwrap();
    let mut served: HashMap<usize, usize> = HashMap::new();
    let requests_per_frontend = 60;
    for m in 0..200 {
        let config = BalanceConfig::new(m, 2).with_fan_out(3).with_affinity(3, Duration::from_secs(60));
        let (b, _, _job) = balancer(config, 40);
        b.follow_assignments(futures_util::stream::iter([Ok::<_, AssignmentError>(assignment.clone())]));
        settle().await;
        // Warm the affinity connections, then count.
        for _ in 0..3 {
            let _ = send(&b, Some(SliceKey(9))).await.unwrap();
        }
        settle().await;
        let mut used = std::collections::HashSet::new();
        for _ in 0..requests_per_frontend {
            let task = send(&b, Some(SliceKey(9))).await.unwrap();
            used.insert(task);
            *served.entry(task).or_default() += 1;
        }
        // Each frontend spreads over exactly its own three replicas.
        assert_eq!(used.len(), 3, "frontend {m} used {used:?}");
    }
    assert!(served.keys().all(|t| replicas.contains(&(*t as u32))), "only replicas serve the slice");
    assert_eq!(served.len(), 20);
    let mean = 200.0 * requests_per_frontend as f64 / 20.0;
    let max = *served.values().max().unwrap() as f64;
    let min = *served.values().min().unwrap() as f64;
    // Stated bound: every replica within 25% of the mean load.
    assert!(max <= 1.25 * mean && min >= 0.75 * mean, "min {min}, max {max}, mean {mean}: {served:?}");
}

#[tokio::test(start_paused = true)]
async fn an_assignment_change_moves_exactly_the_keys_of_the_changed_slices() {
    let (b, _, _job) = balancer(BalanceConfig::new(0, 1).with_affinity(8, Duration::from_secs(60)), 10);
    let (tx, rx) = watch::channel(
        Assignment::new(
            1,
            vec![slice(0, &[1]), slice(1 << 61, &[2]), slice(1 << 62, &[3]), slice(1 << 63, &[4])],
        )
        .unwrap(),
    );
    b.follow_assignment_watch(rx);
    settle().await;
    let keys: Vec<SliceKey> = (0..200u32).map(|i| SliceKey::of(i.to_le_bytes())).collect();
    let mut before = Vec::new();
    for &k in &keys {
        before.push(send(&b, Some(k)).await.unwrap());
    }
    // Slice 2 (keys from 2^62 to 2^63) moves to task 5; nothing else changes.
    tx.send_replace(
        Assignment::new(
            2,
            vec![slice(0, &[1]), slice(1 << 61, &[2]), slice(1 << 62, &[5]), slice(1 << 63, &[4])],
        )
        .unwrap(),
    );
    settle().await;
    for (i, &k) in keys.iter().enumerate() {
        let after = send(&b, Some(k)).await.unwrap();
        let in_moved_slice = (1u64 << 62..1u64 << 63).contains(&k.get());
        assert_eq!(after, if in_moved_slice { 5 } else { before[i] }, "key {k}");
    }
}

/// A connection whose `poll_ready` fails (its transport is gone), or that answers with
/// its task index.
#[derive(Clone)]
struct MaybeDead {
    task: usize,
    dead: bool,
}

impl Service<Req> for MaybeDead {
    type Response = usize;
    type Error = BoxError;
    type Future = std::future::Ready<Result<usize, BoxError>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), BoxError>> {
        std::task::Poll::Ready(if self.dead { Err("connection closed".into()) } else { Ok(()) })
    }

    fn call(&mut self, _: Req) -> Self::Future {
        std::future::ready(Ok(self.task))
    }
}

#[tokio::test(start_paused = true)]
async fn a_keyed_request_refused_by_a_replica_moves_only_to_another_replica_of_its_slice() {
    let dead = 11usize;
    let (_job, views) = watch::channel(JobView::serving(0..20));
    let connector =
        service_fn(
            move |task: usize| async move { Ok::<_, Infallible>(MaybeDead { task, dead: task == dead }) },
        );
    let key: fn(&Req) -> Option<SliceKey> = |req| *req;
    // `Fail`: a request that finds no replica must not reach the subset either.
    let config = BalanceConfig::new(0, 3).with_fan_out(2).with_no_replica(NoReplicaPolicy::Fail);
    let b = Balance::new(config, connector, WatchStream::new(views)).unwrap().with_key_extractor(key);
    let subset = Algorithm::default().subset(0, 20, 3).unwrap();
    let healthy = (12..20).find(|t| !subset.contains(t)).unwrap();
    b.follow_assignments(futures_util::stream::iter([Assignment::single(
        1,
        vec![dead as u32, healthy as u32],
    )]));
    settle().await;
    for _ in 0..3 {
        // While connections come up a request may find no ready replica; any answer
        // must come from the slice's healthy replica.
        if let Ok(task) = send(&b, Some(SliceKey(7))).await {
            assert_eq!(task, healthy);
        }
        settle().await;
    }
    // Whatever the dead replica refused went to the slice's other replica, never to
    // a subset member outside the slice.
    for _ in 0..20 {
        assert_eq!(send(&b, Some(SliceKey(7))).await.unwrap(), healthy);
    }
}

#[tokio::test(start_paused = true)]
async fn warming_tasks_get_no_request() {
    // Every task in the subset: only the assignment keeps requests off task 1.
    let (b, _, _job) = balancer(BalanceConfig::new(0, 4), 4);
    let warming = slice(0, &[0]).with_warming([1, 2]);
    let (_tx, rx) = watch::channel(Assignment::new(1, vec![warming, slice(1 << 63, &[3])]).unwrap());
    b.follow_assignment_watch(rx);
    settle().await;
    for k in 0..200u64 {
        let got = send(&b, Some(SliceKey(k << 55))).await.unwrap();
        assert_eq!(got, if k << 55 < 1 << 63 { 0 } else { 3 }, "key {k}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_draining_owner_keeps_its_keyed_requests_only_when_configured() {
    for keyed_to_draining in [false, true] {
        let config = BalanceConfig::new(0, 4).with_keyed_to_draining(keyed_to_draining);
        let (b, _, job) = balancer(config, 4);
        let (_tx, rx) = watch::channel(Assignment::new(1, vec![slice(0, &[2])]).unwrap());
        b.follow_assignment_watch(rx);
        settle().await;
        assert_eq!(send(&b, Some(SliceKey(9))).await.unwrap(), 2);
        job.send_modify(|v| *v = v.clone().with_state(2, steady_balance::TaskState::Draining));
        settle().await;
        for k in 0..50u64 {
            let got = send(&b, Some(SliceKey(k << 58))).await.unwrap();
            if keyed_to_draining {
                assert_eq!(got, 2, "the draining owner still answers for its keys");
            } else {
                assert_ne!(got, 2, "a draining task gets nothing");
            }
            assert_ne!(send(&b, None).await.unwrap(), 2, "unkeyed requests never go to a draining task");
        }
        // Gone is gone, configured or not.
        job.send_modify(|v| *v = v.clone().with_state(2, steady_balance::TaskState::Gone));
        settle().await;
        assert_ne!(send(&b, Some(SliceKey(9))).await.unwrap(), 2);
    }
}
