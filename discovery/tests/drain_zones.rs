//! Drain budgets per zone, on a real etcd on 127.0.0.1 started per test by
//! `steady_testing::Etcd` (skipped when etcd is missing, unless STEADY_REQUIRE_ETCD is
//! set): with a job budget of 2 and a zone budget of 1, a second drain in a zone is
//! refused naming the zone's budget while a drain in another zone goes through; the
//! waiting drain is admitted only once the zone's draining task undrains or leaves
//! (checked against etcd's history, not a clock); tasks in no zone count toward the
//! job's budget only; many tasks draining together never exceed either budget (every
//! revision of the records replayed from a watch); budgets of 0 are typed errors. Every
//! wait is bounded.

#![cfg(feature = "etcd")]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{EventType, GetOptions, WatchOptions};
use steady_discovery::registry::{
    DrainBudget, DrainScope, Registration, Registry, RegistryConfig, RegistryError, TaskRecord,
};
use steady_discovery::{Locality, TaskState, Zone};
use steady_testing::wait::holds_within;
use steady_testing::{within, Etcd};
use tokio::task::JoinHandle;

/// The most any single step may take.
const WAIT: Duration = Duration::from_secs(15);
/// How long a drain that must be refused (or must keep waiting) is watched.
const SHORT: Duration = Duration::from_millis(300);
/// The lease of these tests: etcd's minimum with its default settings.
const TTL: Duration = Duration::from_secs(2);

async fn connect(etcd: &Etcd) -> Registry {
    let config =
        RegistryConfig::new([etcd.endpoint()]).lease_ttl(TTL).request_timeout(Duration::from_secs(3));
    within(WAIT, "connecting", Registry::connect(config)).await.unwrap()
}

async fn raw_client(etcd: &Etcd) -> etcd_client::Client {
    within(WAIT, "connecting", etcd_client::Client::connect([etcd.endpoint()], None)).await.unwrap()
}

fn zone(label: &str) -> Zone {
    Zone::new(label).unwrap()
}

/// Task `index` of `job` at zone index `zone_index` of `zone` (or in no zone).
async fn task(registry: &Registry, job: &str, index: usize, at: Option<(&Zone, usize)>) -> Registration {
    let address = format!("10.0.0.{index}:50051");
    let registering = async {
        match at {
            Some((zone, zone_index)) => {
                registry.register_in_zone(job, index, Locality::new(zone.clone(), zone_index), &address).await
            }
            None => registry.register(job, index, &address).await,
        }
    };
    within(WAIT, "a registration", registering).await.unwrap()
}

/// The prefix of all of `job`'s keys, `P J /` (its tasks, zones and maintenance key).
fn job_prefix(registry: &Registry, job: &str) -> String {
    registry.tasks_prefix(job).strip_suffix("tasks/").expect("P J /tasks/").to_owned()
}

/// The refusal's budget, tasks and limit, or a panic naming what came instead.
fn refusal(result: Result<(), RegistryError>) -> (DrainScope, Vec<usize>, usize) {
    match result {
        Err(RegistryError::DrainRefused { scope, draining, max, .. }) => (scope, draining, max),
        other => panic!("expected a refused drain, got {other:?}"),
    }
}

/// The value of `key` and the revision it was last written at, if it is there now.
async fn record_at(raw: &mut etcd_client::Client, key: &str) -> Option<(String, i64)> {
    let got = within(WAIT, "a read", raw.get(key, None)).await.unwrap();
    got.kvs().first().map(|kv| (String::from_utf8(kv.value().to_vec()).unwrap(), kv.mod_revision()))
}

/// The value `key` had at `revision` (etcd's history: these tests never compact).
async fn value_at_revision(raw: &mut etcd_client::Client, key: &str, revision: i64) -> Option<String> {
    let options = GetOptions::new().with_revision(revision);
    let got = within(WAIT, "a read of the history", raw.get(key, Some(options))).await.unwrap();
    got.kvs().first().map(|kv| String::from_utf8(kv.value().to_vec()).unwrap())
}

/// The job indices of `job`'s tasks whose records say draining, now.
async fn draining_now(raw: &mut etcd_client::Client, registry: &Registry, job: &str) -> Vec<usize> {
    let prefix = registry.tasks_prefix(job);
    let got = within(WAIT, "a read", raw.get(prefix.as_str(), Some(GetOptions::new().with_prefix())))
        .await
        .unwrap();
    let mut draining: Vec<usize> = got
        .kvs()
        .iter()
        .filter(|kv| kv.value().starts_with(b"draining "))
        .map(|kv| std::str::from_utf8(&kv.key()[prefix.len()..]).unwrap().parse().unwrap())
        .collect();
    draining.sort_unstable();
    draining
}

/// `registration`'s drain within `budget`, running on its own while the test goes on.
fn drain_in_background(
    registration: Arc<Registration>,
    budget: DrainBudget,
) -> JoinHandle<Result<(), RegistryError>> {
    tokio::spawn(async move { registration.drain_within(budget, WAIT).await })
}

/// Asserts that the drain `waiting` is still waiting after [`SHORT`] (it must not be
/// admitted while its budget has no room).
async fn still_waiting(waiting: &JoinHandle<Result<(), RegistryError>>, what: &str) {
    assert!(!holds_within(SHORT, || waiting.is_finished()).await, "{what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_drain_in_a_zone_waits_for_the_zone_budget_while_other_zones_drain() {
    let Some(etcd) = Etcd::start() else { return };
    let registry = connect(&etcd).await;
    let mut raw = raw_client(&etcd).await;
    let (a, b, c) = (zone("zone-a"), zone("zone-b"), zone("zone-c"));
    let a0 = task(&registry, "api", 0, Some((&a, 0))).await;
    let a1 = Arc::new(task(&registry, "api", 1, Some((&a, 1))).await);
    let a2 = Arc::new(task(&registry, "api", 2, Some((&a, 2))).await);
    let b0 = task(&registry, "api", 3, Some((&b, 0))).await;
    let c0 = task(&registry, "api", 4, Some((&c, 0))).await;
    let budget = DrainBudget::job(2).per_zone(1);

    // One drain in zone a: admitted. A second in zone a: refused by zone a's budget,
    // naming the zone and the task draining there; it still serves.
    within(WAIT, "a0's drain", a0.drain_within(budget, WAIT)).await.unwrap();
    let refused = within(WAIT, "a1's drain", a1.drain_within(budget, SHORT)).await;
    let message = refused.as_ref().unwrap_err().to_string();
    assert_eq!(refusal(refused), (DrainScope::Zone(a.clone()), vec![0], 1));
    assert!(message.contains("zone zone-a"), "{message}");
    assert_eq!(a1.state(), TaskState::Serving);
    assert_eq!(record_at(&mut raw, a1.key()).await.unwrap().0, "serving 10.0.0.1:50051 zone=zone-a/1");

    // A drain in zone b at the same time: admitted (zone a's drain does not count in b).
    within(WAIT, "b0's drain", b0.drain_within(budget, WAIT)).await.unwrap();
    assert_eq!(draining_now(&mut raw, &registry, "api").await, [0, 3]);

    // Now the job's budget is spent: zone c (nothing draining there) is refused by the
    // job's, and so is zone a (both spent: the job's is named).
    let (scope, draining, max) = refusal(within(WAIT, "c0's drain", c0.drain_within(budget, SHORT)).await);
    assert_eq!((scope, draining, max), (DrainScope::Job, vec![0, 3], 2));
    assert_eq!(refusal(within(WAIT, "a1's drain", a1.drain_within(budget, SHORT)).await).0, DrainScope::Job);

    // b0's maintenance is over: it serves again, and the job has room. a1 waits for
    // zone a's slot, and gets it only once a0 undrains.
    within(WAIT, "b0's undrain", b0.undrain()).await.unwrap();
    assert_eq!(b0.state(), TaskState::Serving);
    assert_eq!(draining_now(&mut raw, &registry, "api").await, [0]);
    let waiting = drain_in_background(a1.clone(), budget);
    still_waiting(&waiting, "a1 was admitted while a0 drained in its zone").await;
    within(WAIT, "a0's undrain", a0.undrain()).await.unwrap();
    within(WAIT, "a1's waiting drain", waiting).await.unwrap().unwrap();
    assert_eq!(a1.state(), TaskState::Draining);
    let (value, admitted_at) = record_at(&mut raw, a1.key()).await.unwrap();
    assert_eq!(value, "draining 10.0.0.1:50051 zone=zone-a/1");
    assert_eq!(
        value_at_revision(&mut raw, a0.key(), admitted_at - 1).await.as_deref(),
        Some("serving 10.0.0.0:50051 zone=zone-a/0"),
        "a1 was admitted only after a0 had undrained"
    );

    // a2 waits for zone a's slot in turn, and gets it once a1 leaves (released).
    let waiting = drain_in_background(a2.clone(), budget);
    still_waiting(&waiting, "a2 was admitted while a1 drained in its zone").await;
    let a1 = Arc::into_inner(a1).expect("the background drain is done");
    let a1_key = a1.key().to_owned();
    within(WAIT, "a1's release", a1.release()).await.unwrap();
    within(WAIT, "a2's waiting drain", waiting).await.unwrap().unwrap();
    let (_, admitted_at) = record_at(&mut raw, a2.key()).await.unwrap();
    assert_eq!(
        value_at_revision(&mut raw, &a1_key, admitted_at - 1).await,
        None,
        "a2 was admitted after a1 left"
    );
    assert_eq!(draining_now(&mut raw, &registry, "api").await, [2]);
    // One per zone, two in the job: c0 fits beside a2.
    within(WAIT, "c0's drain", c0.drain_within(budget, WAIT)).await.unwrap();
    assert_eq!(draining_now(&mut raw, &registry, "api").await, [2, 4]);
    drop((a0, a2, b0, c0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_in_no_zone_count_toward_the_job_budget_only() {
    let Some(etcd) = Etcd::start() else { return };
    let registry = connect(&etcd).await;
    let mut raw = raw_client(&etcd).await;
    let a = zone("zone-a");
    let n0 = task(&registry, "mixed", 0, None).await;
    let n1 = task(&registry, "mixed", 1, None).await;
    let a0 = task(&registry, "mixed", 2, Some((&a, 0))).await;
    let a1 = task(&registry, "mixed", 3, Some((&a, 1))).await;
    let budget = DrainBudget::job(2).per_zone(1);

    // A task in no zone: the zone budget does not apply to it. It does not count in
    // zone a either, so a0 is admitted beside it.
    within(WAIT, "n0's drain", n0.drain_within(budget, WAIT)).await.unwrap();
    within(WAIT, "a0's drain", a0.drain_within(budget, WAIT)).await.unwrap();
    // It counts toward the job's budget, though.
    let (scope, draining, max) = refusal(within(WAIT, "n1's drain", n1.drain_within(budget, SHORT)).await);
    assert_eq!((scope, draining, max), (DrainScope::Job, vec![0, 2], 2));
    // Two in no zone drain side by side: no zone budget holds them to one.
    within(WAIT, "a0's undrain", a0.undrain()).await.unwrap();
    within(WAIT, "n1's drain", n1.drain_within(budget, WAIT)).await.unwrap();
    assert_eq!(draining_now(&mut raw, &registry, "mixed").await, [0, 1]);
    let (scope, draining, _) = refusal(within(WAIT, "a1's drain", a1.drain_within(budget, SHORT)).await);
    assert_eq!((scope, draining), (DrainScope::Job, vec![0, 1]));
    drop((n0, n1, a0, a1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budgets_of_zero_are_invalid_arguments_and_nothing_is_written() {
    let Some(etcd) = Etcd::start() else { return };
    let registry = connect(&etcd).await;
    let mut raw = raw_client(&etcd).await;
    let a0 = task(&registry, "api", 0, Some((&zone("zone-a"), 0))).await;
    let what = |result: Result<(), RegistryError>| match result {
        Err(RegistryError::InvalidArgument { what, .. }) => what,
        other => panic!("expected an invalid argument, got {other:?}"),
    };
    assert_eq!(what(a0.drain_within(DrainBudget::job(0), WAIT).await), "max_draining");
    assert_eq!(what(a0.drain_within(DrainBudget::job(0).per_zone(1), WAIT).await), "max_draining");
    assert_eq!(what(a0.drain_within(DrainBudget::job(2).per_zone(0), WAIT).await), "max_draining_per_zone");
    assert_eq!(what(a0.drain_within_budget(0, WAIT).await), "max_draining");
    assert_eq!(a0.state(), TaskState::Serving);
    assert_eq!(record_at(&mut raw, a0.key()).await.unwrap().0, "serving 10.0.0.0:50051 zone=zone-a/0");
    assert_eq!(record_at(&mut raw, &registry.maintenance_key("api")).await, None, "no admission was written");
    // A zone budget above the job's is valid (and never binds).
    within(WAIT, "a drain", a0.drain_within(DrainBudget::job(1).per_zone(5), WAIT)).await.unwrap();
    assert_eq!(a0.state(), TaskState::Draining);
}

/// What a replay of every revision of a job's records saw: the most tasks draining at
/// once in each zone and in the whole job, and how many drains were admitted.
#[derive(Debug, Default)]
struct Peaks {
    per_zone: BTreeMap<Zone, usize>,
    job: usize,
    admitted: usize,
}

/// Follows `/steady/jobs/<job>/` from `revision` on, replaying each change of a task's
/// record, until the key `<prefix>done` is written; what it saw. Every admission and
/// every leave is one transaction that touches one task key, so counting after each
/// event sees every state the records went through.
async fn replay(mut raw: etcd_client::Client, registry: Registry, job: &'static str, revision: i64) -> Peaks {
    let tasks = registry.tasks_prefix(job);
    let done = format!("{}done", job_prefix(&registry, job));
    let options = WatchOptions::new().with_prefix().with_start_revision(revision);
    let mut stream = raw.watch(job_prefix(&registry, job), Some(options)).await.unwrap();
    let mut records: BTreeMap<Vec<u8>, TaskRecord> = BTreeMap::new();
    let mut peaks = Peaks::default();
    loop {
        let response = stream.message().await.unwrap().expect("the watch stays open");
        for event in response.events() {
            let kv = event.kv().expect("an event has its key");
            if kv.key() == done.as_bytes() {
                return peaks;
            }
            if !kv.key().starts_with(tasks.as_bytes()) {
                continue; // the maintenance key, zone keys
            }
            match event.event_type() {
                EventType::Delete => {
                    records.remove(kv.key());
                }
                EventType::Put => {
                    let record = TaskRecord::decode(kv.value()).expect("the registry writes records");
                    let was_draining = records.get(kv.key()).is_some_and(|r| r.state == TaskState::Draining);
                    if record.state == TaskState::Draining && !was_draining {
                        peaks.admitted += 1;
                    }
                    records.insert(kv.key().to_vec(), record);
                }
            }
            let draining: Vec<&TaskRecord> =
                records.values().filter(|r| r.state == TaskState::Draining).collect();
            peaks.job = peaks.job.max(draining.len());
            let mut per_zone: BTreeMap<Zone, usize> = BTreeMap::new();
            for record in draining {
                let zone =
                    record.locality.as_ref().expect("every task of this test is in a zone").zone.clone();
                *per_zone.entry(zone).or_default() += 1;
            }
            for (zone, count) in per_zone {
                let peak = peaks.per_zone.entry(zone).or_default();
                *peak = (*peak).max(count);
            }
        }
    }
}

/// A maintenance storm over three zones: nine tasks (three per zone, each on its own
/// connection) ask to drain at once with a job budget of 2 and a zone budget of 1; each
/// drains, holds a while, and leaves. Replayed from etcd's history, no zone ever had two
/// tasks draining and the job never three, two zones drained side by side, and all
/// nine drains went through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_drains_in_a_zone_never_exceed_the_zone_budget() {
    let Some(etcd) = Etcd::start() else { return };
    let registry = connect(&etcd).await;
    let mut raw = raw_client(&etcd).await;
    let zones = [zone("zone-a"), zone("zone-b"), zone("zone-c")];
    let mut tasks = Vec::new();
    for index in 0..9 {
        let own = connect(&etcd).await; // its own connection, as separate processes have
        tasks.push(task(&own, "storm", index, Some((&zones[index % 3], index / 3))).await);
    }
    let now = within(WAIT, "a read", raw.get("/", None)).await.unwrap();
    let from = now.header().expect("etcd answers with a header").revision() + 1;
    let replaying = tokio::spawn(replay(raw_client(&etcd).await, registry.clone(), "storm", from));

    let budget = DrainBudget::job(2).per_zone(1);
    let storm: Vec<_> = tasks
        .into_iter()
        .map(|task| {
            tokio::spawn(async move {
                task.drain_within(budget, WAIT).await.unwrap();
                // Requests in flight finish; then the task leaves.
                tokio::time::sleep(Duration::from_millis(150)).await;
                task.release().await.unwrap();
            })
        })
        .collect();
    for task in storm {
        within(WAIT * 2, "a drain of the storm", task).await.unwrap();
    }
    raw.put(format!("{}done", job_prefix(&registry, "storm")), "", None).await.unwrap();
    let peaks = within(WAIT, "the replay", replaying).await.unwrap();
    println!("storm over three zones, job budget 2, zone budget 1: {peaks:?}");
    assert_eq!(peaks.admitted, 9, "every drain went through");
    let expected: BTreeMap<Zone, usize> = zones.iter().map(|z| (z.clone(), 1)).collect();
    assert_eq!(peaks.per_zone, expected, "at most one draining per zone, and every zone drained");
    assert_eq!(peaks.job, 2, "two zones drained side by side, never three");
}
