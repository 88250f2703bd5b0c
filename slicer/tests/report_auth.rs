//! Load reports only from the task they describe: a collector behind mutual TLS accepts
//! a Slicelet's reports for the task its certificate names, and refuses (and counts)
//! anything else, leaving the Assigner's view as it was. Real rustls on loopback.
#![cfg(feature = "tls")]

#[path = "../../tonic-integration/tests/support/mod.rs"]
mod support;

use std::net::SocketAddr;
use std::time::Duration;

use steady_proto::load::load_collector_client::LoadCollectorClient;
use steady_proto::load::{self as load_proto, KeyLoad, SliceLoad};
use steady_slice::{Assignment, Slice, SliceKey};
use steady_slicelet::Slicelet;
use steady_slicer::load::{LoadBook, LoadCollector, ReporterNames};
use steady_testing::tls::{Leaf, TestPki};
use support::eventually;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, Server, ServerTlsConfig};
use tonic::Code;

/// Four equal slices: task 0 holds slices 0 and 2, task 1 slices 1 and 3.
fn four_slices(generation: u64) -> Assignment {
    Assignment::new(
        generation,
        (0..4u64).map(|i| Slice { start: SliceKey(i << 62), replicas: vec![(i % 2) as u32] }).collect(),
    )
    .unwrap()
}

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
async fn serve_collector(pki: &TestPki, collector: LoadCollector) -> (SocketAddr, oneshot::Sender<()>) {
    let server = pki.issue(&["127.0.0.1"]);
    let tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(server.cert_pem(), server.key_pem()))
        .client_ca_root(Certificate::from_pem(pki.ca_pem()))
        .client_auth_optional(true);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let server = Server::builder().tls_config(tls).unwrap().add_service(collector.service());
    tokio::spawn(server.serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
        let _ = stopped.await;
    }));
    (addr, stop)
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
    let reporter = slicelet.report_to(endpoint(&pki, addr, Some(&task0)), "users", Duration::from_millis(20));
    eventually("task 0's report", || book.accepted() >= 1).await;
    drop(reporter);
    eventually("the reporter's stream to close", || collector.open_streams() == 0).await;
    let before = view(&book);
    assert_eq!(before.iter().map(|(task, _)| *task).collect::<Vec<_>>(), vec![0]);
    assert_eq!(collector.refused(), 0);

    // The same certificate sends task 1's load (to make it look hot) and then task 0's:
    // the stream ends at the first, and neither reaches the book.
    let status =
        stream(endpoint(&pki, addr, Some(&task0)), vec![message(1, 1e6), message(0, 1e6)]).await.unwrap_err();
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
