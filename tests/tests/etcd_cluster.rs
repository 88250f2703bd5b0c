//! The control plane on a three-member etcd cluster (`steady_testing::EtcdCluster`, real
//! `etcd` processes on 127.0.0.1), as production runs it: the store, the Assigner's
//! election, the registry and the frontends' identities, under keyed load, through the
//! faults a cluster has that a single member cannot show:
//!
//! * the leader member killed (the others elect a new leader) and restarted;
//! * a follower stopped (cut off from the others and from clients) and back;
//! * the whole cluster killed and restarted on its data.
//!
//! Each phase measures what an operator cares about and prints it to stderr: requests
//! that failed, the time from the fault until a new generation (triggered by draining or
//! undraining a backend in the registry) reaches every frontend, identities that moved
//! (frontends' and backends' registry indices; the goal is none), and the time until
//! every lease is confirmed again. Run it with the figures:
//!
//! ```text
//! STEADY_REQUIRE_ETCD=1 cargo test -p steady-tests --test etcd_cluster -- --nocapture
//! ```

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use steady_assigner::by_name;
use steady_balance::BalanceConfig;
use steady_discovery::registry::{watch_job, Registration, Registry, RegistryConfig};
use steady_discovery::Discovery;
use steady_slicelet::{LoadReporter, Slicelet};
use steady_slicer::assigner_service::{follow_job, AssignerConfig, AssignerHandle, AssignerService};
use steady_slicer::load::{LoadBook, LoadCollector};
use steady_slicer::store::{EtcdConfig, EtcdStore};
use steady_slicer::Distributor;
use steady_testing::echo::echo_client::EchoClient;
use steady_testing::echo::echo_server::EchoServer;
use steady_testing::echo::{EchoRequest, EchoTask};
use steady_testing::loopback::{endpoint, Loopback, ServerGuard};
use steady_testing::{within, EtcdCluster};
use steady_tonic::SteadyChannel;
use tokio::task::JoinHandle;
use tonic::transport::{Endpoint, Server};

/// The backend job the Assigner shards, and the frontends' job.
const JOB: &str = "users";
const FRONTEND_JOB: &str = "web";
const BACKENDS: usize = 4;
const FRONTENDS: usize = 6;
/// The leases of the registry and of the Assigner's election: etcd's minimum.
const TTL: Duration = Duration::from_secs(2);
/// The most any one step may take.
const WAIT: Duration = Duration::from_secs(30);
/// A keyed request's deadline.
const DEADLINE: Duration = Duration::from_secs(2);
/// The pause between a frontend's requests.
const PACE: Duration = Duration::from_millis(10);

fn registry_config(etcd: &EtcdCluster) -> RegistryConfig {
    RegistryConfig::new(etcd.endpoints()).lease_ttl(TTL).request_timeout(Duration::from_secs(2))
}

/// A registry on a connection of its own, as on another machine.
async fn registry(etcd: &EtcdCluster) -> Registry {
    within(WAIT, "connecting to the registry", Registry::connect(registry_config(etcd))).await.unwrap()
}

struct Backend {
    slicelet: Slicelet,
    registration: Registration,
    _server: ServerGuard,
    follow: JoinHandle<()>,
    _reporter: LoadReporter,
}

struct Frontend {
    channel: SteadyChannel,
    registration: Registration,
}

/// Requests sent and failed by every frontend's load loop.
#[derive(Default)]
struct Load {
    sent: AtomicU64,
    failed: AtomicU64,
    running: AtomicBool,
}

struct Fleet {
    /// `None` only while a fault runs on a blocking thread.
    etcd: Option<EtcdCluster>,
    distributor: Distributor,
    assigners: Vec<AssignerHandle>,
    backends: Vec<Backend>,
    frontends: Vec<Frontend>,
    load: Arc<Load>,
    loops: Vec<JoinHandle<()>>,
    _control: ServerGuard,
    _discovery: Discovery,
}

impl Fleet {
    async fn start(etcd: EtcdCluster) -> Self {
        // The control plane: a Distributor and a load collector on one address.
        let distributor = Distributor::new();
        let book = LoadBook::new();
        let collector = LoadCollector::new(book.clone());
        let port = Loopback::bind().await;
        let control = endpoint(port.addr());
        let (served, collected) = (distributor.service(), collector.service());
        let control_guard = port.serve_with(|incoming, stopped| {
            Server::builder()
                .add_service(served)
                .add_service(collected)
                .serve_with_incoming_shutdown(incoming, stopped)
        });

        // The backends: echo servers behind Slicelets that follow the Distributor and
        // report their load, each registered in the registry at its index.
        let mut backends = Vec::new();
        let mut addresses: Vec<SocketAddr> = Vec::new();
        for task in 0..BACKENDS {
            let slicelet = Slicelet::new(task as u32);
            let server = Loopback::bind().await.serve_with({
                let layer = slicelet.layer();
                move |incoming, stopped| {
                    Server::builder()
                        .layer(layer)
                        .add_service(EchoServer::new(EchoTask(task as u32)))
                        .serve_with_incoming_shutdown(incoming, stopped)
                }
            });
            let registration = within(
                WAIT,
                "registering a backend",
                registry(&etcd).await.register(JOB, task, &server.addr().to_string()),
            )
            .await
            .unwrap();
            let source = steady_tonic::watch_assignments(control.clone(), JOB, Default::default()).unwrap();
            let follow = slicelet.follow(source);
            let reporter = slicelet.report_to(control.clone(), JOB, Duration::from_millis(250));
            addresses.push(server.addr());
            backends.push(Backend { slicelet, registration, _server: server, follow, _reporter: reporter });
        }

        // The Assigner follows the backends in the registry, and a standby waits for its
        // lease on a connection of its own.
        let discovery =
            within(WAIT, "watching the job", watch_job(&registry(&etcd).await, JOB)).await.unwrap();
        let tasks = follow_job(discovery.views());
        let mut assigners = Vec::new();
        for candidate in ["a", "b"] {
            let config =
                EtcdConfig::new(etcd.endpoints()).lease_ttl(TTL).request_timeout(Duration::from_secs(2));
            let store = within(WAIT, "connecting the store", EtcdStore::connect(config)).await.unwrap();
            let service = AssignerService::new(
                JOB,
                candidate,
                Arc::from(by_name("weighted-move").unwrap()),
                Arc::new(store),
                distributor.clone(),
                book.clone(),
            )
            .config(AssignerConfig {
                cadence: Duration::from_millis(500),
                min_interval: Duration::from_millis(50),
                backoff: Duration::from_millis(100),
                ..AssignerConfig::default()
            })
            .unwrap();
            assigners.push(service.spawn(tasks.clone()));
        }

        // The frontends: each claims its index in the registry and routes by key over
        // the backends, following the Distributor.
        let mut frontends = Vec::new();
        for n in 0..FRONTENDS {
            let registration = within(
                WAIT,
                "a frontend's claim",
                registry(&etcd).await.claim(FRONTEND_JOB, &format!("web-host-{n}")),
            )
            .await
            .unwrap();
            let channel = SteadyChannel::builder(BalanceConfig::new(registration.index(), BACKENDS))
                .from_endpoints(addresses.iter().map(|&a| endpoint(a)).collect::<Vec<Endpoint>>())
                .unwrap();
            channel.follow_assignments(
                steady_tonic::watch_assignments(control.clone(), JOB, Default::default()).unwrap(),
            );
            frontends.push(Frontend { channel, registration });
        }
        Self {
            etcd: Some(etcd),
            distributor,
            assigners,
            backends,
            frontends,
            load: Arc::default(),
            loops: Vec::new(),
            _control: control_guard,
            _discovery: discovery,
        }
    }

    /// The newest generation the Distributor holds.
    fn generation(&self) -> u64 {
        self.distributor.current(JOB).map_or(0, |a| a.generation())
    }

    /// Waits until a generation newer than `than` reaches every frontend and every
    /// backend; returns it.
    async fn newer_everywhere(&self, than: u64) -> u64 {
        within(WAIT, "a newer generation on every frontend and backend", async {
            loop {
                let newest = self.generation();
                if newest > than
                    && self
                        .frontends
                        .iter()
                        .all(|f| f.channel.balance().assignment_generation() >= Some(newest))
                    && self.backends.iter().all(|b| b.slicelet.generation() >= Some(newest))
                {
                    return newest;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
    }

    /// Starts every frontend's keyed load: a request every [`PACE`], each for its own key.
    fn start_load(&mut self) {
        self.load.running.store(true, Ordering::Relaxed);
        for (n, frontend) in self.frontends.iter().enumerate() {
            let (load, mut client) = (self.load.clone(), EchoClient::new(frontend.channel.clone()));
            self.loops.push(tokio::spawn(async move {
                let mut i = 0_u64;
                while load.running.load(Ordering::Relaxed) {
                    let key = format!("user:{n}:{}", i % 64);
                    let mut request = tonic::Request::new(EchoRequest { payload: key.clone().into_bytes() });
                    request.metadata_mut().insert("x-slice-key", key.parse().unwrap());
                    request.set_timeout(DEADLINE);
                    load.sent.fetch_add(1, Ordering::Relaxed);
                    if tokio::time::timeout(DEADLINE, client.echo(request)).await.map_or(true, |r| r.is_err())
                    {
                        load.failed.fetch_add(1, Ordering::Relaxed);
                    }
                    i += 1;
                    tokio::time::sleep(PACE).await;
                }
            }));
        }
    }

    /// Every registration (backends' and frontends'): its key, index and lease.
    fn identities(&self) -> Vec<(String, usize, i64)> {
        let backends = self.backends.iter().map(|b| &b.registration);
        let frontends = self.frontends.iter().map(|f| &f.registration);
        backends.chain(frontends).map(|r| (r.key().to_owned(), r.index(), r.lease_id())).collect()
    }

    /// Waits until every registration is held and confirmed (a renewal answered within
    /// the TTL, after the fault) and etcd's key at its index is attached to its lease.
    async fn every_lease_confirmed(&self, raw: &mut etcd_client::Client) {
        let registrations: Vec<&Registration> = self
            .backends
            .iter()
            .map(|b| &b.registration)
            .chain(self.frontends.iter().map(|f| &f.registration))
            .collect();
        within(WAIT, "every lease confirmed", async {
            loop {
                let confirmed = registrations.iter().all(|r| r.is_held() && r.is_confirmed());
                if confirmed && keys_attached(raw, &registrations).await {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
    }

    /// Runs `step` (killing or starting members blocks while it waits for their health)
    /// on a blocking thread, with the cluster.
    async fn on_cluster(&mut self, step: impl FnOnce(&mut EtcdCluster) + Send + 'static) {
        let mut etcd = self.etcd.take().expect("one step at a time");
        let etcd = tokio::task::spawn_blocking(move || {
            step(&mut etcd);
            etcd
        });
        self.etcd = Some(within(WAIT, "a step on the cluster", etcd).await.unwrap());
    }

    /// One phase: `fault` runs; backend 3 is drained (or undrained) to make the Assigner
    /// publish, while the fault lasts; then `heal` runs, and the figures are taken and
    /// checked: requests failed, the time from the fault until the new generation is on
    /// every frontend and backend, identities moved, and the time from the fault until
    /// every lease is confirmed again.
    async fn phase(
        &mut self,
        name: &str,
        raw: &mut etcd_client::Client,
        fault: impl FnOnce(&mut EtcdCluster) + Send + 'static,
        heal: impl FnOnce(&mut EtcdCluster) + Send + 'static,
    ) {
        let (sent, failed) =
            (self.load.sent.load(Ordering::Relaxed), self.load.failed.load(Ordering::Relaxed));
        let before = self.generation();
        let identities = self.identities();
        let started = Instant::now();
        self.on_cluster(fault).await;
        // The trigger goes through etcd too: retried while the cluster elects a leader.
        let backend = &self.backends[BACKENDS - 1].registration;
        let drain = backend.state() == steady_core::TaskState::Serving;
        within(WAIT, "draining or undraining backend 3", async {
            loop {
                let written = if drain { backend.drain().await } else { backend.undrain().await };
                match written {
                    Ok(()) => return,
                    Err(error) => {
                        eprintln!("{name}: the trigger is retried: {error}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        })
        .await;
        let generation = self.newer_everywhere(before).await;
        let next_generation = started.elapsed();
        self.on_cluster(heal).await;
        self.every_lease_confirmed(raw).await;
        let confirmed = started.elapsed();
        let moved: Vec<_> = identities
            .iter()
            .zip(self.identities())
            .filter(|(old, new)| old.1 != new.1 || old.2 != new.2)
            .map(|(old, new)| (old.0.clone(), old.1, new.1))
            .collect();
        let sent = self.load.sent.load(Ordering::Relaxed) - sent;
        let failed = self.load.failed.load(Ordering::Relaxed) - failed;
        let terms: Vec<u64> = self.assigners.iter().map(|a| a.stats().terms()).collect();
        eprintln!(
            "{name}: generation {before} -> {generation} on every frontend and backend {next_generation:?} \
             after the fault; every lease confirmed {confirmed:?} after it; identities moved: {}; \
             requests failed: {failed} of {sent}; Assigner terms so far (a, b): {terms:?}",
            moved.len()
        );
        assert_eq!(failed, 0, "{name}: keyed requests failed (etcd is not on the request path)");
        assert!(sent > 0, "{name}: the load stopped");
        assert!(moved.is_empty(), "{name}: identities moved (key, before, after): {moved:?}");
        let backend = &self.backends[BACKENDS - 1].registration;
        assert_eq!(backend.state() == steady_core::TaskState::Draining, drain);
    }
}

/// Whether etcd's key of every registration is attached to its lease (etcd deletes a
/// key when its lease ends, so the lease was alive at this read).
async fn keys_attached(raw: &mut etcd_client::Client, registrations: &[&Registration]) -> bool {
    for registration in registrations {
        let Ok(response) = raw.get(registration.key(), None).await else { return false };
        if response.kvs().first().map(|kv| kv.lease()) != Some(registration.lease_id()) {
            return false;
        }
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_load_identities_and_the_assigner_ride_through_member_faults_of_a_three_member_cluster() {
    let Some(etcd) = EtcdCluster::start() else { return };
    let mut raw =
        within(WAIT, "connecting", etcd_client::Client::connect(etcd.endpoints(), None)).await.unwrap();
    let mut fleet = Fleet::start(etcd).await;
    let first = fleet.newer_everywhere(0).await;
    assert!(first >= 1);
    fleet.start_load();
    within(WAIT, "the load flowing", async {
        while fleet.load.sent.load(Ordering::Relaxed) < 50 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;

    fleet
        .phase(
            "leader member killed (a generation published on the other two), then restarted",
            &mut raw,
            |etcd| {
                let leader = etcd.wait_for_leader();
                etcd.kill(leader);
                assert_ne!(etcd.wait_for_leader(), leader);
            },
            |etcd| {
                let down = (0..etcd.len()).find(|&m| !etcd.is_healthy(m)).expect("the killed member");
                etcd.restart(down);
            },
        )
        .await;
    fleet
        .phase(
            "a follower stopped (a generation published meanwhile) and back",
            &mut raw,
            |etcd| {
                let leader = etcd.wait_for_leader();
                let follower = (leader + 1) % etcd.len();
                etcd.kill(follower);
                assert!(!etcd.is_healthy(follower));
                assert!(etcd.is_healthy(leader), "two of three keep quorum");
            },
            |etcd| {
                let down = (0..etcd.len()).find(|&m| !etcd.is_healthy(m)).expect("the stopped member");
                etcd.restart(down);
            },
        )
        .await;
    fleet
        .phase(
            "the whole cluster down for three lease TTLs and restarted",
            &mut raw,
            |etcd| {
                etcd.kill_all();
                assert_eq!(etcd.leader(), None);
                // The outage itself lasts three TTLs, whatever the clients do.
                std::thread::sleep(3 * TTL);
                etcd.restart_all();
            },
            |_| {},
        )
        .await;

    fleet.load.running.store(false, Ordering::Relaxed);
    for handle in fleet.loops.drain(..) {
        within(WAIT, "a load loop", handle).await.unwrap();
    }
    for assigner in fleet.assigners.drain(..) {
        assigner.stop().await;
    }
    for backend in &fleet.backends {
        backend.follow.abort();
    }
}
