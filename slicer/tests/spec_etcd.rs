//! `EtcdSpecs` on a real etcd on 127.0.0.1 (started per test by `steady_testing::Etcd`;
//! skipped with a message when `etcd` is missing, unless `STEADY_REQUIRE_ETCD` is set):
//! put, get, list and delete under `<prefix>.specs/`; a bad spec refused and the stored
//! one kept; the watch's current set and changes; values written around the store (a
//! corrupt one, one naming another job) skipped with the last good spec kept; a watch
//! that outlives an etcd restart; the job bound over paged listings; a user confined to
//! the store's prefix.

use std::time::Duration;

use etcd_client::{Client, GetOptions, Txn, TxnOp};
use futures_util::StreamExt;
use steady_slicer::specs::{
    EtcdSpecs, JobConfig, SpecChange, SpecStore, SpecStoreError, SpecWatch, TaskSource, MAX_JOBS,
};
use steady_slicer::store::{EtcdAccess, EtcdConfig, EtcdStore, DEFAULT_KEY_PREFIX};
use steady_testing::{within, Etcd, EtcdOptions};

/// The most any single step may take.
const WAIT: Duration = Duration::from_secs(15);

fn config(etcd: &Etcd) -> EtcdConfig {
    EtcdConfig::new([etcd.endpoint()]).request_timeout(Duration::from_secs(3))
}

async fn specs(etcd: &Etcd) -> SpecStore {
    let store = within(WAIT, "connecting", EtcdStore::connect(config(etcd))).await.unwrap();
    SpecStore::Etcd(EtcdSpecs::of(&store))
}

/// A plain etcd client, to write around the store.
async fn raw(etcd: &Etcd) -> Client {
    within(WAIT, "connecting", Client::connect([etcd.endpoint()], None)).await.unwrap()
}

fn key(job: &str) -> String {
    format!("{DEFAULT_KEY_PREFIX}.specs/{job}")
}

fn job(name: &str, tasks: u32) -> JobConfig {
    JobConfig::new(name, TaskSource::Count(tasks))
}

async fn next(watch: &mut SpecWatch) -> Result<SpecChange, SpecStoreError> {
    within(WAIT, "the next spec change", watch.next()).await.expect("a watch never ends")
}

async fn next_change(watch: &mut SpecWatch) -> SpecChange {
    next(watch).await.expect("a change")
}

/// The job a refusal item names, and the field.
async fn next_refusal(watch: &mut SpecWatch) -> (String, String) {
    match next(watch).await {
        Err(SpecStoreError::Rejected(rejected)) => (rejected.job, rejected.error.field().to_owned()),
        other => panic!("a refusal, not {other:?}"),
    }
}

#[tokio::test]
async fn put_get_list_and_delete_under_the_specs_prefix() {
    let Some(etcd) = Etcd::start() else { return };
    let store = specs(&etcd).await;
    let mut raw = raw(&etcd).await;
    assert_eq!(store.get("users").await.unwrap(), None);
    let users = job("users", 8);
    store.put(&users).await.unwrap();
    // The key and value are the contract: the document at `<prefix>.specs/<job>`.
    let stored = raw.get(key("users"), None).await.unwrap();
    assert_eq!(stored.kvs()[0].value_str().unwrap(), users.to_json());
    assert_eq!(store.get("users").await.unwrap(), Some(users.clone()));
    // A job's own keys beside the specs (its assignment, its registry) are not specs.
    raw.put(format!("{DEFAULT_KEY_PREFIX}users/assignment"), "STAS...", None).await.unwrap();
    raw.put(format!("{DEFAULT_KEY_PREFIX}users/tasks/0"), "{}", None).await.unwrap();
    let mut orders = job("orders", 4);
    orders.cadence = Duration::from_secs(2);
    store.put(&orders).await.unwrap();
    let listing = store.list().await.unwrap();
    assert_eq!(listing.specs, [orders.clone(), users.clone()]);
    assert!(listing.rejected.is_empty());
    assert!(store.delete("users").await.unwrap());
    assert!(!store.delete("users").await.unwrap());
    assert_eq!(store.get("users").await.unwrap(), None);
    assert_eq!(store.list().await.unwrap().specs, [orders]);
}

#[tokio::test]
async fn a_bad_spec_is_refused_by_job_and_field_and_the_stored_one_stays() {
    let Some(etcd) = Etcd::start() else { return };
    let store = specs(&etcd).await;
    let users = job("users", 8);
    store.put(&users).await.unwrap();
    let mut exclusive = users.clone();
    exclusive.consistency = steady_slice::guard::Consistency::Exclusive;
    exclusive.spec.replicas = steady_assigner::ReplicaLimits::new(1, 2).unwrap();
    match store.put(&exclusive).await {
        Err(SpecStoreError::Invalid { job, error }) => {
            assert_eq!((job.as_str(), error.field.as_str()), ("users", "spec.replicas"));
        }
        other => panic!("{other:?}"),
    }
    match store.put(&job("users", 1024)).await {
        Err(SpecStoreError::Invalid { error, .. }) => assert_eq!(error.field, "tasks.count"),
        other => panic!("{other:?}"),
    }
    assert_eq!(store.get("users").await.unwrap(), Some(users));
    // A name whose keys would be the specs' own.
    assert!(matches!(store.put(&job(".specs/users", 2)).await, Err(SpecStoreError::Invalid { .. })));
    assert!(matches!(store.get(".specs").await, Err(SpecStoreError::Invalid { .. })));
}

#[tokio::test]
async fn values_written_around_the_store_are_refused_by_job_and_the_last_good_spec_stays() {
    let Some(etcd) = Etcd::start() else { return };
    let store = specs(&etcd).await;
    let mut raw = raw(&etcd).await;
    let users = job("users", 8);
    store.put(&users).await.unwrap();
    raw.put(key("broken"), "{\"version\": 1,", None).await.unwrap();
    // A key that names no job (not UTF-8).
    let mut not_utf8 = key("").into_bytes();
    not_utf8.push(0xff);
    raw.put(not_utf8, users.to_json(), None).await.unwrap();
    let mut watch = store.watch();
    // The current set first, the refusals after it.
    assert_eq!(next_change(&mut watch).await, SpecChange::Current(vec![users.clone()]));
    let mut refused = vec![next_refusal(&mut watch).await, next_refusal(&mut watch).await];
    refused.sort();
    assert_eq!(
        refused,
        [("broken".to_owned(), "document".to_owned()), ("\u{fffd}".to_owned(), "job".to_owned())]
    );
    assert!(matches!(store.get("broken").await, Err(SpecStoreError::Rejected(_))));
    let listing = store.list().await.unwrap();
    assert_eq!((listing.specs.len(), listing.rejected.len()), (1, 2));

    // Changes through the store.
    let orders = job("orders", 4);
    store.put(&orders).await.unwrap();
    assert_eq!(next_change(&mut watch).await, SpecChange::Put(orders.clone()));
    // A corrupt value and one naming another job: refused; users' spec stays in force.
    raw.put(key("users"), "{", None).await.unwrap();
    assert_eq!(next_refusal(&mut watch).await, ("users".to_owned(), "document".to_owned()));
    raw.put(key("users"), job("other", 8).to_json(), None).await.unwrap();
    assert_eq!(next_refusal(&mut watch).await, ("users".to_owned(), "job".to_owned()));
    raw.put(key("users"), users.to_json().replace("\"cadence_ms\": 10000", "\"cadence_ms\": 1"), None)
        .await
        .unwrap();
    assert_eq!(next_refusal(&mut watch).await, ("users".to_owned(), "cadence_ms".to_owned()));
    // The good spec written back is the one in force: no change, so the next item is the
    // change after it.
    raw.put(key("users"), users.to_json(), None).await.unwrap();
    let carts = job("carts", 2);
    store.put(&carts).await.unwrap();
    assert_eq!(next_change(&mut watch).await, SpecChange::Put(carts));
    // A changed spec, then removals (the bad value's changes nothing).
    let mut faster = users.clone();
    faster.cadence = Duration::from_secs(1);
    store.put(&faster).await.unwrap();
    assert_eq!(next_change(&mut watch).await, SpecChange::Put(faster));
    raw.delete(key("broken"), None).await.unwrap();
    assert!(store.delete("users").await.unwrap());
    assert_eq!(next_change(&mut watch).await, SpecChange::Removed("users".into()));
}

/// A watch that starts while a job's value is bad (an instance that joins a fleet then)
/// takes the last good spec from the key's history, as the watches that saw it have in
/// force: instances agree on the set of jobs. Without a good value in the history the
/// job is only refused.
#[tokio::test]
async fn a_watch_that_starts_behind_a_bad_value_takes_the_last_good_spec_from_history() {
    let Some(etcd) = Etcd::start() else { return };
    let store = specs(&etcd).await;
    let mut raw = raw(&etcd).await;
    let mut users = job("users", 8);
    users.cadence = Duration::from_secs(2);
    store.put(&users).await.unwrap();
    raw.put(key("users"), r#"{"version": 1, "job": "users", "tasks": {"count": 7}, "cadence_ms": 1}"#, None)
        .await
        .unwrap();
    raw.put(key("users"), "not json", None).await.unwrap();
    raw.put(key("never-good"), "not json either", None).await.unwrap();
    let mut watch = store.watch();
    // Two bad values back, the good one: in force from the first item.
    assert_eq!(next_change(&mut watch).await, SpecChange::Current(vec![users]));
    let mut refused = vec![next_refusal(&mut watch).await.0, next_refusal(&mut watch).await.0];
    refused.sort();
    assert_eq!(refused, ["never-good", "users"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_outlives_an_etcd_restart() {
    let Some(mut etcd) = Etcd::start() else { return };
    let store = specs(&etcd).await;
    store.put(&job("users", 8)).await.unwrap();
    let mut watch = store.watch();
    assert_eq!(next_change(&mut watch).await, SpecChange::Current(vec![job("users", 8)]));
    etcd.kill();
    etcd.restart();
    // The store's client reconnects; the watch lists again and follows on.
    let orders = job("orders", 4);
    within(WAIT, "a put once etcd is back", async {
        while store.put(&orders).await.is_err() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(store.delete("users").await.unwrap());
    let mut changes = vec![next_change(&mut watch).await, next_change(&mut watch).await];
    changes.sort_by_key(|c| format!("{c:?}"));
    assert_eq!(changes, [SpecChange::Put(orders), SpecChange::Removed("users".into())]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_more_than_max_jobs_are_stored_and_listings_are_paged() {
    let Some(etcd) = Etcd::start() else { return };
    let store = specs(&etcd).await;
    let mut raw = raw(&etcd).await;
    // MAX_JOBS specs written around the store, 100 to a transaction.
    for batch in 0..MAX_JOBS / 100 {
        let puts: Vec<TxnOp> = (batch * 100..(batch + 1) * 100)
            .map(|i| {
                let name = format!("j{i:05}");
                TxnOp::put(key(&name), job(&name, 1).to_json(), None)
            })
            .collect();
        raw.txn(Txn::new().and_then(puts)).await.unwrap();
    }
    match store.put(&job("past", 1)).await {
        Err(SpecStoreError::TooManyJobs { job, limit }) => {
            assert_eq!((job.as_str(), limit), ("past", MAX_JOBS))
        }
        other => panic!("{other:?}"),
    }
    // A stored job may change.
    store.put(&job("j00000", 2)).await.unwrap();
    let listing = store.list().await.unwrap();
    assert_eq!(listing.specs.len(), MAX_JOBS);
    assert_eq!(listing.specs[0], job("j00000", 2));
    assert_eq!(listing.specs[MAX_JOBS - 1].job, format!("j{:05}", MAX_JOBS - 1));
    let mut watch = store.watch();
    let SpecChange::Current(jobs) = next_change(&mut watch).await else { panic!("Current first") };
    assert_eq!(jobs.len(), MAX_JOBS);
    // One more, around the store: refused by the watch, and a listing of all refused.
    raw.put(key("past"), job("past", 1).to_json(), None).await.unwrap();
    assert!(matches!(next(&mut watch).await, Err(SpecStoreError::TooManyJobs { .. })));
    assert!(matches!(store.list().await, Err(SpecStoreError::TooManySpecs { .. })));
    let count = raw.get(key(""), Some(GetOptions::new().with_prefix().with_count_only())).await.unwrap();
    assert_eq!(count.count(), MAX_JOBS as i64 + 1);
}

#[tokio::test]
async fn a_user_confined_to_the_store_prefix_manages_specs() {
    let Some(etcd) = Etcd::start_with(EtcdOptions::new().auth("root-secret").user(
        "slicer",
        "slicer-secret",
        DEFAULT_KEY_PREFIX,
    )) else {
        return;
    };
    let config = config(&etcd).access(EtcdAccess::new().user("slicer", "slicer-secret"));
    let store = SpecStore::Etcd(within(WAIT, "connecting", EtcdSpecs::connect(config)).await.unwrap());
    let users = job("users", 3);
    store.put(&users).await.unwrap();
    let mut watch = store.watch();
    assert_eq!(next_change(&mut watch).await, SpecChange::Current(vec![users.clone()]));
    assert_eq!(store.list().await.unwrap().specs, [users]);
    assert!(store.delete("users").await.unwrap());
    assert_eq!(next_change(&mut watch).await, SpecChange::Removed("users".into()));
    // A wrong password fails at connect, typed.
    let wrong = self::config(&etcd).access(EtcdAccess::new().user("slicer", "wrong"));
    assert!(matches!(
        within(WAIT, "connecting", EtcdSpecs::connect(wrong)).await,
        Err(SpecStoreError::Store(_))
    ));
}
