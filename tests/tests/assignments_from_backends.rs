//! Assignments served by every backend: Slicelets re-serve the assignment they hold
//! (`Slicelet::assignment_service`), and frontends that watch the distributor and the
//! backends (`watch_assignments_any`) keep receiving every new generation, and new
//! frontends start, while the distributor they know is down — on real tonic servers on
//! 127.0.0.1, under keyed load, with no failed request.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use steady_balance::BalanceConfig;
use steady_core::Backoff;
use steady_proto::{watch_assignments, watch_assignments_any};
use steady_slice::{Assignment, Slice, SliceKey};
use steady_slicelet::Slicelet;
use steady_slicer::Distributor;
use steady_testing::echo::echo_client::EchoClient;
use steady_testing::echo::echo_server::EchoServer;
use steady_testing::echo::{EchoRequest, EchoTask};
use steady_testing::loopback::{endpoint, serve, Loopback, ServerGuard};
use steady_testing::{eventually, holds_within, wait::PATIENCE};
use steady_tonic::SteadyChannel;
use tonic::transport::{Endpoint, Server};

const JOB: &str = "users";
const BACKENDS: u32 = 3;

fn fast() -> Backoff {
    Backoff { base: Duration::from_millis(20), max: Duration::from_millis(200), jitter: 0.5 }
}

/// Generation `g`: 12 slices, slice `i` on task `(i + g) % 3`.
fn generation(g: u64) -> Assignment {
    let slices =
        (0..12u64).map(|i| Slice::new(SliceKey(i * (u64::MAX / 12)), vec![((i + g) % 3) as u32])).collect();
    Assignment::new(g, slices).unwrap()
}

async fn serve_distributor(distributor: &Distributor) -> (SocketAddr, ServerGuard) {
    serve(distributor.service()).await
}

/// Backend `task`: echo behind its Slicelet's layer, and the Slicelet's Watch service
/// (until the runtime ends).
async fn serve_backend(task: u32, slicelet: &Slicelet) -> SocketAddr {
    Loopback::bind()
        .await
        .serve_with(|incoming, stopped| {
            Server::builder()
                .layer(slicelet.layer())
                .add_service(EchoServer::new(EchoTask(task)))
                .add_service(slicelet.assignment_service(JOB).into_server())
                .serve_with_incoming_shutdown(incoming, stopped)
        })
        .detach()
}

/// A frontend over the backends that watches `sources`.
fn frontend(backends: &[SocketAddr], sources: Vec<Endpoint>) -> SteadyChannel {
    let channel = SteadyChannel::builder(BalanceConfig::new(0, backends.len()))
        .from_endpoints(backends.iter().map(|&a| endpoint(a)).collect())
        .unwrap();
    channel.follow_assignments(watch_assignments_any(sources, JOB, fast()).unwrap());
    channel
}

async fn wait_for_generation(channel: &SteadyChannel, g: u64, what: &str) {
    let what = format!("{what}: generation {g}");
    eventually(&what, || channel.stats().assignment_generation >= Some(g)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frontends_keep_up_through_the_backends_while_their_distributor_is_down() {
    // The distributor frontends know, and the control plane's own that backends follow
    // (as a standby control-plane instance's would be).
    let (front, back) = (Distributor::new(), Distributor::new());
    let (front_addr, stop_front) = serve_distributor(&front).await;
    let (back_addr, _stop_back) = serve_distributor(&back).await;
    let publish = |g: u64| {
        front.publish(JOB, generation(g));
        back.publish(JOB, generation(g));
    };
    publish(1);
    let mut slicelets = Vec::new();
    let mut backends = Vec::new();
    for task in 0..BACKENDS {
        let slicelet = Slicelet::new(task);
        slicelet.follow(watch_assignments(endpoint(back_addr), JOB, fast()).unwrap());
        backends.push(serve_backend(task, &slicelet).await);
        slicelets.push(slicelet);
    }
    let sources = |with_front: bool| {
        with_front.then(|| endpoint(front_addr)).into_iter().chain(backends.iter().map(|&a| endpoint(a)))
    };
    let channel = frontend(&backends, sources(true).collect());
    wait_for_generation(&channel, 1, "the first frontend").await;

    // Keyed load throughout.
    let (stop, failed, sent) =
        (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let load = {
        let (channel, stop, failed, sent) = (channel.clone(), stop.clone(), failed.clone(), sent.clone());
        tokio::spawn(async move {
            let mut client = EchoClient::new(channel);
            let mut i = 0u64;
            // Bounded: at most 100,000 requests or 60 s.
            let deadline = Instant::now() + Duration::from_secs(60);
            while !stop.load(Ordering::Relaxed) && i < 100_000 && Instant::now() < deadline {
                let mut request = tonic::Request::new(EchoRequest { payload: vec![1; 8] });
                request.metadata_mut().insert("x-slice-key", format!("key-{}", i % 500).parse().unwrap());
                if client.echo(request).await.is_err() {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
                sent.fetch_add(1, Ordering::Relaxed);
                i += 1;
                if i % 50 == 0 {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
        })
    };

    // The frontends' distributor goes away; new generations still reach the frontend.
    front.close_watchers();
    drop(stop_front);
    for g in 2..=5 {
        back.publish(JOB, generation(g));
        wait_for_generation(&channel, g, "the frontend, distributor down").await;
    }
    // A frontend that starts now, knowing the dead distributor and the backends, starts
    // from the backends.
    let late = frontend(&backends, sources(true).collect());
    wait_for_generation(&late, 5, "a new frontend, distributor down").await;
    // Every backend re-serves what it holds: a frontend that knows only one backend.
    let only_one = frontend(&backends, vec![endpoint(backends[2])]);
    wait_for_generation(&only_one, 5, "a frontend that knows one backend").await;
    publish(6);
    wait_for_generation(&only_one, 6, "a frontend that knows one backend").await;
    // The load runs on until it has sent enough to show (the distributor still down).
    eventually("the load to send 100 requests", || sent.load(Ordering::Relaxed) > 100).await;

    stop.store(true, Ordering::Relaxed);
    load.await.unwrap();
    assert!(sent.load(Ordering::Relaxed) > 100, "the load hardly ran");
    assert_eq!(failed.load(Ordering::Relaxed), 0, "requests failed while the distributor was down");
    let keyed: u64 = slicelets.iter().map(Slicelet::keyed_requests).sum();
    assert!(keyed >= sent.load(Ordering::Relaxed), "every request carried its key to a backend");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_serves_only_its_job_within_its_watcher_bound_and_closes_its_watchers() {
    use steady_proto::assignment::assignment_distributor_client::AssignmentDistributorClient;
    use steady_proto::assignment::WatchRequest;

    let slicelet = Slicelet::new(0);
    slicelet.set_assignment(generation(3));
    let service = slicelet.assignment_service(JOB).max_watchers(2);
    let addr = Loopback::bind().await.serve(service.clone().into_server()).detach();
    let mut client = AssignmentDistributorClient::connect(format!("http://{addr}")).await.unwrap();
    let watch = |job: &str, known: u64| WatchRequest { job: job.to_owned(), known_generation: known };

    let other = client.watch(watch("orders", 0)).await.unwrap_err();
    assert_eq!(other.code(), tonic::Code::NotFound, "{other}");
    // What the watcher knows is not sent again; the next generation is.
    let mut first = client.watch(watch(JOB, 3)).await.unwrap().into_inner();
    let mut second = client.watch(watch(JOB, 0)).await.unwrap().into_inner();
    assert_eq!(second.message().await.unwrap().unwrap().generation, 3);
    let third = client.watch(watch(JOB, 0)).await.unwrap_err();
    assert_eq!(third.code(), tonic::Code::ResourceExhausted, "{third}");
    slicelet.set_assignment(generation(4));
    assert_eq!(first.message().await.unwrap().unwrap().generation, 4);
    assert_eq!(second.message().await.unwrap().unwrap().generation, 4);
    // Closing ends both streams and refuses new ones.
    service.close_watchers();
    assert!(first.message().await.unwrap().is_none());
    assert!(second.message().await.unwrap().is_none());
    let closed = holds_within(PATIENCE, || service.watchers() == 0).await;
    assert!(closed, "{} watchers still counted", service.watchers());
    let refused = client.watch(watch(JOB, 0)).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused}");
}

#[test]
fn watching_no_endpoint_is_a_typed_error() {
    let Err(error) = watch_assignments_any(Vec::<Endpoint>::new(), JOB, Backoff::default()) else {
        panic!("no endpoint accepted");
    };
    assert_eq!(error.field(), "endpoints");
}
