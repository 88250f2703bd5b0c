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
use steady_slicer::autosharding::{quantum_per_task, Autosharding, ClientLoadSink, EndpointNames};
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
    /// The configurations received since the first one, in order.
    configs: Vec<LoadReportingConfig>,
}

impl Client {
    /// Opens a stream to `addr` and sends `first`.
    async fn open(addr: std::net::SocketAddr, first: Request) -> Self {
        let mut client = AutoshardingServiceClient::connect(endpoint(addr)).await.unwrap();
        let (tx, rx) = mpsc::channel(64);
        tx.send(first).await.unwrap();
        let responses = client.watch_sharding_assignment(ReceiverStream::new(rx)).await.unwrap().into_inner();
        Self { tx, responses, reassembly: Reassembly::default(), configs: Vec::new() }
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

    /// The next assignment: its chunks (how many) reassembled at its metadata. A new
    /// configuration before its first chunk is kept in `configs`.
    async fn assignment(&mut self) -> (Outcome, usize) {
        let mut chunks = 0;
        loop {
            let response = self.next().await;
            if let Some(config) = response.config {
                assert_eq!(chunks, 0, "a configuration within an assignment's chunks");
                self.configs.push(config);
            } else if let Some(chunk) = response.chunk {
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

/// The load quantum is per task: a generation whose task count changes it comes after a
/// new configuration carrying it, on a stream open since before; a generation of the same
/// count does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generation_that_changes_the_quantum_comes_after_a_configuration_with_it() {
    let distributor = Distributor::new();
    let autosharding = Autosharding::new(distributor.clone());
    distributor.publish("users", Assignment::single(1, vec![0, 1]).unwrap());
    let (addr, _server) = serving(&autosharding).await;
    // One slice per task, over `tasks` tasks.
    let over = |generation: u64, tasks: u64| {
        let step = u64::MAX / tasks;
        let slices = (0..tasks).map(|t| Slice::new(SliceKey(t * step), [t as u32])).collect();
        Assignment::new(generation, slices).unwrap()
    };
    let mut client = Client::watch(addr, "users", "c", 0).await;
    let first = client.config().await;
    assert_eq!(first.load_quantum_fraction, quantum_per_task(2));
    client.assignment().await;
    assert!(client.configs.is_empty());
    // Ten tasks: a finer quantum, sent before the generation's chunks; the rest as before.
    distributor.publish("users", over(2, 10));
    let (outcome, _) = client.assignment().await;
    assert_eq!(outcome.assignment.unwrap().generation, 2);
    let finer = LoadReportingConfig { load_quantum_fraction: quantum_per_task(10), ..first };
    assert_eq!(client.configs, [finer]);
    // The same ten tasks again: no configuration.
    distributor.publish("users", over(3, 10));
    let (outcome, _) = client.assignment().await;
    assert_eq!(outcome.assignment.unwrap().generation, 3);
    assert_eq!(client.configs.len(), 1);
}

/// A client that connects while the job's names are coming (an instance that just
/// started serving it asked its registry) gets its first generation with the names, not
/// with the tasks' indices (which it would keep until the job's next generation).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_connecting_while_the_names_are_coming_gets_them_with_its_first_generation() {
    let distributor = Distributor::new();
    let autosharding = Autosharding::new(distributor.clone());
    let names = autosharding.endpoint_names().clone();
    names.expect("users");
    distributor.publish("users", Assignment::single(1, vec![0, 1]).unwrap());
    let (addr, _server) = serving(&autosharding).await;
    let mut client = Client::watch(addr, "users", "c", 0).await;
    client.config().await;
    // The registry answers a moment later (the client's stream is open meanwhile).
    let answered = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        names.set("users", vec![(0, "10.0.0.1:80".to_owned()), (1, "10.0.0.2:80".to_owned())]);
    });
    let (outcome, _) = client.assignment().await;
    assert_eq!(outcome.assignment.unwrap().endpoints, ["10.0.0.1:80", "10.0.0.2:80"]);
    assert_eq!(autosharding.encodings(), 1);
    answered.await.unwrap();
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
    // A name set now reaches the clients connected with the next generation (each
    // generation goes to a client once), and a client that connects now at once: the
    // generation is encoded anew for it, once, whoever else comes.
    names.set("users", vec![(1, "10.0.0.2:80".to_owned())]);
    for i in 5..7 {
        let mut late = Client::watch(addr, "users", &format!("c{i}"), 0).await;
        late.config().await;
        let (outcome, _) = late.assignment().await;
        let assignment = outcome.assignment.unwrap();
        assert_eq!(
            (assignment.generation, assignment.endpoints),
            (1, vec!["0".to_owned(), "10.0.0.2:80".to_owned()])
        );
        clients.push(late);
    }
    assert_eq!(autosharding.encodings(), 2, "generation 1 encoded once per set of names");
    // The same names set again change nothing.
    names.set("users", vec![(1, "10.0.0.2:80".to_owned())]);
    distributor.publish("users", Assignment::single(2, vec![0, 1]).unwrap());
    for client in &mut clients {
        let (outcome, _) = client.assignment().await;
        assert_eq!(outcome.assignment.unwrap().endpoints, ["0", "10.0.0.2:80"]);
    }
    assert_eq!(autosharding.encodings(), 3, "generation 2 encoded once for seven streams");
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
    assert_eq!((autosharding.streams_ended_invalid(), autosharding.invalid_messages()), (8, 8));
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

/// A sink that keeps every report it is handed.
#[derive(Debug, Clone, Default)]
struct Recorder(Arc<Mutex<Vec<(String, String, RangeRates)>>>);

impl ClientLoadSink for Recorder {
    fn accept(&self, job: &str, client: &str, rates: RangeRates) {
        self.0.lock().unwrap().push((job.to_owned(), client.to_owned(), rates));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_valid_load_report_reaches_the_sink_as_rates() {
    let distributor = Distributor::new();
    let recorder = Recorder::default();
    let got = recorder.0.clone();
    let autosharding = Autosharding::new(distributor.clone()).with_client_load(recorder);
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

/// How long one new generation takes to reach 1,000 watchers over A119 and over steady's
/// Watch: one server serving both from one Distributor, 20 loopback connections of 50
/// streams each per protocol, a 15,000-slice assignment on 40 tasks named by address,
/// each round timed from the publish to the last watcher's complete generation. Twice:
/// with clients that take each message's bytes as they come (what the server and the
/// transport cost), then with the generated clients, which decode every message (on the
/// same two cores as the server). A measurement, not a check:
///
/// ```text
/// cargo test --release -p steady-slicer --test autosharding -- --ignored --nocapture
/// ```
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run it in release with --ignored --nocapture"]
async fn distribution_to_a_thousand_watchers_over_a119_and_over_watch() {
    fanout::measure(false).await;
    fanout::measure(true).await;
}

/// The fan-out measurement's parts.
mod fanout {
    use prost::bytes::{Buf, BufMut, Bytes};
    use steady_proto::assignment::assignment_distributor_client::AssignmentDistributorClient;
    use steady_proto::assignment::WatchRequest;
    use steady_testing::loopback::Loopback;
    use tokio::time::Instant;
    use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
    use tonic::transport::Channel;

    use super::*;

    const WATCHERS: usize = 1000;
    const CONNECTIONS: usize = 20;
    const ROUNDS: u64 = 7;
    const SLICES: u64 = 15_000;

    fn name(task: u32) -> String {
        format!("10.0.{task}.1:8080")
    }

    pub(super) async fn measure(decoded: bool) {
        let distributor = Distributor::new();
        let autosharding = Autosharding::new(distributor.clone());
        autosharding.endpoint_names().set("a119", (0..40).map(|t| (t, name(t))).collect::<Vec<_>>());
        distributor.publish("watch", wide(1, SLICES));
        distributor.publish("a119", wide(1, SLICES));
        let (watch_service, a119_service) = (distributor.service(), autosharding.service());
        let port = Loopback::bind().await;
        let addr = port.addr();
        let _server = port.serve_with(move |incoming, stopped| {
            tonic::transport::Server::builder()
                .add_service(watch_service)
                .add_service(a119_service)
                .serve_with_incoming_shutdown(incoming, stopped)
        });
        let mut channels = Vec::new();
        for _ in 0..CONNECTIONS {
            channels.push(endpoint(addr).connect().await.unwrap());
        }
        // Each watcher says which generation it has, complete, on its protocol's channel.
        let (watch_tx, mut watch_rx) = mpsc::unbounded_channel::<u64>();
        let (a119_tx, mut a119_rx) = mpsc::unbounded_channel::<u64>();
        let mut watchers = Vec::new();
        for i in 0..WATCHERS {
            let channel = channels[i % CONNECTIONS].clone();
            let uuid = format!("client-{i}");
            if decoded {
                watchers.push(watch_decoded(channel.clone(), watch_tx.clone()).await);
                watchers.push(a119_decoded(channel, &uuid, a119_tx.clone()).await);
            } else {
                watchers.push(watch_raw(channel.clone(), watch_tx.clone()).await);
                watchers.push(a119_raw(channel, &uuid, a119_tx.clone()).await);
            }
        }
        all_have(&mut watch_rx, 1).await;
        all_have(&mut a119_rx, 1).await;

        let (mut watch_times, mut a119_times) = (Vec::new(), Vec::new());
        for generation in 2..2 + ROUNDS {
            let assignment = wide(generation, SLICES);
            let started = Instant::now();
            distributor.publish("watch", assignment.clone());
            all_have(&mut watch_rx, generation).await;
            watch_times.push(started.elapsed());
            let started = Instant::now();
            distributor.publish("a119", assignment);
            all_have(&mut a119_rx, generation).await;
            a119_times.push(started.elapsed());
        }
        watch_times.sort();
        a119_times.sort();
        let (watch, a119) = (watch_times[watch_times.len() / 2], a119_times[a119_times.len() / 2]);
        let watch_bytes = steady_proto::encode_update(&wide(1, SLICES)).len();
        let a119_messages =
            steady_proto::autosharding::chunks::encoded_responses(&wide(1, SLICES), name, 64 * 1024);
        println!(
            "{} clients: {WATCHERS} watchers per protocol, {SLICES} slices ({watch_bytes} bytes on Watch, \
             {} bytes in {} messages on A119), {ROUNDS} rounds: Watch median {watch:?} (min {:?}), \
             A119 median {a119:?} (min {:?}), A119/Watch {:.2}; A119 encodings {}",
            if decoded { "decoding" } else { "raw" },
            a119_messages.iter().map(Bytes::len).sum::<usize>(),
            a119_messages.len(),
            watch_times[0],
            a119_times[0],
            a119.as_secs_f64() / watch.as_secs_f64(),
            autosharding.encodings(),
        );
        for watcher in watchers {
            watcher.abort();
        }
    }

    /// Waits until every watcher has `generation`.
    async fn all_have(rx: &mut mpsc::UnboundedReceiver<u64>, generation: u64) {
        let mut have = 0;
        while have < WATCHERS {
            let got = within(Duration::from_secs(120), "every watcher", rx.recv()).await.unwrap();
            if got == generation {
                have += 1;
            }
        }
    }

    type Watcher = tokio::task::JoinHandle<()>;

    async fn watch_decoded(channel: Channel, tx: mpsc::UnboundedSender<u64>) -> Watcher {
        let mut client = AssignmentDistributorClient::new(channel).max_decoding_message_size(16 << 20);
        let request = WatchRequest { job: "watch".to_owned(), known_generation: 0 };
        let mut updates = client.watch(request).await.unwrap().into_inner();
        tokio::spawn(async move {
            while let Ok(Some(update)) = updates.message().await {
                let _ = tx.send(update.generation);
            }
        })
    }

    async fn a119_decoded(channel: Channel, uuid: &str, tx: mpsc::UnboundedSender<u64>) -> Watcher {
        let (requests, rx) = mpsc::channel(4);
        requests.send(initial("a119", uuid, 0)).await.unwrap();
        let mut responses = AutoshardingServiceClient::new(channel)
            .watch_sharding_assignment(ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        tokio::spawn(async move {
            let _requests = requests;
            while let Ok(Some(response)) = responses.message().await {
                if let Some(metadata) = response.metadata {
                    let _ = tx.send(metadata.generation as u64);
                }
            }
        })
    }

    async fn watch_raw(channel: Channel, tx: mpsc::UnboundedSender<u64>) -> Watcher {
        let mut grpc = tonic::client::Grpc::new(channel).max_decoding_message_size(16 << 20);
        grpc.ready().await.unwrap();
        let request = WatchRequest { job: "watch".to_owned(), known_generation: 0 };
        let path = http::uri::PathAndQuery::from_static("/steady.assignment.v1.AssignmentDistributor/Watch");
        let request = tonic::Request::new(Bytes::from(prost::Message::encode_to_vec(&request)));
        let mut updates = grpc.server_streaming(request, path, Raw).await.unwrap().into_inner();
        tokio::spawn(async move {
            while let Ok(Some(update)) = updates.message().await {
                // Field 1, the generation, comes first.
                let mut rest = &update[1..];
                let _ = tx.send(prost::encoding::decode_varint(&mut rest).unwrap());
            }
        })
    }

    async fn a119_raw(channel: Channel, uuid: &str, tx: mpsc::UnboundedSender<u64>) -> Watcher {
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready().await.unwrap();
        let (requests, rx) = mpsc::channel(4);
        requests.send(Bytes::from(prost::Message::encode_to_vec(&initial("a119", uuid, 0)))).await.unwrap();
        let path =
            http::uri::PathAndQuery::from_static(steady_proto::autosharding::WATCH_SHARDING_ASSIGNMENT);
        let request = tonic::Request::new(ReceiverStream::new(rx));
        let mut responses = grpc.streaming(request, path, Raw).await.unwrap().into_inner();
        tokio::spawn(async move {
            let _requests = requests;
            while let Ok(Some(response)) = responses.message().await {
                // Field 3, the metadata, is a message of its own: the rest are chunks.
                if response.first() == Some(&0x1a) {
                    let decoded = <Response as prost::Message>::decode(response).unwrap();
                    let _ = tx.send(decoded.metadata.unwrap().generation as u64);
                }
            }
        })
    }

    /// Messages as their bytes, both ways.
    #[derive(Debug, Clone, Copy, Default)]
    struct Raw;

    impl Codec for Raw {
        type Encode = Bytes;
        type Decode = Bytes;
        type Encoder = Raw;
        type Decoder = Raw;

        fn encoder(&mut self) -> Raw {
            Raw
        }

        fn decoder(&mut self) -> Raw {
            Raw
        }
    }

    impl Encoder for Raw {
        type Item = Bytes;
        type Error = Status;

        fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
            dst.put(item);
            Ok(())
        }
    }

    impl Decoder for Raw {
        type Item = Bytes;
        type Error = Status;

        fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
            Ok(Some(src.copy_to_bytes(src.remaining())))
        }
    }
}
