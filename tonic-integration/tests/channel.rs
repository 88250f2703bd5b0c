//! The tonic channel and the assignment Watch RPC against real tonic servers on
//! 127.0.0.1. Every server and loop is bounded in count and time.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use steady_balance::{Assignment, Backoff, BalanceConfig, JobView, Slice, SliceKey, TaskState};
use steady_tonic::echo::echo_client::EchoClient;
use steady_tonic::echo::echo_server::{Echo, EchoServer};
use steady_tonic::echo::{EchoReply, EchoRequest};
use steady_tonic::{watch_assignments, Distributor, SteadyChannel, TaskEndpoint};
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Endpoint, Server};
use tonic::{Code, Request, Response, Status};

/// One backend task: answers with its index and records the slice keys it receives.
#[derive(Clone, Default)]
struct Backend {
    task: u32,
    requests: Arc<AtomicUsize>,
    keys: Arc<Mutex<Vec<String>>>,
}

#[tonic::async_trait]
impl Echo for Backend {
    async fn echo(&self, request: Request<EchoRequest>) -> Result<Response<EchoReply>, Status> {
        self.requests.fetch_add(1, Ordering::SeqCst);
        if let Some(key) = request.metadata().get("x-slice-key").and_then(|v| v.to_str().ok()) {
            self.keys.lock().unwrap().push(key.to_owned());
        }
        let payload = request.into_inner().payload;
        if payload.first() == Some(&b's') {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(Response::new(EchoReply { payload, task: self.task }))
    }
}

/// A running server; dropping it shuts it down.
struct Running {
    addr: SocketAddr,
    backend: Backend,
    _stop: oneshot::Sender<()>,
}

async fn serve<S>(service: S) -> (SocketAddr, oneshot::Sender<()>)
where
    S: tower::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
            Error = std::convert::Infallible,
        > + tonic::server::NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(Server::builder().add_service(service).serve_with_incoming_shutdown(
        TcpListenerStream::new(listener),
        async {
            let _ = stopped.await;
        },
    ));
    (addr, stop)
}

async fn start_backends(n: u32) -> Vec<Running> {
    let mut out = Vec::new();
    for task in 0..n {
        let backend = Backend { task, ..Backend::default() };
        let (addr, stop) = serve(EchoServer::new(backend.clone())).await;
        out.push(Running { addr, backend, _stop: stop });
    }
    out
}

fn endpoint(addr: SocketAddr) -> Endpoint {
    Endpoint::from_shared(format!("http://{addr}")).unwrap()
}

fn endpoints(backends: &[Running]) -> Vec<Endpoint> {
    backends.iter().map(|b| endpoint(b.addr)).collect()
}

async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let start = Instant::now();
    while !condition() {
        assert!(start.elapsed() < Duration::from_secs(10), "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn echo(
    client: &mut EchoClient<SteadyChannel>,
    key: Option<&str>,
    payload: &[u8],
) -> Result<u32, Status> {
    let mut request = Request::new(EchoRequest { payload: payload.to_vec() });
    if let Some(key) = key {
        request.metadata_mut().insert("x-slice-key", key.parse().unwrap());
    }
    Ok(client.echo(request).await?.into_inner().task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generated_client_talks_through_the_channel_to_its_subset() {
    let backends = start_backends(6).await;
    let channel = SteadyChannel::builder(BalanceConfig::new(4, 3)).from_endpoints(endpoints(&backends));
    let mut client = EchoClient::new(channel.clone());
    let subset = steady_subset::Subsetting::subset(&steady_subset::Rocksteadier::default(), 4, 6, 3).unwrap();
    for _ in 0..60 {
        let task = echo(&mut client, None, b"hi").await.unwrap();
        assert!(subset.contains(&(task as usize)), "{task} not in {subset:?}");
    }
    let served: Vec<usize> = backends.iter().map(|b| b.backend.requests.load(Ordering::SeqCst)).collect();
    assert_eq!(served.iter().sum::<usize>(), 60);
    assert!(subset.iter().all(|&t| served[t] > 0), "{served:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_endpoints_gives_unavailable_quickly() {
    let (_job, views) = watch::channel(JobView::<TaskEndpoint>::default());
    let config = BalanceConfig::new(0, 3).with_no_backend_wait(Duration::from_millis(100));
    let mut client = EchoClient::new(SteadyChannel::builder(config).from_job(views));
    let start = Instant::now();
    let status = echo(&mut client, None, b"x").await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(start.elapsed() < Duration::from_millis(600), "{:?}", start.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_requests_land_on_the_servers_their_pushed_assignment_names() {
    let backends = start_backends(6).await;
    let distributor = Distributor::new();
    let (distributor_addr, _stop) = serve(distributor.service()).await;
    let assignment = Assignment::new(
        1,
        vec![
            Slice { start: SliceKey(0), replicas: vec![5] },
            Slice { start: SliceKey(1 << 62), replicas: vec![1, 2] },
            Slice { start: SliceKey(1 << 63), replicas: vec![0] },
            Slice { start: SliceKey(3 << 62), replicas: vec![3, 4] },
        ],
    )
    .unwrap();
    assert!(distributor.publish("echo", assignment.clone()));
    let channel = SteadyChannel::builder(BalanceConfig::new(0, 2)).from_endpoints(endpoints(&backends));
    channel.follow_assignments(watch_assignments(endpoint(distributor_addr), "echo", Backoff::default()));
    eventually("the assignment", || channel.stats().assignment_generation == Some(1)).await;
    let mut client = EchoClient::new(channel.clone());
    for i in 0..200 {
        let key = format!("user-{i}");
        let task = echo(&mut client, Some(&key), b"k").await.unwrap();
        let replicas = &assignment.slice_for(SliceKey::of(&key)).replicas;
        assert!(replicas.contains(&task), "{key} served by {task}, assigned to {replicas:?}");
    }
    // The servers saw only their own keys.
    for b in &backends {
        for key in b.backend.keys.lock().unwrap().iter() {
            assert!(assignment.slice_for(SliceKey::of(key)).replicas.contains(&b.backend.task));
        }
    }
    // A key set in code, as a request extension, wins over metadata.
    let mut request = Request::new(EchoRequest { payload: b"e".to_vec() });
    request.extensions_mut().insert(SliceKey(1 << 63));
    request.metadata_mut().insert("x-slice-key", "user-1".parse().unwrap());
    assert_eq!(client.echo(request).await.unwrap().into_inner().task, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pushed_assignment_reaches_a_hundred_watchers() {
    let distributor = Distributor::new();
    let (addr, _stop) = serve(distributor.service()).await;
    let latest = Arc::new(AtomicUsize::new(0));
    let mut watchers = Vec::new();
    for _ in 0..100 {
        let latest = latest.clone();
        let stream = watch_assignments(endpoint(addr), "job", Backoff::default());
        watchers.push(tokio::spawn(async move {
            futures_util::pin_mut!(stream);
            while let Some(Ok(a)) = futures_util::StreamExt::next(&mut stream).await {
                if a.generation() == 2 {
                    latest.fetch_add(1, Ordering::SeqCst);
                    return;
                }
            }
        }));
    }
    eventually("100 watchers", || distributor.watchers("job") == 100).await;
    distributor.publish("job", Assignment::single(1, vec![0]).unwrap());
    distributor.publish("job", Assignment::single(2, vec![1]).unwrap());
    assert!(!distributor.publish("job", Assignment::single(2, vec![3]).unwrap()), "not newer");
    eventually("every watcher to see generation 2", || latest.load(Ordering::SeqCst) == 100).await;
    for w in watchers {
        w.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_keep_the_last_good_assignment_while_the_distributor_restarts() {
    let backends = start_backends(4).await;
    let distributor = Distributor::new();
    distributor.publish("echo", Assignment::single(1, vec![3]).unwrap());
    // The distributor listens on a port we can reuse after a restart.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let server =
        tokio::spawn(Server::builder().add_service(distributor.service()).serve_with_incoming_shutdown(
            TcpListenerStream::new(listener),
            async {
                let _ = stopped.await;
            },
        ));
    let channel = SteadyChannel::builder(BalanceConfig::new(0, 1)).from_endpoints(endpoints(&backends));
    let backoff = Backoff { base: Duration::from_millis(20), max: Duration::from_millis(100), jitter: 0.5 };
    channel.follow_assignments(watch_assignments(endpoint(addr), "echo", backoff));
    eventually("generation 1", || channel.stats().assignment_generation == Some(1)).await;
    let mut client = EchoClient::new(channel.clone());
    // The distributor goes away: keyed routing goes on with generation 1.
    distributor.close_watchers();
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), server).await.expect("server stops").unwrap().unwrap();
    for i in 0..20 {
        assert_eq!(echo(&mut client, Some(&format!("k{i}")), b"x").await.unwrap(), 3);
    }
    // It comes back on the same address with a newer assignment; the client reconnects.
    distributor.publish("echo", Assignment::single(2, vec![2]).unwrap());
    let listener = TcpListener::bind(addr).await.unwrap();
    let (_stop2, stopped2) = oneshot::channel::<()>();
    tokio::spawn(Server::builder().add_service(distributor.service()).serve_with_incoming_shutdown(
        TcpListenerStream::new(listener),
        async {
            let _ = stopped2.await;
        },
    ));
    eventually("generation 2", || channel.stats().assignment_generation == Some(2)).await;
    assert_eq!(echo(&mut client, Some("k1"), b"x").await.unwrap(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planned_removal_loses_no_request() {
    let backends = start_backends(4).await;
    let view = JobView::serving(endpoints(&backends).into_iter().map(TaskEndpoint));
    let (job, views) = watch::channel(view.clone());
    let channel = SteadyChannel::builder(BalanceConfig::new(0, 4)).from_job(views);
    eventually("four members", || channel.stats().members.len() == 4).await;
    let failures = Arc::new(AtomicUsize::new(0));
    let mut loops = Vec::new();
    for _ in 0..16 {
        let (mut client, failures) = (EchoClient::new(channel.clone()), failures.clone());
        loops.push(tokio::spawn(async move {
            for _ in 0..40 {
                if echo(&mut client, None, b"slow").await.is_err() {
                    failures.fetch_add(1, Ordering::SeqCst);
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    job.send_replace(view.with_state(1, TaskState::Draining));
    for l in loops {
        l.await.unwrap();
    }
    assert_eq!(failures.load(Ordering::SeqCst), 0);
    let s = channel.stats();
    assert!(s.members.iter().all(|m| m.task != 1));
    assert_eq!(s.connections_closed, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slicelets_count_no_misroutes_when_clients_follow_the_assignment() {
    use steady_tonic::Slicelet;
    let distributor = Distributor::new();
    let (distributor_addr, _stop_d) = serve(distributor.service()).await;
    let assignment = Assignment::new(
        1,
        vec![
            Slice { start: SliceKey(0), replicas: vec![0] },
            Slice { start: SliceKey(1 << 63), replicas: vec![1] },
        ],
    )
    .unwrap();
    distributor.publish("echo", assignment);
    // Two backends, each with a slicelet following the distributor.
    let mut addrs = Vec::new();
    let mut slicelets = Vec::new();
    let mut stops = Vec::new();
    for task in 0..2u32 {
        let slicelet = Slicelet::new(task);
        slicelet.follow(watch_assignments(endpoint(distributor_addr), "echo", Backoff::default()));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        addrs.push(listener.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(
            Server::builder()
                .layer(slicelet.layer())
                .add_service(EchoServer::new(Backend { task, ..Backend::default() }))
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                    let _ = stopped.await;
                }),
        );
        slicelets.push(slicelet);
        stops.push(stop);
    }
    eventually("the slicelets' assignment", || slicelets.iter().all(|s| s.generation() == Some(1))).await;
    assert_eq!(slicelets[0].held_slices(), [SliceKey(0)]);
    let eps: Vec<Endpoint> = addrs.iter().map(|a| endpoint(*a)).collect();
    // A client that follows the assignment: no misroutes.
    let following = SteadyChannel::builder(BalanceConfig::new(0, 2)).from_endpoints(eps.clone());
    following.follow_assignments(watch_assignments(endpoint(distributor_addr), "echo", Backoff::default()));
    eventually("the client's assignment", || following.stats().assignment_generation == Some(1)).await;
    let mut client = EchoClient::new(following);
    for i in 0..100 {
        echo(&mut client, Some(&format!("key-{i}")), b"x").await.unwrap();
    }
    let misrouted: u64 = slicelets.iter().map(Slicelet::misrouted).sum();
    assert_eq!(misrouted, 0);
    assert_eq!(slicelets.iter().map(Slicelet::keyed_requests).sum::<u64>(), 100);
    // A client that ignores assignments balances keyed requests over its subset: about
    // half land on the task that does not hold the key, and the slicelets see it.
    let mut blind = EchoClient::new(SteadyChannel::builder(BalanceConfig::new(0, 2)).from_endpoints(eps));
    for i in 0..100 {
        echo(&mut blind, Some(&format!("key-{i}")), b"x").await.unwrap();
    }
    let misrouted: u64 = slicelets.iter().map(Slicelet::misrouted).sum();
    assert!((20..=80).contains(&misrouted), "{misrouted} of 100 misrouted");
    drop(stops);
}
