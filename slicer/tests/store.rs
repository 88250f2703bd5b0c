//! The assignment stores' specification: one set of behaviours that `MemoryStore` and
//! `EtcdStore` (on a real etcd on 127.0.0.1, started per test by `steady_testing::Etcd`)
//! must both show, then what only etcd has (values written around the store, lease
//! failover, restarts). The etcd behaviours run five ways: plaintext on one member, on a
//! three-member cluster (`steady_testing::EtcdCluster`), on such a cluster whose leader
//! member was killed first (the client still lists it), over TLS with client certificates
//! required, and with authentication as a user confined to the store's prefix; settings
//! that cannot work fail at connect with a typed error. Every wait is bounded.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use steady_slice::Assignment;
use steady_slicer::store::{
    AssignmentStore, AssignmentWatch, ConnectError, EtcdAccess, EtcdConfig, EtcdStore, EtcdTls, MemoryStore,
    StoreError, ValueError,
};
use steady_testing::tls::{Leaf, TestPki};
use steady_testing::{within, Etcd, EtcdOptions};

/// The most any single step may take.
const WAIT: Duration = Duration::from_secs(15);
/// The lease of the etcd tests: etcd's minimum with its default settings.
const TTL: Duration = Duration::from_secs(2);

fn assignment(generation: u64, task: u32) -> Assignment {
    Assignment::single(generation, vec![task]).unwrap()
}

/// The next item of a watch, which must be an assignment.
async fn next_assignment(watch: &mut AssignmentWatch) -> Assignment {
    within(WAIT, "the next assignment", watch.next())
        .await
        .expect("a watch never ends")
        .expect("an assignment")
}

fn etcd_config(etcd: &Etcd) -> EtcdConfig {
    EtcdConfig::new([etcd.endpoint()]).lease_ttl(TTL).request_timeout(Duration::from_secs(3))
}

async fn etcd_store(etcd: &Etcd) -> EtcdStore {
    within(WAIT, "connecting", EtcdStore::connect(etcd_config(etcd))).await.unwrap()
}

/// A store on every member of a cluster.
async fn cluster_store(etcd: &steady_testing::EtcdCluster) -> EtcdStore {
    let config = EtcdConfig::new(etcd.endpoints()).lease_ttl(TTL).request_timeout(Duration::from_secs(3));
    within(WAIT, "connecting", EtcdStore::connect(config)).await.unwrap()
}

/// An etcd that serves clients over TLS and requires their certificates, and the
/// access of a client it trusts.
struct TlsEtcd {
    etcd: Etcd,
    access: EtcdAccess,
    pki: TestPki,
    _client: Leaf,
}

impl TlsEtcd {
    fn start() -> Option<Self> {
        let pki = TestPki::new("etcd CA");
        let server = pki.issue(&["127.0.0.1"]);
        let options =
            EtcdOptions::new().tls(server.cert_file(), server.key_file()).client_cert_auth(pki.ca_file());
        let etcd = Etcd::start_with(options)?;
        let client = pki.issue(&["steady-slicer"]);
        let access =
            EtcdAccess::new().tls(EtcdTls::new(pki.ca_pem()).identity(client.cert_pem(), client.key_pem()));
        Some(Self { etcd, access, pki, _client: client })
    }

    async fn store(&self) -> EtcdStore {
        within(WAIT, "connecting", EtcdStore::connect(etcd_config(&self.etcd).access(self.access.clone())))
            .await
            .unwrap()
    }
}

/// An etcd with authentication on, where user `slicer` may use only the store's prefix.
fn etcd_with_auth() -> Option<Etcd> {
    Etcd::start_with(EtcdOptions::new().auth("root-secret").user(
        "slicer",
        "slicer-secret",
        steady_slicer::store::DEFAULT_KEY_PREFIX,
    ))
}

async fn store_as(etcd: &Etcd, user: &str, password: &str) -> Result<EtcdStore, StoreError> {
    within(
        WAIT,
        "connecting",
        EtcdStore::connect(etcd_config(etcd).access(EtcdAccess::new().user(user, password))),
    )
    .await
}

/// What every store must do.
mod spec {
    use super::*;

    pub(super) async fn a_written_assignment_reads_back_at_a_newer_revision(store: &dyn AssignmentStore) {
        let empty = store.read("job").await.unwrap();
        assert_eq!((empty.assignment(), empty.generation(), empty.rejected()), (None, 0, None));
        let leader = within(WAIT, "campaign", store.campaign("job", "a")).await.unwrap();
        let written = store.write(&leader, &empty, &assignment(1, 4)).await.unwrap();
        let read = store.read("job").await.unwrap();
        assert_eq!(read, written);
        assert_eq!(read.assignment(), Some(&assignment(1, 4)));
        assert!(read.revision() > empty.revision(), "{} then {}", empty.revision(), read.revision());
        // The returned snapshot is good for the next write, without a read.
        let again = store.write(&leader, &written, &assignment(2, 5)).await.unwrap();
        assert_eq!(store.read("job").await.unwrap().into_assignment(), Some(assignment(2, 5)));
        assert!(again.revision() > written.revision());
        // Other jobs are untouched.
        assert_eq!(store.read("other").await.unwrap().assignment(), None);
    }

    pub(super) async fn a_write_that_lost_a_race_is_a_conflict_and_wins_after_rereading(
        store: &dyn AssignmentStore,
    ) {
        let leader = within(WAIT, "campaign", store.campaign("job", "a")).await.unwrap();
        let start = store.read("job").await.unwrap();
        let first = store.write(&leader, &start, &assignment(1, 0)).await.unwrap();
        // Two writers read the same snapshot; the first to write wins.
        let (seen_by_one, seen_by_two) = (first.clone(), first.clone());
        store.write(&leader, &seen_by_one, &assignment(2, 1)).await.unwrap();
        let lost = store.write(&leader, &seen_by_two, &assignment(3, 2)).await;
        assert!(matches!(lost, Err(StoreError::Conflict)), "{lost:?}");
        assert_eq!(store.read("job").await.unwrap().generation(), 2, "the loser wrote nothing");
        // The loser re-reads and retries.
        let fresh = store.read("job").await.unwrap();
        store.write(&leader, &fresh, &assignment(3, 2)).await.unwrap();
        assert_eq!(store.read("job").await.unwrap().into_assignment(), Some(assignment(3, 2)));
    }

    pub(super) async fn an_older_or_equal_generation_is_refused(store: &dyn AssignmentStore) {
        let leader = within(WAIT, "campaign", store.campaign("job", "a")).await.unwrap();
        let start = store.read("job").await.unwrap();
        let at_five = store.write(&leader, &start, &assignment(5, 0)).await.unwrap();
        for offered in [5, 4, 1] {
            let refused = store.write(&leader, &at_five, &assignment(offered, 1)).await;
            assert!(
                matches!(refused, Err(StoreError::NotNewer { stored: 5, offered: o }) if o == offered),
                "{refused:?}"
            );
        }
        assert_eq!(store.read("job").await.unwrap(), at_five);
    }

    pub(super) async fn a_watcher_sees_every_newer_generation_in_order_and_none_older(
        store: &dyn AssignmentStore,
    ) {
        let leader = within(WAIT, "campaign", store.campaign("job", "a")).await.unwrap();
        let mut snapshot = store.read("job").await.unwrap();
        for generation in 1..=2 {
            snapshot = store.write(&leader, &snapshot, &assignment(generation, 0)).await.unwrap();
        }
        // Knowing generation 1, a watcher starts with the current generation 2 ...
        let mut watch = store.watch("job", 1).unwrap();
        assert_eq!(next_assignment(&mut watch).await, assignment(2, 0));
        // ... then each new one, in order.
        for generation in 3..=6 {
            snapshot =
                store.write(&leader, &snapshot, &assignment(generation, generation as u32)).await.unwrap();
            assert_eq!(next_assignment(&mut watch).await, assignment(generation, generation as u32));
        }
        // A watcher that knows the newest sees nothing until a newer one is written.
        let mut up_to_date = store.watch("job", 6).unwrap();
        let early = tokio::time::timeout(Duration::from_millis(300), up_to_date.next()).await;
        assert!(early.is_err(), "got {early:?} though nothing newer was written");
        store.write(&leader, &snapshot, &assignment(7, 0)).await.unwrap();
        assert_eq!(next_assignment(&mut up_to_date).await.generation(), 7);
        assert_eq!(next_assignment(&mut watch).await.generation(), 7);
        assert_eq!(watch.rejected(), 0);
    }

    pub(super) async fn one_candidate_leads_and_a_standby_takes_over_when_the_leader_resigns(
        store: &dyn AssignmentStore,
    ) {
        let first = within(WAIT, "campaign", store.campaign("job", "a")).await.unwrap();
        assert!(first.is_held());
        assert_eq!((first.job(), first.candidate()), ("job", "a"));
        // While "a" leads, "b" waits.
        let waiting = tokio::time::timeout(Duration::from_millis(500), store.campaign("job", "b")).await;
        assert!(waiting.is_err(), "a second leader while the first holds its term");
        // Another job has a leader of its own.
        let other = within(WAIT, "campaign", store.campaign("other", "b")).await.unwrap();
        within(WAIT, "resign", first.resign()).await.unwrap();
        let second = within(WAIT, "the standby's campaign", store.campaign("job", "b")).await.unwrap();
        assert_eq!(second.candidate(), "b");
        drop(other);
        // Dropping the handle ends the term too.
        drop(second);
        within(WAIT, "campaign after a drop", store.campaign("job", "c")).await.unwrap();
    }

    pub(super) async fn a_deposed_writer_is_refused_even_at_the_current_revision(
        store: &dyn AssignmentStore,
    ) {
        let old = within(WAIT, "campaign", store.campaign("job", "a")).await.unwrap();
        let snapshot = store.read("job").await.unwrap();
        let snapshot = store.write(&old, &snapshot, &assignment(1, 0)).await.unwrap();
        old.stop_renewing();
        let new = within(WAIT, "the standby's campaign", store.campaign("job", "b")).await.unwrap();
        // Nobody wrote since: the old leader's snapshot is current, and still it is refused.
        assert_eq!(store.read("job").await.unwrap(), snapshot);
        let refused = store.write(&old, &snapshot, &assignment(2, 9)).await;
        assert!(matches!(refused, Err(StoreError::NotLeader)), "{refused:?}");
        assert_eq!(store.read("job").await.unwrap(), snapshot, "the deposed writer wrote nothing");
        store.write(&new, &snapshot, &assignment(2, 1)).await.unwrap();
    }

    pub(super) async fn bad_names_and_mismatched_snapshots_are_refused_before_anything_is_written(
        store: &dyn AssignmentStore,
    ) {
        let long = "j".repeat(steady_core::MAX_JOB_NAME_LEN + 1);
        assert!(matches!(store.read("").await, Err(StoreError::InvalidName { what: "job", len: 0 })));
        assert!(matches!(store.read(&long).await, Err(StoreError::InvalidName { what: "job", .. })));
        assert!(matches!(store.watch(&long, 0), Err(StoreError::InvalidName { .. })));
        let campaign = store.campaign("job", &long).await;
        assert!(matches!(campaign, Err(StoreError::InvalidName { what: "candidate", .. })), "{campaign:?}");
        let leader = within(WAIT, "campaign", store.campaign("job", "a")).await.unwrap();
        let elsewhere = store.read("other").await.unwrap();
        let refused = store.write(&leader, &elsewhere, &assignment(1, 0)).await;
        assert!(matches!(refused, Err(StoreError::WrongJob { .. })), "{refused:?}");
        assert_eq!(store.read("other").await.unwrap().assignment(), None);
        assert_eq!(store.read("job").await.unwrap().assignment(), None);
    }
}

/// Runs each behaviour of [`spec`] against a `MemoryStore` and an `EtcdStore`.
macro_rules! specification {
    ($($behaviour:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test]
                async fn $behaviour() {
                    super::spec::$behaviour(&steady_slicer::MemoryStore::new()).await;
                }
            )*
        }
        mod etcd {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $behaviour() {
                    let Some(etcd) = steady_testing::Etcd::start() else { return };
                    super::spec::$behaviour(&super::etcd_store(&etcd).await).await;
                }
            )*
        }
        mod etcd_cluster {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $behaviour() {
                    let Some(etcd) = steady_testing::EtcdCluster::start() else { return };
                    super::spec::$behaviour(&super::cluster_store(&etcd).await).await;
                }
            )*
        }
        mod etcd_cluster_with_its_leader_member_dead {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $behaviour() {
                    let Some(mut etcd) = steady_testing::EtcdCluster::start() else { return };
                    let leader = etcd.wait_for_leader();
                    etcd.kill(leader);
                    etcd.wait_for_leader();
                    // The client still lists the dead member: its calls must go to the others.
                    super::spec::$behaviour(&super::cluster_store(&etcd).await).await;
                }
            )*
        }
        mod etcd_with_client_certificates {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $behaviour() {
                    let Some(etcd) = super::TlsEtcd::start() else { return };
                    super::spec::$behaviour(&etcd.store().await).await;
                }
            )*
        }
        mod etcd_with_a_user_confined_to_the_prefix {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $behaviour() {
                    let Some(etcd) = super::etcd_with_auth() else { return };
                    let store = super::store_as(&etcd, "slicer", "slicer-secret").await.unwrap();
                    super::spec::$behaviour(&store).await;
                }
            )*
        }
    };
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_a_wrong_ca_or_no_client_certificate_fails_at_connect_naming_tls() {
    let Some(etcd) = TlsEtcd::start() else { return };
    let stranger = TestPki::new("another CA");
    let client = etcd.pki.issue(&["steady-slicer"]);
    let settings = [
        ("a wrong CA", EtcdTls::new(stranger.ca_pem()).identity(client.cert_pem(), client.key_pem())),
        ("no client certificate", EtcdTls::new(etcd.pki.ca_pem())),
    ];
    for (what, tls) in settings {
        let config = etcd_config(&etcd.etcd).access(EtcdAccess::new().tls(tls));
        let refused = within(WAIT, "connecting", EtcdStore::connect(config)).await;
        match refused {
            Err(StoreError::Connect(ConnectError::Tls { .. })) => {}
            other => panic!("{what}: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_auth_a_wrong_password_or_a_user_without_the_prefix_fails_at_connect() {
    let Some(etcd) = etcd_with_auth() else { return };
    let refused = store_as(&etcd, "slicer", "wrong").await;
    assert!(matches!(refused, Err(StoreError::Connect(ConnectError::Unauthenticated { .. }))), "{refused:?}");
    let message = refused.unwrap_err().to_string();
    assert!(message.contains("\"slicer\"") && !message.contains("wrong"), "{message}");
    // The same user under another prefix.
    let elsewhere = etcd_config(&etcd)
        .key_prefix("/elsewhere/")
        .access(EtcdAccess::new().user("slicer", "slicer-secret"));
    let refused = within(WAIT, "connecting", EtcdStore::connect(elsewhere)).await;
    assert!(
        matches!(refused, Err(StoreError::Connect(ConnectError::PermissionDenied { .. }))),
        "{refused:?}"
    );
}

specification!(
    a_written_assignment_reads_back_at_a_newer_revision,
    a_write_that_lost_a_race_is_a_conflict_and_wins_after_rereading,
    an_older_or_equal_generation_is_refused,
    a_watcher_sees_every_newer_generation_in_order_and_none_older,
    one_candidate_leads_and_a_standby_takes_over_when_the_leader_resigns,
    a_deposed_writer_is_refused_even_at_the_current_revision,
    bad_names_and_mismatched_snapshots_are_refused_before_anything_is_written,
);

#[tokio::test]
async fn a_memory_store_holds_a_bounded_number_of_jobs() {
    let store = MemoryStore::with_max_jobs(2);
    let _one = store.watch("one", 0).unwrap();
    let two = store.watch("two", 0).unwrap();
    assert!(matches!(store.watch("three", 0), Err(StoreError::TooManyJobs { limit: 2 })));
    // Reads make no entry; a job nobody watches any more makes room.
    store.read("four").await.unwrap();
    drop(two);
    let _three = store.watch("three", 0).unwrap();
    assert_eq!(store.jobs(), 2);
}

/// A plain etcd client, to write around the store as another program could.
async fn raw_client(etcd: &Etcd) -> etcd_client::Client {
    within(WAIT, "connecting", etcd_client::Client::connect([etcd.endpoint()], None)).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_value_under_the_key_is_rejected_and_the_last_good_assignment_stays() {
    let Some(etcd) = Etcd::start() else { return };
    let store = etcd_store(&etcd).await;
    let leader = within(WAIT, "campaign", store.campaign("job", "a")).await.unwrap();
    let empty = store.read("job").await.unwrap();
    store.write(&leader, &empty, &assignment(3, 0)).await.unwrap();
    let mut watch = store.watch("job", 0).unwrap();
    assert_eq!(next_assignment(&mut watch).await, assignment(3, 0));

    let mut raw = raw_client(&etcd).await;
    let key = store.assignment_key("job");
    assert_eq!(key, "/steady/jobs/job/assignment", "the key layout is a contract");
    raw.put(key.as_str(), b"not an assignment".to_vec(), None).await.unwrap();
    let rejected = within(WAIT, "the rejection", watch.next()).await.unwrap().unwrap_err();
    assert!(matches!(rejected.error, ValueError::Decode(_)), "{rejected}");
    assert_eq!(watch.rejected(), 1);
    // An older generation written around the store is not news, and is skipped silently.
    raw.put(key.as_str(), assignment(2, 7).encode(), None).await.unwrap();
    // A read shows what is there; the leader may replace it with any generation.
    let corrupt = store.read("job").await.unwrap();
    assert_eq!(corrupt.into_assignment(), Some(assignment(2, 7)));
    raw.put(key.as_str(), vec![0; 16], None).await.unwrap();
    let corrupt = store.read("job").await.unwrap();
    assert!(corrupt.rejected().is_some() && corrupt.assignment().is_none(), "{corrupt:?}");
    store.write(&leader, &corrupt, &assignment(4, 1)).await.unwrap();
    // The watcher skipped generation 2, counted the second bad value, and sees 4.
    let rejected = within(WAIT, "the second rejection", watch.next()).await.unwrap().unwrap_err();
    assert!(matches!(rejected.error, ValueError::Decode(_)), "{rejected}");
    assert_eq!(next_assignment(&mut watch).await, assignment(4, 1));
    assert_eq!(watch.rejected(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_watcher_sees_a_burst_of_generations_one_by_one_in_order() {
    let Some(etcd) = Etcd::start() else { return };
    let store = etcd_store(&etcd).await;
    let leader = within(WAIT, "campaign", store.campaign("job", "a")).await.unwrap();
    let mut watch = store.watch("job", 0).unwrap();
    let mut snapshot = store.read("job").await.unwrap();
    snapshot = store.write(&leader, &snapshot, &assignment(1, 0)).await.unwrap();
    // The watch starts when first polled: once it has seen generation 1 it follows the key.
    assert_eq!(next_assignment(&mut watch).await.generation(), 1);
    for generation in 2..=50 {
        snapshot = store.write(&leader, &snapshot, &assignment(generation, 0)).await.unwrap();
    }
    for generation in 2..=50 {
        assert_eq!(next_assignment(&mut watch).await.generation(), generation);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_leads_within_the_lease_ttl_after_the_leader_stops_renewing() {
    let Some(etcd) = Etcd::start() else { return };
    let store = etcd_store(&etcd).await;
    let standby_store = etcd_store(&etcd).await;
    let leader = within(WAIT, "campaign", store.campaign("job", "a")).await.unwrap();
    let standby = tokio::spawn(async move {
        let leadership = standby_store.campaign("job", "b").await;
        (Instant::now(), leadership)
    });
    // Let the leader renew a few times first: the standby must keep waiting meanwhile.
    tokio::time::sleep(TTL * 2).await;
    assert!(!standby.is_finished(), "the standby led while the leader renewed its lease");
    assert!(leader.is_held());
    let stopped = Instant::now();
    leader.stop_renewing();
    let (led_at, leadership) = within(WAIT, "the standby's takeover", standby).await.unwrap();
    let leadership = leadership.unwrap();
    let failover = led_at - stopped;
    // The lease was renewed at most a third of a TTL before it stopped, and etcd checks
    // for lapsed leases every 500 ms.
    eprintln!("failover after the leader stopped renewing: {failover:?} (TTL {TTL:?})");
    assert!(failover >= TTL / 2, "took over after {failover:?}, before the lease could lapse");
    // The upper bound is loose (the figure printed above is the measurement): a loaded
    // machine delays the watch and the campaign after the lapse, never the lapse itself.
    assert!(failover <= TTL + Duration::from_secs(3), "took over after {failover:?}");
    assert_eq!(leadership.candidate(), "b");
    // The old leader knows by now that its term is over.
    within(WAIT, "the old leader to see its loss", leader.lost()).await;
    assert!(!leader.is_held());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_leader_hands_over_at_once_not_after_its_lease() {
    let Some(etcd) = Etcd::start() else { return };
    let store = etcd_store(&etcd).await;
    let leader = within(WAIT, "campaign", store.campaign("job", "a")).await.unwrap();
    let standby_store = etcd_store(&etcd).await;
    let standby =
        tokio::spawn(async move { standby_store.campaign("job", "b").await.map(|l| (Instant::now(), l)) });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let dropped = Instant::now();
    drop(leader);
    let (led_at, _leadership) = within(WAIT, "the standby's takeover", standby).await.unwrap().unwrap();
    let handover = led_at - dropped;
    eprintln!("handover after the leader's handle dropped: {handover:?}");
    assert!(handover < TTL / 2, "took {handover:?}: the lease was not revoked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_and_a_writer_carry_on_after_etcd_restarts() {
    let Some(mut etcd) = Etcd::start() else { return };
    let store = etcd_store(&etcd).await;
    let leader = within(WAIT, "campaign", store.campaign("job", "a")).await.unwrap();
    let snapshot = store.read("job").await.unwrap();
    let snapshot = store.write(&leader, &snapshot, &assignment(1, 0)).await.unwrap();
    let mut watch = store.watch("job", 0).unwrap();
    assert_eq!(next_assignment(&mut watch).await.generation(), 1);
    etcd.kill();
    let unavailable = store.read("job").await;
    assert!(matches!(unavailable, Err(StoreError::Unavailable(_))), "{unavailable:?}");
    etcd.restart();
    // The data survived; writes go through again once the client has reconnected.
    let deadline = Instant::now() + WAIT;
    loop {
        match store.write(&leader, &snapshot, &assignment(2, 1)).await {
            Ok(_) => break,
            Err(StoreError::Unavailable(e)) if Instant::now() < deadline => {
                eprintln!("waiting for etcd: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("write after the restart: {e:?}"),
        }
    }
    assert_eq!(next_assignment(&mut watch).await, assignment(2, 1));
}
