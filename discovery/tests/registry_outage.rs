//! The registry through the control plane's own outage, on a real etcd on 127.0.0.1
//! (`steady_testing::Etcd`, skipped when etcd is missing unless STEADY_REQUIRE_ETCD is
//! set): etcd is killed (SIGKILL) for three lease TTLs and restarted on its data, and
//! every frontend keeps its index; a lease etcd really lost (revoked, with etcd up) is
//! reported, and its holder takes its own index back, even from under another lease.
//! Every wait is bounded; the measured figures are printed to stderr:
//!
//! ```text
//! STEADY_REQUIRE_ETCD=1 cargo test -p steady-discovery --test registry_outage -- --nocapture
//! ```

#![cfg(feature = "etcd")]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::GetOptions;
use steady_discovery::registry::{Registration, Registry, RegistryConfig, RegistryError};
use steady_testing::{within, Etcd};
use tokio::sync::watch;

/// The most any single step may take.
const WAIT: Duration = Duration::from_secs(30);
/// The lease of these tests: etcd's minimum with its default settings.
const TTL: Duration = Duration::from_secs(2);
/// How many frontends share the job.
const FRONTENDS: usize = 60;
/// How long etcd stays down: three TTLs.
const OUTAGE: Duration = Duration::from_secs(6);
/// How often the sampler looks at who holds which index.
const SAMPLE_EVERY: Duration = Duration::from_millis(20);
/// A frontend's pause between re-claims that etcd did not answer.
const RECLAIM_RETRY: Duration = Duration::from_millis(100);

async fn connect(etcd: &Etcd) -> Registry {
    let config =
        RegistryConfig::new([etcd.endpoint()]).lease_ttl(TTL).request_timeout(Duration::from_secs(3));
    within(WAIT, "connecting", Registry::connect(config)).await.unwrap()
}

/// One frontend: its member name, the index it first claimed, and its registration now
/// (replaced when it re-claims).
struct Frontend {
    name: String,
    first_index: usize,
    current: watch::Receiver<Arc<Registration>>,
}

/// Keeps a frontend's identity as an application would: whenever the registration is
/// lost, re-claim (retrying while etcd does not answer), and publish the new one.
async fn keep_identity(
    name: String,
    mut registration: Arc<Registration>,
    current: watch::Sender<Arc<Registration>>,
    losses: Arc<AtomicUsize>,
) {
    loop {
        registration.lost().await;
        losses.fetch_add(1, Ordering::Relaxed);
        let next = loop {
            match registration.reclaim().await {
                Ok(next) => break next,
                Err(RegistryError::Unavailable(_)) => tokio::time::sleep(RECLAIM_RETRY).await,
                Err(error) => panic!("{name}: re-claim: {error}"),
            }
        };
        registration = Arc::new(next);
        current.send_replace(registration.clone());
    }
}

/// Whether no index is held by two frontends whose registrations are alive; the first
/// clash found otherwise.
fn clash(frontends: &[Frontend]) -> Option<(usize, String, String)> {
    let mut holders: BTreeMap<usize, &str> = BTreeMap::new();
    for frontend in frontends {
        let registration = frontend.current.borrow();
        if !registration.is_held() {
            continue;
        }
        if let Some(other) = holders.insert(registration.index(), &frontend.name) {
            return Some((registration.index(), other.to_owned(), frontend.name.clone()));
        }
    }
    None
}

/// Whether every frontend holds a live lease: its registration is held and confirmed
/// (a renewal answered within the TTL: after an outage longer than the TTL, one answered
/// since etcd came back), and etcd's key at its index is attached to its lease (etcd
/// deletes a key when its lease ends, so the lease was alive at this read). Also returns
/// the number of task keys read.
async fn all_live(client: &mut etcd_client::Client, prefix: &str, frontends: &[Frontend]) -> (bool, usize) {
    let Ok(response) = client.get(prefix, Some(GetOptions::new().with_prefix())).await else {
        return (false, 0);
    };
    let leases: BTreeMap<String, i64> = response
        .kvs()
        .iter()
        .map(|kv| (String::from_utf8_lossy(kv.key()).into_owned(), kv.lease()))
        .collect();
    let live = frontends.iter().all(|frontend| {
        let registration = frontend.current.borrow();
        registration.is_confirmed() && leases.get(registration.key()) == Some(&registration.lease_id())
    });
    (live, leases.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_frontends_keep_their_indices_through_an_etcd_outage_of_three_ttls() {
    let Some(mut etcd) = Etcd::start() else { return };
    let registry = connect(&etcd).await;
    let job = "web";

    // Sixty frontends, each on its own connection, claim 0..59.
    let mut claims = Vec::new();
    for n in 0..FRONTENDS {
        let registry = connect(&etcd).await;
        claims.push(tokio::spawn(async move {
            let name = format!("web-host-{n}");
            let registration = registry.claim(job, &name).await;
            (name, registration)
        }));
    }
    let (mut frontends, mut keepers) = (Vec::new(), Vec::new());
    let losses = Arc::new(AtomicUsize::new(0));
    for claim in claims {
        let (name, registration) = within(WAIT, "a claim", claim).await.unwrap();
        let registration = Arc::new(registration.unwrap());
        let (current, watched) = watch::channel(registration.clone());
        frontends.push(Frontend { name: name.clone(), first_index: registration.index(), current: watched });
        keepers.push(tokio::spawn(keep_identity(name, registration, current, losses.clone())));
    }
    let mut first: Vec<usize> = frontends.iter().map(|f| f.first_index).collect();
    first.sort_unstable();
    assert_eq!(first, (0..FRONTENDS).collect::<Vec<_>>());
    assert_eq!(registry.job_size(job).await.unwrap(), FRONTENDS);

    // Samples who holds which index, from before the outage to the end of the test.
    let frontends = Arc::new(frontends);
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (frontends, sampling) = (frontends.clone(), sampling.clone());
        tokio::spawn(async move {
            let (mut samples, mut clashes) = (0_usize, Vec::new());
            while sampling.load(Ordering::Relaxed) {
                samples += 1;
                clashes.extend(clash(&frontends));
                tokio::time::sleep(SAMPLE_EVERY).await;
            }
            (samples, clashes)
        })
    };

    let killed = Instant::now();
    etcd.kill();
    // The outage itself: the fault lasts three TTLs, whatever the frontends do.
    tokio::time::sleep(OUTAGE).await;
    etcd.restart();
    let restarted = Instant::now();
    eprintln!("etcd down for {:?} (lease TTL {TTL:?}), {FRONTENDS} frontends", restarted - killed);

    // Wait (bounded) until every frontend holds a live lease again.
    let mut raw =
        within(WAIT, "connecting", etcd_client::Client::connect([etcd.endpoint()], None)).await.unwrap();
    let prefix = registry.tasks_prefix(job);
    let keys = within(WAIT, "every frontend holding a live lease", async {
        loop {
            let (live, keys) = all_live(&mut raw, &prefix, &frontends).await;
            if live {
                return keys;
            }
            tokio::time::sleep(SAMPLE_EVERY).await;
        }
    })
    .await;
    let recovered = restarted.elapsed();

    let changed: Vec<(String, usize, usize)> = frontends
        .iter()
        .map(|f| (f.name.clone(), f.first_index, f.current.borrow().index()))
        .filter(|(_, before, after)| before != after)
        .collect();
    let size = registry.job_size(job).await.unwrap();
    sampling.store(false, Ordering::Relaxed);
    let (samples, clashes) = within(WAIT, "the sampler", sampler).await.unwrap();
    let losses = losses.load(Ordering::Relaxed);
    eprintln!(
        "every frontend held a live lease {recovered:?} after etcd was back ({:?} after the kill); \
         indices changed: {}; leases lost: {losses}; job size afterwards: {size}; task keys: {keys}; \
         index clashes in {samples} samples: {}",
        killed.elapsed(),
        changed.len(),
        clashes.len()
    );

    assert!(clashes.is_empty(), "an index held by two live frontends at once: {:?}", clashes.first());
    assert!(samples >= 100, "only {samples} samples");
    assert_eq!(changed.len(), 0, "frontends at another index (name, before, after): {changed:?}");
    assert_eq!(losses, 0, "etcd restored every lease, yet a frontend counted its own lost");
    assert_eq!(size, FRONTENDS, "the job's size after the outage");
    assert_eq!(keys, FRONTENDS, "task keys after the outage: a stray key is still there");
    for keeper in keepers {
        keeper.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_etcd_really_lost_is_reported_and_reclaimed_at_its_own_index_when_free() {
    let Some(etcd) = Etcd::start() else { return };
    let registry = connect(&etcd).await;
    let job = "web";
    let mut frontends = Vec::new();
    for n in 0..6 {
        let registration =
            within(WAIT, "a claim", registry.claim(job, &format!("web-host-{n}"))).await.unwrap();
        assert_eq!(registration.index(), n);
        frontends.push(registration);
    }

    // etcd up, and the leases of 1 and 3 revoked behind their holders' backs (as etcd
    // expires the lease of a holder cut off from it for a TTL): both keys are gone, and
    // each holder hears of it at its next renewal.
    let mut raw =
        within(WAIT, "connecting", etcd_client::Client::connect([etcd.endpoint()], None)).await.unwrap();
    for index in [1, 3] {
        raw.lease_revoke(frontends[index].lease_id()).await.unwrap();
    }
    let revoked = Instant::now();
    within(WAIT, "the holders see their loss", async {
        frontends[1].lost().await;
        frontends[3].lost().await;
    })
    .await;
    eprintln!("revoked leases reported lost {:?} after the revocation (TTL {TTL:?})", revoked.elapsed());
    assert!(!frontends[1].is_held() && !frontends[3].is_held());
    let still_held: Vec<usize> = frontends.iter().filter(|f| f.is_held()).map(Registration::index).collect();
    assert_eq!(still_held, [0, 2, 4, 5], "the others' leases are untouched");

    // 3 re-claims first: its own index, although 1 is lower and free too; then 1.
    let three = within(WAIT, "re-claim", frontends[3].reclaim()).await.unwrap();
    assert_eq!(three.index(), 3, "a re-claim takes its own free index, not the lowest free one");
    let one = within(WAIT, "re-claim", frontends[1].reclaim()).await.unwrap();
    assert_eq!(one.index(), 1);
    assert_ne!(three.lease_id(), frontends[3].lease_id(), "a lost lease is not reused");
    assert!(one.is_held() && three.is_held());
    assert_eq!(registry.job_size(job).await.unwrap(), 6);
    frontends[1] = one;
    frontends[3] = three;

    // A member's own key under a lease that is not its current one (here its crashed
    // predecessor's, not lapsed yet; after an etcd restart, its own old lease restored
    // with a fresh TTL) is still its own: taken over in one transaction, and the old
    // lease's lapse no longer deletes it.
    let old_lease = frontends[5].lease_id();
    frontends.pop().unwrap().crash();
    let five = within(WAIT, "re-claim", registry.claim_preferring(job, "web-host-5", 5)).await.unwrap();
    assert_eq!(five.index(), 5, "its own key, still there under the old lease");
    within(WAIT, "the old lease lapses", async {
        while raw.lease_time_to_live(old_lease, None).await.unwrap().ttl() > 0 {
            tokio::time::sleep(SAMPLE_EVERY).await;
        }
    })
    .await;
    let key = raw.get(five.key(), None).await.unwrap();
    assert_eq!(
        key.kvs().first().map(|kv| kv.lease()),
        Some(five.lease_id()),
        "the key went with the old lease"
    );
    assert!(five.is_held());

    // Somebody else's key is not taken: another member preferring index 0 gets the
    // lowest free index.
    let intruder = within(WAIT, "a claim", registry.claim_preferring(job, "intruder", 0)).await.unwrap();
    assert_eq!(intruder.index(), 6);
    assert!(frontends[0].is_held());
    let zero = raw.get(frontends[0].key(), None).await.unwrap();
    assert_eq!(zero.kvs().first().map(|kv| kv.lease()), Some(frontends[0].lease_id()));
}
