//! What a backend does with a request for a key it no longer holds, on real tonic servers
//! on 127.0.0.1 and a real `SteadyChannel`: refused with the newer generation and routed
//! again by the client, served when the client is ahead or within the old owner's grace
//! period, forwarded once to the owner with no loop (and a forwarded mark honoured only
//! where the policy forwards).

use std::net::SocketAddr;
use std::time::Duration;

use steady_balance::BalanceConfig;
use steady_proto::{FORWARDED_HEADER, GENERATION_HEADER, MOVED_HEADER};
use steady_slice::{Assignment, Slice, SliceKey};
use steady_slicelet::{OnMisroute, Slicelet, SliceletLayer};
use steady_testing::echo::echo_client::EchoClient;
use steady_testing::echo::echo_server::EchoServer;
use steady_testing::echo::{EchoRequest, EchoTask};
use steady_testing::eventually;
use steady_testing::loopback::{endpoint, Loopback, ServerGuard};
use steady_tonic::SteadyChannel;
use tokio::sync::watch;
use tonic::transport::Server;

/// Generation `g`: every key on `task`.
fn all_on(g: u64, task: u32) -> Assignment {
    Assignment::new(g, vec![Slice::new(SliceKey::MIN, vec![task])]).unwrap()
}

/// Echo task `task` behind `layer`, on `port`, until the guard is dropped.
fn serve_on(port: Loopback, task: u32, layer: SliceletLayer) -> ServerGuard {
    port.serve_with(|incoming, stopped| {
        Server::builder()
            .layer(layer)
            .add_service(EchoServer::new(EchoTask(task)))
            .serve_with_incoming_shutdown(incoming, stopped)
    })
}

/// Echo task `task` behind `layer`, on a port of its own (until the runtime ends).
async fn serve(task: u32, layer: SliceletLayer) -> SocketAddr {
    serve_on(Loopback::bind().await, task, layer).detach()
}

/// A channel over `backends` routing by the assignments sent on the returned sender.
fn channel(backends: &[SocketAddr], first: Assignment) -> (SteadyChannel, watch::Sender<Assignment>) {
    let channel = SteadyChannel::builder(BalanceConfig::new(0, backends.len()))
        .from_endpoints(backends.iter().map(|&a| endpoint(a)).collect())
        .unwrap();
    let (tx, rx) = watch::channel(first);
    channel.balance().follow_assignment_watch(rx);
    (channel, tx)
}

fn keyed(key: &str) -> tonic::Request<EchoRequest> {
    let mut request = tonic::Request::new(EchoRequest { payload: key.as_bytes().to_vec() });
    request.metadata_mut().insert("x-slice-key", key.parse().unwrap());
    request
}

/// Two backends whose Slicelets are at generation 2 (every key on task 1) and a frontend
/// still at generation 1 (every key on task 0).
async fn moved_fleet(
    layer: impl Fn(&Slicelet) -> SliceletLayer,
) -> (Vec<Slicelet>, SteadyChannel, watch::Sender<Assignment>) {
    let slicelets: Vec<Slicelet> = (0..2).map(Slicelet::new).collect();
    let mut addrs = Vec::new();
    for (task, s) in slicelets.iter().enumerate() {
        s.set_assignment(all_on(1, 0));
        s.set_assignment(all_on(2, 1));
        addrs.push(serve(task as u32, layer(s)).await);
    }
    let (channel, assignments) = channel(&addrs, all_on(1, 0));
    eventually("the frontend's first assignment", || channel.stats().assignment_generation == Some(1)).await;
    assert!(channel.balance().wait_for_members(2, Duration::from_secs(10)).await);
    (slicelets, channel, assignments)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_request_is_routed_again_once_the_client_has_the_newer_generation() {
    let (slicelets, channel, assignments) = moved_fleet(|s| s.layer().on_misroute(OnMisroute::Reject)).await;
    // Generation 2 reaches the frontend only once task 0 has refused the request.
    let notify = {
        let s = slicelets[0].clone();
        tokio::spawn(async move {
            eventually("the refusal", || s.misroutes_rejected() == 1).await;
            assignments.send_replace(all_on(2, 1));
        })
    };
    let reply =
        EchoClient::new(channel.clone()).echo(keyed("user:7")).await.expect("routed again, not failed");
    assert_eq!(reply.into_inner().task, 1, "the new owner answered");
    assert_eq!((slicelets[0].misroutes_rejected(), slicelets[0].misrouted()), (1, 1));
    assert_eq!(slicelets[1].misrouted(), 0);
    notify.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_names_the_generation_to_a_client_that_does_not_route_by_key() {
    let (slicelets, _channel, _assignments) =
        moved_fleet(|s| s.layer().on_misroute(OnMisroute::Reject)).await;
    let addr_of_0 = {
        // A plain tonic client, straight to task 0, sending no generation.
        let slicelet = Slicelet::new(0);
        slicelet.set_assignment(all_on(2, 1));
        serve(0, slicelet.layer().on_misroute(OnMisroute::Reject)).await
    };
    let status = EchoClient::new(endpoint(addr_of_0).connect().await.unwrap())
        .echo(keyed("user:7"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert_eq!(status.metadata().get(MOVED_HEADER).unwrap(), "2");
    // A client ahead of the backend (generation 3 against its 2) is served.
    let mut ahead = keyed("user:7");
    ahead.metadata_mut().insert(GENERATION_HEADER, "3".parse().unwrap());
    let reply = EchoClient::new(endpoint(addr_of_0).connect().await.unwrap()).echo(ahead).await.unwrap();
    assert_eq!(reply.into_inner().task, 0);
    assert_eq!(slicelets[0].misroutes_rejected(), 0, "the fleet's own task 0 saw none of this");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_mark_makes_only_a_forwarding_backend_serve() {
    // A backend at generation 2 (every key on task 1) is task 0: every key is misrouted
    // here. A plain client sends it requests marked as forwarded once already.
    let forwarded = || {
        let mut request = keyed("user:7");
        request.metadata_mut().insert(FORWARDED_HEADER, "1".parse().unwrap());
        request
    };
    let backend = |policy: OnMisroute| async move {
        let slicelet = Slicelet::new(0);
        slicelet.set_assignment(all_on(2, 1));
        let addr = serve(0, slicelet.layer().on_misroute(policy)).await;
        (slicelet, EchoClient::new(endpoint(addr).connect().await.unwrap()))
    };

    // Reject: no task answers for a key it does not hold, whatever the mark says.
    let (rejecting, mut client) = backend(OnMisroute::Reject).await;
    let status = client.echo(forwarded()).await.expect_err("refused despite the mark");
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert_eq!(status.metadata().get(MOVED_HEADER).unwrap(), "2");
    assert_eq!((rejecting.misrouted(), rejecting.misroutes_rejected()), (1, 1));

    // Forward: one hop at most, so the marked request is served here, not sent on.
    let nowhere = tower::service_fn(|_: tonic::codegen::http::Request<tonic::body::Body>| async {
        Err::<tonic::codegen::http::Response<tonic::body::Body>, tower::BoxError>(
            "a marked request is never forwarded".into(),
        )
    });
    let (forwarding, mut client) = backend(OnMisroute::forward(nowhere)).await;
    let reply = client.echo(forwarded()).await.expect("served: forwarded once already");
    assert_eq!(reply.into_inner().task, 0);
    assert_eq!((forwarding.misrouted(), forwarding.misroutes_forwarded()), (1, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_old_owner_answers_within_its_grace_period() {
    let (slicelets, channel, _assignments) =
        moved_fleet(|s| s.layer().on_misroute(OnMisroute::Reject).grace(Duration::from_secs(3600))).await;
    let reply = EchoClient::new(channel).echo(keyed("user:7")).await.unwrap();
    assert_eq!(reply.into_inner().task, 0, "released a moment ago: still served here");
    assert_eq!((slicelets[0].misroutes_in_grace(), slicelets[0].misroutes_rejected()), (1, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_misrouted_request_is_forwarded_to_the_owner_once_and_never_back() {
    // Task 0 forwards through a channel at generation 2 (key on task 1); task 1, at
    // generation 3, thinks the key is task 0's and would forward it back: it serves it,
    // since it was forwarded once already.
    let slicelets: Vec<Slicelet> = (0..2).map(Slicelet::new).collect();
    slicelets[0].set_assignment(all_on(2, 1));
    slicelets[1].set_assignment(all_on(3, 0));
    let listeners: Vec<Loopback> = {
        let mut v = Vec::new();
        for _ in 0..2 {
            v.push(Loopback::bind().await);
        }
        v
    };
    let addrs: Vec<SocketAddr> = listeners.iter().map(Loopback::addr).collect();
    let (to_owner, _a) = channel(&addrs, all_on(2, 1));
    let (back_to_0, _b) = channel(&addrs, all_on(3, 0));
    let forwarders = [to_owner, back_to_0];
    let mut servers = Vec::new();
    for ((task, listener), forwarder) in listeners.into_iter().enumerate().zip(forwarders) {
        let layer = slicelets[task].layer().on_misroute(OnMisroute::forward(forwarder));
        servers.push(serve_on(listener, task as u32, layer));
    }
    let (frontend, _c) = channel(&addrs, all_on(1, 0));
    eventually("the frontend's assignment", || frontend.stats().assignment_generation == Some(1)).await;
    let reply = EchoClient::new(frontend).echo(keyed("user:7")).await.expect("forwarded, not failed");
    assert_eq!(reply.into_inner().task, 1, "task 0 forwarded it to task 1, which answered");
    assert_eq!(slicelets[0].misroutes_forwarded(), 1);
    assert_eq!(slicelets[1].misrouted(), 1, "task 1 saw it as misrouted too");
    assert_eq!(slicelets[1].misroutes_forwarded(), 0, "and did not send it back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exclusive_backend_that_has_not_taken_a_key_over_refuses_it_and_the_channel_waits_before_routing_again(
) {
    // Task 0 of an exclusive job knows generation 2 (every key its own) but holds no
    // lease yet: it owns nothing, so it refuses, whatever the policy or the grace say.
    let slicelet = Slicelet::exclusive(0);
    slicelet.set_assignment(all_on(2, 0));
    let layer = slicelet.layer().grace(Duration::from_secs(60));
    let addr = serve(0, layer).await;
    let (channel, _assignments) = channel(&[addr], all_on(2, 0));
    eventually("the frontend's assignment", || channel.stats().assignment_generation == Some(2)).await;
    assert!(channel.balance().wait_for_members(1, Duration::from_secs(10)).await);
    let started = tokio::time::Instant::now();
    let status =
        EchoClient::new(channel.clone()).echo(keyed("user:7")).await.expect_err("nobody owns the key");
    let waited = started.elapsed();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert_eq!(status.metadata().get(MOVED_HEADER).unwrap(), "2");
    // Routed by generation 2 already, the channel waited for the owner to take over, then
    // tried once more.
    assert_eq!(slicelet.misroutes_rejected(), 2, "the first try and one more, no third");
    assert!(waited >= steady_tonic::TAKEOVER_WAIT, "routed again after {waited:?}");
}
