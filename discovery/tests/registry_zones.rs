//! Zones in the etcd registry, on a real etcd on 127.0.0.1 started per test by
//! `steady_testing::Etcd` (skipped when etcd is missing, unless STEADY_REQUIRE_ETCD is
//! set): concurrent zoned claims get distinct job indices and distinct zone indices in
//! each zone; watchers see each task's locality and the job's zone sizes; records
//! without a zone (written before zones, by any client) still read; drains keep the
//! zone; re-claims keep the zone index. Every wait is bounded.

#![cfg(feature = "etcd")]

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use steady_core::ZoneSizes;
use steady_discovery::identity::Origin;
use steady_discovery::registry::{self, Registration, Registry, RegistryConfig, RegistryError};
use steady_discovery::{JobView, Locality, TaskState, Zone};
use steady_testing::{within, Etcd};
use tokio::sync::watch;

/// The most any single step may take.
const WAIT: Duration = Duration::from_secs(15);
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

/// The value etcd holds at `key`, if any.
async fn value_at(raw: &mut etcd_client::Client, key: &str) -> Option<String> {
    let got = within(WAIT, "a read", raw.get(key, None)).await.unwrap();
    got.kvs().first().map(|kv| String::from_utf8(kv.value().to_vec()).unwrap())
}

/// Members claim in their zones at once, each on its own connection; returns the
/// registrations (by job index) and the median time a claim took.
async fn claim_all_in_zones(
    etcd: &Etcd,
    job: &'static str,
    members: impl IntoIterator<Item = (Zone, String)>,
) -> (Vec<Registration>, Duration) {
    let mut claims = Vec::new();
    for (zone, member) in members {
        let registry = connect(etcd).await;
        claims.push(tokio::spawn(async move {
            let started = Instant::now();
            let claimed = registry.claim_in_zone(job, &zone, &member).await;
            (claimed, started.elapsed())
        }));
    }
    let (mut registrations, mut times) = (Vec::new(), Vec::new());
    for claim in claims {
        let (claimed, took) = within(WAIT, "a zoned claim", claim).await.unwrap();
        registrations.push(claimed.unwrap());
        times.push(took);
    }
    registrations.sort_by_key(Registration::index);
    times.sort_unstable();
    (registrations, times[times.len() / 2])
}

/// Each zone's zone indices among `registrations`, sorted.
fn zone_indices(registrations: &[Registration]) -> BTreeMap<Zone, Vec<usize>> {
    let mut by_zone: BTreeMap<Zone, Vec<usize>> = BTreeMap::new();
    for r in registrations {
        let locality = r.locality().expect("a zoned claim has a locality");
        by_zone.entry(locality.zone.clone()).or_default().push(locality.index);
    }
    by_zone.values_mut().for_each(|v| v.sort_unstable());
    by_zone
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_zoned_claims_take_distinct_job_and_zone_indices_and_watchers_see_the_zones() {
    let Some(etcd) = Etcd::start() else { return };
    let registry = connect(&etcd).await;
    let mut raw = raw_client(&etcd).await;
    let (a, b, c) = (zone("zone-a"), zone("zone-b"), zone("zone-c"));
    let members = watch_members(&registry).await;
    let mut views = members.views();

    // Twelve frontends at once, six in a, three each in b and c (the 6/3/3).
    let wanted: Vec<(Zone, String)> = (0..12)
        .map(|n| {
            let z = match n % 4 {
                0 | 1 => a.clone(),
                2 => b.clone(),
                _ => c.clone(),
            };
            (z, format!("web-host-{n}"))
        })
        .collect();
    let (frontends, median) = claim_all_in_zones(&etcd, "web", wanted).await;
    let job_indices: Vec<usize> = frontends.iter().map(Registration::index).collect();
    assert_eq!(job_indices, (0..12).collect::<Vec<_>>(), "distinct job indices, 0..12");
    let expected: BTreeMap<Zone, Vec<usize>> =
        [(a.clone(), (0..6).collect()), (b.clone(), (0..3).collect()), (c.clone(), (0..3).collect())].into();
    assert_eq!(zone_indices(&frontends), expected, "distinct zone indices in each zone, 0..n");
    println!("zoned index allocation, 12 concurrent claims in 3 zones: median {median:?}");

    // Each task key records its locality, each zone key the job index (the layout is a
    // contract); the zone keys do not count in the job's size.
    for f in &frontends {
        let l = f.locality().unwrap();
        let record = value_at(&mut raw, f.key()).await.unwrap();
        assert_eq!(record, format!("serving {} zone={}/{}", f.address(), l.zone, l.index));
        let zone_key = format!("/steady/jobs/web/zones/{}/{}", l.zone, l.index);
        assert_eq!(f.zone_key(), Some(zone_key.as_str()));
        assert_eq!(value_at(&mut raw, &zone_key).await, Some(f.index().to_string()));
    }
    assert_eq!(registry.job_size("web").await.unwrap(), 12);

    // Watchers see every task's locality, and so the zone sizes.
    let view = view_where("all 12 in the view", &mut views, |v| v.tasks.len() == 12).await;
    assert_eq!(view.size, 12, "zone keys are not tasks");
    for f in &frontends {
        assert_eq!(view.tasks[&f.index()].locality.as_ref(), f.locality());
    }
    let sizes = ZoneSizes::new().with(a.clone(), 6).with(b.clone(), 3).with(c.clone(), 3);
    assert_eq!(view.zone_sizes(), sizes);

    // Two leave zone b (one cleanly, one crashes): the next two claimants in b take
    // exactly their zone indices and the job indices they freed; a claimant in c, who
    // came meanwhile, takes c's next zone index.
    let mut frontends = frontends;
    let b_members: Vec<usize> =
        (0..frontends.len()).filter(|&i| frontends[i].locality().unwrap().zone == b).collect();
    let (released, crashed) = (frontends.remove(b_members[2]), frontends.remove(b_members[0]));
    let freed_job: BTreeSet<usize> = [released.index(), crashed.index()].into();
    let freed_zone: BTreeSet<usize> =
        [released.locality().unwrap().index, crashed.locality().unwrap().index].into();
    within(WAIT, "a release", released.release()).await.unwrap();
    crashed.crash();
    view_where("both gone from the view", &mut views, |v| v.tasks.len() == 10).await;
    let (newcomers, _) = claim_all_in_zones(
        &etcd,
        "web",
        [(b.clone(), "new-b-0".to_owned()), (b.clone(), "new-b-1".to_owned())],
    )
    .await;
    assert_eq!(newcomers.iter().map(Registration::index).collect::<BTreeSet<_>>(), freed_job);
    assert_eq!(newcomers.iter().map(|r| r.locality().unwrap().index).collect::<BTreeSet<_>>(), freed_zone);
    let in_c = within(WAIT, "a claim in c", registry.claim_index_in_zone("web", &c, "new-c")).await.unwrap();
    assert_eq!((in_c.index(), in_c.zone(), in_c.origin()), (3, Some(&c), &Origin::Registry));
    let view = view_where("the newcomers in the view", &mut views, |v| v.tasks.len() == 13).await;
    assert_eq!(view.zone_sizes(), sizes.clone().with(c.clone(), 4));
    assert_eq!(view.size, 13, "the claim in c took the next job index, 12");
    drop(in_c);
    drop(members);
}

/// A watch of the `web` job.
async fn watch_members(registry: &Registry) -> steady_discovery::Discovery {
    within(WAIT, "watching", registry::watch_job(registry, "web")).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_without_a_zone_still_read_beside_zoned_ones_and_bad_zone_fields_are_skipped() {
    let Some(etcd) = Etcd::start() else { return };
    let registry = connect(&etcd).await;
    let mut raw = raw_client(&etcd).await;
    let prefix = registry.tasks_prefix("api");
    // Written by another client, as before zones existed and with them.
    raw.put(format!("{prefix}0"), "serving 10.0.0.1:80", None).await.unwrap();
    raw.put(format!("{prefix}1"), "serving 10.0.0.2:80 zone=us-east1-b/0", None).await.unwrap();
    raw.put(format!("{prefix}2"), "draining 10.0.0.3:80 zone=us-east1-c/4", None).await.unwrap();
    raw.put(format!("{prefix}3"), "serving 10.0.0.4:80 zone=us_east!/0", None).await.unwrap();
    raw.put(format!("{prefix}4"), "serving 10.0.0.5:80 zone=us-east1-b/007", None).await.unwrap();
    raw.put(format!("{prefix}5"), "serving 10.0.0.6:80 zone=us-east1-b/99999999", None).await.unwrap();
    raw.put(format!("{prefix}6"), "serving 10.0.0.7:80 rack=r1", None).await.unwrap();
    // A zone key, written as the registry writes them: not a task.
    raw.put("/steady/jobs/api/zones/us-east1-b/0", "1", None).await.unwrap();
    let (discovery, counters) =
        within(WAIT, "watching", registry::watch_job_counted(&registry, "api")).await.unwrap();
    let view = discovery.current();
    assert_eq!(view.size, 3);
    assert_eq!(view.serving_task(0).map(String::as_str), Some("10.0.0.1:80"));
    assert_eq!(view.tasks[&0].locality, None, "a record without a zone is a task in no zone");
    assert_eq!(view.tasks[&1].locality, Some(Locality::new(zone("us-east1-b"), 0)));
    assert_eq!(view.tasks[&2].state, TaskState::Draining);
    assert_eq!(view.tasks[&2].locality, Some(Locality::new(zone("us-east1-c"), 4)));
    assert_eq!(
        counters.get().rejected,
        4,
        "a bad label, a non-canonical index, an index too large, an unknown field"
    );
    assert_eq!(view.zone_sizes(), ZoneSizes::new().with(zone("us-east1-b"), 1).with(zone("us-east1-c"), 5));
    assert_eq!(registry.job_size("api").await.unwrap(), 7, "held keys count, whatever their value");

    // A record gaining a zone (rewritten by its owner) changes the view.
    let mut views = discovery.views();
    raw.put(format!("{prefix}0"), "serving 10.0.0.1:80 zone=us-east1-c/0", None).await.unwrap();
    let view = view_where("the zone appears", &mut views, |v| v.tasks[&0].locality.is_some()).await;
    assert_eq!(view.zone_of(0), Some(&zone("us-east1-c")));

    // A zoned claim passes over the zone key there (us-east1-b/0), and a plain claim
    // in the same job still works beside zoned ones.
    let b = zone("us-east1-b");
    let claimed =
        within(WAIT, "a zoned claim", registry.claim_in_zone("api", &b, "10.0.0.9:80")).await.unwrap();
    assert_eq!((claimed.index(), claimed.locality().map(|l| l.index)), (7, Some(1)));
    let plain = within(WAIT, "a plain claim", registry.claim("api", "10.0.0.10:80")).await.unwrap();
    assert_eq!((plain.index(), plain.locality(), plain.zone_key()), (8, None, None));
    assert_eq!(value_at(&mut raw, plain.key()).await.as_deref(), Some("serving 10.0.0.10:80"));
    drop(discovery);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explicit_zoned_registrations_drains_and_reclaims_keep_the_locality() {
    let Some(etcd) = Etcd::start() else { return };
    let registry = connect(&etcd).await;
    let mut raw = raw_client(&etcd).await;
    let a = zone("zone-a");
    let members = watch_members(&registry).await;
    let mut views = members.views();

    // A StatefulSet per zone: pod 1 of zone a registers its ordinal as its zone index.
    let pod = within(
        WAIT,
        "a registration",
        registry.register_in_zone("web", 4, Locality::new(a.clone(), 1), "10.0.0.4:80"),
    )
    .await
    .unwrap();
    assert_eq!(value_at(&mut raw, "/steady/jobs/web/zones/zone-a/1").await.as_deref(), Some("4"));
    // A claim in zone a passes over zone index 1 (held) and job index 4.
    let mut claims = Vec::new();
    for n in 0..5 {
        claims.push(
            within(WAIT, "a zoned claim", registry.claim_in_zone("web", &a, &format!("web-host-{n}")))
                .await
                .unwrap(),
        );
    }
    let got: Vec<(usize, usize)> = claims.iter().map(|r| (r.index(), r.locality().unwrap().index)).collect();
    assert_eq!(got, [(0, 0), (1, 2), (2, 3), (3, 4), (5, 5)]);

    // Drains keep the zone, in the record and in the view; the zone key stays.
    within(WAIT, "a drain", pod.drain()).await.unwrap();
    assert_eq!(value_at(&mut raw, pod.key()).await.as_deref(), Some("draining 10.0.0.4:80 zone=zone-a/1"));
    within(WAIT, "a budgeted drain", claims[1].drain_within_budget(2, WAIT)).await.unwrap();
    let view = view_where("two draining", &mut views, |v| {
        v.tasks.values().filter(|t| t.state == TaskState::Draining).count() == 2
    })
    .await;
    assert_eq!(view.tasks[&4].locality, Some(Locality::new(a.clone(), 1)));
    assert_eq!(view.tasks[&1].locality, Some(Locality::new(a.clone(), 2)));
    assert_eq!(view.zone_sizes().get(&a), 6, "draining tasks keep their zone indices");

    // Lost (its lease revoked behind its back): the re-claim takes both indices back,
    // although lower ones are free in the job and in the zone, and stays draining.
    within(WAIT, "a release", claims.remove(0).release()).await.unwrap(); // job 0, zone index 0
    let lost = claims.remove(0); // job 1, zone index 2, draining
    raw.lease_revoke(lost.lease_id()).await.unwrap();
    within(WAIT, "the loss is seen", lost.lost()).await;
    let back = within(WAIT, "a re-claim", lost.reclaim()).await.unwrap();
    assert_eq!((back.index(), back.locality()), (1, Some(&Locality::new(a.clone(), 2))));
    assert_eq!(back.state(), TaskState::Draining);
    assert_eq!(value_at(&mut raw, back.key()).await.as_deref(), Some("draining web-host-1 zone=zone-a/2"));
    assert_eq!(value_at(&mut raw, "/steady/jobs/web/zones/zone-a/2").await.as_deref(), Some("1"));

    // Crashed, its keys still there under the old lease: taken over in one transaction.
    let old = claims.remove(0); // job 2, zone index 3
    let old_lease = old.lease_id();
    old.crash();
    let over = within(
        WAIT,
        "a re-claim over its own keys",
        registry.claim_preferring_in_zone("web", "web-host-2", 2, Locality::new(a.clone(), 3)),
    )
    .await
    .unwrap();
    assert_eq!((over.index(), over.locality().map(|l| l.index)), (2, Some(3)));
    for key in [over.key(), over.zone_key().unwrap()] {
        let got = raw.get(key, None).await.unwrap();
        assert_eq!(
            got.kvs().first().map(|kv| kv.lease()),
            Some(over.lease_id()),
            "{key} under the new lease"
        );
    }
    assert_ne!(over.lease_id(), old_lease);

    // Somebody else's zone index is not taken: preferring zone index 3 (held by
    // web-host-2), another member gets the lowest free job and zone indices (job 0 and
    // zone index 0, freed by the release above).
    let intruder = within(
        WAIT,
        "a claim preferring another's zone index",
        registry.claim_preferring_in_zone("web", "intruder", 9, Locality::new(a.clone(), 3)),
    )
    .await
    .unwrap();
    assert_eq!((intruder.index(), intruder.locality().map(|l| l.index)), (0, Some(0)));

    // Arguments out of range are refused before anything is written.
    let refused =
        |r: Result<Registration, RegistryError>| matches!(r, Err(RegistryError::InvalidArgument { .. }));
    let far = Locality::new(a.clone(), registry::MAX_TASKS);
    assert!(refused(registry.register_in_zone("web", 9, far.clone(), "a:1").await));
    assert!(refused(registry.claim_preferring_in_zone("web", "x", 9, far).await));
    assert!(refused(registry.claim_in_zone("web", &a, "a b").await));
    drop((pod, back, over, intruder, claims, members));
}
