//! Exclusive mode, the Assigner's side (`docs/exclusive.md`), on a real etcd started per
//! test: a generation is granted only once every Slicelet's hold allows it, a leader
//! deposed mid-recall leaves it to the next one's settle, a recall that cannot complete
//! blocks the next write, eventual writes cannot reach an exclusive job, and the Assigner
//! service publishes generation after generation with the guard granted after each.
//!
//! Slicelets are simulated with etcd-client directly (a lease of their own, a hold on it
//! under `hold_key`). The guard and the holds are read together, at one revision (they
//! share the prefix `P J /exclusive/`), so what a test asserts about them is what etcd
//! held at one instant. Every wait is bounded.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, EventType, GetOptions, PutOptions, Txn, TxnOp, WatchOptions};
use futures_util::StreamExt;
use steady_assigner::{by_name, Assignment, SliceKey, TaskState, Tasks};
use steady_slice::guard::{guard_key, hold_key, holds_prefix, Consistency, Guard, Hold};
use steady_slice::Slice;
use steady_slicer::assigner_service::{AssignerConfig, AssignerService};
use steady_slicer::load::LoadBook;
use steady_slicer::store::{
    AssignmentStore, EtcdConfig, EtcdStore, ExclusiveWrite, Leadership, MemoryStore, Recall, StoreError,
    DEFAULT_KEY_PREFIX,
};
use steady_slicer::Distributor;
use steady_testing::{eventually_within, within, Etcd};
use tokio::sync::watch;

const JOB: &str = "ledger";
/// The most any single step may take.
const WAIT: Duration = Duration::from_secs(20);
/// The lease of a leadership a test ends by letting it lapse: etcd's minimum with its
/// default settings.
const TTL: Duration = Duration::from_secs(2);
/// The lease of every other leadership: far longer than any test's steps, so that a
/// machine starved of CPU cannot let it lapse mid-test (a 2 s strict lease did so once in
/// CI: deposed mid-test, NotLeader).
const LONG_TTL: Duration = Duration::from_secs(30);

fn one(generation: u64, task: u32) -> Assignment {
    Assignment::single(generation, vec![task]).unwrap()
}

/// An assignment with one slice per owner, in order, each owned by one task.
fn owned_by(generation: u64, owners: &[u32]) -> Assignment {
    let step = u64::MAX / owners.len() as u64;
    let slices =
        owners.iter().enumerate().map(|(i, &t)| Slice::new(SliceKey(i as u64 * step), vec![t])).collect();
    Assignment::new(generation, slices).unwrap()
}

async fn store(etcd: &Etcd, recall: Duration) -> EtcdStore {
    store_with_ttl(etcd, recall, LONG_TTL).await
}

/// [`store`] with a leadership lease of `ttl`.
async fn store_with_ttl(etcd: &Etcd, recall: Duration, ttl: Duration) -> EtcdStore {
    let config = EtcdConfig::new([etcd.endpoint()])
        .lease_ttl(ttl)
        .request_timeout(Duration::from_secs(3))
        .recall_timeout(recall);
    within(WAIT, "connecting", EtcdStore::connect(config)).await.unwrap()
}

async fn raw(etcd: &Etcd) -> Client {
    within(WAIT, "connecting", Client::connect([etcd.endpoint()], None)).await.unwrap()
}

/// The job's guard and holds as etcd held them at one revision (`at`, or the newest).
#[derive(Debug)]
struct State {
    guard: Option<Guard>,
    /// The guard key's `mod_revision` (0: absent).
    guard_revision: i64,
    /// Holds by task, as stored.
    holds: Vec<(u32, Hold)>,
}

async fn state(client: &Client, at: Option<i64>) -> State {
    let mut options = GetOptions::new().with_prefix();
    if let Some(revision) = at {
        options = options.with_revision(revision);
    }
    let prefix = format!("{DEFAULT_KEY_PREFIX}{JOB}/exclusive/");
    let response = within(WAIT, "reading the guard and holds", client.kv_client().get(prefix, Some(options)))
        .await
        .unwrap();
    let (guard_key, holds) = (guard_key(DEFAULT_KEY_PREFIX, JOB), holds_prefix(DEFAULT_KEY_PREFIX, JOB));
    let mut state = State { guard: None, guard_revision: 0, holds: Vec::new() };
    for kv in response.kvs() {
        let key = kv.key_str().unwrap();
        if key == guard_key {
            state.guard = Some(Guard::decode(kv.value()).unwrap());
            state.guard_revision = kv.mod_revision();
        } else {
            let task = key.strip_prefix(holds.as_str()).unwrap().split('/').next().unwrap().parse().unwrap();
            state.holds.push((task, Hold::decode(kv.value()).unwrap()));
        }
    }
    state
}

/// The stored assignment's generation and `mod_revision`.
async fn stored(client: &Client) -> (u64, i64) {
    let key = format!("{DEFAULT_KEY_PREFIX}{JOB}/assignment");
    let response = within(WAIT, "reading the assignment", client.kv_client().get(key, None)).await.unwrap();
    let kv = response.kvs().first().expect("an assignment");
    (Assignment::decode(kv.value()).unwrap().generation(), kv.mod_revision())
}

/// A simulated Slicelet: an etcd lease of its own, and its hold on it.
struct Holder {
    client: Client,
    lease: i64,
    key: String,
}

impl Holder {
    async fn new(client: &Client, task: u32, ttl_secs: i64) -> Self {
        let lease = client.lease_client().grant(ttl_secs, None).await.unwrap().id();
        Self { client: client.clone(), lease, key: hold_key(DEFAULT_KEY_PREFIX, JOB, task, lease) }
    }

    /// Puts `hold` (unconditioned: the tests drive each step); the revision it was put at.
    async fn hold(&self, hold: Hold) -> i64 {
        self.put(hold.encode()).await
    }

    async fn put(&self, value: impl Into<Vec<u8>>) -> i64 {
        let options = PutOptions::new().with_lease(self.lease);
        let response = self.client.kv_client().put(self.key.as_str(), value, Some(options)).await.unwrap();
        response.header().unwrap().revision()
    }

    /// Revokes the lease (its hold goes with it); the revision of the deletion.
    async fn revoke(&self) -> i64 {
        self.client.lease_client().revoke(self.lease).await.unwrap().header().unwrap().revision()
    }
}

/// Waits (bounded) until the guard is `guard`; the state then.
async fn until_guard(client: &Client, guard: Guard) -> State {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let now = state(client, None).await;
        if now.guard == Some(guard) {
            return now;
        }
        assert!(tokio::time::Instant::now() < deadline, "the guard is not {guard} after {WAIT:?}: {now:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Asserts that the guard was granted `to` after `after`, and that at the revision just
/// before the grant every hold already allowed the recall to end (`bridge from to`, or
/// none).
async fn assert_granted_after(client: &Client, from: u64, to: u64, after: i64) {
    let now = state(client, None).await;
    assert_eq!(now.guard, Some(Guard::Granted(to)), "{now:?}");
    assert!(now.guard_revision > after, "granted at {} before {after}: {now:?}", now.guard_revision);
    let before = state(client, Some(now.guard_revision - 1)).await;
    assert_eq!(before.guard, Some(Guard::Recalling { from, to }), "{before:?}");
    assert!(
        before.holds.iter().all(|&(_, h)| h == Hold::Bridge { from, to }),
        "granted while a hold blocked: {before:?}"
    );
}

async fn lead(store: &EtcdStore, candidate: &str) -> Leadership {
    within(WAIT, "campaign", store.campaign(JOB, candidate)).await.unwrap()
}

/// Writes generation 1 (task 0 owns everything) as the job's first exclusive assignment:
/// nobody holds anything yet, so it is granted at once.
async fn first_generation(store: &EtcdStore, leader: &Leadership) -> ExclusiveWrite {
    let empty = store.read(JOB).await.unwrap();
    let written =
        within(WAIT, "the first write", store.write_exclusive(leader, &empty, &one(1, 0))).await.unwrap();
    assert!(matches!(written.recall, Recall::Granted { from: 0, to: 1, .. }), "{written:?}");
    written
}

/// (a) The grant waits for every hold: a `full G1` that converts to `bridge G1 G2`, one
/// whose lease is revoked, one whose lease lapses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generation_is_granted_only_once_every_hold_allows_it() {
    let Some(etcd) = Etcd::start() else { return };
    let (store, client) = (store(&etcd, WAIT).await, raw(&etcd).await);
    let leader = lead(&store, "a").await;
    let first = first_generation(&store, &leader).await;
    assert_eq!(state(&client, None).await.guard, Some(Guard::Granted(1)));
    let (converts, revoked, lapses) = (
        Holder::new(&client, 0, 60).await,
        Holder::new(&client, 1, 60).await,
        Holder::new(&client, 2, 3).await,
    );
    for h in [&converts, &revoked, &lapses] {
        h.hold(Hold::Full(1)).await;
    }
    let (store2, leader) = (store.clone(), Arc::new(leader));
    let writer = leader.clone();
    let write = tokio::spawn(async move {
        let next = owned_by(2, &[0, 1, 2]);
        store2.write_exclusive(&writer, &first.snapshot, &next).await
    });
    // Published and recalling: the assignment is stored, the guard says so, and no hold moved.
    let recalling = until_guard(&client, Guard::Recalling { from: 1, to: 2 }).await;
    assert_eq!(recalling.holds.len(), 3, "{recalling:?}");
    assert_eq!(stored(&client).await.0, 2);
    let converted = converts.hold(Hold::Bridge { from: 1, to: 2 }).await;
    let gone = revoked.revoke().await;
    // The lapsing hold still blocks: the guard is still recalling, at one revision with it.
    let blocked = state(&client, None).await;
    assert_eq!(blocked.guard, Some(Guard::Recalling { from: 1, to: 2 }), "{blocked:?}");
    assert!(blocked.holds.contains(&(2, Hold::Full(1))), "the lapsing lease is gone already: {blocked:?}");
    assert!(!write.is_finished(), "the write returned while a hold blocked");
    let written = within(WAIT, "the recall", write).await.unwrap().unwrap();
    let Recall::Granted { from: 1, to: 2, at } = written.recall else { panic!("{written:?}") };
    assert!(at >= written.published_at);
    assert_eq!(written.snapshot.generation(), 2);
    assert_granted_after(&client, 1, 2, converted.max(gone)).await;
    let after = state(&client, None).await;
    assert_eq!(after.holds, [(0, Hold::Bridge { from: 1, to: 2 })], "the lapsed hold is gone: {after:?}");
}

/// (b) A leader deposed mid-recall changes nothing more; the next leader's settle
/// completes the recall once the hold allows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recall_left_by_a_deposed_leader_is_completed_by_the_next_one() {
    let Some(etcd) = Etcd::start() else { return };
    // The old leader's lease lapses when it stops renewing: the shortest there is.
    let (old_store, new_store, client) =
        (store_with_ttl(&etcd, WAIT, TTL).await, store(&etcd, WAIT).await, raw(&etcd).await);
    let old = Arc::new(lead(&old_store, "old").await);
    let first = first_generation(&old_store, &old).await;
    let holder = Holder::new(&client, 0, 60).await;
    holder.hold(Hold::Full(1)).await;
    let (writer, store2) = (old.clone(), old_store.clone());
    let write =
        tokio::spawn(async move { store2.write_exclusive(&writer, &first.snapshot, &one(2, 0)).await });
    until_guard(&client, Guard::Recalling { from: 1, to: 2 }).await;
    old.stop_renewing();
    let new = lead(&new_store, "new").await;
    // The old leader's write stored its generation and left the recall pending.
    let written = within(WAIT, "the deposed write", write).await.unwrap().unwrap();
    assert_eq!(written.recall, Recall::Pending { from: 1, to: 2 });
    assert!(!old.is_held());
    assert!(matches!(old_store.settle(&old).await, Err(StoreError::NotLeader)));
    let latest = new_store.read(JOB).await.unwrap();
    assert_eq!(latest.generation(), 2);
    assert!(matches!(old_store.write_exclusive(&old, &latest, &one(3, 0)).await, Err(StoreError::NotLeader)));
    // The new leader settles: it waits for the hold, then grants.
    let (settler, store3) = (Arc::new(new), new_store.clone());
    let leader = settler.clone();
    let settle = tokio::spawn(async move { store3.settle(&leader).await });
    assert_eq!(state(&client, None).await.guard, Some(Guard::Recalling { from: 1, to: 2 }));
    let converted = holder.hold(Hold::Bridge { from: 1, to: 2 }).await;
    let settled = within(WAIT, "the settle", settle).await.unwrap().unwrap();
    assert!(matches!(settled, Recall::Granted { from: 1, to: 2, .. }), "{settled:?}");
    assert_granted_after(&client, 1, 2, converted).await;
    assert_eq!(new_store.settle(&settler).await.unwrap(), Recall::Clear, "nothing left to settle");
    assert_eq!(stored(&client).await.0, 2);
}

/// (c) A recall that cannot complete in time: the write that began it returns (its
/// generation is stored), and the next write is refused until the hold goes. A hold that
/// does not decode blocks too; a guard that does not decode stops every write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_while_a_recall_is_pending_is_refused_and_writes_nothing() {
    let Some(etcd) = Etcd::start() else { return };
    let store = store(&etcd, Duration::from_millis(300)).await;
    let client = raw(&etcd).await;
    let leader = lead(&store, "a").await;
    let first = first_generation(&store, &leader).await;
    let stuck = Holder::new(&client, 0, 60).await;
    stuck.hold(Hold::Full(1)).await;
    let second =
        within(WAIT, "a write", store.write_exclusive(&leader, &first.snapshot, &one(2, 1))).await.unwrap();
    assert_eq!(second.recall, Recall::Pending { from: 1, to: 2 });
    let before = stored(&client).await;
    assert_eq!(before.0, 2, "the generation is stored");
    let refused = store.write_exclusive(&leader, &second.snapshot, &one(3, 0)).await;
    assert!(
        matches!(&refused, Err(StoreError::RecallPending { job, from: 1, to: 2 }) if job == JOB),
        "{refused:?}"
    );
    assert_eq!(stored(&client).await, before, "nothing written");
    assert_eq!(state(&client, None).await.guard, Some(Guard::Recalling { from: 1, to: 2 }));
    assert!(matches!(store.settle(&leader).await, Err(StoreError::RecallPending { from: 1, to: 2, .. })));
    // Gone: the next settle grants, and writes go on.
    let gone = stuck.revoke().await;
    assert!(matches!(store.settle(&leader).await.unwrap(), Recall::Granted { from: 1, to: 2, .. }));
    assert_granted_after(&client, 1, 2, gone).await;
    // A hold that does not decode blocks the recall, as one that blocks would.
    let unreadable = Holder::new(&client, 1, 60).await;
    unreadable.put("v9 whatever").await;
    let third = store.write_exclusive(&leader, &second.snapshot, &one(3, 0)).await.unwrap();
    assert_eq!(third.recall, Recall::Pending { from: 2, to: 3 });
    let gone = unreadable.revoke().await;
    assert!(matches!(store.settle(&leader).await.unwrap(), Recall::Granted { from: 2, to: 3, .. }));
    assert_granted_after(&client, 2, 3, gone).await;
    // A guard that does not decode: nothing is written until it is repaired.
    let key = guard_key(DEFAULT_KEY_PREFIX, JOB);
    client.kv_client().put(key.as_str(), "v1 granted banana", None).await.unwrap();
    let before = stored(&client).await;
    let refused = store.write_exclusive(&leader, &third.snapshot, &one(4, 0)).await;
    assert!(matches!(refused, Err(StoreError::InvalidGuard { .. })), "{refused:?}");
    assert!(matches!(store.settle(&leader).await, Err(StoreError::InvalidGuard { .. })));
    assert_eq!(stored(&client).await, before, "nothing written");
}

/// (d) An eventual write cannot reach an exclusive job (its guard exists), and one that
/// lost its term learns that first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eventual_write_to_an_exclusive_job_is_refused() {
    let Some(etcd) = Etcd::start() else { return };
    // The leader's term ends by lapsing: the shortest lease there is.
    let (store, client) = (store_with_ttl(&etcd, WAIT, TTL).await, raw(&etcd).await);
    let leader = lead(&store, "a").await;
    // An eventual job first: written as before, and made exclusive by its first exclusive
    // write (from generation 0: it had no guard).
    let empty = store.read(JOB).await.unwrap();
    let eventual = store.write(&leader, &empty, &one(4, 0)).await.unwrap();
    let exclusive = store.write_exclusive(&leader, &eventual, &one(5, 0)).await.unwrap();
    assert!(matches!(exclusive.recall, Recall::Granted { from: 0, to: 5, .. }), "{exclusive:?}");
    let before = stored(&client).await;
    let refused = store.write(&leader, &exclusive.snapshot, &one(6, 1)).await;
    assert!(
        matches!(&refused, Err(StoreError::ConsistencyMismatch { job, stored: Consistency::Exclusive }) if job == JOB),
        "{refused:?}"
    );
    assert_eq!(stored(&client).await, before, "nothing written");
    assert_eq!(state(&client, None).await.guard, Some(Guard::Granted(5)));
    leader.stop_renewing();
    eventually_within(WAIT, "the term lapsed", || !leader.is_held()).await;
    let _next = lead(&store, "b").await;
    assert!(matches!(
        store.write(&leader, &exclusive.snapshot, &one(6, 1)).await,
        Err(StoreError::NotLeader)
    ));
    assert_eq!(stored(&client).await, before, "nothing written");
}

/// (e) Exclusive mode has one task per slice, and needs a store with leases: refused by
/// name before anything is written, or at the service's construction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_exclusive_mode_cannot_hold_is_refused_by_name() {
    let exclusive = |replicas, handover| AssignerConfig {
        consistency: Consistency::Exclusive,
        replicas: steady_assigner::ReplicaLimits::new(1, replicas).unwrap(),
        handover,
        ..AssignerConfig::default()
    };
    assert_eq!(exclusive(2, None).validate().unwrap_err().field, "replicas");
    assert_eq!(exclusive(1, Some(Duration::from_secs(1))).validate().unwrap_err().field, "handover");
    assert!(exclusive(1, None).validate().is_ok());
    let memory = MemoryStore::new();
    assert!(!memory.supports_exclusive());
    let service = |store: Arc<dyn AssignmentStore>| {
        let algorithm = Arc::from(by_name("weighted-move").unwrap());
        AssignerService::new(JOB, "a", algorithm, store, Distributor::new(), LoadBook::new())
            .config(exclusive(1, None))
    };
    assert_eq!(service(Arc::new(memory.clone())).unwrap_err().field, "consistency");
    let leader = memory.campaign(JOB, "a").await.unwrap();
    let empty = memory.read(JOB).await.unwrap();
    let refused = memory.write_exclusive(&leader, &empty, &one(1, 0)).await;
    assert!(matches!(refused, Err(StoreError::Unsupported(_))), "{refused:?}");
    assert_eq!(memory.settle(&leader).await.unwrap(), Recall::Clear);

    let Some(etcd) = Etcd::start() else { return };
    let (store, client) = (store(&etcd, WAIT).await, raw(&etcd).await);
    assert!(store.supports_exclusive());
    assert!(service(Arc::new(store.clone())).is_ok());
    let leader = lead(&store, "a").await;
    let empty = store.read(JOB).await.unwrap();
    let two = Assignment::new(1, vec![Slice::new(SliceKey(0), vec![0]), Slice::new(SliceKey(7), vec![1, 2])])
        .unwrap();
    let refused = store.write_exclusive(&leader, &empty, &two).await;
    assert!(matches!(refused, Err(StoreError::NotExclusive { slice: 1, tasks: 2 })), "{refused:?}");
    let warming = Slice::new(SliceKey(0), vec![0]).with_warming([1]);
    let warming = Assignment::new(1, vec![warming]).unwrap();
    let refused = store.write_exclusive(&leader, &empty, &warming).await;
    assert!(matches!(refused, Err(StoreError::NotExclusive { slice: 0, tasks: 2 })), "{refused:?}");
    // A job named into another job's holds (job `other`'s, here).
    let nested = within(WAIT, "campaign", store.campaign("other/exclusive/holds/1", "a")).await.unwrap();
    let empty_nested = store.read(nested.job()).await.unwrap();
    let refused = store.write_exclusive(&nested, &empty_nested, &one(1, 0)).await;
    assert!(matches!(refused, Err(StoreError::InvalidConfig { field: "job", .. })), "{refused:?}");
    drop(nested);
    let prefix = format!("{DEFAULT_KEY_PREFIX}{JOB}/");
    let everything = client.kv_client().get(prefix, Some(GetOptions::new().with_prefix())).await.unwrap();
    let keys: Vec<&str> = everything.kvs().iter().map(|kv| kv.key_str().unwrap()).collect();
    assert_eq!(keys, [format!("{DEFAULT_KEY_PREFIX}{JOB}/leader")], "nothing but the leader key written");
}

/// A Slicelet that follows the guard as `docs/exclusive.md`'s does, without the
/// assignments: under `granted G` it holds `full G`, under `recalling G1 G2` it holds
/// `bridge G1 G2` (or nothing when `G1` is 0), each hold written in a transaction
/// conditioned on the guard it follows. Counts the holds it wrote. It takes `slow` to
/// write a bridge: a Slicelet busy elsewhere, which the recall must wait for.
fn follow_guard(client: Client, task: u32, slow: Duration) -> (tokio::task::JoinHandle<()>, Arc<Mutex<u64>>) {
    let written = Arc::new(Mutex::new(0));
    let count = written.clone();
    let handle = tokio::spawn(async move {
        let lease = client.lease_client().grant(60, None).await.unwrap().id();
        let (guard_key, hold_key) =
            (guard_key(DEFAULT_KEY_PREFIX, JOB), hold_key(DEFAULT_KEY_PREFIX, JOB, task, lease));
        let read = client.kv_client().get(guard_key.as_str(), None).await.unwrap();
        let from = read.header().unwrap().revision() + 1;
        let mut values: Vec<Vec<u8>> = read.kvs().iter().map(|kv| kv.value().to_vec()).collect();
        let options = WatchOptions::new().with_start_revision(from);
        let mut stream = client.watch_client().watch(guard_key.as_str(), Some(options)).await.unwrap();
        loop {
            for value in values.drain(..) {
                let guard = Guard::decode(&value).unwrap();
                if matches!(guard, Guard::Recalling { .. }) {
                    tokio::time::sleep(slow).await;
                }
                let write = match guard.hold_to_take(true) {
                    Some(hold) => TxnOp::put(
                        hold_key.as_str(),
                        hold.encode(),
                        Some(PutOptions::new().with_lease(lease)),
                    ),
                    None => TxnOp::delete(hold_key.as_str(), None),
                };
                let txn = Txn::new()
                    .when([Compare::value(guard_key.as_str(), CompareOp::Equal, value)])
                    .and_then([write]);
                if client.kv_client().txn(txn).await.unwrap().succeeded() {
                    *count.lock().unwrap() += 1;
                }
            }
            let Ok(Some(response)) = stream.message().await else { return };
            values.extend(
                response
                    .events()
                    .iter()
                    .filter(|e| e.event_type() == EventType::Put)
                    .filter_map(|e| e.kv())
                    .map(|kv| kv.value().to_vec()),
            );
        }
    });
    (handle, written)
}

/// (f) The Assigner service in exclusive mode, with live Slicelets that follow the guard:
/// every task-set change publishes a generation of one replica per slice, and the guard
/// grants it once the Slicelets bridged (a slow one too); at every instant read, every
/// hold is one the guard allows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_in_exclusive_mode_grants_each_generation_it_publishes() {
    let Some(etcd) = Etcd::start() else { return };
    let (store, client) = (store(&etcd, WAIT).await, raw(&etcd).await);
    // Task 0's Slicelet takes a while to bridge: every recall must wait for it.
    let slow = Duration::from_millis(200);
    let followers: Vec<_> = (0..5)
        .map(|task| follow_guard(client.clone(), task, if task == 0 { slow } else { Duration::ZERO }))
        .collect();
    // Every assignment the store holds, as the store's watch delivers them.
    let mut published = store.watch(JOB, 0).unwrap();
    let seen = Arc::new(Mutex::new(Vec::<Assignment>::new()));
    let log = seen.clone();
    let _collect = tokio::spawn(async move {
        while let Some(item) = published.next().await {
            log.lock().unwrap().push(item.unwrap());
        }
    });
    // The protocol's second invariant, checked at every read: each hold is one the guard
    // allows.
    let checker_client = client.clone();
    let violations = Arc::new(Mutex::new(Vec::new()));
    let found = violations.clone();
    let checker = tokio::spawn(async move {
        loop {
            let now = state(&checker_client, None).await;
            if let Some(guard) = now.guard {
                if now.holds.iter().any(|&(_, h)| !guard.allows(h)) {
                    found.lock().unwrap().push(format!("{now:?}"));
                }
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    });
    let (tasks, tasks_rx) = watch::channel(Tasks::serving(0..3).unwrap());
    let config = AssignerConfig {
        consistency: Consistency::Exclusive,
        cadence: Duration::from_millis(100),
        min_interval: Duration::from_millis(20),
        backoff: Duration::from_millis(20),
        ..AssignerConfig::default()
    };
    let distributor = Distributor::new();
    let algorithm = Arc::from(by_name("weighted-move").unwrap());
    let service = AssignerService::new(
        JOB,
        "a",
        algorithm,
        Arc::new(store.clone()),
        distributor.clone(),
        LoadBook::new(),
    )
    .config(config)
    .unwrap()
    .spawn(tasks_rx);
    let owners = |a: &Assignment| {
        let mut o: Vec<u32> = a.slices().iter().flat_map(|s| s.replicas().iter().copied()).collect();
        o.sort_unstable();
        o.dedup();
        o
    };
    // Each step: a task set, and the owners the Assigner must give the job then.
    let (serving, draining) = (TaskState::Serving, TaskState::Draining);
    let steps = [
        (vec![(0, serving), (1, serving), (2, serving)], vec![0, 1, 2]),
        (vec![(0, serving), (1, serving), (2, serving), (3, serving)], vec![0, 1, 2, 3]),
        (vec![(0, serving), (1, draining), (2, serving), (3, serving)], vec![0, 2, 3]),
        (vec![(0, serving), (2, serving), (3, serving), (4, serving)], vec![0, 2, 3, 4]),
    ];
    let mut generations = Vec::new();
    for (set, expected) in steps {
        tasks.send_replace(Tasks::new(set).unwrap());
        let mut granted = None;
        eventually_within(WAIT, &format!("a granted generation owned by {expected:?}"), || {
            granted = distributor.current(JOB).filter(|a| owners(a) == expected);
            granted.is_some()
        })
        .await;
        let first = granted.unwrap().generation();
        // That generation, or a later one (the Assigner may go on balancing on its 100 ms
        // cadence; the task set, and so the owners, stay), granted with the Slicelets
        // caught up: every one holds the generation granted, read at one revision. So the next change's
        // recall has the slow one's hold to wait for.
        let deadline = tokio::time::Instant::now() + WAIT;
        let generation = loop {
            let now = state(&client, None).await;
            if let Some(Guard::Granted(g)) = now.guard.filter(|_| now.holds.len() == 5) {
                if g >= first && now.holds.iter().all(|&(_, h)| h == Hold::Full(g)) {
                    break g;
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no grant at or after {first} held by all: {now:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        generations.push(generation);
    }
    assert!(generations.windows(2).all(|w| w[0] < w[1]), "{generations:?}");
    let stats = service.stats();
    assert!(stats.recalls() >= generations.len() as u64, "{} recalls", stats.recalls());
    // A recall of a later balancing step may be under way: one ends.
    eventually_within(WAIT, "no recall pending", || !stats.recall_pending()).await;
    // Timed from the publication to the grant: each waited for the slow Slicelet.
    let (last, longest) = (stats.last_recall().unwrap(), stats.longest_recall().unwrap());
    assert!(slow <= last && last <= longest, "{last:?}, {longest:?}");
    checker.abort();
    assert_eq!(*violations.lock().unwrap(), Vec::<String>::new(), "holds the guard does not allow");
    let seen = seen.lock().unwrap().clone();
    assert!(seen.len() >= generations.len(), "{} assignments seen", seen.len());
    for a in &seen {
        assert!(a.slices().iter().all(|s| s.replicas().len() == 1 && s.warming().is_empty()), "{a:?}");
    }
    // The followers bridged each recall and held each grant: two holds per generation
    // after the first (when there was nothing to bridge from) for each task that follows.
    let writes: u64 = followers.iter().map(|(_, n)| *n.lock().unwrap()).sum();
    assert!(writes >= 2 * generations.len() as u64, "{writes} holds written");
    service.stop().await;
    for (handle, _) in followers {
        handle.abort();
    }
}
