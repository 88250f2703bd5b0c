//! What the balancer counts, and how its retries spread in time.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use steady_balance::{Assignment, Balance, BalanceConfig, JobView, SliceKey};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_stream::wrappers::WatchStream;
use tower::{service_fn, BoxError, ServiceExt};

#[tokio::test(start_paused = true)]
async fn frontends_with_the_same_index_do_not_retry_in_step() {
    // Two clients of different jobs, both frontend 0, both failing to reach the same
    // backends: each records when it tries again.
    let mut attempts: Vec<Arc<Mutex<Vec<Duration>>>> = Vec::new();
    let mut balancers = Vec::new();
    let start = Instant::now();
    for _ in 0..2 {
        let times: Arc<Mutex<Vec<Duration>>> = Arc::default();
        let t = times.clone();
        let connect = service_fn(move |_task: usize| {
            t.lock().unwrap().push(start.elapsed());
            async {
                Err::<tower::util::BoxCloneSyncService<u32, u32, Infallible>, BoxError>("refused".into())
            }
        });
        balancers.push(Balance::from_addresses(BalanceConfig::new(0, 1), connect, vec![0]).unwrap());
        attempts.push(times);
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (a, b) = (attempts[0].lock().unwrap().clone(), attempts[1].lock().unwrap().clone());
    assert!(a.len() >= 3 && b.len() >= 3, "{a:?} {b:?}");
    // The first attempts start together; the retries, jittered independently, do not.
    assert_eq!(a[0], b[0]);
    assert_ne!(a[1..3], b[1..3], "retries in lockstep: {a:?} {b:?}");
}

#[tokio::test(start_paused = true)]
async fn requests_on_affinity_connections_are_counted() {
    let connect = service_fn(|task: usize| async move {
        Ok::<_, Infallible>(service_fn(move |_: Option<SliceKey>| async move { Ok::<_, Infallible>(task) }))
    });
    let (_job, views) = watch::channel(JobView::serving(0..10));
    let key: fn(&Option<SliceKey>) -> Option<SliceKey> = |k| *k;
    let balance = Balance::new(BalanceConfig::new(0, 1), connect, WatchStream::new(views))
        .unwrap()
        .with_key_extractor(key);
    assert!(balance.wait_for_members(1, Duration::from_secs(1)).await);
    // Every key on a task outside the one-member subset: served on an affinity connection.
    let outside = (0..10u32).find(|t| !balance.stats().subset.contains(&(*t as usize))).unwrap();
    let (_a, assignments) = watch::channel(Assignment::single(1, vec![outside]).unwrap());
    balance.follow_assignment_watch(assignments);
    tokio::time::sleep(Duration::from_millis(1)).await;
    for i in 0..5 {
        assert_eq!(balance.clone().oneshot(Some(SliceKey(i))).await.unwrap(), outside as usize);
    }
    let stats = balance.stats();
    assert_eq!(stats.affinity, [outside as usize]);
    assert_eq!((stats.requests, stats.keyed_requests), (5, 5), "{stats:?}");
}
