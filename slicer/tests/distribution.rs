//! Assignment distribution end to end, on real tonic servers on 127.0.0.1: the
//! `Distributor` serving the Watch RPC, clients (`SteadyChannel` with
//! `watch_assignments`) and slicelets following it. Every server and loop is bounded in
//! count and time.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;

use steady_balance::{Backoff, BalanceConfig};
use steady_core::MAX_JOB_NAME_LEN;
use steady_proto::assignment::assignment_distributor_client::AssignmentDistributorClient;
use steady_proto::assignment::{AssignmentUpdate, Slice as ProtoSlice, WatchRequest};
use steady_slice::Slice;
use steady_slice::{Assignment, AssignmentError, SliceKey};
use steady_slicelet::Slicelet;
use steady_slicer::Distributor;
use steady_testing::echo::echo_client::EchoClient;
use steady_testing::echo::echo_server::EchoServer;
use steady_testing::echo::{echo, endpoints, serve_recording, EchoRequest, RecordingEcho};
use steady_testing::eventually;
use steady_testing::loopback::{endpoint, serve, Loopback};
use steady_tonic::{watch_assignments, SteadyChannel, WatchError};
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Code, Request};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pushed_assignment_reaches_a_hundred_watchers() {
    let distributor = Distributor::new();
    let (addr, _stop) = serve(distributor.service()).await;
    let latest = Arc::new(AtomicUsize::new(0));
    let mut watchers = Vec::new();
    for _ in 0..100 {
        let latest = latest.clone();
        let stream = watch_assignments(endpoint(addr), "job", Backoff::default()).unwrap();
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
    let backends = serve_recording(4).await;
    let distributor = Distributor::new();
    distributor.publish("echo", Assignment::single(1, vec![3]).unwrap());
    // The distributor listens on a port we can reuse after a restart.
    let (addr, server) = serve(distributor.service()).await;
    let channel =
        SteadyChannel::builder(BalanceConfig::new(0, 1)).from_endpoints(endpoints(&backends)).unwrap();
    let backoff = Backoff { base: Duration::from_millis(20), max: Duration::from_millis(100), jitter: 0.5 };
    channel.follow_assignments(watch_assignments(endpoint(addr), "echo", backoff).unwrap());
    eventually("generation 1", || channel.stats().assignment_generation == Some(1)).await;
    let mut client = EchoClient::new(channel.clone());
    // The distributor goes away: keyed routing goes on with generation 1.
    distributor.close_watchers();
    server.stop().await;
    for i in 0..20 {
        assert_eq!(echo(&mut client, Some(&format!("k{i}")), b"x").await.unwrap(), 3);
    }
    // It comes back on the same address with a newer assignment; the client reconnects.
    distributor.publish("echo", Assignment::single(2, vec![2]).unwrap());
    let _server2 = Loopback::bind_to(addr).await.serve(distributor.service());
    eventually("generation 2", || channel.stats().assignment_generation == Some(2)).await;
    assert_eq!(echo(&mut client, Some("k1"), b"x").await.unwrap(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slicelets_count_no_misroutes_when_clients_follow_the_assignment() {
    let distributor = Distributor::new();
    let (distributor_addr, _stop_d) = serve(distributor.service()).await;
    let assignment =
        Assignment::new(1, vec![Slice::new(SliceKey(0), vec![0]), Slice::new(SliceKey(1 << 63), vec![1])])
            .unwrap();
    distributor.publish("echo", assignment);
    // Two backends, each with a slicelet following the distributor.
    let mut addrs = Vec::new();
    let mut slicelets = Vec::new();
    let mut stops = Vec::new();
    for task in 0..2u32 {
        let slicelet = Slicelet::new(task);
        slicelet.follow(watch_assignments(endpoint(distributor_addr), "echo", Backoff::default()).unwrap());
        let port = Loopback::bind().await;
        addrs.push(port.addr());
        let stop = port.serve_with(|incoming, stopped| {
            Server::builder()
                .layer(slicelet.layer())
                .add_service(EchoServer::new(RecordingEcho { task, ..RecordingEcho::default() }))
                .serve_with_incoming_shutdown(incoming, stopped)
        });
        slicelets.push(slicelet);
        stops.push(stop);
    }
    eventually("the slicelets' assignment", || slicelets.iter().all(|s| s.generation() == Some(1))).await;
    assert_eq!(slicelets[0].held_slices(), [SliceKey(0)]);
    let eps: Vec<Endpoint> = addrs.iter().map(|a| endpoint(*a)).collect();
    // A client that follows the assignment: no misroutes.
    let following = SteadyChannel::builder(BalanceConfig::new(0, 2)).from_endpoints(eps.clone()).unwrap();
    following.follow_assignments(
        watch_assignments(endpoint(distributor_addr), "echo", Backoff::default()).unwrap(),
    );
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
    let mut blind =
        EchoClient::new(SteadyChannel::builder(BalanceConfig::new(0, 2)).from_endpoints(eps).unwrap());
    for i in 0..100 {
        echo(&mut blind, Some(&format!("key-{i}")), b"x").await.unwrap();
    }
    let misrouted: u64 = slicelets.iter().map(Slicelet::misrouted).sum();
    assert!((20..=80).contains(&misrouted), "{misrouted} of 100 misrouted");
    drop(stops);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slicelet_reads_keys_from_the_header_its_clients_use() {
    let header = HeaderName::from_static("x-tenant");
    let assignment = Assignment::single(1, vec![0]).unwrap();
    let slicelet = Slicelet::new(0);
    assert!(slicelet.set_assignment(assignment.clone()));
    let port = Loopback::bind().await;
    let addr = port.addr();
    let _stop = port.serve_with(|incoming, stopped| {
        Server::builder()
            .layer(slicelet.layer().key_header(header.clone()))
            .add_service(EchoServer::new(RecordingEcho::default()))
            .serve_with_incoming_shutdown(incoming, stopped)
    });
    let channel = SteadyChannel::builder(BalanceConfig::new(0, 1))
        .key_header(header)
        .from_endpoints(vec![endpoint(addr)])
        .unwrap();
    let mut client = EchoClient::new(channel);
    for i in 0..50 {
        let mut request = Request::new(EchoRequest { payload: b"t".to_vec() });
        request.metadata_mut().insert("x-tenant", format!("tenant-{i}").parse().unwrap());
        client.echo(request).await.unwrap();
    }
    // Every request counted as keyed, by the header both sides name; none misrouted.
    assert_eq!((slicelet.keyed_requests(), slicelet.misrouted()), (50, 0));
}

/// Whatever `publish` accepts reaches a watcher. Generation 0 means "none" in
/// `WatchRequest.known_generation`, so an assignment numbered 0 would be accepted and
/// never sent: it cannot be built, so it cannot be published, and a message carrying
/// one is refused by its receiver.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_published_assignment_reaches_a_watcher_and_generation_zero_cannot_be_published() {
    let distributor = Distributor::new();
    let (addr, _stop) = serve(distributor.service()).await;
    let (received, mut receive) = tokio::sync::mpsc::unbounded_channel();
    let stream = watch_assignments(endpoint(addr), "job", Backoff::default()).unwrap();
    let watcher = tokio::spawn(async move {
        futures_util::pin_mut!(stream);
        while let Some(item) = futures_util::StreamExt::next(&mut stream).await {
            if received.send(item).is_err() {
                return;
            }
        }
    });
    eventually("the watcher", || distributor.watchers("job") == 1).await;
    for generation in [0, 1, 2] {
        let Ok(assignment) = Assignment::single(generation, vec![0]) else { continue };
        assert!(distributor.publish("job", assignment), "generation {generation} is newer");
        let got = tokio::time::timeout(Duration::from_secs(5), receive.recv())
            .await
            .unwrap_or_else(|_| panic!("published generation {generation} never reached the watcher"))
            .expect("the stream never ends")
            .expect("valid");
        assert_eq!(got.generation(), generation);
    }
    watcher.abort();
    assert_eq!(Assignment::single(0, vec![0]), Err(AssignmentError::ZeroGeneration));
    // Nor can one be received.
    let zero = AssignmentUpdate {
        generation: 0,
        slices: vec![ProtoSlice { start: 0, replicas: vec![0], warming: vec![] }],
    };
    assert_eq!(Assignment::try_from(zero), Err(AssignmentError::ZeroGeneration));
}

/// A Watch call for `job`, returning the open stream or the status it was refused with.
async fn open_watch(
    client: &mut AssignmentDistributorClient<Channel>,
    job: &str,
) -> Result<tonic::Streaming<AssignmentUpdate>, tonic::Status> {
    let request = WatchRequest { job: job.to_owned(), known_generation: 0 };
    let call = client.watch(request);
    let response = tokio::time::timeout(Duration::from_secs(10), call).await.expect("the call is answered");
    response.map(tonic::Response::into_inner)
}

/// A remote peer cannot grow the distributor: watching thousands of made-up jobs, one
/// stream after another, leaves behind only the jobs that were published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_spammer_leaves_only_the_published_jobs() {
    let distributor = Distributor::new();
    distributor.publish("real", Assignment::single(1, vec![0]).unwrap());
    let (addr, _stop) = serve(distributor.service()).await;
    let mut client = AssignmentDistributorClient::new(endpoint(addr).connect().await.unwrap());
    let mut state = 0x5EED_u64;
    for i in 0..2000 {
        let job = format!(
            "spam-{:016x}",
            steady_subset::hash::mix64({
                state = state.wrapping_add(1);
                state
            })
        );
        let stream = open_watch(&mut client, &job).await.unwrap_or_else(|s| panic!("watch {i}: {s}"));
        drop(stream);
        assert!(
            distributor.jobs() <= 1 + distributor.max_unpublished_jobs(),
            "{} jobs after {i} watches",
            distributor.jobs()
        );
    }
    eventually("the spammer's jobs to go", || distributor.jobs() == 1).await;
    // The published job stays, with nobody watching it.
    let stream = open_watch(&mut client, "real").await.unwrap();
    drop(stream);
    eventually("its watcher to go", || distributor.watchers("real") == 0).await;
    assert_eq!(distributor.jobs(), 1);
    assert_eq!(distributor.current("real").map(|a| a.generation()), Some(1));
    // Read-only queries for unknown jobs create nothing.
    assert_eq!((distributor.current("spam-unknown"), distributor.watchers("spam-unknown")), (None, 0));
    assert_eq!(distributor.jobs(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_and_overlong_job_names_are_invalid_arguments() {
    let distributor = Distributor::new();
    let (addr, _stop) = serve(distributor.service()).await;
    let mut client = AssignmentDistributorClient::new(endpoint(addr).connect().await.unwrap());
    for job in [String::new(), "j".repeat(MAX_JOB_NAME_LEN + 1), "j".repeat(1 << 20)] {
        let status = open_watch(&mut client, &job).await.expect_err("refused");
        assert_eq!(status.code(), Code::InvalidArgument, "a name of {} bytes: {status}", job.len());
    }
    assert_eq!(distributor.jobs(), 0);
    let longest = open_watch(&mut client, &"j".repeat(MAX_JOB_NAME_LEN)).await;
    assert!(longest.is_ok(), "{MAX_JOB_NAME_LEN} bytes is allowed");
    assert!(!distributor.publish("", Assignment::single(1, vec![0]).unwrap()), "nobody could watch it");
}

/// A job name the Distributor will never accept ends `watch_assignments`' stream with the
/// refusal, as its one and last item (before, the stream retried forever with backoff,
/// yielding nothing); a balancer following it counts the error and goes on with what it
/// has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_refused_as_an_invalid_argument_ends_with_the_refusal() {
    let distributor = Distributor::new();
    let (addr, _stop) = serve(distributor.service()).await;
    let fast = Backoff { base: Duration::from_millis(1), max: Duration::from_millis(10), jitter: 0.0 };
    for job in [String::new(), "j".repeat(MAX_JOB_NAME_LEN + 1), "j".repeat(300)] {
        let stream = watch_assignments(endpoint(addr), job.clone(), fast).unwrap();
        let items =
            tokio::time::timeout(Duration::from_secs(10), futures_util::StreamExt::collect::<Vec<_>>(stream))
                .await
                .unwrap_or_else(|_| panic!("the watch of a {}-byte job name never ended", job.len()));
        let [Err(WatchError::Refused(status))] = &items[..] else {
            panic!("a {}-byte job name: {items:?}", job.len());
        };
        assert_eq!(status.code(), Code::InvalidArgument, "{status}");
    }
    // A channel following such a watch counts the refusal, and stops following.
    let channel =
        SteadyChannel::builder(BalanceConfig::new(0, 1)).from_endpoints(vec![endpoint(addr)]).unwrap();
    channel.follow_assignments(watch_assignments(endpoint(addr), "", fast).unwrap());
    eventually("the refusal counted", || channel.stats().assignments_rejected == 1).await;
}

/// A refusal that may pass (`ResourceExhausted`: too many watch streams now) is retried
/// with backoff: the watch gets through once a place frees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_refused_for_now_is_retried_until_it_gets_through() {
    let distributor = Distributor::new().with_max_watchers(1);
    distributor.publish("published", Assignment::single(1, vec![0]).unwrap());
    let (addr, _stop) = serve(distributor.service()).await;
    let mut client = AssignmentDistributorClient::new(endpoint(addr).connect().await.unwrap());
    let held = open_watch(&mut client, "published").await.unwrap();
    let fast = Backoff { base: Duration::from_millis(1), max: Duration::from_millis(10), jitter: 0.0 };
    let mut stream = Box::pin(watch_assignments(endpoint(addr), "published", fast).unwrap());
    let next = futures_util::StreamExt::next(&mut stream);
    tokio::pin!(next);
    // Refused while the place is held (the watch is attempted again and again meanwhile).
    assert!(
        tokio::time::timeout(Duration::from_millis(200), &mut next).await.is_err(),
        "no item while refused"
    );
    drop(held);
    let first =
        tokio::time::timeout(Duration::from_secs(10), next).await.expect("through once a place frees");
    assert_eq!(first.expect("not ended").expect("valid").generation(), 1);
}

/// Watchers may hold only so many unpublished jobs at once; joining one that exists,
/// or a published one, always works, and a slot frees when its last watcher goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchers_beyond_the_unpublished_job_limit_are_resource_exhausted() {
    let distributor = Distributor::new().with_max_unpublished_jobs(4);
    distributor.publish("published", Assignment::single(1, vec![0]).unwrap());
    let (addr, _stop) = serve(distributor.service()).await;
    let mut client = AssignmentDistributorClient::new(endpoint(addr).connect().await.unwrap());
    let mut held = Vec::new();
    for i in 0..4 {
        held.push(open_watch(&mut client, &format!("waiting-{i}")).await.unwrap());
    }
    let status = open_watch(&mut client, "waiting-4").await.expect_err("over the limit");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status}");
    assert_eq!(distributor.jobs(), 5);
    let _joined = open_watch(&mut client, "waiting-0").await.expect("an existing job");
    let mut published = open_watch(&mut client, "published").await.expect("a published job");
    let first = tokio::time::timeout(Duration::from_secs(10), published.message()).await.unwrap().unwrap();
    assert_eq!(first.map(|u| u.generation), Some(1));
    // Publishing to a waiting job makes it published: its slot frees at once.
    distributor.publish("waiting-1", Assignment::single(1, vec![0]).unwrap());
    let _fifth = open_watch(&mut client, "waiting-4").await.expect("a slot freed by publishing");
    let status = open_watch(&mut client, "waiting-5").await.expect_err("over the limit again");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status}");
    // The last watcher of an unpublished job leaving frees its slot too.
    drop(held.remove(3));
    eventually("waiting-3 to go", || distributor.current("waiting-3").is_none() && distributor.jobs() == 5)
        .await;
    open_watch(&mut client, "waiting-5").await.expect("a slot freed by the last watcher");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_streams_beyond_the_limit_are_resource_exhausted_even_for_a_published_job() {
    let distributor = Distributor::new().with_max_watchers(3);
    distributor.publish("published", Assignment::single(1, vec![0]).unwrap());
    let (addr, _stop) = serve(distributor.service()).await;
    let mut client = AssignmentDistributorClient::new(endpoint(addr).connect().await.unwrap());
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(open_watch(&mut client, "published").await.unwrap());
    }
    let status = open_watch(&mut client, "published").await.expect_err("over the limit");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status}");
    // A stream that closes frees its place.
    drop(held.pop());
    eventually("a free place", || distributor.watchers("published") == 2).await;
    open_watch(&mut client, "published").await.expect("a place freed by a closed stream");
}
