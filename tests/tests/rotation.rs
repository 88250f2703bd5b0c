//! Every certificate rotated under load, on real TLS between real tonic servers and
//! clients on loopback: the control plane's (a Distributor and a load collector) and the
//! backends' serving certificates, the clients' identities (a frontend's channel, a
//! Slicelet's load reports), and every CA bundle, which gains the new CA and then drops
//! the old. Requests flow throughout and none fails; a Watch stream opened before the
//! rotation is still open after it and delivers the next generation; a client
//! presenting an old certificate is refused once the old CA is gone from the bundles.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use steady_balance::{BalanceConfig, JobView};
use steady_core::Backoff;
use steady_proto::assignment::assignment_distributor_client::AssignmentDistributorClient;
use steady_proto::assignment::WatchRequest;
use steady_proto::tls::rustls::server::danger::ClientCertVerifier;
use steady_proto::tls::{server_config, ClientAuth, ClientCas, ClientTlsSource, ServerIdentity, TlsIncoming};
use steady_slice::{Assignment, Slice, SliceKey};
use steady_slicelet::Slicelet;
use steady_slicer::load::{LoadBook, LoadCollector, ReporterNames};
use steady_slicer::Distributor;
use steady_testing::echo::echo_client::EchoClient;
use steady_testing::echo::echo_server::EchoServer;
use steady_testing::echo::{echo, RecordingEcho};
use steady_testing::proxy::FaultProxy;
use steady_testing::tls::{Leaf, TestPki};
use steady_tonic::{EndpointTemplate, SteadyChannel};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, Server};

/// How long any one change may take to show.
const WAIT: Duration = Duration::from_secs(15);

/// A server's replaceable TLS material, and the server (stopped when dropped).
struct Tls {
    identity: ServerIdentity,
    clients: ClientCas,
}

struct Served {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A task, aborted when dropped.
struct Aborting(JoinHandle<()>);

impl Drop for Aborting {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Tls {
    fn new(server: &Leaf, ca: &TestPki, auth: ClientAuth) -> Self {
        Self {
            identity: ServerIdentity::from_pem(server.cert_pem().as_bytes(), server.key_pem().as_bytes())
                .unwrap(),
            clients: ClientCas::from_pem(ca.ca_pem().as_bytes(), auth).unwrap(),
        }
    }

    async fn incoming(&self) -> (SocketAddr, TlsIncoming) {
        let verifier: Arc<dyn ClientCertVerifier> = Arc::new(self.clients.clone());
        let config = server_config(Arc::new(self.identity.clone()), Some(verifier)).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        (listener.local_addr().unwrap(), TlsIncoming::new(listener, config))
    }

    fn rotate_identity(&self, leaf: &Leaf) {
        self.identity.replace_pem(leaf.cert_pem().as_bytes(), leaf.key_pem().as_bytes()).unwrap();
    }
}

/// An echo backend for `task` over mutual TLS (client certificates required).
async fn backend(task: u32, tls: &Tls) -> (Served, RecordingEcho) {
    let echo = RecordingEcho { task, ..RecordingEcho::default() };
    let (addr, incoming) = tls.incoming().await;
    let router = Server::builder().add_service(EchoServer::new(echo.clone()));
    let task = tokio::spawn(async move {
        let _ = router.serve_with_incoming(incoming).await;
    });
    (Served { addr, task }, echo)
}

fn bundle(cas: &[&TestPki]) -> String {
    cas.iter().map(|ca| ca.ca_pem()).collect()
}

fn client_tls(cas: &[&TestPki], me: &Leaf) -> ClientTlsConfig {
    ClientTlsConfig::new()
        .ca_certificates(cas.iter().map(|ca| Certificate::from_pem(ca.ca_pem())))
        .identity(Identity::from_pem(me.cert_pem(), me.key_pem()))
}

fn assignment(generation: u64) -> Assignment {
    Assignment::new(
        generation,
        (0..4u64).map(|i| Slice::new(SliceKey(i << 62), vec![(i % 3) as u32])).collect(),
    )
    .unwrap()
}

/// Until `check` passes (polled every 50 ms), within [`WAIT`].
async fn until<F: std::future::Future<Output = bool>>(what: &str, mut check: impl FnMut() -> F) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One echo call on a fresh connection made with `template` (the frontend's, so its TLS
/// settings as they are now).
async fn fresh_call(template: &EndpointTemplate, addr: SocketAddr) -> Result<u32, String> {
    let channel = template.connect(&addr.to_string()).await.map_err(|e| e.to_string())?;
    echo(&mut EchoClient::new(channel), None, b"fresh").await.map_err(|s| s.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_certificate_rotates_under_load_with_no_failed_request_and_open_watches_kept() {
    let (old_ca, new_ca) = (TestPki::new("old CA"), TestPki::new("new CA"));

    // The control plane: Watch on one server, load reports on another whose connections
    // are recycled every second (so the Slicelet's reporter connects again and again).
    let control = Tls::new(&old_ca.issue(&["127.0.0.1"]), &old_ca, ClientAuth::Optional);
    let distributor = Distributor::new();
    distributor.publish("users", assignment(1));
    let (watch_addr, incoming) = control.incoming().await;
    let watch_server = Server::builder().add_service(distributor.service());
    let _watch_served = Served {
        addr: watch_addr,
        task: tokio::spawn(async move {
            let _ = watch_server.serve_with_incoming(incoming).await;
        }),
    };
    let book = LoadBook::new();
    book.published("users", assignment(1).into(), [0, 1, 2]);
    let collector =
        LoadCollector::new(book.clone()).authorize_reporters(ReporterNames::pattern("{job}-{task}").unwrap());
    let (reports_addr, incoming) = control.incoming().await;
    let reports_server = Server::builder()
        .max_connection_age(Duration::from_secs(1))
        .max_connection_age_grace(Duration::from_millis(100))
        .add_service(collector.service());
    let _reports_served = Served {
        addr: reports_addr,
        task: tokio::spawn(async move {
            let _ = reports_server.serve_with_incoming(incoming).await;
        }),
    };

    // Three backends over mutual TLS, and a frontend's channel over them.
    let backends_tls = Tls::new(&old_ca.issue(&["127.0.0.1"]), &old_ca, ClientAuth::Required);
    let mut backends = Vec::new();
    for task in 0..3 {
        backends.push(backend(task, &backends_tls).await);
    }
    let old_frontend = old_ca.issue(&["web-frontend"]);
    let frontend_tls = ClientTlsSource::new(client_tls(&[&old_ca], &old_frontend)).unwrap();
    let template =
        EndpointTemplate::new().tls_source(frontend_tls.clone()).connect_timeout(Duration::from_secs(5));
    let addresses: Vec<String> = backends.iter().map(|(s, _)| s.addr.to_string()).collect();
    let (view, views) = watch::channel(JobView::serving(addresses.clone()));
    let channel = SteadyChannel::builder(BalanceConfig::new(0, 4))
        .endpoint_template(template.clone())
        .from_addresses(views)
        .unwrap();

    // A Slicelet reporting task 1's load over mutual TLS.
    let old_reporter = old_ca.issue(&["users-1"]);
    let reporter_tls = ClientTlsSource::new(client_tls(&[&old_ca], &old_reporter)).unwrap();
    let slicelet = Slicelet::new(1);
    slicelet.set_assignment(assignment(1));
    let backoff = Backoff { base: Duration::from_millis(20), max: Duration::from_millis(200), jitter: 0.5 };
    let reporter = slicelet
        .report_to_tls(
            Endpoint::from_shared(format!("https://{reports_addr}")).unwrap(),
            reporter_tls.clone(),
            "users",
            Duration::from_millis(20),
            backoff,
        )
        .unwrap();

    // A watcher that connected before the rotation holds its stream throughout.
    let watch_endpoint = Endpoint::from_shared(format!("https://{watch_addr}"))
        .unwrap()
        .tls_config(client_tls(&[&old_ca], &old_frontend))
        .unwrap();
    let mut watcher = AssignmentDistributorClient::new(watch_endpoint.connect().await.unwrap());
    let request = WatchRequest { job: "users".into(), known_generation: 0 };
    let mut held = watcher.watch(request).await.unwrap().into_inner();
    assert_eq!(held.message().await.unwrap().unwrap().generation, 1);

    // Load: requests through the channel from four loops, and fresh connections made
    // with the frontend's template one after another; every one counted.
    let (sent, failed, fresh) =
        (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let errors = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut load = Vec::new();
    for _ in 0..4 {
        let (channel, sent, failed, errors, stop) =
            (channel.clone(), sent.clone(), failed.clone(), errors.clone(), stop.clone());
        load.push(tokio::spawn(async move {
            let mut client = EchoClient::new(channel);
            while !stop.load(Ordering::Relaxed) {
                match echo(&mut client, None, b"under rotation").await {
                    Ok(_) => sent.fetch_add(1, Ordering::Relaxed),
                    Err(status) => {
                        errors.lock().unwrap().push(status.to_string());
                        failed.fetch_add(1, Ordering::Relaxed)
                    }
                };
            }
        }));
    }
    {
        let (template, fresh, failed, errors, stop) =
            (template.clone(), fresh.clone(), failed.clone(), errors.clone(), stop.clone());
        let targets: Vec<SocketAddr> = backends.iter().map(|(s, _)| s.addr).collect();
        load.push(tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                match fresh_call(&template, targets[i % targets.len()]).await {
                    Ok(_) => fresh.fetch_add(1, Ordering::Relaxed),
                    Err(error) => {
                        errors.lock().unwrap().push(error);
                        failed.fetch_add(1, Ordering::Relaxed)
                    }
                };
                i += 1;
            }
        }));
    }
    // Waits until the load has made `n` more fresh connections (so every connection
    // made from here on was made after the step before).
    let settle = |n: u64| {
        let fresh = fresh.clone();
        async move {
            let from = fresh.load(Ordering::Relaxed);
            until("fresh connections under load", || {
                let fresh = fresh.clone();
                async move { fresh.load(Ordering::Relaxed) >= from + n }
            })
            .await;
        }
    };
    let accepted_from = |n: u64| {
        let book = book.clone();
        async move {
            let from = book.accepted();
            until("reports accepted", || {
                let book = book.clone();
                async move { book.accepted() >= from + n }
            })
            .await;
        }
    };
    // Waits until the reporter has opened a stream since now (on a connection made with
    // the identity in force now), and the collector has accepted reports since.
    let reopened = |reporter: &steady_slicelet::LoadReporter| {
        let from = reporter.streams_opened();
        move |r: &steady_slicelet::LoadReporter| r.streams_opened() > from
    };
    settle(5).await;
    accepted_from(3).await;

    // 1. Every bundle gains the new CA: the servers' client CAs and the clients' trust.
    let both = bundle(&[&old_ca, &new_ca]);
    control.clients.replace_pem(both.as_bytes()).unwrap();
    backends_tls.clients.replace_pem(both.as_bytes()).unwrap();
    frontend_tls.replace(client_tls(&[&old_ca, &new_ca], &old_frontend)).unwrap();
    reporter_tls.replace(client_tls(&[&old_ca, &new_ca], &old_reporter)).unwrap();
    settle(5).await;

    // 2. Every serving certificate moves to the new CA.
    control.rotate_identity(&new_ca.issue(&["127.0.0.1"]));
    backends_tls.rotate_identity(&new_ca.issue(&["127.0.0.1"]));
    settle(5).await;

    // 3. Every client identity moves to the new CA.
    let (new_frontend, new_reporter) = (new_ca.issue(&["web-frontend"]), new_ca.issue(&["users-1"]));
    frontend_tls.replace(client_tls(&[&old_ca, &new_ca], &new_frontend)).unwrap();
    reporter_tls.replace(client_tls(&[&old_ca, &new_ca], &new_reporter)).unwrap();
    settle(5).await;
    // The reporter's connections are recycled every second: wait for one made now.
    let since = reopened(&reporter);
    until("the reporter reconnected with its new identity", || std::future::ready(since(&reporter))).await;
    accepted_from(3).await;

    // 4. Every bundle drops the old CA.
    let new_only = bundle(&[&new_ca]);
    control.clients.replace_pem(new_only.as_bytes()).unwrap();
    backends_tls.clients.replace_pem(new_only.as_bytes()).unwrap();
    frontend_tls.replace(client_tls(&[&new_ca], &new_frontend)).unwrap();
    reporter_tls.replace(client_tls(&[&new_ca], &new_reporter)).unwrap();
    settle(5).await;
    // The reporter still gets its reports in, over connections made after the drop.
    let since = reopened(&reporter);
    until("the reporter reconnected after the old CA was dropped", || std::future::ready(since(&reporter)))
        .await;
    accepted_from(3).await;

    // A backend that joins now is reached by the channel with the new identity (a
    // connection made with the old one would be refused).
    let (joined, joined_echo) = backend(3, &backends_tls).await;
    let mut grown = addresses.clone();
    grown.push(joined.addr.to_string());
    view.send_replace(JobView::serving(grown));
    until("the joined backend served", || {
        let joined_echo = joined_echo.clone();
        async move { joined_echo.requests.load(Ordering::SeqCst) > 0 }
    })
    .await;

    stop.store(true, Ordering::Relaxed);
    for task in load {
        task.await.unwrap();
    }
    let errors = errors.lock().unwrap().clone();
    assert_eq!(failed.load(Ordering::Relaxed), 0, "requests failed under rotation: {errors:?}");
    let (sent, fresh) = (sent.load(Ordering::Relaxed), fresh.load(Ordering::Relaxed));
    assert!(sent >= 100 && fresh >= 25, "sent {sent}, fresh connections {fresh}");
    assert_eq!(collector.refused(), 0, "no report was refused");

    // The Watch stream opened before the rotation is still open, and delivers.
    distributor.publish("users", assignment(2));
    let next = tokio::time::timeout(WAIT, held.message()).await.unwrap().unwrap().unwrap();
    assert_eq!(next.generation, 2);

    // The old certificate is refused now, by the control plane and by the backends.
    let old_identity = EndpointTemplate::new().tls(client_tls(&[&new_ca], &old_frontend));
    let refused = fresh_call(&old_identity, backends[0].0.addr).await;
    assert!(refused.is_err(), "a backend took the old certificate");
    let old_watch = Endpoint::from_shared(format!("https://{watch_addr}"))
        .unwrap()
        .tls_config(client_tls(&[&new_ca], &old_frontend))
        .unwrap();
    let refused = match old_watch.connect().await {
        Err(_) => true,
        Ok(channel) => AssignmentDistributorClient::new(channel)
            .watch(WatchRequest { job: "users".into(), known_generation: 0 })
            .await
            .is_err(),
    };
    assert!(refused, "the control plane took the old certificate");
    eprintln!("rotation under load: {sent} requests and {fresh} fresh connections, 0 failed");
}

/// A watcher given its TLS settings through a `ClientTlsSource` (`WatchEndpoint::tls`)
/// presents the identity in force at each connection: once the control plane's bundle
/// drops its CA, its reconnections are refused until the source holds a certificate of
/// the new CA, and then it is back on the stream and gets the next generation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_presents_a_replaced_client_identity_when_it_reconnects() {
    let (old_ca, new_ca) = (TestPki::new("old CA"), TestPki::new("new CA"));
    let control = Tls::new(&old_ca.issue(&["127.0.0.1"]), &old_ca, ClientAuth::Required);
    let distributor = Distributor::new();
    distributor.publish("users", assignment(1));
    let (addr, incoming) = control.incoming().await;
    let handshakes = incoming.counter();
    let server = Server::builder().add_service(distributor.service());
    let _served = Served {
        addr,
        task: tokio::spawn(async move {
            let _ = server.serve_with_incoming(incoming).await;
        }),
    };
    // The watch goes through a proxy that can break its connection.
    let proxy = FaultProxy::start(addr).await;

    let source = ClientTlsSource::new(client_tls(&[&old_ca], &old_ca.issue(&["web-frontend"]))).unwrap();
    let target =
        steady_proto::WatchEndpoint::new(Endpoint::from_shared(format!("https://{}", proxy.addr())).unwrap())
            .tls(source.clone());
    let backoff = Backoff { base: Duration::from_millis(20), max: Duration::from_millis(100), jitter: 0.5 };
    // Polled throughout (a stream does nothing between polls), its assignments passed on.
    let mut watch = Box::pin(steady_proto::watch_assignments(target, "users", backoff).unwrap());
    let (passed, mut assignments) = tokio::sync::mpsc::unbounded_channel();
    let _polled = Aborting(tokio::spawn(async move {
        while let Some(item) = tokio_stream::StreamExt::next(&mut watch).await {
            let _ = passed.send(item.unwrap());
        }
    }));
    let first = tokio::time::timeout(WAIT, assignments.recv()).await.unwrap().unwrap();
    assert_eq!(first.generation(), 1);

    // The old CA leaves the bundle and the connection breaks: the watch's next
    // connection, with the old certificate, is refused.
    control.clients.replace_pem(new_ca.ca_pem().as_bytes()).unwrap();
    let refused = handshakes().failed;
    proxy.cut();
    until("the watch's connection closed", || {
        let open = proxy.counts().open;
        async move { open == 0 }
    })
    .await;
    proxy.restore();
    until("a reconnection refused", || {
        let failed = handshakes().failed;
        async move { failed > refused }
    })
    .await;
    distributor.publish("users", assignment(2));

    // A certificate of the new CA in the source: the next connection presents it.
    source.replace(client_tls(&[&old_ca], &new_ca.issue(&["web-frontend"]))).unwrap();
    let second = tokio::time::timeout(WAIT, assignments.recv()).await.unwrap().unwrap();
    assert_eq!(second.generation(), 2);
}
