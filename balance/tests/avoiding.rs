//! The hook hedging uses: a request sent away from the tasks given
//! (`Balance::call_avoiding`), and the task a response future went to
//! (`ResponseFuture::task`).

use std::convert::Infallible;
use std::time::Duration;

use steady_balance::{Assignment, Balance, BalanceConfig, JobView, SliceKey};
use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;
use tower::{service_fn, Service};

#[tokio::test(start_paused = true)]
async fn an_attempt_avoiding_tasks_goes_elsewhere_or_nowhere_and_a_keyed_one_stays_on_its_replicas() {
    // Each backend answers with its task index.
    let connect = service_fn(|task: usize| async move {
        Ok::<_, Infallible>(service_fn(move |_: Option<SliceKey>| async move { Ok::<_, Infallible>(task) }))
    });
    let (_job, views) = watch::channel(JobView::serving(0..4));
    let key: fn(&Option<SliceKey>) -> Option<SliceKey> = |k| *k;
    let mut balance = Balance::new(BalanceConfig::new(0, 4), connect, WatchStream::new(views))
        .unwrap()
        .with_key_extractor(key);
    assert!(balance.wait_for_members(4, Duration::from_secs(1)).await);

    // The fast path's future names its task too.
    let future = balance.call(None);
    let task = future.task().expect("a member was picked");
    assert_eq!(future.await.unwrap(), task);

    let mut seen = [0; 4];
    for _ in 0..100 {
        let Ok(future) = balance.call_avoiding(None, &[0, 2]) else { panic!("members 1 and 3 are ready") };
        let task = future.task().expect("a member was picked");
        assert!(task == 1 || task == 3, "{task}");
        assert_eq!(future.await.unwrap(), task);
        seen[task] += 1;
    }
    assert!(seen[1] > 0 && seen[3] > 0, "both others serve: {seen:?}");
    assert!(balance.call_avoiding(None, &[0, 1, 2, 3]).is_err(), "no member left: not sent");

    // Keyed: the slice's replicas are 1 and 2; the attempt never falls back to the subset.
    let (_publish, assignments) = watch::channel(Assignment::single(1, vec![1, 2]).unwrap());
    balance.follow_assignment_watch(assignments);
    assert!(balance.wait_for_generation(1, Duration::from_secs(1)).await);
    for _ in 0..20 {
        let Ok(future) = balance.call_avoiding(Some(SliceKey(7)), &[1]) else { panic!("replica 2 is ready") };
        assert_eq!(future.task(), Some(2));
        assert_eq!(future.await.unwrap(), 2);
    }
    assert!(balance.call_avoiding(Some(SliceKey(7)), &[1, 2]).is_err(), "no other replica: not sent");
    assert!(balance.stats().members.iter().all(|m| m.in_flight == 0));
}
