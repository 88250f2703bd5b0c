//! steady's A119 client (`steady_proto::autosharding::follow_autosharding`) and a
//! `SteadyChannel` following an A119 server, against a scripted A119 server on 127.0.0.1:
//! each test plays the server's side of the stream message by message with the generated
//! `AutoshardingService` server, and checks what the client answers.

use std::net::SocketAddr;
use std::pin::pin;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::StreamExt;
use steady_balance::{Backoff, BalanceConfig};
use steady_proto::autosharding::chunks::{responses, DEFAULT_MAX_CHUNK_BYTES};
use steady_proto::autosharding::ranges::{validate, ReportRules};
use steady_proto::autosharding::v1::autosharding_service_server::{
    AutoshardingService, AutoshardingServiceServer,
};
use steady_proto::autosharding::v1::{
    AssignmentAck, AssignmentChunk, AssignmentMetadata, EndpointState, InitialClientConfig, LoadReport,
    LoadReportingConfig, PerSliceEndpointState, Slice as A119Slice, SliceAssignment,
    WatchShardingAssignmentRequest, WatchShardingAssignmentResponse,
};
use steady_proto::autosharding::{follow_autosharding, key_bytes, AutoshardingConfig, AutoshardingError};
use steady_slice::{Assignment, Slice, SliceKey};
use steady_testing::echo::echo_client::EchoClient;
use steady_testing::echo::{echo, endpoints, serve_echo, serve_recording};
use steady_testing::loopback::{self, ServerGuard};
use steady_testing::wait::PATIENCE;
use steady_testing::{eventually, within};
use steady_tonic::{KeyTally, SteadyChannel};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Request, Response, Status, Streaming};

type Responses = mpsc::Sender<Result<WatchShardingAssignmentResponse, Status>>;

/// A raw slice: `(start, end, endpoint indices)`.
type RawSlice<'a> = (&'a [u8], Option<&'a [u8]>, &'a [i32]);

/// A raw assignment the client rejects: its generation, endpoints and slices, and what
/// the ack says.
type Rejected<'a> = (i64, &'a [&'a str], Vec<RawSlice<'a>>, &'a str);

/// The server's side: every stream a client opens is handed to the test as a [`Call`];
/// a stream for the target `unknown` is refused with `NOT_FOUND`. While the test holds
/// the gate closed, a new stream waits at it (counted in `attempts`).
#[derive(Clone)]
struct ScriptedServer {
    calls: mpsc::UnboundedSender<Call>,
    gate: Arc<tokio::sync::watch::Sender<bool>>,
    attempts: Arc<AtomicUsize>,
}

#[tonic::async_trait]
impl AutoshardingService for ScriptedServer {
    type WatchShardingAssignmentStream = ReceiverStream<Result<WatchShardingAssignmentResponse, Status>>;

    async fn watch_sharding_assignment(
        &self,
        request: Request<Streaming<WatchShardingAssignmentRequest>>,
    ) -> Result<Response<Self::WatchShardingAssignmentStream>, Status> {
        self.attempts.fetch_add(1, Ordering::SeqCst);
        let _ = self.gate.subscribe().wait_for(|&open| open).await;
        let mut requests = request.into_inner();
        let first = requests.message().await?.ok_or_else(|| Status::invalid_argument("no first message"))?;
        let initial =
            first.initial_client_config.ok_or_else(|| Status::invalid_argument("no client config first"))?;
        if initial.target == "unknown" {
            return Err(Status::not_found("no such target"));
        }
        let (responses, stream) = mpsc::channel(64);
        let _ = self.calls.send(Call { initial, requests, responses, reports: Vec::new() });
        Ok(Response::new(ReceiverStream::new(stream)))
    }
}

/// A scripted server on a loopback port.
struct Script {
    addr: SocketAddr,
    calls: mpsc::UnboundedReceiver<Call>,
    gate: Arc<tokio::sync::watch::Sender<bool>>,
    attempts: Arc<AtomicUsize>,
    _server: ServerGuard,
}

impl Script {
    async fn start() -> Self {
        let (calls, received) = mpsc::unbounded_channel();
        let gate = Arc::new(tokio::sync::watch::Sender::new(true));
        let attempts = Arc::new(AtomicUsize::new(0));
        let server = ScriptedServer { calls, gate: gate.clone(), attempts: attempts.clone() };
        let (addr, server) = loopback::serve(AutoshardingServiceServer::new(server)).await;
        Self { addr, calls: received, gate, attempts, _server: server }
    }

    /// Holds new streams at the gate (`false`) or lets them through (`true`).
    fn gate(&self, open: bool) {
        self.gate.send_replace(open);
    }

    /// How many streams clients have opened, taken or held at the gate.
    fn attempts(&self) -> usize {
        self.attempts.load(Ordering::SeqCst)
    }

    fn endpoint(&self) -> tonic::transport::Endpoint {
        loopback::endpoint(self.addr)
    }

    /// The next stream a client opens.
    async fn next_call(&mut self) -> Call {
        within(PATIENCE, "a client's stream", self.calls.recv()).await.expect("the server runs")
    }
}

/// One stream, from the server's side.
struct Call {
    initial: InitialClientConfig,
    requests: Streaming<WatchShardingAssignmentRequest>,
    responses: Responses,
    /// The load reports read so far.
    reports: Vec<LoadReport>,
}

impl Call {
    async fn send(&self, response: WatchShardingAssignmentResponse) {
        self.responses.send(Ok(response)).await.expect("the stream is open");
    }

    /// Sends a reporting configuration: reports every second.
    async fn config(&self, quantum: f64, resolution: i32) {
        let config = LoadReportingConfig {
            load_quantum_fraction: quantum,
            max_load_balancing_resolution_bytes: resolution,
            load_reporting_interval: Some(prost_types_duration(1)),
            load_report_start_threshold: Some(prost_types_duration(300)),
        };
        self.send(WatchShardingAssignmentResponse { config: Some(config), ..Default::default() }).await;
    }

    /// Sends `assignment` as `pieces` chunks (its endpoints in order, its slices last
    /// first), then its metadata.
    async fn assignment(&self, assignment: &Assignment, name: impl FnMut(u32) -> String, pieces: usize) {
        for response in split(responses(assignment, name, DEFAULT_MAX_CHUNK_BYTES), pieces) {
            self.send(response).await;
        }
    }

    /// Sends one raw assignment: `slices` as `(start, end, endpoint indices)` over
    /// `endpoints`.
    async fn raw(&self, generation: i64, endpoints: &[&str], slices: &[RawSlice<'_>]) {
        let chunk = AssignmentChunk {
            endpoints: endpoints.iter().map(|e| EndpointState { endpoint: (*e).to_owned() }).collect(),
            slice_assignments: slices
                .iter()
                .map(|(start, end, indices)| SliceAssignment {
                    slice: Some(A119Slice { start_key: start.to_vec(), end_key: end.map(<[u8]>::to_vec) }),
                    endpoints: indices.iter().map(|&i| PerSliceEndpointState { endpoint_index: i }).collect(),
                })
                .collect(),
        };
        self.send(WatchShardingAssignmentResponse { chunk: Some(chunk), ..Default::default() }).await;
        let metadata = AssignmentMetadata { generation };
        self.send(WatchShardingAssignmentResponse { metadata: Some(metadata), ..Default::default() }).await;
    }

    /// The client's next message that is not a load report (those are kept).
    async fn next_ack(&mut self) -> AssignmentAck {
        loop {
            let request = self.next_request().await;
            if let Some(ack) = request.assignment_ack {
                return ack;
            }
            assert!(request.initial_client_config.is_none(), "a second client config");
        }
    }

    /// Reads the client's messages until the reports read hold `total` load of the
    /// metric `requests` (acks are not expected meanwhile).
    async fn reports_until(&mut self, total: f64) {
        while reported(&self.reports) < total {
            let request = self.next_request().await;
            assert!(
                request.assignment_ack.is_none() && request.initial_client_config.is_none(),
                "{request:?}"
            );
        }
        assert_eq!(reported(&self.reports), total, "no more than what was counted");
    }

    async fn next_request(&mut self) -> WatchShardingAssignmentRequest {
        let request = within(PATIENCE, "the client's next message", self.requests.message())
            .await
            .expect("the stream is healthy")
            .expect("the client keeps its stream open");
        if let Some(report) = &request.load_report {
            self.reports.push(report.clone());
        }
        request
    }
}

fn prost_types_duration(seconds: i64) -> prost_types::Duration {
    prost_types::Duration { seconds, nanos: 0 }
}

/// The load of the metric `requests` in `reports`.
fn reported(reports: &[LoadReport]) -> f64 {
    reports
        .iter()
        .filter_map(|r| r.metric_loads.get("requests"))
        .flat_map(|load| load.range_loads.iter().map(|r| r.load))
        .sum()
}

/// `messages` (one chunk and the metadata) with the chunk split into `pieces`: the
/// endpoints spread over them in order, the slices in reverse order (the protocol allows
/// any).
fn split(
    messages: Vec<WatchShardingAssignmentResponse>,
    pieces: usize,
) -> Vec<WatchShardingAssignmentResponse> {
    let [chunk, metadata]: [WatchShardingAssignmentResponse; 2] =
        messages.try_into().expect("one chunk, one metadata");
    let chunk = chunk.chunk.expect("a chunk");
    let mut out: Vec<AssignmentChunk> = vec![AssignmentChunk::default(); pieces];
    let endpoints = chunk.endpoints.len();
    for (i, endpoint) in chunk.endpoints.into_iter().enumerate() {
        out[i * pieces / endpoints.max(1)].endpoints.push(endpoint);
    }
    for (i, slice) in chunk.slice_assignments.into_iter().rev().enumerate() {
        out[i % pieces].slice_assignments.push(slice);
    }
    let mut messages: Vec<WatchShardingAssignmentResponse> = out
        .into_iter()
        .map(|chunk| WatchShardingAssignmentResponse { chunk: Some(chunk), ..Default::default() })
        .collect();
    messages.push(metadata);
    messages
}

/// A backoff short enough for a test to see reconnections at once.
fn fast() -> Backoff {
    Backoff { base: Duration::from_millis(5), max: Duration::from_millis(50), jitter: 0.5 }
}

/// Four slices over tasks 0 to 3, at `generation`.
fn quarters(generation: u64, tasks: [u32; 4]) -> Assignment {
    let starts = [0, 1 << 62, 1 << 63, 3 << 62];
    Assignment::new(
        generation,
        starts.iter().zip(tasks).map(|(&s, t)| Slice::new(SliceKey(s), vec![t])).collect(),
    )
    .unwrap()
}

/// Follows `script` with `config`, the stream's items forwarded to the receiver it
/// returns (the stream is polled all the time, as a balancer polls its source).
fn follow(
    script: &Script,
    target: &str,
    config: AutoshardingConfig,
) -> mpsc::UnboundedReceiver<Result<Assignment, AutoshardingError>> {
    let stream = follow_autosharding(script.endpoint(), target, config).unwrap();
    let (items, received) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut stream = pin!(stream);
        while let Some(item) = stream.next().await {
            if items.send(item).is_err() {
                return;
            }
        }
    });
    received
}

async fn next_item(
    items: &mut mpsc::UnboundedReceiver<Result<Assignment, AutoshardingError>>,
) -> Option<Result<Assignment, AutoshardingError>> {
    within(PATIENCE, "the client's next item", items.recv()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_assignment_is_acknowledged_with_the_clients_final_decision() {
    let mut script = Script::start().await;
    let mut items = follow(&script, "users", AutoshardingConfig { backoff: fast(), ..Default::default() });
    let mut call = script.next_call().await;
    assert_eq!(call.initial.target, "users");
    assert_eq!(call.initial.latest_generation, 0);
    assert_eq!(call.initial.client_uuid.len(), 36, "{}", call.initial.client_uuid);
    call.config(0.01, 8).await;

    // An assignment in three chunks, then a newer one: each followed, each accepted.
    for (generation, tasks) in [(3, [0, 1, 2, 3]), (4, [3, 2, 1, 0])] {
        let assignment = quarters(generation, tasks);
        call.assignment(&assignment, |t| t.to_string(), 3).await;
        assert_eq!(next_item(&mut items).await.unwrap().unwrap(), assignment);
        let ack = call.next_ack().await;
        assert_eq!(
            ack,
            AssignmentAck { generation: generation as i64, accepted: true, error_message: String::new() }
        );
    }

    // A stale generation, by the protocol's rules; keys without an endpoint and
    // endpoints the client cannot name, by steady's: each rejected, named in the ack,
    // and counted by the stream as an error item.
    let half: &[u8] = &[0x80];
    let rejected: [Rejected<'_>; 3] = [
        (2, &["0"], vec![(b"", None, &[0])], "stale generation 2"),
        (5, &["0"], vec![(b"", Some(half), &[0]), (half, None, &[])], "have no endpoint"),
        (
            6,
            &["0", "backend-x"],
            vec![(b"", Some(half), &[0]), (half, None, &[1])],
            "does not know (\"backend-x\")",
        ),
    ];
    for (generation, endpoints, slices, reason) in rejected {
        call.raw(generation, endpoints, &slices).await;
        let ack = call.next_ack().await;
        assert_eq!((ack.generation, ack.accepted), (generation, false), "{ack:?}");
        assert!(ack.error_message.contains(reason), "{generation}: {}", ack.error_message);
        match next_item(&mut items).await {
            Some(Err(AutoshardingError::Rejected { generation: g, reason: r })) => {
                assert_eq!((g, r), (generation, ack.error_message));
            }
            other => panic!("{generation}: {other:?}"),
        }
    }

    // The stream ends mid-assignment: the client opens another as the same client, names
    // the newest generation it answered, and takes the next assignment whole (nothing of
    // the cut one mixed in).
    let cut =
        split(responses(&quarters(7, [1, 1, 1, 1]), |t| format!("cut-{t}"), DEFAULT_MAX_CHUNK_BYTES), 3);
    call.send(cut[0].clone()).await;
    let uuid = call.initial.client_uuid.clone();
    drop(call);
    let mut call = script.next_call().await;
    assert_eq!(call.initial.client_uuid, uuid);
    assert_eq!(
        call.initial.latest_generation, 4,
        "the newest followed: 5 and 6 were answered, but not followed"
    );
    let assignment = quarters(7, [2, 0, 3, 1]);
    call.assignment(&assignment, |t| t.to_string(), 2).await;
    assert_eq!(next_item(&mut items).await.unwrap().unwrap(), assignment);
    assert!(call.next_ack().await.accepted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_that_asking_again_cannot_change_end_the_stream() {
    let script = Script::start().await;
    let mut items = follow(&script, "unknown", AutoshardingConfig { backoff: fast(), ..Default::default() });
    match next_item(&mut items).await {
        Some(Err(AutoshardingError::Refused(status))) => {
            assert_eq!(status.code(), Code::NotFound, "{status:?}")
        }
        other => panic!("{other:?}"),
    }
    assert!(next_item(&mut items).await.is_none(), "the stream ended");

    // A server without the service: UNIMPLEMENTED.
    let (addr, _echo) = serve_echo(0).await;
    let stream =
        follow_autosharding(loopback::endpoint(addr), "users", AutoshardingConfig::default()).unwrap();
    let items: Vec<_> = within(PATIENCE, "the stream's end", stream.collect::<Vec<_>>()).await;
    assert!(
        matches!(&items[..], [Err(AutoshardingError::Refused(s))] if s.code() == Code::Unimplemented),
        "{items:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_argument_ends_the_following_only_when_it_refuses_a_streams_first_message() {
    let mut script = Script::start().await;
    let mut items = follow(&script, "users", AutoshardingConfig { backoff: fast(), ..Default::default() });
    // After the stream delivered its configuration, the server refuses some later
    // message (steady's server: 8 invalid load reports in a row): the client connects
    // again, as the same client.
    let call = script.next_call().await;
    call.config(0.01, 8).await;
    call.responses.send(Err(Status::invalid_argument("8 invalid messages in a row"))).await.unwrap();
    let uuid = call.initial.client_uuid.clone();
    let again = script.next_call().await;
    assert_eq!(again.initial.client_uuid, uuid);
    assert!(items.try_recv().is_err(), "nothing came through");
    drop(call);

    // Before any response, it refuses the client's first message: final.
    again.responses.send(Err(Status::invalid_argument("a late first message"))).await.unwrap();
    match next_item(&mut items).await {
        Some(Err(AutoshardingError::Refused(status))) => {
            assert_eq!(status.code(), Code::InvalidArgument, "{status:?}")
        }
        other => panic!("{other:?}"),
    }
    assert!(next_item(&mut items).await.is_none(), "the stream ended");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_assignment_naming_endpoints_not_known_yet_is_followed_once_they_are() {
    let mut script = Script::start().await;
    // The client knows "backend-<i>" for i below `known`: its view lags the server's.
    let known = Arc::new(AtomicU32::new(2));
    let view = known.clone();
    let names = move |name: &str| {
        let task: u32 = name.strip_prefix("backend-")?.parse().ok()?;
        (task < view.load(Ordering::SeqCst)).then_some(task)
    };
    let config =
        AutoshardingConfig { backoff: fast(), endpoint_names: Some(Arc::new(names)), ..Default::default() };
    let mut items = follow(&script, "users", config);
    let name = |t: u32| format!("backend-{t}");
    let mut call = script.next_call().await;
    let first = quarters(1, [0, 1, 0, 1]);
    call.assignment(&first, name, 1).await;
    assert_eq!(next_item(&mut items).await.unwrap().unwrap(), first);
    assert!(call.next_ack().await.accepted);

    // A scale-up the client has not seen yet: rejected for now.
    let scaled = quarters(2, [0, 1, 2, 3]);
    call.assignment(&scaled, name, 1).await;
    let rejected = |item: Option<Result<Assignment, AutoshardingError>>| match item {
        Some(Err(AutoshardingError::Rejected { generation: 2, reason })) => {
            assert!(reason.contains("backend-2"), "{reason}")
        }
        other => panic!("{other:?}"),
    };
    rejected(next_item(&mut items).await);
    assert!(!call.next_ack().await.accepted);

    // A new stream names the newest generation followed, so the server sends its
    // current one again.
    drop(call);
    let mut call = script.next_call().await;
    assert_eq!(call.initial.latest_generation, 1, "2 was never followed");
    call.assignment(&scaled, name, 1).await;
    rejected(next_item(&mut items).await);
    assert!(!call.next_ack().await.accepted);

    // The client's view catches up: the assignment is followed with no newer one and no
    // second ack.
    known.store(4, Ordering::SeqCst);
    assert_eq!(next_item(&mut items).await.unwrap().unwrap(), scaled);
    let newer = quarters(3, [3, 2, 1, 0]);
    call.assignment(&newer, name, 1).await;
    assert_eq!(next_item(&mut items).await.unwrap().unwrap(), newer);
    let ack = call.next_ack().await;
    assert_eq!((ack.generation, ack.accepted), (3, true), "{ack:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_reports_hold_every_counted_request_under_the_servers_rules() {
    let mut script = Script::start().await;
    let tally = KeyTally::default();
    let config = AutoshardingConfig {
        backoff: fast(),
        load_source: Some(Arc::new(tally.clone())),
        ..Default::default()
    };
    let _items = follow(&script, "users", config);
    let mut call = script.next_call().await;
    let (quantum, resolution) = (0.1, 3);
    call.config(quantum, resolution).await;

    // A hot key, and a tail of 200 keys seen once to three times.
    let hot = SliceKey::of(b"hot");
    let mut rng = steady_subset::prng::SplitMix64::new(11);
    let mut counted = 0u64;
    for i in 0..200u64 {
        for _ in 0..=i % 3 {
            tally.record(SliceKey(rng.next()));
            counted += 1;
        }
    }
    for _ in 0..300 {
        tally.record(hot);
        counted += 1;
    }
    call.reports_until(counted as f64).await;
    let rules = ReportRules { resolution_bytes: resolution as usize, ..ReportRules::default() };
    for report in &call.reports {
        validate(report, &rules, SystemTime::now()).unwrap_or_else(|e| panic!("{e}: {report:?}"));
        let ranges = &report.metric_loads["requests"].range_loads;
        let total: f64 = ranges.iter().map(|r| r.load).sum();
        for pair in ranges.windows(2) {
            let single_key = successor(&pair[0].start_key) == pair[1].start_key;
            assert!(pair[0].load <= quantum * total || single_key, "{pair:?} of {total}");
        }
    }
    let hot_start = key_bytes(hot)[..3].to_vec();
    let hot_load: f64 = call
        .reports
        .iter()
        .flat_map(|r| &r.metric_loads["requests"].range_loads)
        .filter(|r| r.start_key == hot_start)
        .map(|r| r.load)
        .sum();
    assert!(hot_load >= 300.0, "the hot key has a range of its own: {hot_load}");

    // Load counted while no stream is open (the stream is cut, and the server holds the
    // client's next one at its gate) goes in the next stream's first report.
    script.gate(false);
    let attempts = script.attempts();
    drop(call);
    eventually("the client asking for another stream", || script.attempts() > attempts).await;
    for _ in 0..50 {
        tally.record(hot);
    }
    script.gate(true);
    let mut call = script.next_call().await;
    call.config(quantum, resolution).await;
    call.reports_until(50.0).await;
    assert_eq!(call.reports.len(), 1, "all of it in the first report: {:?}", call.reports);
}

/// The next byte string of the same length (what follows a single-key range).
fn successor(key: &[u8]) -> Vec<u8> {
    let value = key.iter().fold(0u128, |v, &b| (v << 8) | u128::from(b)) + 1;
    (0..key.len()).rev().map(|i| (value >> (8 * i)) as u8).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_following_an_autosharding_server_routes_keys_where_it_says_and_reports_them() {
    let backends = serve_recording(4).await;
    let channel =
        SteadyChannel::builder(BalanceConfig::new(0, 4)).from_endpoints(endpoints(&backends)).unwrap();
    let mut script = Script::start().await;
    channel
        .follow_autosharding(
            script.endpoint(),
            "echo",
            AutoshardingConfig { backoff: fast(), ..Default::default() },
        )
        .unwrap();
    let mut call = script.next_call().await;
    assert_eq!(call.initial.target, "echo");
    call.config(0.01, 8).await;
    // Tasks named by their addresses as the channel has them, but task 3 by its index.
    let assignment = quarters(1, [2, 3, 0, 1]);
    let addresses: Vec<String> = backends.iter().map(|b| b.addr.to_string()).collect();
    call.assignment(&assignment, |t| if t == 3 { "3".to_owned() } else { addresses[t as usize].clone() }, 2)
        .await;
    assert!(call.next_ack().await.accepted);
    eventually("the assignment in force", || channel.stats().assignment_generation == Some(1)).await;

    let mut client = EchoClient::new(channel.clone());
    for _ in 0..20 {
        echo(&mut client, None, b"unkeyed").await.unwrap();
    }
    for i in 0..200 {
        let key = format!("user-{i}");
        let task = echo(&mut client, Some(&key), b"k").await.unwrap();
        assert_eq!([task], assignment.slice_for(SliceKey::of(&key)).replicas(), "{key}");
    }
    call.reports_until(200.0).await;
}
