//! gRPC's autosharding protocol (gRFC A119) as the control plane serves it, end to end on
//! real tonic servers on 127.0.0.1 with the generated client: what a stream receives,
//! what it may send, and what becomes of its acks and load reports.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use steady_proto::autosharding::key_bytes;
use steady_proto::autosharding::keys::start_bytes;
use steady_proto::autosharding::ranges::{RangeRates, DEFAULT_METRIC};
use steady_proto::autosharding::reassembly::{Outcome, Reassembly};
use steady_proto::autosharding::v1::autosharding_service_client::AutoshardingServiceClient;
use steady_proto::autosharding::v1::{
    AssignmentAck, InitialClientConfig, Load, LoadReport, LoadReportingConfig, RangeLoad,
    WatchShardingAssignmentRequest as Request, WatchShardingAssignmentResponse as Response,
};
use steady_slice::{Assignment, Slice, SliceKey};
use steady_slicer::autosharding::{Autosharding, EndpointNames};
use steady_slicer::Distributor;
use steady_testing::loopback::{endpoint, serve, ServerGuard};
use steady_testing::{eventually, within};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Status, Streaming};

const PATIENCE: Duration = Duration::from_secs(10);

/// One client stream: what it sends goes through `tx`.
struct Client {
    tx: mpsc::Sender<Request>,
    responses: Streaming<Response>,
    reassembly: Reassembly,
}

impl Client {
    /// Opens a stream to `addr` and sends `first`.
    async fn open(addr: std::net::SocketAddr, first: Request) -> Self {
        let mut client = AutoshardingServiceClient::connect(endpoint(addr)).await.unwrap();
        let (tx, rx) = mpsc::channel(64);
        tx.send(first).await.unwrap();
        let responses = client.watch_sharding_assignment(ReceiverStream::new(rx)).await.unwrap().into_inner();
        Self { tx, responses, reassembly: Reassembly::default() }
    }

    /// Opens a stream on `job` as client `uuid`, which has `latest` already.
    async fn watch(addr: std::net::SocketAddr, job: &str, uuid: &str, latest: i64) -> Self {
        Self::open(addr, initial(job, uuid, latest)).await
    }

    async fn send(&self, request: Request) {
        self.tx.send(request).await.unwrap();
    }

    /// The next response (panics on an error or the end).
    async fn next(&mut self) -> Response {
        within(PATIENCE, "a response", self.responses.message()).await.unwrap().expect("the stream goes on")
    }

    /// How the stream ends: `Ok(())` cleanly, else its status. Panics on a response.
    async fn end(&mut self) -> Result<(), Status> {
        match within(PATIENCE, "the stream's end", self.responses.message()).await {
            Ok(None) => Ok(()),
            Ok(Some(response)) => panic!("a response instead of the end: {response:?}"),
            Err(status) => Err(status),
        }
    }

    async fn config(&mut self) -> LoadReportingConfig {
        self.next().await.config.expect("the configuration first")
    }

    /// The next assignment: its chunks (how many) reassembled at its metadata.
    async fn assignment(&mut self) -> (Outcome, usize) {
        let mut chunks = 0;
        loop {
            let response = self.next().await;
            if let Some(chunk) = response.chunk {
                chunks += 1;
                self.reassembly.chunk(chunk);
            } else {
                let metadata = response.metadata.expect("a chunk or the metadata");
                return (self.reassembly.finish(metadata), chunks);
            }
        }
    }
}

fn initial(job: &str, uuid: &str, latest: i64) -> Request {
    Request {
        initial_client_config: Some(InitialClientConfig {
            target: job.to_owned(),
            client_uuid: uuid.to_owned(),
            latest_generation: latest,
        }),
        ..Default::default()
    }
}

fn ack(generation: i64, accepted: bool, message: &str) -> Request {
    Request {
        assignment_ack: Some(AssignmentAck { generation, accepted, error_message: message.to_owned() }),
        ..Default::default()
    }
}

fn report(ranges: Vec<RangeLoad>, start: SystemTime, end: SystemTime) -> Request {
    Request {
        load_report: Some(LoadReport {
            metric_loads: [(DEFAULT_METRIC.to_owned(), Load { range_loads: ranges })].into(),
            start_time: Some(start.into()),
            end_time: Some(end.into()),
        }),
        ..Default::default()
    }
}

/// An assignment of `slices` slices over 40 tasks, each slice on two of them.
fn wide(generation: u64, slices: u64) -> Assignment {
    let step = u64::MAX / slices;
    let slices = (0..slices)
        .map(|i| Slice::new(SliceKey(i * step), [(i % 40) as u32, ((i + 7) % 40) as u32]))
        .collect();
    Assignment::new(generation, slices).unwrap()
}

/// A slice as `(start, end, its tasks' names)`.
type Named = (Vec<u8>, Option<Vec<u8>>, Vec<String>);

/// `assignment` as a client should have it: per slice, its start, its end and its tasks
/// by the names given.
fn expected(assignment: &Assignment, names: &EndpointNames, job: &str) -> Vec<Named> {
    let slices = assignment.slices();
    slices
        .iter()
        .enumerate()
        .map(|(i, slice)| {
            let end = slices.get(i + 1).map(|next| key_bytes(next.start).to_vec());
            let tasks = slice.replicas().iter().map(|&t| names.name(job, t)).collect();
            (start_bytes(slice.start), end, tasks)
        })
        .collect()
}

fn received(outcome: &Outcome) -> Vec<Named> {
    let received = outcome.assignment.as_ref().expect("an accepted assignment");
    received
        .slices
        .iter()
        .map(|s| {
            let tasks = s.endpoints.iter().map(|&i| received.endpoints[i].clone()).collect();
            (s.start.clone(), s.end.clone(), tasks)
        })
        .collect()
}

async fn serving(autosharding: &Autosharding) -> (std::net::SocketAddr, ServerGuard) {
    serve(autosharding.service()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configuration_comes_first_then_the_assignment_in_chunks_then_each_newer_one() {
    let distributor = Distributor::new();
    let names = EndpointNames::new();
    names.set("users", (0..40).map(|t| (t, format!("10.0.{t}.1:8080"))).collect::<Vec<_>>());
    let autosharding = Autosharding::new(distributor.clone())
        .with_endpoint_names(names.clone())
        .with_max_chunk_bytes(8 * 1024)
        .with_load_quantum(0.05)
        .with_report_interval(Duration::from_secs(3));
    let first = wide(1, 2000);
    distributor.publish("users", first.clone());
    let (addr, _server) = serving(&autosharding).await;
    let mut client = Client::watch(addr, "users", "client-a", 0).await;

    let config = client.config().await;
    assert_eq!(config.load_quantum_fraction, 0.05);
    assert_eq!(config.max_load_balancing_resolution_bytes, 8);
    assert_eq!(config.load_reporting_interval, Some(prost_types::Duration { seconds: 3, nanos: 0 }));
    assert_eq!(config.load_report_start_threshold, Some(prost_types::Duration { seconds: 300, nanos: 0 }));

    let (outcome, chunks) = client.assignment().await;
    assert!(chunks >= 3, "2,000 slices in chunks of 8 KiB: {chunks} chunks");
    assert!(outcome.ack.accepted, "{:?}", outcome.ack);
    assert_eq!(outcome.ack.generation, 1);
    assert_eq!(received(&outcome), expected(&first, &names, "users"));
    client.send(Request { assignment_ack: Some(outcome.ack), ..Default::default() }).await;

    let second = wide(2, 300);
    distributor.publish("users", second.clone());
    let (outcome, _) = client.assignment().await;
    assert_eq!(outcome.ack.generation, 2);
    assert_eq!(received(&outcome), expected(&second, &names, "users"));
    client.send(Request { assignment_ack: Some(outcome.ack), ..Default::default() }).await;
    eventually("both acks counted", || autosharding.acks_accepted() == 2).await;
    assert_eq!(autosharding.encodings(), 2, "one encoding per generation");
    assert_eq!(distributor.watchers("users"), 1, "the stream is one of the Distributor's watchers");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generation_is_encoded_once_for_every_stream_and_names_are_read_then() {
    let distributor = Distributor::new();
    let autosharding = Autosharding::new(distributor.clone());
    let names = autosharding.endpoint_names().clone();
    distributor.publish("users", Assignment::single(1, vec![0, 1]).unwrap());
    let (addr, _server) = serving(&autosharding).await;
    let mut clients = Vec::new();
    for i in 0..5 {
        let mut client = Client::watch(addr, "users", &format!("c{i}"), 0).await;
        client.config().await;
        let (outcome, _) = client.assignment().await;
        let endpoints = outcome.assignment.unwrap().endpoints;
        assert_eq!(endpoints, ["0", "1"], "no names set: task indices");
        clients.push(client);
    }
    // A name set now reaches clients with the next generation.
    names.set("users", vec![(1, "10.0.0.2:80".to_owned())]);
    distributor.publish("users", Assignment::single(2, vec![0, 1]).unwrap());
    for client in &mut clients {
        let (outcome, _) = client.assignment().await;
        assert_eq!(outcome.assignment.unwrap().endpoints, ["0", "10.0.0.2:80"]);
    }
    assert_eq!(autosharding.encodings(), 2, "each generation encoded once for five streams");
    drop(clients);
    eventually("the encoded generation dropped with the job's last stream", || {
        autosharding.encoded_jobs() == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latest_generation_skips_what_the_client_has() {
    let distributor = Distributor::new();
    let autosharding = Autosharding::new(distributor.clone());
    distributor.publish("users", Assignment::single(3, vec![0]).unwrap());
    let (addr, _server) = serving(&autosharding).await;
    let mut client = Client::watch(addr, "users", "client-a", 3).await;
    client.config().await;
    distributor.publish("users", Assignment::single(4, vec![1]).unwrap());
    let (outcome, _) = client.assignment().await;
    assert_eq!(outcome.ack.generation, 4, "generation 3 was not sent again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_are_counted_and_rejections_kept_and_an_ack_of_a_generation_not_sent_is_invalid() {
    let distributor = Distributor::new();
    let autosharding = Autosharding::new(distributor.clone());
    distributor.publish("users", Assignment::single(1, vec![0]).unwrap());
    let (addr, _server) = serving(&autosharding).await;
    let mut client = Client::watch(addr, "users", "client-a", 0).await;
    client.config().await;
    client.assignment().await;
    client.send(ack(1, true, "")).await;
    distributor.publish("users", Assignment::single(2, vec![0]).unwrap());
    client.assignment().await;
    client.send(ack(2, false, "no endpoint I can reach")).await;
    client.send(ack(9, true, "")).await;
    client.send(ack(1, true, "")).await;
    eventually("every ack taken", || {
        (autosharding.acks_accepted(), autosharding.acks_rejected(), autosharding.acks_invalid()) == (1, 1, 2)
    })
    .await;
    assert_eq!(autosharding.invalid_messages(), 2, "acks of generation 9 (never sent) and 1 (acked already)");
    let rejections = autosharding.rejections("users");
    assert_eq!(rejections.len(), 1);
    assert_eq!(
        (rejections[0].client.as_str(), rejections[0].generation, rejections[0].message.as_str()),
        ("client-a", 2, "no endpoint I can reach")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_no_one_knows_is_not_found_and_a_known_one_waits_for_its_first_generation() {
    let distributor = Distributor::new();
    let autosharding = Autosharding::new(distributor.clone()).with_known_jobs(|job| job == "specified");
    distributor.publish("users", Assignment::single(1, vec![0]).unwrap());
    let (addr, _server) = serving(&autosharding).await;
    let mut unknown = Client::watch(addr, "nobody", "client-a", 0).await;
    assert_eq!(unknown.end().await.unwrap_err().code(), Code::NotFound);

    let mut waiting = Client::watch(addr, "specified", "client-a", 0).await;
    waiting.config().await;
    distributor.publish("specified", Assignment::single(1, vec![2]).unwrap());
    let (outcome, _) = waiting.assignment().await;
    assert_eq!(outcome.assignment.unwrap().endpoints, ["2"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_first_message_ends_the_stream_with_invalid_argument() {
    let distributor = Distributor::new();
    let autosharding = Autosharding::new(distributor.clone());
    distributor.publish("users", Assignment::single(1, vec![0]).unwrap());
    let (addr, _server) = serving(&autosharding).await;
    let now = SystemTime::now();
    let bad_firsts = [
        ("a load report first", report(Vec::new(), now - Duration::from_secs(1), now)),
        ("an ack first", ack(1, true, "")),
        ("nothing set", Request::default()),
        (
            "a config and an ack",
            Request { assignment_ack: Some(AssignmentAck::default()), ..initial("users", "c", 0) },
        ),
        ("an empty client_uuid", initial("users", "", 0)),
        ("an overlong client_uuid", initial("users", &"u".repeat(129), 0)),
        ("an empty target", initial("", "c", 0)),
        ("an overlong target", initial(&"j".repeat(10_000), "c", 0)),
    ];
    for (what, first) in bad_firsts {
        let mut client = Client::open(addr, first).await;
        let status = client.end().await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{what}: {status:?}");
    }
    assert_eq!(autosharding.streams_ended_invalid(), 8);
    assert_eq!(distributor.watchers("users"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_load_report_is_counted_and_eight_invalid_messages_in_a_row_end_the_stream() {
    let distributor = Distributor::new();
    let autosharding = Autosharding::new(distributor.clone());
    distributor.publish("users", Assignment::single(1, vec![0]).unwrap());
    let (addr, _server) = serving(&autosharding).await;
    let mut client = Client::watch(addr, "users", "client-a", 0).await;
    client.config().await;
    client.assignment().await;
    let now = SystemTime::now();
    let backwards =
        report(vec![RangeLoad { start_key: vec![], load: 1.0 }], now, now - Duration::from_secs(1));
    client.send(backwards.clone()).await;
    eventually("the invalid report counted", || autosharding.reports_invalid() == 1).await;
    // A valid message between invalid ones starts the count again.
    let valid = report(vec![RangeLoad { start_key: vec![], load: 1.0 }], now - Duration::from_secs(1), now);
    client.send(valid).await;
    for _ in 0..6 {
        client.send(backwards.clone()).await;
    }
    client.send(Request::default()).await;
    eventually("seven invalid reports and an empty message", || autosharding.invalid_messages() == 8).await;
    assert_eq!(autosharding.streams_ended_invalid(), 0, "seven in a row since the valid one");
    client.send(backwards).await;
    let status = client.end().await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert_eq!((autosharding.reports_invalid(), autosharding.reports_accepted()), (8, 1));
    assert_eq!(autosharding.streams_ended_invalid(), 1);
    eventually("the stream's place freed", || distributor.watchers("users") == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_valid_load_report_reaches_the_sink_as_rates() {
    let distributor = Distributor::new();
    let got: Arc<Mutex<Vec<(String, String, RangeRates)>>> = Arc::default();
    let sink = got.clone();
    let autosharding = Autosharding::new(distributor.clone()).with_client_load(
        move |job: &str, client: &str, rates: RangeRates| {
            sink.lock().unwrap().push((job.to_owned(), client.to_owned(), rates));
        },
    );
    distributor.publish("users", Assignment::single(1, vec![0]).unwrap());
    let (addr, _server) = serving(&autosharding).await;
    let mut client = Client::watch(addr, "users", "client-a", 0).await;
    client.config().await;
    let end = SystemTime::now();
    let half = key_bytes(SliceKey(1 << 63)).to_vec();
    let ranges = vec![RangeLoad { start_key: vec![], load: 20.0 }, RangeLoad { start_key: half, load: 40.0 }];
    client.send(report(ranges, end - Duration::from_secs(10), end)).await;
    eventually("the report in the sink", || !got.lock().unwrap().is_empty()).await;
    let (job, uuid, rates) = got.lock().unwrap()[0].clone();
    assert_eq!((job.as_str(), uuid.as_str()), ("users", "client-a"));
    assert_eq!(rates.interval, Duration::from_secs(10));
    assert_eq!(
        rates.ranges,
        vec![(SliceKey(0), Some(SliceKey(1 << 63)), 2.0), (SliceKey(1 << 63), None, 4.0)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_count_against_the_distributor_s_limits_and_end_with_its_watchers() {
    let distributor = Distributor::new().with_max_watchers(1);
    let autosharding = Autosharding::new(distributor.clone());
    distributor.publish("users", Assignment::single(1, vec![0]).unwrap());
    let (addr, _server) = serving(&autosharding).await;
    let mut client = Client::watch(addr, "users", "client-a", 1).await;
    client.config().await;
    assert_eq!((distributor.total_watchers(), autosharding.open_streams()), (1, 1));
    let mut second = Client::watch(addr, "users", "client-b", 1).await;
    assert_eq!(second.end().await.unwrap_err().code(), Code::ResourceExhausted);

    distributor.close_watchers();
    assert!(client.end().await.is_ok(), "ended cleanly: the client reconnects");
    eventually("no stream left", || distributor.total_watchers() == 0 && autosharding.open_streams() == 0)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_half_closes_keeps_receiving_assignments() {
    let distributor = Distributor::new();
    let autosharding = Autosharding::new(distributor.clone());
    distributor.publish("users", Assignment::single(1, vec![0]).unwrap());
    let (addr, _server) = serving(&autosharding).await;
    let mut client = Client::watch(addr, "users", "client-a", 0).await;
    // Its side of the stream ends once its sender is gone.
    let (unused, _) = mpsc::channel(1);
    drop(std::mem::replace(&mut client.tx, unused));
    client.config().await;
    client.assignment().await;
    distributor.publish("users", Assignment::single(2, vec![1]).unwrap());
    let (outcome, _) = client.assignment().await;
    assert_eq!(outcome.ack.generation, 2);
}
