//! Every configuration value is checked when a balancer is built or changed: a value out
//! of range is a typed error naming its field, and any accepted configuration gives a
//! balancer that works. Beyond configuration, the control task survives panics.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use proptest::prelude::*;
use steady_balance::{
    Assignment, Backoff, Balance, BalanceConfig, BalanceError, BalanceLayer, JobView, Load, SliceKey,
    MAX_SUBSET_SIZE, MAX_WAIT,
};
use steady_testing::holds_within;
use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;
use tower::{service_fn, BoxError, ServiceExt};

/// Every field `validate` may name.
const FIELDS: [&str; 13] = [
    "subset_size",
    "max_stand_ins",
    "max_affinity",
    "fan_out",
    "connect_timeout",
    "no_backend_wait",
    "affinity_wait",
    "affinity_idle",
    "backoff.base",
    "backoff.max",
    "backoff.jitter",
    "load.decay",
    "load.default_rtt",
];

fn any_count() -> impl Strategy<Value = usize> {
    prop_oneof![
        Just(0usize),
        1usize..8,
        Just(MAX_SUBSET_SIZE),
        Just(MAX_SUBSET_SIZE + 1),
        Just(1 << 40),
        Just(usize::MAX)
    ]
}

fn any_duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        Just(Duration::from_nanos(1)),
        (1u64..5_000).prop_map(Duration::from_millis),
        Just(Duration::from_secs(3600)),
        Just(Duration::from_secs(3600) + Duration::from_nanos(1)),
        Just(Duration::from_secs(u64::MAX / 2)),
        Just(Duration::MAX),
    ]
}

fn any_jitter() -> impl Strategy<Value = f64> {
    prop_oneof![Just(f64::NAN), Just(f64::INFINITY), Just(-1.0), Just(1.5), 0.0..=1.0f64]
}

fn any_config() -> impl Strategy<Value = BalanceConfig> {
    (
        (any::<usize>(), any_count(), any_count(), any_count(), any_count()),
        (any_duration(), any_duration(), any_duration(), any_duration()),
        (any_duration(), any_duration(), any_jitter()),
        prop::option::of((any_duration(), any_duration())),
    )
        .prop_map(
            |(
                (frontend, k, stand_ins, fan_out, max_affinity),
                (connect, no_backend, affinity, idle),
                (base, max, jitter),
                ewma,
            )| {
                let mut config = BalanceConfig::new(frontend, k)
                    .with_max_stand_ins(stand_ins)
                    .with_fan_out(fan_out)
                    .with_affinity(max_affinity, idle)
                    .with_connect_timeout(connect)
                    .with_no_backend_wait(no_backend)
                    .with_affinity_wait(affinity)
                    .with_backoff(Backoff { base, max, jitter });
                if let Some((decay, default_rtt)) = ewma {
                    config = config.with_load(Load::PeakEwma { decay, default_rtt });
                }
                config
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn any_configuration_gives_a_working_balancer_or_a_typed_error(config in any_config()) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap();
        rt.block_on(async move {
            let connect = service_fn(|task: usize| async move {
                Ok::<_, Infallible>(service_fn(move |req: u32| async move { Ok::<_, Infallible>((task, req)) }))
            });
            let (_job, views) = watch::channel(JobView::serving(0..3));
            match Balance::new(config.clone(), connect, WatchStream::new(views)) {
                Err(error) => {
                    prop_assert!(FIELDS.contains(&error.field()), "{error}");
                    prop_assert!(error.to_string().contains(error.field()));
                    // The layer checks the same way.
                    let (_job, views) = watch::channel(JobView::<usize>::serving(0..3));
                    prop_assert_eq!(BalanceLayer::new(config, views).unwrap_err(), error);
                }
                Ok(balance) => {
                    // Accepted: it connects its subset (at most the job) and serves.
                    let k = config.subset_size.min(3);
                    prop_assert!(balance.wait_for_members(k, Duration::from_secs(10)).await, "{config:?}");
                    let (task, echoed) = balance.clone().oneshot(7).await.expect("served");
                    prop_assert!(task < 3 && echoed == 7);
                    prop_assert_eq!(balance.stats().control_restarts, 0);
                }
            }
            Ok(())
        })?;
    }
}

/// A `Backoff` alone (as `watch_assignments` and `Slicelet::report_to_with_backoff` take
/// it) is checked with the same ranges as `BalanceConfig::validate` checks its own.
#[test]
fn a_backoff_out_of_range_is_a_typed_error_naming_its_field() {
    let good = Backoff::default();
    assert_eq!(good.validate(), Ok(()));
    let ms = Duration::from_millis(1);
    let cases = [
        (Backoff { base: Duration::ZERO, ..good }, "backoff.base"),
        (Backoff { base: ms - Duration::from_nanos(1), ..good }, "backoff.base"),
        (Backoff { base: MAX_WAIT + Duration::from_nanos(1), max: Duration::MAX, ..good }, "backoff.base"),
        (Backoff { base: Duration::MAX, max: Duration::MAX, ..good }, "backoff.base"),
        (Backoff { base: ms * 10, max: ms * 9, ..good }, "backoff.max"),
        (Backoff { max: MAX_WAIT + Duration::from_nanos(1), ..good }, "backoff.max"),
        (Backoff { max: Duration::MAX, ..good }, "backoff.max"),
        (Backoff { jitter: f64::NAN, ..good }, "backoff.jitter"),
        (Backoff { jitter: -0.1, ..good }, "backoff.jitter"),
        (Backoff { jitter: 1.0 + f64::EPSILON, ..good }, "backoff.jitter"),
        (Backoff { jitter: f64::INFINITY, ..good }, "backoff.jitter"),
    ];
    for (backoff, field) in cases {
        let error = backoff.validate().unwrap_err();
        assert_eq!(error.field(), field, "{backoff:?}: {error}");
        assert!(error.to_string().contains(field), "{error}");
        // The same error as a balancer configuration with it.
        assert_eq!(BalanceConfig::new(0, 1).with_backoff(backoff).validate(), Err(error));
    }
    // The bounds themselves are accepted.
    for backoff in
        [Backoff { base: ms, max: ms, jitter: 0.0 }, Backoff { base: MAX_WAIT, max: MAX_WAIT, jitter: 1.0 }]
    {
        assert_eq!(backoff.validate(), Ok(()), "{backoff:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_subset_size_out_of_range_is_refused_at_run_time_and_changes_nothing() {
    let connect = service_fn(|task: usize| async move {
        Ok::<_, Infallible>(service_fn(move |_: u32| async move { Ok::<_, Infallible>(task) }))
    });
    let balance = Balance::from_addresses(BalanceConfig::new(0, 2), connect, (0..5).collect()).unwrap();
    assert!(balance.wait_for_members(2, Duration::from_secs(1)).await);
    for k in [0, MAX_SUBSET_SIZE + 1, usize::MAX] {
        let error = balance.set_subset_size(k).unwrap_err();
        assert_eq!(error.field(), "subset_size", "{error}");
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(balance.stats().subset.len(), 2);
    // A k above the job's size is the whole job.
    balance.set_subset_size(1000).unwrap();
    assert!(balance.wait_for_members(5, Duration::from_secs(1)).await);
}

/// An address whose comparison panics while `PANIC` is set: user code the control task
/// runs (it compares addresses to notice a task that moved).
#[derive(Debug, Clone)]
struct Fragile(usize, Arc<AtomicBool>);

impl PartialEq for Fragile {
    fn eq(&self, other: &Self) -> bool {
        assert!(!self.1.load(Ordering::SeqCst), "address comparison failed");
        self.0 == other.0
    }
}

#[tokio::test(start_paused = true)]
async fn the_control_task_survives_a_panic_and_rebuilds_from_the_last_view() {
    let panic = Arc::new(AtomicBool::new(false));
    let view = |n: usize| JobView::serving((0..n).map(|t| Fragile(t, panic.clone())));
    let (job, views) = watch::channel(view(4));
    let connect = service_fn(|address: Fragile| async move {
        Ok::<_, Infallible>(service_fn(move |_: u32| async move { Ok::<_, Infallible>(address.0) }))
    });
    let balance = Balance::new(BalanceConfig::new(0, 2), connect, WatchStream::new(views)).unwrap();
    assert!(balance.wait_for_members(2, Duration::from_secs(1)).await);
    // The next view makes the control task panic, again and again while `panic` is set.
    panic.store(true, Ordering::SeqCst);
    job.send_replace(view(5));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(balance.stats().control_restarts >= 2, "{:?}", balance.stats());
    // Requests never meet a dead balancer: they are served on the table in force.
    for _ in 0..10 {
        balance.clone().oneshot(1).await.expect("served while the control task restarts");
    }
    // Once the fault is gone, the rebuilt task follows the view again.
    panic.store(false, Ordering::SeqCst);
    job.send_replace(view(6));
    tokio::time::sleep(Duration::from_secs(11)).await;
    let stats = balance.stats();
    assert_eq!(stats.subset.len(), 2, "{stats:?}");
    assert_eq!(stats.members.len(), 2, "{stats:?}");
    let served = balance.clone().oneshot(1).await.unwrap();
    assert!(stats.subset.contains(&served));
    assert!(!matches!(
        balance.clone().oneshot(1).await.map_err(|e| e.downcast::<BalanceError>().map(|b| *b)),
        Err(Ok(BalanceError::NoReadyBackends { .. }))
    ));
}

#[tokio::test(start_paused = true)]
async fn a_job_source_that_panics_is_dropped_and_the_rest_keeps_working() {
    // The source yields one view, then panics (and would again on every poll).
    let job = futures_util::stream::iter([JobView::serving(0..4)])
        .chain(futures_util::stream::once(async { panic!("job source bug") }));
    let connect = service_fn(|task: usize| async move {
        Ok::<_, Infallible>(service_fn(move |_: Option<SliceKey>| async move { Ok::<_, Infallible>(task) }))
    });
    let key: fn(&Option<SliceKey>) -> Option<SliceKey> = |k| *k;
    let balance = Balance::new(BalanceConfig::new(0, 2), connect, job).unwrap().with_key_extractor(key);
    assert!(balance.wait_for_members(2, Duration::from_secs(1)).await);
    // Assignments are still followed, and keyed requests routed by them.
    let replica = balance.stats().subset[1];
    let (_a, assignments) = watch::channel(Assignment::single(1, vec![replica as u32]).unwrap());
    balance.follow_assignment_watch(assignments);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(balance.stats().assignment_generation, Some(1));
    assert_eq!(balance.clone().oneshot(Some(SliceKey(9))).await.unwrap(), replica);
}

#[tokio::test(start_paused = true)]
async fn a_connection_whose_failure_was_half_handled_is_replaced_after_a_restart() {
    let panic = Arc::new(AtomicBool::new(false));
    let failing = Arc::new(AtomicBool::new(false));
    let (_job, views) = watch::channel(JobView::serving([Fragile(0, panic.clone())]));
    let f = failing.clone();
    let connect = service_fn(move |address: Fragile| {
        let f = f.clone();
        async move {
            Ok::<_, Infallible>(service_fn(move |_: u32| {
                let fail = f.load(Ordering::SeqCst);
                async move {
                    if fail {
                        Err::<usize, BoxError>("call failed".into())
                    } else {
                        Ok(address.0)
                    }
                }
            }))
        }
    });
    let config = BalanceConfig::new(0, 1).with_no_backend_wait(Duration::from_millis(50));
    let balance = Balance::new(config, connect, WatchStream::new(views)).unwrap();
    assert!(balance.wait_for_members(1, Duration::from_secs(1)).await);
    // A call fails, and handling the failure panics half way (comparing addresses).
    panic.store(true, Ordering::SeqCst);
    failing.store(true, Ordering::SeqCst);
    assert!(balance.clone().oneshot(1).await.is_err());
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(balance.stats().control_restarts >= 1);
    // The faults go away: the broken connection is replaced, not kept for good.
    panic.store(false, Ordering::SeqCst);
    failing.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert_eq!(balance.clone().oneshot(1).await.expect("served by a new connection"), 0);
}

/// One assignment per poll from `generations`, except that the polls numbered in
/// `panics` (from 0) panic instead.
fn panicking_source(
    generations: Vec<u64>,
    panics: impl Fn(usize) -> bool + Send + 'static,
) -> impl futures_util::Stream<Item = Result<Assignment, BoxError>> + Send + 'static {
    let mut polls = 0usize;
    let mut generations = generations.into_iter();
    futures_util::stream::poll_fn(move |_| {
        let poll = polls;
        polls += 1;
        if panics(poll) {
            panic!("assignment source bug on poll {poll}");
        }
        std::task::Poll::Ready(generations.next().map(|g| Ok(Assignment::single(g, vec![0]).unwrap())))
    })
    .chain(futures_util::stream::pending())
}

#[tokio::test(start_paused = true)]
async fn an_assignment_source_that_panics_is_followed_again_after_a_backoff() {
    let connect = service_fn(|task: usize| async move {
        Ok::<_, Infallible>(service_fn(move |_: u32| async move { Ok::<_, Infallible>(task) }))
    });
    let balance = Balance::from_addresses(BalanceConfig::new(0, 1), connect, vec![0]).unwrap();
    // Generation 1, then a panic, then generation 2.
    balance.follow_assignments(panicking_source(vec![1, 2], |poll| poll == 1));
    assert!(holds_within(Duration::from_secs(1), || balance.stats().assignment_generation == Some(1)).await);
    assert!(holds_within(Duration::from_secs(1), || balance.stats().assignment_source_restarts == 1).await);
    let panicked = tokio::time::Instant::now();
    // Polled again after the first restart delay (100 ms, less up to half of it).
    assert!(holds_within(Duration::from_secs(1), || balance.stats().assignment_generation == Some(2)).await);
    let waited = panicked.elapsed();
    assert!(waited >= Duration::from_millis(49) && waited <= Duration::from_millis(101), "{waited:?}");
    let s = balance.stats();
    assert_eq!((s.assignment_source_restarts, s.assignments_accepted, s.assignments_rejected), (1, 2, 0));
    assert_eq!(s.control_restarts, 0);
}

#[tokio::test(start_paused = true)]
async fn an_assignment_source_that_always_panics_is_polled_again_ever_more_slowly() {
    let connect = service_fn(|task: usize| async move {
        Ok::<_, Infallible>(service_fn(move |_: u32| async move { Ok::<_, Infallible>(task) }))
    });
    let balance = Balance::from_addresses(BalanceConfig::new(0, 1), connect, vec![0]).unwrap();
    balance.follow_assignments(panicking_source(vec![1], |poll| poll >= 1));
    assert!(holds_within(Duration::from_secs(1), || balance.stats().assignment_generation == Some(1)).await);
    // Delays of 100 ms doubling to 10 s, each less up to half: in a minute, 7 doubling
    // ones (6.35 to 12.7 s in all), then one every 5 to 10 s.
    tokio::time::sleep(Duration::from_secs(60)).await;
    let restarts = balance.stats().assignment_source_restarts;
    assert!((12..=18).contains(&restarts), "{restarts} restarts in a minute");
    // The assignment in force stays, and the balancer serves.
    assert_eq!(balance.stats().assignment_generation, Some(1));
    assert_eq!(balance.clone().oneshot(1).await.unwrap(), 0);
}
