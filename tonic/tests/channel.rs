//! The tonic channel against real tonic servers on 127.0.0.1. Every server and loop is
//! bounded in count and time. (Assignment distribution over the Watch RPC, with the
//! `Distributor` and the slicelets, is tested in `steady-slicer`.)

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use steady_balance::{BalanceConfig, JobView, Load, TaskState};
use steady_slice::{Assignment, Slice, SliceKey};
use steady_testing::echo::echo_client::EchoClient;
use steady_testing::echo::{echo, endpoints, serve_recording, EchoRequest};
use steady_testing::eventually;
use steady_tonic::{SteadyChannel, TaskEndpoint};
use tokio::sync::watch;
use tonic::{Code, Request};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generated_client_talks_through_the_channel_to_its_subset() {
    let backends = serve_recording(6).await;
    let channel =
        SteadyChannel::builder(BalanceConfig::new(4, 3)).from_endpoints(endpoints(&backends)).unwrap();
    let mut client = EchoClient::new(channel.clone());
    // The default algorithm's subset (decimal Rocksteadier), as BalanceConfig::new picks it.
    let subset = steady_subset::Subsetting::subset(&steady_subset::Algorithm::default(), 4, 6, 3).unwrap();
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
    let mut client = EchoClient::new(SteadyChannel::builder(config).from_job(views).unwrap());
    let start = Instant::now();
    let status = echo(&mut client, None, b"x").await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(start.elapsed() < Duration::from_millis(600), "{:?}", start.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_requests_land_on_the_servers_their_assignment_names() {
    let backends = serve_recording(6).await;
    let assignment = Assignment::new(
        1,
        vec![
            Slice::new(SliceKey(0), vec![5]),
            Slice::new(SliceKey(1 << 62), vec![1, 2]),
            Slice::new(SliceKey(1 << 63), vec![0]),
            Slice::new(SliceKey(3 << 62), vec![3, 4]),
        ],
    )
    .unwrap();
    let channel =
        SteadyChannel::builder(BalanceConfig::new(0, 2)).from_endpoints(endpoints(&backends)).unwrap();
    let (_publish, assignments) = watch::channel(assignment.clone());
    channel.balance().follow_assignment_watch(assignments);
    eventually("the assignment", || channel.stats().assignment_generation == Some(1)).await;
    let mut client = EchoClient::new(channel.clone());
    for i in 0..200 {
        let key = format!("user-{i}");
        let task = echo(&mut client, Some(&key), b"k").await.unwrap();
        let replicas = assignment.slice_for(SliceKey::of(&key)).replicas();
        assert!(replicas.contains(&task), "{key} served by {task}, assigned to {replicas:?}");
    }
    // The servers saw only their own keys.
    for b in &backends {
        for key in b.backend.keys.lock().unwrap().iter() {
            assert!(assignment.slice_for(SliceKey::of(key)).replicas().contains(&b.backend.task));
        }
    }
    // A key set in code, as a request extension, wins over metadata.
    let mut request = Request::new(EchoRequest { payload: b"e".to_vec() });
    request.extensions_mut().insert(SliceKey(1 << 63));
    request.metadata_mut().insert("x-slice-key", "user-1".parse().unwrap());
    assert_eq!(client.echo(request).await.unwrap().into_inner().task, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planned_removal_loses_no_request() {
    let backends = serve_recording(4).await;
    let view = JobView::serving(endpoints(&backends).into_iter().map(TaskEndpoint));
    let (job, views) = watch::channel(view.clone());
    let channel = SteadyChannel::builder(BalanceConfig::new(0, 4)).from_job(views).unwrap();
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
async fn a_request_for_a_backend_that_died_while_idle_moves_to_another_member() {
    let mut backends = serve_recording(3).await;
    // Requests in flight as the load: calls one after another are spread evenly, so task
    // 0 is picked whatever latencies the warm-up saw (with Peak EWMA one slow warm-up
    // answer from it would keep every pick away from it for a second).
    let config = BalanceConfig::new(0, 3).with_load(Load::InFlight);
    let channel = SteadyChannel::builder(config).from_endpoints(endpoints(&backends)).unwrap();
    eventually("three members", || channel.stats().members.len() == 3).await;
    let mut client = EchoClient::new(channel.clone());
    for _ in 0..6 {
        echo(&mut client, None, b"warm").await.unwrap();
    }
    // Backend 0 goes away while idle: its connection closes, and reconnecting is refused.
    backends.remove(0).stop().await;
    // Requests picked for it were never sent: they move on, and none fails. At least 30,
    // and on until one was picked for it (its failure is counted on the request path).
    for i in 0.. {
        if i >= 30 && channel.stats().failures >= 1 {
            break;
        }
        assert!(i < 1000, "no request was picked for the dead member: {:?}", channel.stats());
        let task =
            echo(&mut client, None, b"x").await.unwrap_or_else(|s| panic!("request {i} failed: {s:?}"));
        assert_ne!(task, 0);
    }
    // The control task ejects it and publishes a table without it.
    eventually("the dead member ejected and out of the table", || {
        let stats = channel.stats();
        stats.ejections >= 1 && stats.members.iter().all(|m| m.task != 0)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_follows_address_views_as_discovery_publishes_them() {
    let backends = serve_recording(3).await;
    let addresses: Vec<String> = backends.iter().map(|b| b.addr.to_string()).collect();
    // Task 1's address is not a URI: it is skipped, and the others serve.
    let mut first = addresses.clone();
    first[1] = "not a uri".to_owned();
    let (job, views) = watch::channel(JobView::serving(first));
    let channel = SteadyChannel::builder(BalanceConfig::new(0, 3)).from_addresses(views).unwrap();
    let mut client = EchoClient::new(channel.clone());
    for _ in 0..30 {
        let task = echo(&mut client, None, b"hi").await.unwrap();
        assert_ne!(task, 1);
    }
    // The address is fixed and task 0 drains: only tasks 1 and 2 get new requests.
    job.send_replace(JobView::serving(addresses).with_state(0, TaskState::Draining));
    eventually("task 1 joins", || channel.stats().members.iter().any(|m| m.task == 1)).await;
    let before = backends[0].backend.requests.load(Ordering::SeqCst);
    for _ in 0..30 {
        let task = echo(&mut client, None, b"hi").await.unwrap();
        assert_ne!(task, 0);
    }
    assert_eq!(backends[0].backend.requests.load(Ordering::SeqCst), before);
}
