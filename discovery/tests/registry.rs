//! The etcd registry's specification, on a real etcd on 127.0.0.1 started per test by
//! `steady_testing::Etcd` (skipped when etcd is missing, unless STEADY_REQUIRE_ETCD is
//! set): frontends take contiguous indices and replacements fill exactly the holes
//! crashes leave; a frontend's subset stays put while others come and go; every
//! watcher sees a backend arrive, drain and go within one watch event. Every wait is
//! bounded. The measured times are printed (`--nocapture` shows them).

#![cfg(feature = "etcd")]

use std::collections::BTreeSet;
use std::future::Future;
use std::time::{Duration, Instant};

use steady_discovery::identity::Origin;
use steady_discovery::registry::{
    self, DrainScope, Registration, Registry, RegistryConfig, RegistryError, WatchCounters, MAX_TASKS,
};
use steady_discovery::{Discovery, JobView, TaskState};
use steady_subset::{Algorithm, Subsetting};
use steady_testing::{within, Etcd};
use tokio::sync::watch;

/// The most any single step may take.
const WAIT: Duration = Duration::from_secs(15);
/// The lease of these tests: etcd's minimum with its default settings.
const TTL: Duration = Duration::from_secs(2);

async fn connect(etcd: &Etcd, ttl: Duration) -> Registry {
    let config =
        RegistryConfig::new([etcd.endpoint()]).lease_ttl(ttl).request_timeout(Duration::from_secs(3));
    within(WAIT, "connecting", Registry::connect(config)).await.unwrap()
}

/// Waits (bounded) until `views` shows a view that satisfies `wanted`; returns it.
async fn view_where(
    what: &str,
    views: &mut watch::Receiver<JobView<String>>,
    wanted: impl FnMut(&JobView<String>) -> bool,
) -> JobView<String> {
    within(WAIT, what, views.wait_for(wanted))
        .await
        .expect("the watch task runs while its Discovery lives")
        .clone()
}

/// The next view `views` publishes (bounded), whatever it is.
async fn next_view(what: &str, views: &mut watch::Receiver<JobView<String>>) -> JobView<String> {
    within(WAIT, what, views.changed()).await.expect("the watch task runs while its Discovery lives");
    views.borrow_and_update().clone()
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort_unstable();
    times[times.len() / 2]
}

/// `count` members named `<name>-<n>` claim indices of `job` at once, each on its own
/// connection; returns their registrations and how long each claim took.
async fn claim_all(
    etcd: &Etcd,
    job: &'static str,
    names: impl IntoIterator<Item = String>,
) -> (Vec<Registration>, Vec<Duration>) {
    let mut claims = Vec::new();
    for name in names {
        let registry = connect(etcd, TTL).await;
        claims.push(tokio::spawn(async move {
            let started = Instant::now();
            let claimed = registry.claim(job, &name).await;
            (claimed, started.elapsed())
        }));
    }
    let (mut registrations, mut times) = (Vec::new(), Vec::new());
    for claim in claims {
        let (claimed, took) = within(WAIT, "a claim", claim).await.unwrap();
        registrations.push(claimed.unwrap());
        times.push(took);
    }
    registrations.sort_by_key(Registration::index);
    (registrations, times)
}

fn indices(registrations: &[Registration]) -> Vec<usize> {
    registrations.iter().map(Registration::index).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_frontends_take_0_to_19_and_newcomers_take_exactly_the_indices_of_crashed_ones() {
    let Some(etcd) = Etcd::start() else { return };
    let registry = connect(&etcd, TTL).await;
    let members = within(WAIT, "watching", registry::watch_job(&registry, "web")).await.unwrap();
    let mut view = members.views();

    let (mut frontends, times) = claim_all(&etcd, "web", (0..20).map(|n| format!("web-host-{n}"))).await;
    assert_eq!(indices(&frontends), (0..20).collect::<Vec<_>>(), "20 claims at once take 0..19, once each");
    assert_eq!(registry.job_size("web").await.unwrap(), 20);
    let shown = view_where("all 20 in the view", &mut view, |v| v.tasks.len() == 20).await;
    for f in &frontends {
        assert_eq!(shown.tasks[&f.index()].address, f.address(), "each key holds its claimant's name");
        assert_eq!(f.key(), format!("/steady/jobs/web/tasks/{}", f.index()), "the key layout is a contract");
    }
    println!(
        "index allocation, 20 concurrent claims on one etcd: median {:?}, max {:?}",
        median(times.clone()),
        times.iter().max().unwrap()
    );

    // Five crash: their keys stay until their leases lapse, and nobody gets their
    // indices meanwhile.
    let crashed_indices = [2, 7, 8, 13, 19];
    let survivors: Vec<Registration> = {
        let mut kept = Vec::new();
        for f in frontends.drain(..) {
            if crashed_indices.contains(&f.index()) {
                f.crash();
            } else {
                kept.push(f);
            }
        }
        kept
    };
    let crashed_at = Instant::now();
    let early = within(WAIT, "an early claim", registry.claim("web", "early-bird")).await.unwrap();
    assert_eq!(early.index(), 20, "a crashed task's index is not free before its lease lapses");
    early.release().await.unwrap();
    let after_lapse = view_where("the crashed keys lapse", &mut view, |v| v.tasks.len() == 15).await;
    let lapse = crashed_at.elapsed();
    assert!(lapse >= TTL / 2, "keys went after {lapse:?}, before their TTL ({TTL:?}) could lapse");
    assert_eq!(after_lapse.tasks.keys().copied().collect::<BTreeSet<_>>(), {
        survivors.iter().map(Registration::index).collect::<BTreeSet<_>>()
    });
    assert_eq!(after_lapse.size, 19, "index 19 is the highest held no more");
    println!("crashed frontends' keys gone {lapse:?} after their last renewal (TTL {TTL:?})");

    // Five newcomers, at once: exactly the freed indices, so the job is 0..19 again.
    let (newcomers, _) = claim_all(&etcd, "web", (0..5).map(|n| format!("new-host-{n}"))).await;
    assert_eq!(indices(&newcomers), crashed_indices.to_vec());
    assert_eq!(registry.job_size("web").await.unwrap(), 20);
    // The survivors kept their keys throughout.
    for s in &survivors {
        assert!(s.is_held(), "{s:?}");
    }
    let whole = view_where("the job whole again", &mut view, |v| v.tasks.len() == 20).await;
    assert_eq!(whole.size, 20);

    // As identities: the next claimant is told its origin, and its index is freed when
    // the identity drops.
    let started = Instant::now();
    let identity = within(WAIT, "a claim", registry.claim_index("web", "web-host-20")).await.unwrap();
    println!("index allocation, one claim alone on a job of 20: {:?}", started.elapsed());
    assert_eq!((identity.index(), identity.origin()), (20, &Origin::Registry));
    // Its key is in the view before it drops (else a view of 20 could be one from before
    // the claim, and say nothing of the drop).
    view_where("the identity's key", &mut view, |v| v.tasks.contains_key(&20)).await;
    drop(identity);
    // Dropping it revokes its lease in the background: wait for the size itself, as the
    // registry reads it, not for a view that may run ahead of or behind it.
    job_size_becomes(&registry, "web", 20).await;
    view_where("the dropped identity's key gone from the view", &mut view, |v| v.size == 20).await;
    drop(members);
}

/// Waits (bounded) until the registry reads `job`'s size as `size`.
async fn job_size_becomes(registry: &Registry, job: &str, size: usize) {
    let read = async {
        loop {
            if registry.job_size(job).await.unwrap() == size {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    within(WAIT, &format!("{job}'s size to read {size}"), read).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frontends_index_and_so_its_subset_stay_put_while_other_frontends_come_and_go() {
    let Some(etcd) = Etcd::start() else { return };
    let registry = connect(&etcd, TTL).await;
    let (backends, subset_size) = (40, 6);
    let algorithm = Algorithm::default();

    let (mut others, _) = claim_all(&etcd, "web", (0..4).map(|n| format!("before-{n}"))).await;
    let me = within(WAIT, "my claim", registry.claim("web", "me")).await.unwrap();
    assert_eq!(me.index(), 4);
    let (later, _) = claim_all(&etcd, "web", (0..4).map(|n| format!("after-{n}"))).await;
    others.extend(later);
    let my_subset = algorithm.subset(me.index(), backends, subset_size).unwrap();

    let members = within(WAIT, "watching", registry::watch_job(&registry, "web")).await.unwrap();
    let mut view = members.views();
    let mine = |v: &JobView<String>| v.tasks.get(&4).map(|t| t.address.clone());
    assert_eq!(mine(&members.current()).as_deref(), Some("me"));

    for round in 0..3 {
        // Others below and above me go: some cleanly (at once), some by crashing (a TTL
        // later), and as many newcomers replace them.
        others.sort_by_key(Registration::index);
        let leaving: Vec<Registration> = vec![others.remove(0), others.remove(3), others.remove(4)];
        let gone: BTreeSet<usize> = leaving.iter().map(Registration::index).collect();
        for (n, other) in leaving.into_iter().enumerate() {
            if n == 1 && round != 1 {
                other.crash();
            } else {
                other.release().await.unwrap();
            }
        }
        view_where("the leavers gone", &mut view, |v| gone.iter().all(|i| !v.tasks.contains_key(i))).await;
        let (newcomers, _) = claim_all(&etcd, "web", (0..3).map(|n| format!("round-{round}-{n}"))).await;
        assert_eq!(indices(&newcomers).into_iter().collect::<BTreeSet<_>>(), gone, "round {round}");
        others.extend(newcomers);

        assert!(me.is_held(), "round {round}: my lease lapsed");
        let now = view_where("the newcomers", &mut view, |v| v.tasks.len() == 9).await;
        assert_eq!(mine(&now).as_deref(), Some("me"), "round {round}: my key is someone else's");
        assert_eq!(now.size, 9, "round {round}: the job is contiguous");
        assert_eq!(registry.job_size("web").await.unwrap(), 9);
        // The subset follows from the index alone (and N and k): same index, same subset.
        assert_eq!(algorithm.subset(me.index(), backends, subset_size).unwrap(), my_subset);
    }
}

/// Three frontends (each on its own connection) watching the `api` job.
async fn three_watchers(etcd: &Etcd) -> Vec<(Discovery, WatchCounters, watch::Receiver<JobView<String>>)> {
    let mut watchers = Vec::new();
    for _ in 0..3 {
        let registry = connect(etcd, TTL).await;
        let (discovery, counters) =
            within(WAIT, "watching", registry::watch_job_counted(&registry, "api")).await.unwrap();
        let views = discovery.views();
        watchers.push((discovery, counters, views));
    }
    watchers
}

/// Runs `change` and returns what it returned, how long it took, and each watcher's next
/// view with how long after the start of `change` it arrived. The watchers wait at the
/// same time, each in a task of its own started before `change`.
async fn next_views_after<T>(
    what: &'static str,
    watchers: &mut [(Discovery, WatchCounters, watch::Receiver<JobView<String>>)],
    change: impl Future<Output = T>,
) -> (T, Duration, Vec<(JobView<String>, Duration)>) {
    let since = Instant::now();
    let waits: Vec<_> = watchers
        .iter()
        .map(|(_, _, views)| {
            let mut views = views.clone();
            tokio::spawn(async move {
                let view = next_view(what, &mut views).await;
                (view, since.elapsed(), views)
            })
        })
        .collect();
    let changed = within(WAIT, what, change).await;
    let took = since.elapsed();
    let mut seen = Vec::new();
    for (wait, (_, _, views)) in waits.into_iter().zip(watchers.iter_mut()) {
        let (view, latency, seen_by) = within(WAIT, what, wait).await.unwrap();
        // Carries on from the view just seen.
        *views = seen_by;
        seen.push((view, latency));
    }
    (changed, took, seen)
}

fn slowest(seen: &[(JobView<String>, Duration)]) -> Duration {
    seen.iter().map(|(_, latency)| *latency).max().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_appears_drains_and_goes_in_every_watchers_view_within_one_watch_event() {
    let Some(etcd) = Etcd::start() else { return };
    let backends = connect(&etcd, TTL).await;
    let first = backends.register("api", 0, "10.0.0.1:50051").await.unwrap();
    let second = backends.register("api", 1, "10.0.0.2:50051").await.unwrap();
    let mut watchers = three_watchers(&etcd).await;
    for (discovery, counters, _) in &watchers {
        let view = discovery.current();
        assert_eq!((view.size, view.serving_task(1).map(String::as_str)), (2, Some("10.0.0.2:50051")));
        assert_eq!(counters.get().reads, 1);
    }

    // Arrives: one put, one event, one new view in every watcher, with the task in it.
    let before: Vec<_> = watchers.iter().map(|(_, c, _)| c.get()).collect();
    let (third, took, seen) =
        next_views_after("the arrival", &mut watchers, backends.register("api", 3, "10.0.0.4:50051")).await;
    let third = third.unwrap();
    for ((view, _), ((_, counters, _), before)) in seen.iter().zip(watchers.iter().zip(&before)) {
        assert_eq!(view.size, 4, "the size is the highest index plus one");
        assert_eq!(view.serving_task(3).map(String::as_str), Some("10.0.0.4:50051"));
        assert!(!view.tasks.contains_key(&2), "a hole is skipped");
        let now = counters.get();
        assert_eq!((now.events - before.events, now.views - before.views), (1, 1));
    }
    println!(
        "registration: register() (lease grant + put) took {took:?}; in all 3 watchers' views {:?} after the call began",
        slowest(&seen)
    );

    // Drains: the next view in every watcher shows it draining (not serving).
    let (drained, took, seen) = next_views_after("the drain", &mut watchers, third.drain()).await;
    drained.unwrap();
    assert_eq!(third.state(), TaskState::Draining);
    for (view, _) in &seen {
        assert_eq!(view.tasks[&3].state, TaskState::Draining);
        assert_eq!(view.serving_task(3), None, "a draining task gets no new requests");
        assert_eq!(view.serving_task(0).map(String::as_str), Some("10.0.0.1:50051"));
    }
    println!(
        "drain: drain() took {took:?}; in all 3 watchers' views {:?} after the call began",
        slowest(&seen)
    );

    // Its lease lapses: it disappears from every view, and the size shrinks back.
    let ((), _, seen) = next_views_after("the lapse", &mut watchers, async { third.crash() }).await;
    for (view, _) in &seen {
        assert_eq!((view.size, view.tasks.len()), (2, 2));
    }
    let lapsed = slowest(&seen);
    assert!(lapsed >= TTL / 2, "gone after {lapsed:?}, before the lease could lapse");
    println!("lapse: gone from all 3 watchers' views {lapsed:?} after renewals stopped (TTL {TTL:?})");

    // Released: gone at once.
    let (released, took, seen) = next_views_after("the release", &mut watchers, second.release()).await;
    released.unwrap();
    assert!(seen.iter().all(|(v, _)| v.size == 1 && v.serving_task(0).is_some()));
    println!(
        "release: release() took {took:?}; gone from all 3 watchers' views {:?} after the call began",
        slowest(&seen)
    );

    // Another task at an explicit index takes over its key; the old holder's drain then
    // fails instead of touching it, and dropping the old holder leaves the key alone.
    let replacement = backends.register("api", 0, "10.0.0.9:50051").await.unwrap();
    assert_eq!(first.drain().await, Err(RegistryError::Lost));
    let old_lease = first.lease_id();
    drop(first); // Revokes its lease (in the background), which no longer carries the key.
    lease_gone(&etcd, old_lease).await;
    for (discovery, _, views) in &mut watchers {
        let view = view_where("the replacement", views, |v| {
            v.serving_task(0).is_some_and(|a| a.ends_with(".9:50051"))
        })
        .await;
        assert_eq!(view.size, 1);
        assert_eq!(discovery.current().tasks.len(), 1);
    }
    assert!(replacement.is_held());
}

/// A plain etcd client, to write around the registry as another program could.
async fn raw_client(etcd: &Etcd) -> etcd_client::Client {
    within(WAIT, "connecting", etcd_client::Client::connect([etcd.endpoint()], None)).await.unwrap()
}

/// Waits (bounded) until etcd knows `lease` no more (revoked or expired).
async fn lease_gone(etcd: &Etcd, lease: i64) {
    let mut raw = raw_client(etcd).await;
    let gone = async {
        // etcd answers TTL -1 for a lease it does not know.
        while raw.lease_time_to_live(lease, None).await.is_ok_and(|r| r.ttl() != -1) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    within(WAIT, "the lease to go", gone).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_written_around_the_registry_are_read_and_bad_ones_are_counted_and_skipped() {
    let Some(etcd) = Etcd::start() else { return };
    let registry = connect(&etcd, TTL).await;
    let mut raw = raw_client(&etcd).await;
    let prefix = registry.tasks_prefix("api");
    assert_eq!(prefix, "/steady/jobs/api/tasks/", "the key layout is a contract");
    raw.put(format!("{prefix}0"), "serving 10.0.0.1:80", None).await.unwrap();
    raw.put(format!("{prefix}1"), "draining 10.0.0.2:80", None).await.unwrap();
    raw.put(format!("{prefix}2"), "up 10.0.0.3:80", None).await.unwrap();
    raw.put(format!("{prefix}03"), "serving 10.0.0.4:80", None).await.unwrap();
    raw.put(format!("{prefix}{MAX_TASKS}"), "serving 10.0.0.5:80", None).await.unwrap();
    raw.put("/steady/jobs/api2/tasks/0", "serving 10.9.9.9:80", None).await.unwrap();
    let (discovery, counters) =
        within(WAIT, "watching", registry::watch_job_counted(&registry, "api")).await.unwrap();
    let view = discovery.current();
    assert_eq!(view.size, 2);
    assert_eq!(view.serving_task(0).map(String::as_str), Some("10.0.0.1:80"));
    assert_eq!(view.tasks[&1].state, TaskState::Draining);
    assert_eq!(counters.get().rejected, 3, "an unknown state, a non-canonical index, an index too large");

    // A good value turning bad removes the task (counted); it comes back when fixed.
    let mut views = discovery.views();
    raw.put(format!("{prefix}0"), vec![0xff, 0xfe], None).await.unwrap();
    let view = next_view("the bad value", &mut views).await;
    assert_eq!((view.size, view.tasks.contains_key(&0)), (2, false));
    raw.put(format!("{prefix}0"), "serving 10.0.0.1:81", None).await.unwrap();
    let view = next_view("the fixed value", &mut views).await;
    assert_eq!(view.serving_task(0).map(String::as_str), Some("10.0.0.1:81"));
    assert_eq!(counters.get().rejected, 4);
    // Claims count what is held, whatever its value: index 2 is held by a bad value.
    assert_eq!(registry.claim("api", "x:1").await.unwrap().index(), 3);
    // Arguments out of range are refused before anything is written.
    let refused =
        |r: Result<Registration, RegistryError>| matches!(r, Err(RegistryError::InvalidArgument { .. }));
    assert!(refused(registry.register("api", MAX_TASKS, "a:1").await));
    assert!(refused(registry.register("api", 5, "a b").await));
    assert!(refused(registry.register("a/b", 5, "a:1").await));
    assert!(refused(registry.claim("api", "").await));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_survives_an_etcd_restart_and_converges_whether_or_not_a_compaction_overtook_it() {
    let Some(mut etcd) = Etcd::start() else { return };
    // Leases that outlive the outage: the keepers keep renewing after it.
    let ttl = Duration::from_secs(10);
    let registry = connect(&etcd, ttl).await;
    let staying = registry.register("api", 0, "10.0.0.1:80").await.unwrap();
    let leaving = registry.register("api", 1, "10.0.0.2:80").await.unwrap();
    let (discovery, counters) =
        within(WAIT, "watching", registry::watch_job_counted(&registry, "api")).await.unwrap();
    let mut views = discovery.views();
    assert_eq!(views.borrow_and_update().tasks.len(), 2);

    etcd.kill();
    // The outage lasts 3 s, and at least until the watch has noticed it.
    let down = Instant::now();
    let noticed = async {
        while counters.get().errors == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    within(WAIT, "the watch to notice the outage", noticed).await;
    tokio::time::sleep(Duration::from_secs(3).saturating_sub(down.elapsed())).await;
    etcd.restart();
    // Changes right after the restart, then a compaction past them: the watch either
    // sees the events or (resuming from a compacted revision) reads the prefix again.
    let mut raw = raw_client(&etcd).await;
    within(WAIT, "revoking", leaving.release()).await.unwrap();
    raw.put(registry.task_key("api", 2), "serving 10.0.0.3:80", None).await.unwrap();
    let revision = raw.get("x", None).await.unwrap().header().unwrap().revision();
    raw.compact(revision, None).await.unwrap();

    let view = view_where("convergence after the restart", &mut views, |v| {
        v.size == 3 && !v.tasks.contains_key(&1) && v.serving_task(2).is_some()
    })
    .await;
    assert_eq!(view.serving_task(0).map(String::as_str), Some("10.0.0.1:80"));
    let counts = counters.get();
    assert!(counts.errors >= 1, "the outage went unnoticed: {counts:?}");
    println!("after an etcd restart and a compaction: {counts:?}");
    assert!(staying.is_held(), "the lease was kept through a 3 s outage with a 10 s TTL");
}

/// The tasks of `job` whose records say draining, read from etcd now.
async fn draining_now(client: &mut etcd_client::Client, registry: &Registry, job: &str) -> usize {
    let prefix = registry.tasks_prefix(job);
    let got = client.get(prefix.as_str(), Some(etcd_client::GetOptions::new().with_prefix())).await.unwrap();
    got.kvs().iter().filter(|kv| kv.value().starts_with(b"draining ")).count()
}

/// A maintenance storm: six tasks of a job ask to drain at once with a budget of two.
/// Sampled from etcd every few milliseconds, never more than two are draining; every task
/// gets its turn (drains, is restarted: leaves and registers again, serving) within the
/// bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_maintenance_storm_drains_at_most_the_budget_at_once_and_every_drain_completes() {
    let Some(etcd) = Etcd::start() else { return };
    let registry = connect(&etcd, TTL).await;
    let mut tasks = Vec::new();
    for i in 0..6 {
        tasks.push(registry.register("storm", i, &format!("10.0.0.{i}:50051")).await.unwrap());
    }
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let monitor = {
        let (registry, done) = (registry.clone(), done.clone());
        let mut client = etcd_client::Client::connect([etcd.endpoint()], None).await.unwrap();
        tokio::spawn(async move {
            let mut most = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                most = most.max(draining_now(&mut client, &registry, "storm").await);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            most
        })
    };
    let restarts: Vec<_> = tasks
        .into_iter()
        .map(|task| {
            let registry = registry.clone();
            tokio::spawn(async move {
                task.drain_within_budget(2, Duration::from_secs(30)).await.unwrap();
                assert_eq!(task.state(), TaskState::Draining);
                // Requests in flight finish; then the process restarts.
                tokio::time::sleep(Duration::from_millis(300)).await;
                let index = task.index();
                task.release().await.unwrap();
                registry.register("storm", index, &format!("10.0.0.{index}:50051")).await.unwrap()
            })
        })
        .collect();
    let mut back = Vec::new();
    for r in restarts {
        back.push(within(WAIT, "a restart", r).await.unwrap());
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let most = monitor.await.unwrap();
    assert!((1..=2).contains(&most), "{most} tasks were draining at once (budget 2)");
    assert!(back.iter().all(|t| t.state() == TaskState::Serving));
    assert_eq!(within(WAIT, "size", registry.job_size("storm")).await.unwrap(), 6);
}

/// A drain that does not get its turn in time is refused with the reason, and the task
/// stays serving; once the draining task has left, the same drain goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_past_the_budget_is_refused_by_name_and_goes_through_once_there_is_room() {
    let Some(etcd) = Etcd::start() else { return };
    let registry = connect(&etcd, TTL).await;
    let first = registry.register("upkeep", 0, "10.0.0.1:50051").await.unwrap();
    let second = registry.register("upkeep", 1, "10.0.0.2:50051").await.unwrap();
    first.drain_within_budget(1, Duration::from_secs(5)).await.unwrap();
    match second.drain_within_budget(1, Duration::from_millis(300)).await {
        Err(RegistryError::DrainRefused { job, scope, draining, max }) => {
            assert_eq!((job.as_str(), scope, draining, max), ("upkeep", DrainScope::Job, vec![0], 1));
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(second.state(), TaskState::Serving);
    let mut client = etcd_client::Client::connect([etcd.endpoint()], None).await.unwrap();
    assert_eq!(draining_now(&mut client, &registry, "upkeep").await, 1, "the refused task still serves");
    assert!(matches!(
        second.drain_within_budget(0, Duration::ZERO).await,
        Err(RegistryError::InvalidArgument { what: "max_draining", .. })
    ));
    // Draining twice is harmless; the first task leaves and the second gets its turn.
    first.drain_within_budget(1, Duration::ZERO).await.unwrap();
    first.release().await.unwrap();
    second.drain_within_budget(1, Duration::from_secs(10)).await.unwrap();
    assert_eq!(draining_now(&mut client, &registry, "upkeep").await, 1);
}
