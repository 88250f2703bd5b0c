//! A fleet instance killed under keyed load: three `steady-slicer --fleet` processes on a
//! real etcd serve job `users`, whose four backends (echo servers behind Slicelets) are
//! in the etcd registry and whose frontends route keyed requests by its assignment. The
//! instance leading `users` is killed (SIGKILL, no resignation); the test checks the
//! fleet's promise for that fault:
//!
//! * before it, every instance names the backends to A119 clients by the addresses they
//!   registered (not only the instance running the job's Assigner);
//! * another instance leads `users` within a bound (the target is the election's lease
//!   plus a second; the measured time is printed);
//! * no keyed request fails, through the kill, the takeover and a reassignment by the
//!   new leader (the control plane is not on the request path, and the new leader starts
//!   from the assignment in the store);
//! * a new generation (a backend drained in the registry) reaches a frontend that
//!   watches through a surviving instance that does not lead the job, and that frontend
//!   routes no key to the drained backend any more.
//!
//! Run it with the figures: `STEADY_REQUIRE_ETCD=1 cargo test -p steady-slicer-server
//! --test fleet_failover -- --nocapture`.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use steady_balance::BalanceConfig;
use steady_discovery::registry::{watch_job, Registration, Registry, RegistryConfig};
use steady_slice::{Assignment, SliceKey};
use steady_slicelet::{LoadReporter, Slicelet};
use steady_slicer::fleet::EtcdFleet;
use steady_slicer::specs::{EtcdSpecs, JobConfig, SpecStore, TaskSource};
use steady_slicer::spread::Spread;
use steady_slicer::store::{EtcdConfig, EtcdStore};
use steady_testing::echo::echo_client::EchoClient;
use steady_testing::echo::echo_server::EchoServer;
use steady_testing::echo::{EchoRequest, EchoTask};
use steady_testing::loopback::{Loopback, ServerGuard};
use steady_tonic::SteadyChannel;
use tokio::task::JoinHandle;
use tonic::transport::{Endpoint, Server};

mod a119_client;
mod fleet_instances;
use a119_client::a119_endpoints;
use fleet_instances::{until, Running};
/// The job under load, and the others the spread has to spread.
const JOB: &str = "users";
const OTHER_JOBS: usize = 5;
const INSTANCES: [&str; 3] = ["a", "b", "c"];
const BACKENDS: u32 = 4;
const FRONTENDS: usize = 4;
/// The leases of the fleet (its membership and every job's election) and of the registry.
const TTL: Duration = Duration::from_secs(2);
/// The bound on the takeover asserted: generous for a loaded two-core machine (the
/// target, the lease plus a second, is printed against the measure).
const TAKEOVER_BOUND: Duration = Duration::from_secs(15);
/// How long the load runs on after the takeover, at least.
const AFTER_TAKEOVER: Duration = Duration::from_secs(3);
/// The most any other wait may take.
const WAIT: Duration = Duration::from_secs(30);
/// A keyed request's deadline.
const DEADLINE: Duration = Duration::from_secs(2);
/// The pause between a frontend's requests.
const PACE: Duration = Duration::from_millis(10);
/// Distinct keys per frontend, hashed over the whole key space.
const KEYS: u64 = 1024;
/// The most request errors kept to print.
const ERRORS_KEPT: usize = 10;

/// Starts instance `name` of the fleet on etcd at `etcd` (loopback, port 0, 2 s lease).
fn start(name: &str, etcd: &str) -> Running {
    fleet_instances::start(
        name,
        &["--store", "etcd", "--endpoints", etcd, "--lease-ttl-secs", &TTL.as_secs().to_string()],
    )
}

fn job(name: &str, tasks: TaskSource) -> JobConfig {
    let mut config = JobConfig::new(name, tasks);
    config.cadence = Duration::from_millis(200);
    config.lease_ttl = TTL;
    config
}

/// A registry on a connection of its own, as on another machine.
async fn registry(etcd: &str) -> Registry {
    let config = RegistryConfig::new([etcd]).lease_ttl(TTL).request_timeout(Duration::from_secs(2));
    steady_testing::within(WAIT, "connecting to the registry", Registry::connect(config)).await.unwrap()
}

/// Every task an assignment names (replicas and warming ones).
fn named(assignment: &Assignment) -> BTreeSet<u32> {
    assignment.slices().iter().flat_map(|s| s.tasks().iter().copied()).collect()
}

/// The assignments of `JOB` through the one instance at `at`.
fn watch(at: Endpoint) -> impl futures_util::Stream<Item = Assignment> + Unpin {
    Box::pin(
        steady_tonic::watch_assignments(at, JOB, Default::default())
            .unwrap()
            .filter_map(|a| async { a.ok() }),
    )
}

/// The next assignment of `watch` that `wanted` accepts, within [`WAIT`].
async fn next_such(
    watch: &mut (impl futures_util::Stream<Item = Assignment> + Unpin),
    what: &str,
    wanted: impl Fn(&Assignment) -> bool,
) -> Assignment {
    steady_testing::within(WAIT, what, async {
        loop {
            let a = watch.next().await.expect("a watch ends only with its stream");
            if wanted(&a) {
                return a;
            }
        }
    })
    .await
}

struct Backend {
    slicelet: Slicelet,
    registration: Registration,
    _server: ServerGuard,
    _reporters: Vec<LoadReporter>,
}

/// Keyed requests the backends served for keys they did not hold (the default policy
/// serves them).
fn misrouted(backends: &[Backend]) -> u64 {
    backends.iter().map(|b| b.slicelet.misrouted()).sum()
}

/// Requests sent and failed by every frontend's load loop, and the first errors.
#[derive(Default)]
struct Load {
    sent: AtomicU64,
    failed: AtomicU64,
    running: AtomicBool,
    errors: Mutex<Vec<String>>,
}

impl Load {
    fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }
}

/// A frontend's keyed load: a request every [`PACE`], over [`KEYS`] keys of its own.
fn keyed_load(n: usize, channel: SteadyChannel, load: Arc<Load>) -> JoinHandle<()> {
    let mut client = EchoClient::new(channel);
    tokio::spawn(async move {
        let mut i = 0_u64;
        while load.running.load(Ordering::Relaxed) {
            let key = format!("user:{n}:{}", i % KEYS);
            let mut request = tonic::Request::new(EchoRequest { payload: key.clone().into_bytes() });
            request.metadata_mut().insert("x-slice-key", key.parse().unwrap());
            request.set_timeout(DEADLINE);
            load.sent.fetch_add(1, Ordering::Relaxed);
            let error = match tokio::time::timeout(DEADLINE, client.echo(request)).await {
                Ok(Ok(_)) => None,
                Ok(Err(status)) => Some(format!("{key}: {status}")),
                Err(_) => Some(format!("{key}: no answer within {DEADLINE:?}")),
            };
            if let Some(error) = error {
                load.failed.fetch_add(1, Ordering::Relaxed);
                let mut errors = load.errors.lock().unwrap();
                if errors.len() < ERRORS_KEPT {
                    errors.push(error);
                }
            }
            i += 1;
            tokio::time::sleep(PACE).await;
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_instance_s_job_is_led_elsewhere_with_no_failed_keyed_request() {
    let Some(etcd) = steady_testing::Etcd::start() else { return };
    let etcd_url = etcd.endpoint();
    let store = EtcdStore::connect(EtcdConfig::new([etcd_url.clone()])).await.unwrap();
    let specs = SpecStore::Etcd(EtcdSpecs::of(&store));
    let fleet = EtcdFleet::new(&store);
    specs.put(&job(JOB, TaskSource::Registry { endpoints: vec![etcd_url.clone()] })).await.unwrap();
    for n in 0..OTHER_JOBS {
        specs.put(&job(&format!("other-{n}"), TaskSource::Count(3))).await.unwrap();
    }

    // The backends' servers, registered in the registry before any instance runs.
    let (mut servers, mut registered) = (Vec::new(), Vec::new());
    for task in 0..BACKENDS {
        let slicelet = Slicelet::new(task);
        let server = Loopback::bind().await.serve_with({
            let layer = slicelet.layer();
            move |incoming, stopped| {
                Server::builder()
                    .layer(layer)
                    .add_service(EchoServer::new(EchoTask(task)))
                    .serve_with_incoming_shutdown(incoming, stopped)
            }
        });
        let address = server.addr().to_string();
        let registration = steady_testing::within(
            WAIT,
            "registering a backend",
            registry(&etcd_url).await.register(JOB, task as usize, &address),
        )
        .await
        .unwrap();
        assert_eq!(registration.index(), task as usize);
        registered.push(address);
        servers.push((slicelet, registration, server));
    }

    let mut instances: Vec<Running> = INSTANCES.iter().map(|n| start(n, &etcd_url)).collect();
    let endpoints: Vec<Endpoint> = instances.iter().map(Running::endpoint).collect();

    // Each Slicelet follows the assignment through every instance and reports its load
    // to every instance.
    let backends: Vec<Backend> = servers
        .into_iter()
        .map(|(slicelet, registration, server)| {
            let source =
                steady_proto::watch_assignments_any(endpoints.clone(), JOB, Default::default()).unwrap();
            // The follower runs until the test's runtime shuts down.
            drop(slicelet.follow(source));
            let reporters = endpoints
                .iter()
                .map(|at| slicelet.report_to(at.clone(), JOB, Duration::from_millis(250)))
                .collect();
            Backend { slicelet, registration, _server: server, _reporters: reporters }
        })
        .collect();

    // The frontends follow the registry's view of the job and its assignment through
    // every instance; one more per instance follows the assignment through that
    // instance alone (a watcher of one instance, which the test picks after the kill).
    let discovery =
        steady_testing::within(WAIT, "watching the job", watch_job(&registry(&etcd_url).await, JOB))
            .await
            .unwrap();
    let channel = |n: usize| {
        SteadyChannel::builder(BalanceConfig::new(n, BACKENDS as usize))
            .from_addresses(discovery.views())
            .unwrap()
    };
    let frontends: Vec<SteadyChannel> = (0..FRONTENDS)
        .map(|n| {
            let frontend = channel(n);
            frontend.follow_assignments(
                steady_proto::watch_assignments_any(endpoints.clone(), JOB, Default::default()).unwrap(),
            );
            frontend
        })
        .collect();
    let through_one: Vec<SteadyChannel> = endpoints
        .iter()
        .enumerate()
        .map(|(i, at)| {
            let frontend = channel(FRONTENDS + i);
            frontend.follow_assignments(
                steady_tonic::watch_assignments(at.clone(), JOB, Default::default()).unwrap(),
            );
            frontend
        })
        .collect();

    // Led, assigned over the four backends, and every frontend and backend routing or
    // serving by an assignment.
    // The instances start one after another, and a job moves as each joins: wait for
    // users to be led where the spread of the whole fleet puts it, with all three listed.
    let names: Vec<String> =
        std::iter::once(JOB.to_owned()).chain((0..OTHER_JOBS).map(|n| format!("other-{n}"))).collect();
    let spread = Spread::of(names.iter().map(String::as_str), INSTANCES);
    let owner = spread.owner(JOB).unwrap().to_owned();
    let led = until(WAIT, "users led by its owner in the spread of the three", async || {
        let listed = fleet.instances().await.unwrap().len() == INSTANCES.len();
        let leader = fleet.leader(JOB).await.unwrap();
        (listed && leader.as_deref() == Some(owner.as_str())).then_some(owner.clone())
    })
    .await;
    let all: BTreeSet<u32> = (0..BACKENDS).collect();
    let first = next_such(&mut watch(endpoints[0].clone()), "an assignment of the four backends", |a| {
        named(a) == all
    })
    .await
    .generation();
    until(WAIT, "every frontend and backend on an assignment of the four", async || {
        let frontends = frontends.iter().chain(&through_one).map(|f| f.balance().assignment_generation());
        let backends = backends.iter().map(|b| b.slicelet.generation());
        frontends.chain(backends).all(|g| g >= Some(first)).then_some(())
    })
    .await;
    // An A119 client gets the backends by the addresses they registered from any
    // instance, not only the one running the job's Assigner.
    for instance in &instances {
        let names = until(WAIT, "the instance to name the backends by their addresses", async || {
            let names = a119_endpoints(&instance.address, JOB).await.unwrap();
            (names == registered).then_some(names)
        })
        .await;
        assert_eq!(names.len(), BACKENDS as usize, "{}", instance.name);
    }

    let load = Arc::new(Load::default());
    load.running.store(true, Ordering::Relaxed);
    let loops: Vec<JoinHandle<()>> =
        frontends.iter().enumerate().map(|(n, f)| keyed_load(n, f.clone(), load.clone())).collect();
    until(WAIT, "keyed requests flowing", async || (load.sent() >= 200).then_some(())).await;
    let led_now = fleet.leader(JOB).await.unwrap();
    assert_eq!(led_now.as_ref(), Some(&led), "users changed leader before the kill");

    // The leader of users killed (SIGKILL: its leases run out; nothing resigns).
    let victim = instances.iter().position(|i| i.name == led).unwrap();
    let mut victim = instances.remove(victim);
    let (sent_at_kill, failed_at_kill) = (load.sent(), load.failed());
    let misrouted_at_kill = misrouted(&backends);
    let killed = Instant::now();
    victim.child.kill().unwrap();
    let new_leader = until(TAKEOVER_BOUND, "users led by another instance", async || {
        fleet.leader(JOB).await.unwrap().filter(|l| *l != led)
    })
    .await;
    let takeover = killed.elapsed();
    eprintln!(
        "{led} (leading {JOB}) killed: {new_leader} leads it {takeover:.2?} later (the target: the {TTL:?} lease \
         plus a second; asserted within {TAKEOVER_BOUND:?})"
    );
    assert!(instances.iter().any(|i| i.name == new_leader), "{new_leader} is not a surviving instance");

    // A new generation from the new leader (backend 3 drained in the registry) reaches a
    // frontend that watches through a surviving instance that does not lead the job.
    let survivor = instances.iter().find(|i| i.name != new_leader).expect("three instances, one killed");
    let (survivor_name, survivor_endpoint) = (survivor.name.clone(), survivor.endpoint());
    let probe = &through_one[INSTANCES.iter().position(|n| *n == survivor_name).unwrap()];
    let mut through_survivor = watch(survivor_endpoint);
    let misrouted_at_drain = misrouted(&backends);
    let drained = BACKENDS - 1;
    let drained_at = Instant::now();
    backends[drained as usize].registration.drain().await.unwrap();
    let without = next_such(&mut through_survivor, "an assignment without the drained backend", |a| {
        !named(a).contains(&drained)
    })
    .await;
    assert!(named(&without).len() == BACKENDS as usize - 1, "{:?}", named(&without));
    let generation = without.generation();
    assert!(generation > first);
    until(WAIT, "the new generation on the frontend watching the survivor", async || {
        (probe.balance().assignment_generation() >= Some(generation)).then_some(())
    })
    .await;
    let reached = drained_at.elapsed();
    // Routes no key to the drained backend: by its routing table, and by who answers.
    let mut balance = probe.balance().clone();
    let routed: BTreeSet<usize> = (0..4096_u32)
        .filter_map(|k| balance.route(Some(SliceKey::of(format!("probe:{k}").as_bytes()))))
        .collect();
    assert!(!routed.is_empty() && !routed.contains(&(drained as usize)), "routed to {routed:?}");
    let mut client = EchoClient::new(probe.clone());
    let mut answered = BTreeSet::new();
    for k in 0..256 {
        let key = format!("probe:{k}");
        let mut request = tonic::Request::new(EchoRequest { payload: key.clone().into_bytes() });
        request.metadata_mut().insert("x-slice-key", key.parse().unwrap());
        request.set_timeout(DEADLINE);
        let reply =
            client.echo(request).await.unwrap_or_else(|s| panic!("{key} through {survivor_name}: {s}"));
        answered.insert(reply.into_inner().task);
    }
    assert!(!answered.contains(&drained), "the drained backend answered: {answered:?}");
    eprintln!(
        "backend {drained} drained: generation {generation} (published by {new_leader}) reached the frontend \
         watching {survivor_name} {reached:.2?} later; its keys then answered by tasks {answered:?}"
    );

    // Every load frontend on the new generation too, and the load on for a while past
    // the takeover.
    until(WAIT, "every frontend on the new generation", async || {
        frontends.iter().all(|f| f.balance().assignment_generation() >= Some(generation)).then_some(())
    })
    .await;
    let sent_at_takeover = load.sent();
    until(WAIT, "the load past the takeover", async || {
        (killed.elapsed() >= takeover + AFTER_TAKEOVER && load.sent() >= sent_at_takeover + 200).then_some(())
    })
    .await;
    load.running.store(false, Ordering::Relaxed);
    for handle in loops {
        steady_testing::within(WAIT, "a load loop", handle).await.unwrap();
    }
    let (sent, failed) = (load.sent(), load.failed());
    let per_backend: Vec<u64> = backends.iter().map(|b| b.slicelet.misrouted()).collect();
    eprintln!(
        "keyed requests: {sent} sent, {failed} failed ({} sent and {} failed from the kill on); requests served \
         for keys the backend did not hold: {} up to the kill, {} from the kill to the drain, {per_backend:?} \
         per backend in all",
        sent - sent_at_kill,
        failed - failed_at_kill,
        misrouted_at_kill,
        misrouted_at_drain - misrouted_at_kill,
    );
    if failed > 0 {
        eprintln!("first errors: {:#?}", load.errors.lock().unwrap());
        for instance in instances.iter().chain([&victim]) {
            eprintln!("{} said: {:#?}", instance.name, instance.stderr.lock().unwrap());
        }
    }
    assert_eq!(failed, 0, "keyed requests failed (the control plane is not on the request path)");
    assert!(sent - sent_at_kill > 0, "the load ran on past the kill");
}
