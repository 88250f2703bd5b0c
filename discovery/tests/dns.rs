//! DNS discovery against a real DNS server (hickory's) run in-process on loopback.
//!
//! The zone is what a Kubernetes headless service `web` in namespace `ns` in front of a
//! StatefulSet publishes: for each ready pod `web-i`, an SRV record on the service name
//! whose target is `web-i.web.ns.svc.cluster.local.`, an A record for that target, and an
//! A record on the service name. Tests edit the zone while the source runs, stop the
//! server and start it again on the same port.
//!
//! Time is real, not paused: the resolver's timeouts and the server's sockets run on the
//! real clock. Every wait is bounded; with a 200 ms period the figures printed are how
//! long a change took to reach the view.

#![cfg(feature = "dns")]

use std::net::{Ipv4Addr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::rr::rdata::{A, SOA, SRV};
use hickory_proto::rr::{LowerName, Name, RData, Record, RecordType};
use hickory_server::authority::{AuthorityObject, Catalog, ZoneType};
use hickory_server::store::in_memory::InMemoryAuthority;
use hickory_server::ServerFuture;
use steady_discovery::dns::{self, DnsConfig, DnsCounters, DnsError, IndexRule};
use steady_discovery::{Discovery, JobView, Zone};
use steady_testing::holds_within;
use tokio::net::{TcpListener, UdpSocket};
use tokio::time::{timeout, Instant};

const SERVICE: &str = "web.ns.svc.cluster.local.";
const PERIOD: Duration = Duration::from_millis(200);
/// How long any one wait may take before the test fails: many periods.
const PATIENCE: Duration = Duration::from_secs(5);
/// How long one lookup may take against the test's own server before it counts as a
/// failure: far more than a loopback answer takes, even on a loaded machine (the test's
/// server shares the test's runtime, and a resolution is an SRV lookup and one A lookup
/// per pod).
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(1);
/// The bound a change must reach the view within: one period, plus a resolution, which
/// succeeds within its timeout or fails.
const ONE_PERIOD_AND_A_RESOLUTION: Duration = Duration::from_millis(200 + 1000);

/// The address of pod `web-i`.
fn pod_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 1, (i / 250) as u8, (i % 250 + 1) as u8)
}

fn name(s: &str) -> Name {
    Name::from_str(s).unwrap()
}

/// An authoritative server for the service's zone on 127.0.0.1, UDP and TCP on one port.
struct ZoneServer {
    zone: Arc<InMemoryAuthority>,
    address: SocketAddr,
    server: Option<ServerFuture<Catalog>>,
}

impl ZoneServer {
    async fn start() -> Self {
        let zone = Arc::new(InMemoryAuthority::empty(name(SERVICE), ZoneType::Primary, false));
        let soa = SOA::new(name("ns.cluster.local."), name("admin.cluster.local."), 1, 60, 60, 60, 5);
        assert!(zone.upsert(Record::from_rdata(name(SERVICE), 5, RData::SOA(soa)), 1).await);
        // Port 0 for UDP, then TCP on the port UDP got (taken by chance: try again).
        for _ in 0..20 {
            let udp = UdpSocket::bind("127.0.0.1:0").await.unwrap();
            let address = udp.local_addr().unwrap();
            if let Ok(tcp) = TcpListener::bind(address).await {
                let mut this = Self { zone, address, server: None };
                this.serve(udp, tcp);
                return this;
            }
        }
        panic!("no loopback port free for both UDP and TCP");
    }

    fn serve(&mut self, udp: UdpSocket, tcp: TcpListener) {
        let mut catalog = Catalog::new();
        let zone: Arc<dyn AuthorityObject> = self.zone.clone();
        catalog.upsert(LowerName::new(&name(SERVICE)), vec![zone]);
        let mut server = ServerFuture::new(catalog);
        server.register_socket(udp);
        server.register_listener(tcp, Duration::from_secs(2));
        self.server = Some(server);
    }

    /// Stops answering: the port is closed.
    async fn stop(&mut self) {
        let mut server = self.server.take().expect("running");
        server.shutdown_gracefully().await.unwrap();
    }

    /// Answers again on the same port.
    async fn restart(&mut self) {
        let udp = UdpSocket::bind(self.address).await.unwrap();
        let tcp = TcpListener::bind(self.address).await.unwrap();
        self.serve(udp, tcp);
    }

    /// The zone publishes these ready pods, and `extra` SRV targets (host names) with
    /// their own A records, as a headless service would (everything else is replaced).
    async fn publish(&self, pods: &[usize], extra: &[(&str, Ipv4Addr)]) {
        let service = name(SERVICE);
        let targets = pods
            .iter()
            .map(|&i| (format!("web-{i}.{SERVICE}"), pod_ip(i)))
            .chain(extra.iter().map(|&(host, ip)| (host.to_owned(), ip)));
        let mut records = Vec::new();
        for (host, ip) in targets {
            records.push(Record::from_rdata(
                service.clone(),
                5,
                RData::SRV(SRV::new(0, 100, 8080, name(&host))),
            ));
            records.push(Record::from_rdata(name(&host), 5, RData::A(A(ip))));
            records.push(Record::from_rdata(service.clone(), 5, RData::A(A(ip))));
        }
        self.zone.records_mut().await.retain(|key, _| key.record_type == RecordType::SOA);
        for record in records {
            assert!(self.zone.upsert(record, 1).await);
        }
    }

    /// The zone publishes, for each `(zone, pods)`, a headless service
    /// `web-<zone>.<SERVICE>` with ready pods `web-<zone>-<i>` (a StatefulSet per zone);
    /// everything else is replaced. Pod `i` of the zone at position `z` is at
    /// [`zoned_pod_ip`]`(z, i)`.
    async fn publish_zones(&self, zones: &[(&str, &[usize])]) {
        let mut records = Vec::new();
        for (z, &(zone, pods)) in zones.iter().enumerate() {
            let service = name(&format!("web-{zone}.{SERVICE}"));
            for &i in pods {
                let host = name(&format!("web-{zone}-{i}.web-{zone}.{SERVICE}"));
                records.push(Record::from_rdata(
                    service.clone(),
                    5,
                    RData::SRV(SRV::new(0, 100, 8080, host.clone())),
                ));
                records.push(Record::from_rdata(host, 5, RData::A(A(zoned_pod_ip(z, i)))));
            }
        }
        self.zone.records_mut().await.retain(|key, _| key.record_type == RecordType::SOA);
        for record in records {
            assert!(self.zone.upsert(record, 1).await);
        }
    }

    fn config(&self) -> DnsConfig {
        self.tuned(DnsConfig::new(SERVICE, 50051))
    }

    /// `config` against this server, re-resolving every period, a lookup failing after
    /// [`LOOKUP_TIMEOUT`] (once: no second attempt).
    fn tuned(&self, config: DnsConfig) -> DnsConfig {
        config.nameservers([self.address]).period(PERIOD).timeout(LOOKUP_TIMEOUT, 1)
    }
}

/// The address of pod `i` of the zone at position `z` in [`ZoneServer::publish_zones`].
fn zoned_pod_ip(z: usize, i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 2 + z as u8, 0, i as u8 + 1)
}

/// Task addresses by index, `None` for a hole.
fn tasks(view: &JobView<String>) -> Vec<Option<String>> {
    (0..view.size).map(|i| view.serving_task(i).cloned()).collect()
}

/// The addresses pods `web-i` for `i` in `pods` are published at, holes elsewhere, up to
/// the largest.
fn expected(pods: &[usize], port: u16) -> Vec<Option<String>> {
    let size = pods.iter().max().map_or(0, |top| top + 1);
    (0..size).map(|i| pods.contains(&i).then(|| format!("{}:{port}", pod_ip(i)))).collect()
}

/// Waits (bounded) for the view to satisfy `done`; returns how long it took.
async fn until(discovery: &Discovery, done: impl Fn(&JobView<String>) -> bool) -> Duration {
    let start = Instant::now();
    let mut views = discovery.views();
    timeout(PATIENCE, views.wait_for(|v| done(v)))
        .await
        .unwrap_or_else(|_| {
            panic!("the view did not change in {PATIENCE:?}: {:?}", tasks(&discovery.current()))
        })
        .expect("the source is running");
    start.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statefulset_pods_are_numbered_by_ordinal_as_they_come_and_go() {
    let server = ZoneServer::start().await;
    server.publish(&[0, 1, 2], &[]).await;
    let counters = DnsCounters::default();
    let discovery = dns::discover(server.config().counters(counters.clone())).await.unwrap();
    assert_eq!(tasks(&discovery.current()), expected(&[0, 1, 2], 50051));

    let mut latencies = Vec::new();
    for (change, pods) in [
        ("web-3 added", &[0, 1, 2, 3][..]),
        ("web-1 removed: a hole", &[0, 2, 3][..]),
        ("web-3 removed: the job shrinks", &[0, 2][..]),
        ("web-1 back in its hole", &[0, 1, 2][..]),
    ] {
        server.publish(pods, &[]).await;
        let want = expected(pods, 50051);
        let took = until(&discovery, |v| tasks(v) == want).await;
        eprintln!("dns: {change}: in the view after {took:?} (period {PERIOD:?})");
        latencies.push(took);
    }
    let worst = latencies.iter().max().unwrap();
    assert!(*worst <= ONE_PERIOD_AND_A_RESOLUTION, "a change took {worst:?}");

    let counts = counters.snapshot();
    assert_eq!(counts.changes, 4, "one publication per change, none when nothing changed: {counts:?}");
    assert!(counts.resolutions >= 5, "{counts:?}");
    assert_eq!((counts.failures, counts.empty_answers, counts.skipped_records), (0, 0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_down_keeps_the_last_view_and_counts_failures_until_it_is_back() {
    let mut server = ZoneServer::start().await;
    server.publish(&[0, 1], &[]).await;
    let counters = DnsCounters::default();
    // A dead server fails a round fast rather than after the lookup timeout.
    let fast = server.config().timeout(Duration::from_millis(150), 1);
    let discovery = dns::discover(fast.counters(counters.clone())).await.unwrap();
    let before = discovery.current();

    server.stop().await;
    let failures = counters.snapshot().failures;
    let counted = holds_within(PATIENCE, || counters.snapshot().failures >= failures + 3).await;
    assert!(counted, "no failures counted: {:?}", counters.snapshot());
    assert_eq!(discovery.current(), before, "the last view stays while the server is down");
    assert_eq!(counters.snapshot().changes, 0);

    // A change made while the server is down flows once it answers again.
    server.publish(&[0, 1, 2], &[]).await;
    server.restart().await;
    let took = until(&discovery, |v| tasks(v) == expected(&[0, 1, 2], 50051)).await;
    eprintln!("dns: server back: the change in the view after {took:?}");
    assert_eq!(counters.snapshot().changes, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_answer_keeps_the_last_view_and_is_counted() {
    let server = ZoneServer::start().await;
    server.publish(&[0, 1], &[]).await;
    let counters = DnsCounters::default();
    let discovery = dns::discover(server.config().counters(counters.clone())).await.unwrap();
    server.publish(&[], &[]).await;
    let counted = holds_within(PATIENCE, || counters.snapshot().empty_answers >= 2).await;
    assert!(counted, "no empty answer counted: {:?}", counters.snapshot());
    assert_eq!(tasks(&discovery.current()), expected(&[0, 1], 50051));
    assert_eq!(counters.snapshot().failures, 0, "an empty answer is not a resolver failure");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sorted_addresses_number_tasks_in_address_order() {
    let server = ZoneServer::start().await;
    // Pods 0, 9 and 3 of a Deployment: no ordinals used, addresses 10.1.0.1, .10, .4.
    server.publish(&[0, 9, 3], &[]).await;
    let discovery = dns::discover(server.config().index_rule(IndexRule::SortedAddresses)).await.unwrap();
    let by_address =
        |ips: &[usize]| ips.iter().map(|&i| Some(format!("{}:50051", pod_ip(i)))).collect::<Vec<_>>();
    assert_eq!(tasks(&discovery.current()), by_address(&[0, 3, 9]));

    // 10.1.0.6 lands between .4 and .10: the task at index 2 is now another pod.
    server.publish(&[0, 9, 3, 5], &[]).await;
    let took = until(&discovery, |v| v.size == 4).await;
    eprintln!("dns: sorted addresses: a new address in the view after {took:?}");
    assert_eq!(tasks(&discovery.current()), by_address(&[0, 3, 5, 9]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_answers_are_capped_deduplicated_and_counted() {
    let server = ZoneServer::start().await;
    // 100 pods (an answer too large for UDP: it comes again over TCP), a second target
    // claiming ordinal 1, and a target with no ordinal.
    let pods: Vec<usize> = (0..100).collect();
    let impostor = format!("web-1.zz.{SERVICE}");
    let no_ordinal = format!("db.{SERVICE}");
    server
        .publish(&pods, &[(&impostor, Ipv4Addr::new(10, 9, 9, 9)), (&no_ordinal, Ipv4Addr::new(10, 9, 9, 8))])
        .await;
    let config = server.config();

    let counters = DnsCounters::default();
    let start = Instant::now();
    let discovery = dns::discover(config.clone().counters(counters.clone())).await.unwrap();
    eprintln!(
        "dns: one resolution of 102 SRV targets (UDP truncated, TCP, 101 A lookups): {:?}",
        start.elapsed()
    );
    assert_eq!(
        tasks(&discovery.current()),
        expected(&pods, 50051),
        "web-1.web... sorts before web-1.zz...: it keeps 1"
    );
    let counts = counters.snapshot();
    assert_eq!(
        (counts.duplicate_ordinals, counts.skipped_records, counts.capped_answers),
        (1, 1, 0),
        "{counts:?}"
    );

    // A cap of 64 records keeps the lowest ordinals: 0, 1, 1 again, 2..=62.
    let counters = DnsCounters::default();
    let discovery = dns::discover(config.max_tasks(64).counters(counters.clone())).await.unwrap();
    assert_eq!(tasks(&discovery.current()), expected(&pods[..63], 50051));
    let counts = counters.snapshot();
    assert_eq!(
        (counts.duplicate_ordinals, counts.skipped_records, counts.capped_answers),
        (1, 0, 1),
        "{counts:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_resolution_that_fails_or_finds_nothing_is_the_callers_error() {
    let mut server = ZoneServer::start().await;
    server.publish(&[0], &[]).await;
    let unknown = DnsConfig::new("api.ns.svc.cluster.local.", 80).nameservers([server.address]);
    assert!(matches!(dns::discover(unknown).await, Err(DnsError::NoTasks { .. })));
    let no_ordinals = server.config();
    server.publish(&[], &[("db.web.ns.svc.cluster.local.", Ipv4Addr::new(10, 9, 9, 8))]).await;
    assert!(matches!(dns::discover(no_ordinals).await, Err(DnsError::NoTasks { .. })));
    assert!(matches!(
        dns::discover(server.config().period(Duration::ZERO)).await,
        Err(DnsError::InvalidConfig { .. })
    ));
    let config = server.config();
    server.stop().await;
    let error = dns::discover(config).await.unwrap_err();
    assert!(matches!(error, DnsError::Resolve { .. }), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_name_per_zone_interleaves_the_zones_and_resizing_one_renumbers_nobody() {
    let server = ZoneServer::start().await;
    let labels = ["a", "b", "c"];
    server.publish_zones(&[("a", &[0, 1]), ("b", &[0, 1, 2]), ("c", &[0])]).await;
    let zones: Vec<(Zone, String)> = labels
        .iter()
        .map(|z| (Zone::new(&format!("zone-{z}")).unwrap(), format!("web-{z}.{SERVICE}")))
        .collect();
    let counters = DnsCounters::default();
    let discovery =
        dns::discover(server.tuned(DnsConfig::zoned(zones.clone(), 50051)).counters(counters.clone()))
            .await
            .unwrap();
    // Task o × 3 + p, at (zone p, o).
    let placed = |v: &JobView<String>| -> Vec<(usize, String, usize, String)> {
        v.tasks
            .iter()
            .map(|(&i, t)| {
                let l = t.locality.as_ref().expect("every task has a zone");
                (i, l.zone.to_string(), l.index, t.address.clone())
            })
            .collect()
    };
    let at = |i: usize, z: usize, o: usize| {
        (i, format!("zone-{}", labels[z]), o, format!("{}:50051", zoned_pod_ip(z, o)))
    };
    let first = discovery.current();
    assert_eq!(
        placed(&first),
        [at(0, 0, 0), at(1, 1, 0), at(2, 2, 0), at(3, 0, 1), at(4, 1, 1), at(7, 1, 2)]
    );
    assert_eq!(first.size, 8);
    let sizes = first.zone_sizes();
    assert_eq!((sizes.get(&zones[0].0), sizes.get(&zones[1].0), sizes.get(&zones[2].0)), (2, 3, 1));

    // Zone c grows to three pods and zone b loses pod 1: only their own tasks change.
    server.publish_zones(&[("a", &[0, 1]), ("b", &[0, 2]), ("c", &[0, 1, 2])]).await;
    let took = until(&discovery, |v| v.zone_sizes().get(&zones[2].0) == 3 && !v.tasks.contains_key(&4)).await;
    eprintln!("dns: a zone resized: in the view after {took:?} (period {PERIOD:?})");
    let after = discovery.current();
    for (i, task) in first.tasks.iter() {
        if *i != 4 {
            assert_eq!(after.tasks.get(i), Some(task), "task {i} moved");
        }
    }
    assert_eq!(
        placed(&after).into_iter().filter(|t| t.1 == "zone-c").collect::<Vec<_>>(),
        [at(2, 2, 0), at(5, 2, 1), at(8, 2, 2)]
    );

    // A zone whose name answers nothing keeps its last tasks (counted).
    server.publish_zones(&[("a", &[0, 1]), ("b", &[]), ("c", &[0, 1, 2])]).await;
    let empty_before = counters.snapshot().empty_answers;
    // Two rounds with zone b empty: the first one's view, if any, is published by then.
    let two_rounds = holds_within(PATIENCE, || counters.snapshot().empty_answers >= empty_before + 2).await;
    assert!(two_rounds, "zone b's empty answers are counted");
    assert_eq!(discovery.current(), after, "zone b kept its tasks");

    // A bad configuration is refused.
    let twice = DnsConfig::zoned([zones[0].clone(), zones[0].clone()], 50051);
    assert!(matches!(dns::discover(server.tuned(twice)).await, Err(DnsError::InvalidConfig { .. })));
    let by_address = DnsConfig::zoned(zones, 50051).index_rule(IndexRule::SortedAddresses);
    assert!(matches!(dns::discover(server.tuned(by_address)).await, Err(DnsError::InvalidConfig { .. })));
    let none = DnsConfig::zoned(Vec::<(Zone, String)>::new(), 50051);
    assert!(matches!(dns::discover(server.tuned(none)).await, Err(DnsError::InvalidConfig { .. })));
}
