//! Load reports end to end: a Slicelet streams reports over real loopback gRPC to a
//! `LoadCollector`, which validates them into a `LoadBook`. (The meter itself is tested
//! in `steady-slicelet`.) The servers bind 127.0.0.1:0 and every wait is bounded.

use std::time::Duration;

use std::convert::Infallible;
use steady_core::Backoff;
use steady_proto::load::load_collector_client::LoadCollectorClient;
use steady_proto::load::{self as load_proto, KeyLoad, ReportSummary, SliceLoad};
use steady_slice::{Assignment, Slice, SliceKey};
use steady_slicelet::Slicelet;
use steady_slicer::load::{LoadBook, LoadCollector};
use steady_testing::eventually;
use steady_testing::loopback::{endpoint, serve, Loopback};
use tonic::Code;
use tower::{service_fn, Layer, Service, ServiceExt};

/// Four equal slices: task 0 holds slices 0 and 2, task 1 slices 1 and 3.
fn four_slices(generation: u64) -> Assignment {
    Assignment::new(
        generation,
        (0..4u64).map(|i| Slice::new(SliceKey(i << 62), vec![(i % 2) as u32])).collect(),
    )
    .unwrap()
}

/// A server stack as a backend runs it: the slicelet's layer over a service that answers.
fn server(slicelet: &Slicelet) -> impl Service<http::Request<String>, Error = Infallible> + Clone {
    slicelet
        .layer()
        .layer(service_fn(|_: http::Request<String>| async { Ok::<_, Infallible>(http::Response::new(())) }))
}

async fn send(stack: &mut (impl Service<http::Request<String>, Error = Infallible> + Clone), key: &str) {
    let request = http::Request::builder().header("x-slice-key", key).body(String::new()).unwrap();
    stack.ready().await.unwrap().call(request).await.unwrap();
}

/// Sends `messages` on one stream and returns how it ended.
async fn stream_to(
    addr: std::net::SocketAddr,
    messages: Vec<load_proto::LoadReport>,
) -> Result<ReportSummary, tonic::Status> {
    let mut client = LoadCollectorClient::connect(endpoint(addr)).await.unwrap();
    client.report(tokio_stream::iter(messages)).await.map(tonic::Response::into_inner)
}

fn message(task: u32, generation: u64) -> load_proto::LoadReport {
    load_proto::LoadReport {
        version: 1,
        job: "job".into(),
        task,
        generation,
        slices: vec![SliceLoad { start: 0, rate: 10.0 }, SliceLoad { start: 2 << 62, rate: 5.0 }],
        hot_keys: vec![KeyLoad { key: 42, rate: 3.0 }],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_stream_over_grpc_into_the_load_book() {
    let book = LoadBook::new();
    book.published("job", four_slices(1).into(), [0, 1]);
    let collector = LoadCollector::new(book.clone());
    let (addr, _stop) = serve(collector.service()).await;
    let slicelets: Vec<Slicelet> = (0..2).map(Slicelet::new).collect();
    let mut reporters = Vec::new();
    for s in &slicelets {
        s.set_assignment(four_slices(1));
        let mut stack = server(s);
        for k in 0..100 {
            send(&mut stack, &format!("k{k}")).await;
        }
        reporters.push(s.report_to(endpoint(addr), "job", Duration::from_millis(20)));
    }
    eventually("a report from each task", || book.fresh("job", Duration::from_secs(60)).len() == 2).await;
    let fresh = book.fresh("job", Duration::from_secs(60));
    for (task, received) in fresh.iter().enumerate() {
        assert_eq!((received.report.task(), received.report.generation()), (task as u32, 1));
        let starts: Vec<SliceKey> = received.report.slices().iter().map(|s| s.0).collect();
        assert_eq!(starts, slicelets[task].held_slices(), "task {task} reports the slices it holds");
        assert!(received.report.total() > 0.0);
        assert!(!received.report.hot_keys().is_empty());
    }
    assert_eq!((book.dropped(), collector.invalid()), (0, 0));
    assert_eq!(collector.open_streams(), 2);
    // Dropping a reporter stops it: its stream closes.
    drop(reporters);
    eventually("the streams to close", || collector.open_streams() == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_for_an_unknown_generation_or_task_is_dropped_and_counted() {
    let book = LoadBook::new();
    book.published("job", four_slices(1).into(), [0, 1]);
    let collector = LoadCollector::new(book.clone());
    let (addr, _stop) = serve(collector.service()).await;
    let unknown_job = load_proto::LoadReport { job: "other".into(), ..message(0, 1) };
    let summary =
        stream_to(addr, vec![message(0, 1), message(0, 2), message(7, 1), unknown_job]).await.unwrap();
    assert_eq!((summary.accepted, summary.dropped, summary.invalid), (1, 3, 0));
    assert_eq!((book.accepted(), book.dropped(), collector.invalid()), (1, 3, 0));
    // And a slicelet ahead of the book (generation 2, unpublished) has its reports dropped.
    let ahead = Slicelet::new(1);
    ahead.set_assignment(four_slices(2));
    let _reporter = ahead.report_to(endpoint(addr), "job", Duration::from_millis(10));
    eventually("the slicelet's reports to be dropped", || book.dropped() >= 5).await;
    assert_eq!(
        book.fresh("job", Duration::from_secs(60)).iter().map(|r| r.report.task()).collect::<Vec<_>>(),
        [0]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_messages_are_counted_and_a_stream_of_them_is_ended() {
    let book = LoadBook::new();
    book.published("job", four_slices(1).into(), [0, 1]);
    let collector = LoadCollector::new(book.clone());
    let (addr, _stop) = serve(collector.service()).await;
    let mut nan = message(0, 1);
    nan.slices[1].rate = f64::NAN;
    let version_2 = load_proto::LoadReport { version: 2, ..message(0, 1) };
    let mut unsorted = message(0, 1);
    unsorted.slices.reverse();
    let mut negative_key_rate = message(0, 1);
    negative_key_rate.hot_keys[0].rate = -1.0;
    let summary = stream_to(
        addr,
        vec![nan.clone(), version_2.clone(), unsorted.clone(), negative_key_rate, message(1, 1)],
    )
    .await
    .unwrap();
    assert_eq!((summary.accepted, summary.dropped, summary.invalid), (1, 0, 4));
    assert_eq!((collector.invalid(), book.accepted(), book.dropped()), (4, 1, 0));

    // A stream of nothing but invalid messages is ended after max_invalid_in_a_row.
    let max_invalid_in_a_row = collector.max_invalid_in_a_row();
    let garbage: Vec<_> =
        [nan, version_2, unsorted].into_iter().cycle().take(3 * max_invalid_in_a_row as usize).collect();
    let ended = stream_to(addr, garbage).await.unwrap_err();
    assert_eq!(ended.code(), Code::InvalidArgument, "{ended}");
    assert_eq!(collector.invalid(), 4 + u64::from(max_invalid_in_a_row));
    assert_eq!(collector.streams_ended_invalid(), 1);

    // A message over the size limit is refused before it is buffered, and counted.
    let huge = load_proto::LoadReport { job: "j".repeat(collector.max_message_bytes() + 1), ..message(0, 1) };
    let refused = stream_to(addr, vec![huge]).await.unwrap_err();
    assert_eq!(refused.code(), Code::OutOfRange, "{refused}");
    assert_eq!(collector.invalid(), 5 + u64::from(max_invalid_in_a_row));

    // The collector still serves.
    let summary = stream_to(addr, vec![message(0, 1)]).await.unwrap();
    assert_eq!(summary.accepted, 1);
    assert_eq!(book.accepted(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reporter_reconnects_after_the_collector_restarts() {
    let book = LoadBook::new();
    book.published("job", four_slices(1).into(), [0]);
    let collector = LoadCollector::new(book.clone());
    // The collector listens on a port we can reuse after a restart.
    let (addr, server) = serve(collector.service()).await;
    let slicelet = Slicelet::new(0);
    slicelet.set_assignment(four_slices(1));
    let backoff = Backoff { base: Duration::from_millis(20), max: Duration::from_millis(100), jitter: 0.5 };
    let reporter =
        slicelet.report_to_with_backoff(endpoint(addr), "job", Duration::from_millis(10), backoff).unwrap();
    eventually("a first report", || book.accepted() >= 1).await;
    assert_eq!(reporter.streams_opened(), 1);

    // The collector goes away (its streams closed so that the server can stop)...
    collector.close_streams();
    server.stop().await;
    let before = book.accepted();
    // ...and comes back on the same address: the reporter reconnects on its own.
    let _server2 = Loopback::bind_to(addr).await.serve(collector.service());
    eventually("reports after the restart", || book.accepted() > before + 2).await;
    assert!(reporter.streams_opened() >= 2, "{} streams", reporter.streams_opened());
    assert_eq!(collector.invalid(), 0);
}

/// A `Backoff` out of range is refused when reporting is asked for, naming its field:
/// before, the reporter started, and the first reconnection of one as extreme as
/// `Duration::MAX` panicked its task (in `Backoff::delay`), so reports stopped silently.
#[tokio::test]
async fn a_backoff_out_of_range_is_refused_before_reporting_starts() {
    let slicelet = Slicelet::new(0);
    slicelet.set_assignment(four_slices(1));
    let nowhere = endpoint("127.0.0.1:1".parse().unwrap());
    let good = Backoff::default();
    for (backoff, field) in [
        (Backoff { base: Duration::ZERO, ..good }, "backoff.base"),
        (Backoff { base: Duration::MAX, max: Duration::MAX, jitter: 0.0 }, "backoff.base"),
        (Backoff { max: Duration::from_millis(1), ..good }, "backoff.max"),
        (Backoff { jitter: f64::NAN, ..good }, "backoff.jitter"),
    ] {
        let refused =
            slicelet.report_to_with_backoff(nowhere.clone(), "job", Duration::from_millis(10), backoff);
        assert_eq!(refused.expect_err("refused").field(), field, "{backoff:?}");
    }
    let reporter = slicelet.report_to_with_backoff(nowhere, "job", Duration::from_millis(10), good);
    assert!(reporter.is_ok(), "the default is accepted");
}

/// Load reports only from the task they describe: a collector behind mutual TLS accepts a
/// Slicelet's reports for the task its certificate names, and refuses (and counts) anything
/// else, leaving the Assigner's view as it was. Real rustls on loopback.
#[cfg(feature = "tls")]
mod only_from_the_task_they_describe {
    use std::net::SocketAddr;
    use std::time::Duration;

    use steady_proto::load::load_collector_client::LoadCollectorClient;
    use steady_proto::load::{self as load_proto, KeyLoad, SliceLoad};
    use steady_slicelet::Slicelet;
    use steady_slicer::load::{LoadBook, LoadCollector, ReporterNames};
    use steady_testing::eventually;
    use steady_testing::loopback::{Loopback, ServerGuard};
    use steady_testing::tls::{Leaf, TestPki};
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, Server, ServerTlsConfig};
    use tonic::Code;

    use super::four_slices;

    fn message(task: u32, rate: f64) -> load_proto::LoadReport {
        let start = u64::from(task) << 62;
        load_proto::LoadReport {
            version: 1,
            job: "users".into(),
            task,
            generation: 1,
            slices: vec![SliceLoad { start, rate }],
            hot_keys: vec![KeyLoad { key: start, rate: rate / 2.0 }],
        }
    }

    /// The collector over TLS: client certificates verified when sent (watchers may come
    /// without one), reports authorized by `{job}-{task}` names.
    async fn serve_collector(pki: &TestPki, collector: LoadCollector) -> (SocketAddr, ServerGuard) {
        let server = pki.issue(&["127.0.0.1"]);
        let tls = ServerTlsConfig::new()
            .identity(Identity::from_pem(server.cert_pem(), server.key_pem()))
            .client_ca_root(Certificate::from_pem(pki.ca_pem()))
            .client_auth_optional(true);
        let port = Loopback::bind().await;
        let addr = port.addr();
        let server = Server::builder().tls_config(tls).unwrap().add_service(collector.service());
        (addr, port.serve_with(|incoming, stopped| server.serve_with_incoming_shutdown(incoming, stopped)))
    }

    /// The collector's endpoint, presenting `me` when given.
    fn endpoint(pki: &TestPki, addr: SocketAddr, me: Option<&Leaf>) -> Endpoint {
        let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pki.ca_pem()));
        if let Some(me) = me {
            tls = tls.identity(Identity::from_pem(me.cert_pem(), me.key_pem()));
        }
        Endpoint::from_shared(format!("https://{addr}")).unwrap().tls_config(tls).unwrap()
    }

    /// Sends `messages` on one stream and returns how it ended.
    async fn stream(endpoint: Endpoint, messages: Vec<load_proto::LoadReport>) -> Result<(), tonic::Status> {
        let mut client = LoadCollectorClient::connect(endpoint).await.unwrap();
        client.report(tokio_stream::iter(messages)).await.map(drop)
    }

    /// What the Assigner would read: each fresh report's task and total load.
    fn view(book: &LoadBook) -> Vec<(u32, f64)> {
        book.fresh("users", Duration::from_secs(600))
            .iter()
            .map(|r| (r.report.task(), r.report.total()))
            .collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_slicelet_reports_for_its_own_task_and_its_certificate_cannot_speak_for_another() {
        let pki = TestPki::new("fleet CA");
        let book = LoadBook::new();
        book.published("users", four_slices(1).into(), [0, 1]);
        let names = ReporterNames::pattern("{job}-{task}").unwrap();
        let collector = LoadCollector::new(book.clone()).authorize_reporters(names);
        let (addr, _stop) = serve_collector(&pki, collector.clone()).await;

        // Task 0's Slicelet, with task 0's certificate, reports over mutual TLS: accepted.
        let task0 = pki.issue(&["users-0"]);
        let slicelet = Slicelet::new(0);
        slicelet.set_assignment(four_slices(1));
        let reporter =
            slicelet.report_to(endpoint(&pki, addr, Some(&task0)), "users", Duration::from_millis(20));
        eventually("task 0's report", || book.accepted() >= 1).await;
        drop(reporter);
        eventually("the reporter's stream to close", || collector.open_streams() == 0).await;
        let before = view(&book);
        assert_eq!(before.iter().map(|(task, _)| *task).collect::<Vec<_>>(), vec![0]);
        assert_eq!(collector.refused(), 0);

        // The same certificate sends task 1's load (to make it look hot) and then task 0's:
        // the stream ends at the first, and neither reaches the book.
        let status = stream(endpoint(&pki, addr, Some(&task0)), vec![message(1, 1e6), message(0, 1e6)])
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
        assert!(status.message().contains("may not report for task 1 of job users"), "{}", status.message());
        assert_eq!(collector.refused(), 1);

        // A peer with no certificate at all is refused before it sends anything.
        let status = stream(endpoint(&pki, addr, None), vec![message(0, 1e6)]).await.unwrap_err();
        assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
        assert_eq!(collector.refused(), 2);

        // A certificate for another job's task 1 does not name this job's task 1.
        let other_job = pki.issue(&["orders-1"]);
        let status = stream(endpoint(&pki, addr, Some(&other_job)), vec![message(1, 1e6)]).await.unwrap_err();
        assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
        assert_eq!(collector.refused(), 3);

        assert_eq!(view(&book), before, "the Assigner's view did not change");
        assert_eq!(book.dropped(), 0, "refused reports never reached the book");

        // Task 1's own certificate may report for task 1.
        let task1 = pki.issue(&["users-1"]);
        stream(endpoint(&pki, addr, Some(&task1)), vec![message(1, 7.0)]).await.unwrap();
        assert_eq!(view(&book), vec![before[0], (1, 7.0)]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn without_authorization_any_certificate_or_none_may_report() {
        let pki = TestPki::new("fleet CA");
        let book = LoadBook::new();
        book.published("users", four_slices(1).into(), [0, 1]);
        let collector = LoadCollector::new(book.clone());
        let (addr, _stop) = serve_collector(&pki, collector.clone()).await;
        let task0 = pki.issue(&["users-0"]);
        stream(endpoint(&pki, addr, Some(&task0)), vec![message(1, 3.0)]).await.unwrap();
        stream(endpoint(&pki, addr, None), vec![message(0, 2.0)]).await.unwrap();
        assert_eq!(view(&book), vec![(0, 2.0), (1, 3.0)]);
        assert_eq!(collector.refused(), 0);
    }
}
