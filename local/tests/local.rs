//! Rudolph's mode against a real balancer (in-process backends that answer with their
//! task index), and its agreement across frontends that assign apart.

use std::convert::Infallible;
use std::time::Duration;

use proptest::prelude::*;
use steady_balance::{Balance, BalanceConfig, JobView, TaskState as ViewState};
use steady_local::{agreement, tasks_of, Assignment, LocalAssignments, SliceKey, Tasks};
use steady_subset::prng::SplitMix64;
use steady_testing::eventually;
use tokio::sync::watch;
use tower::{service_fn, Service, ServiceExt};

type Backend = tower::util::BoxCloneSyncService<SliceKey, usize, Infallible>;

/// A balancer over `n` in-process tasks (k = n), routing each request by its key.
async fn balancer(n: usize) -> Balance<Backend, fn(&SliceKey) -> Option<SliceKey>> {
    let connect = service_fn(|task: usize| async move {
        Ok::<_, Infallible>(Backend::new(service_fn(move |_key: SliceKey| async move {
            Ok::<_, Infallible>(task)
        })))
    });
    let balance = Balance::from_addresses(BalanceConfig::new(0, n), connect, (0..n).collect()).unwrap();
    assert!(balance.wait_for_members(n, Duration::from_secs(10)).await);
    balance.with_key_extractor((|key: &SliceKey| Some(*key)) as fn(&SliceKey) -> Option<SliceKey>)
}

/// A Zipf(1) sample over `keys` keys: the rank `r` (from 0) with weight `1 / (r + 1)`.
struct Zipf {
    cumulative: Vec<f64>,
}

impl Zipf {
    fn new(keys: usize) -> Self {
        let mut total = 0.0;
        let cumulative = (0..keys)
            .map(|r| {
                total += 1.0 / (r as f64 + 1.0);
                total
            })
            .collect();
        Self { cumulative }
    }

    fn sample(&self, rng: &mut SplitMix64) -> usize {
        let total = *self.cumulative.last().unwrap();
        let u = (rng.next() >> 11) as f64 / (1u64 << 53) as f64 * total;
        self.cumulative.partition_point(|&c| c < u).min(self.cumulative.len() - 1)
    }
}

fn key_of(rank: usize, shuffle: u64) -> SliceKey {
    SliceKey::of((rank as u64 ^ shuffle).to_le_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_requests_go_to_the_owner_the_frontend_s_own_assignment_names() {
    let mut balance = balancer(8).await;
    let (_job, tasks) = watch::channel(Tasks::serving(0..8).unwrap());
    let mut local =
        LocalAssignments::rudolph().every(Duration::from_millis(20)).start(&balance, tasks).unwrap();
    // The first run needs no load: keys have owners at once.
    local.wait_for_generation(1).await;
    eventually("the balancer to take the local assignment", || {
        balance.stats().assignment_generation.is_some()
    })
    .await;
    // Skewed keys: the hot ones all in the first task's bins at rotation 0.
    let mut rng = SplitMix64::new(3);
    let mut checked = 0;
    for round in 0..40 {
        let in_force = local.assignment().unwrap();
        let balancer_generation = balance.stats().assignment_generation.unwrap();
        for _ in 0..200 {
            let key = if rng.next() % 4 == 0 { SliceKey(rng.next()) } else { SliceKey(rng.next() >> 4) };
            let task = balance.ready().await.unwrap().call(key).await.unwrap();
            // The assignment may change under us: check against the one the balancer had.
            if balance.stats().assignment_generation == Some(balancer_generation)
                && balancer_generation == in_force.generation()
            {
                assert_eq!(Some(&(task as u32)), in_force.slice_for(key).replicas().first(), "round {round}");
                checked += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(checked >= 1000, "only {checked} requests were checked against a settled assignment");
    let stats = local.stats();
    assert!(stats.runs >= 2 && stats.published >= 2, "{stats:?}");
    assert_eq!(stats.errors, 0);
    assert!(balance.stats().keyed_requests >= 8000, "{:?}", balance.stats().keyed_requests);
    // The rotation moved off its start to spread the hot sixteenth of the key space.
    let last = local.assignment().unwrap();
    let first_owner_of_hot = last.slice_for(SliceKey(0)).replicas()[0];
    let owners: std::collections::BTreeSet<u32> =
        (0..64).map(|i| last.slice_for(SliceKey((i as u64) << 54)).replicas()[0]).collect();
    assert!(owners.len() >= 2, "the hot range stayed on task {first_owner_of_hot}: {owners:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_serving_task_a_run_fails_and_the_last_assignment_stays() {
    let balance = balancer(4).await;
    let (job, tasks) = watch::channel(Tasks::serving(0..4).unwrap());
    let mut local =
        LocalAssignments::rudolph().every(Duration::from_millis(10)).start(&balance, tasks).unwrap();
    local.wait_for_generation(1).await;
    let kept = local.assignment().unwrap();
    job.send_replace(Tasks::new((0..4).map(|t| (t, steady_local::TaskState::Draining))).unwrap());
    local.wait_for(|s| s.errors >= 2).await;
    assert_eq!(local.assignment().unwrap(), kept);
    assert_eq!(balance.stats().assignment_generation, Some(kept.generation()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_that_drains_loses_its_keys_at_once_not_at_the_next_period() {
    let balance = balancer(4).await;
    let (job, tasks) = watch::channel(Tasks::serving(0..4).unwrap());
    // A period of an hour: only discovery's change can cause the second run.
    let mut local =
        LocalAssignments::rudolph().every(Duration::from_secs(3600)).start(&balance, tasks).unwrap();
    local.wait_for_generation(1).await;
    assert!(local.assignment().unwrap().slices_of(2).next().is_some());
    job.send_replace(
        Tasks::new((0..4).map(|t| {
            (t, if t == 2 { steady_local::TaskState::Draining } else { steady_local::TaskState::Serving })
        }))
        .unwrap(),
    );
    tokio::time::timeout(Duration::from_secs(10), local.wait_for_generation(2))
        .await
        .expect("no run followed the drain within 10 s");
    let moved = local.assignment().unwrap();
    assert_eq!(moved.slices_of(2).count(), 0, "the draining task still owns keys");
    // The balancer routes by it (it takes it from the assigner's channel on its own task).
    let what = format!("the balancer to take generation {}", moved.generation());
    eventually(&what, || balance.stats().assignment_generation == Some(moved.generation())).await;
    // Discovery going away leaves the last view in force; the assigner keeps running.
    drop(job);
    tokio::task::yield_now().await;
    assert!(!local.is_finished());
    assert_eq!(local.stats().errors, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_assigner_ends_with_its_balancer() {
    let balance = balancer(4).await;
    let (_job, tasks) = watch::channel(Tasks::serving(0..4).unwrap());
    let mut local =
        LocalAssignments::rudolph().every(Duration::from_millis(10)).start(&balance, tasks).unwrap();
    local.wait_for_generation(1).await;
    drop(balance);
    eventually("the local assigner to end with its balancer", || local.is_finished()).await;
}

#[test]
fn bad_settings_are_refused() {
    assert!(LocalAssignments::rudolph().every(Duration::ZERO).runner().is_err());
    assert!(LocalAssignments::rudolph().memory(1.0).runner().is_err());
    assert!(LocalAssignments::rudolph().memory(-0.1).runner().is_err());
    assert!(LocalAssignments::rudolph().bins_log2(0).runner().is_err());
    let mut runner = LocalAssignments::rudolph().bins_log2(4).runner().unwrap();
    assert!(runner.run(&[1, 2, 3], &Tasks::serving(0..2).unwrap()).is_err(), "counts must match the bins");
    assert!(runner.assignment().is_none());
}

#[test]
fn a_discovery_view_becomes_the_assigner_s_tasks() {
    let view = JobView::serving(["a", "b", "c"]).with_state(1, ViewState::Draining);
    let tasks = tasks_of(&view).unwrap();
    assert_eq!(tasks.serving_ids(), vec![0, 2]);
    assert_eq!(tasks.state(1), steady_local::TaskState::Draining);
}

/// `frontends` frontends, each sending a share of one Zipf(1) stream over 100,000 keys
/// (the share each gets chosen by `route`), each assigning from its own counts every
/// 4,000 of its requests, keys reshuffled halfway; the agreement of the last period.
fn simulate(frontends: usize, route: impl Fn(usize, &mut SplitMix64) -> usize) -> f64 {
    let zipf = Zipf::new(100_000);
    let tasks = Tasks::serving(0..8).unwrap();
    let mut rng = SplitMix64::new(11);
    let mut runners: Vec<_> = (0..frontends).map(|_| LocalAssignments::rudolph().runner().unwrap()).collect();
    let mut last: Vec<Vec<(SliceKey, u64)>> = vec![Vec::new(); frontends];
    for period in 0..10 {
        let shuffle = if period < 5 { 0 } else { 0x9e37_79b9 };
        let mut counts = vec![vec![0u64; runners[0].bins()]; frontends];
        let mut sent: Vec<std::collections::HashMap<SliceKey, u64>> = vec![Default::default(); frontends];
        for _ in 0..4_000 * frontends {
            let rank = zipf.sample(&mut rng);
            let frontend = route(rank, &mut rng);
            let key = key_of(rank, shuffle);
            counts[frontend][(key.0 >> (64 - 12)) as usize] += 1;
            *sent[frontend].entry(key).or_default() += 1;
        }
        for (f, runner) in runners.iter_mut().enumerate() {
            runner.run(&counts[f], &tasks).unwrap();
        }
        last = sent.into_iter().map(|s| s.into_iter().collect()).collect();
    }
    let assignments: Vec<Assignment> = runners.iter().map(|r| r.assignment().unwrap().clone()).collect();
    let pairs: Vec<(&Assignment, &[(SliceKey, u64)])> =
        assignments.iter().zip(&last).map(|(a, k)| (a, k.as_slice())).collect();
    agreement(&pairs)
}

#[test]
fn frontends_with_alike_traffic_agree_on_at_least_95_percent_of_requests() {
    // A load balancer in front spreads requests evenly over 4 frontends.
    let agreed = simulate(4, |_rank, rng| (rng.next() % 4) as usize);
    eprintln!("agreement with alike traffic: {agreed}");
    assert!(agreed >= 0.95, "agreement {agreed}");
}

#[test]
fn frontends_with_different_hot_keys_split_some_keys() {
    // Half of each key's requests come from the frontend of its own users (rank % 4), the
    // rest from any: each frontend sees a different hot set and may pick its own
    // rotation; the keys all of them send then split between owners. (The rotation's
    // moving penalty keeps the rotations close: 97.2% on this seed.)
    let agreed =
        simulate(4, |rank, rng| if rng.next() % 2 == 0 { rank % 4 } else { (rng.next() % 4) as usize });
    eprintln!("agreement with different hot keys: {agreed}");
    assert!(agreed < 0.99, "agreement {agreed}");
}

proptest! {
    #[test]
    fn agreement_is_between_one_over_the_frontends_and_one(
        generations in proptest::collection::vec(1u64..4, 1..5),
        keys in proptest::collection::vec((any::<u64>(), 1u64..100), 1..50),
    ) {
        let assignments: Vec<Assignment> = generations
            .iter()
            .enumerate()
            .map(|(f, _)| Assignment::single(1, vec![f as u32]).unwrap())
            .collect();
        let keys: Vec<(SliceKey, u64)> = keys.into_iter().map(|(k, c)| (SliceKey(k), c)).collect();
        let pairs: Vec<(&Assignment, &[(SliceKey, u64)])> =
            assignments.iter().map(|a| (a, keys.as_slice())).collect();
        let agreed = agreement(&pairs);
        // Every frontend sends every key, each to a different owner: exactly 1/f.
        prop_assert!((agreed - 1.0 / assignments.len() as f64).abs() < 1e-9);
        // One assignment shared by all: full agreement.
        let shared: Vec<(&Assignment, &[(SliceKey, u64)])> =
            assignments.iter().map(|_| (&assignments[0], keys.as_slice())).collect();
        prop_assert_eq!(agreement(&shared), 1.0);
    }
}
