//! gRPC's autosharding protocol (gRFC A119) between steady and peers that are not steady:
//! a client and a server written in Python with `grpcio`, from the protocol's rules
//! (`tests/a119/`), their messages generated at test time from steady's .proto.
//!
//! * The peers check each other (Python against Python), so that a failure against
//!   steady is steady's and not the peers'.
//! * The control plane's server (`steady_slicer::autosharding`) followed by the Python
//!   client: chunks, generations, reconnection, an unknown job, a refused ack counted,
//!   load reports taken as rates.
//! * steady's client (`steady_proto::autosharding::follow_autosharding`, and a
//!   `SteadyChannel` routing real requests through it) following the Python server:
//!   chunks in any order, a stale generation and a gap refused, NOT_FOUND final, load
//!   reported within the quantum and resolution.
//!
//! Each peer prints what it received and what it found wrong as JSON lines; the tests
//! assert on them, waiting for each event with a deadline. The peers run under the
//! virtual environment `scripts/test.sh` makes (`steady_testing::PythonGrpc`); without it
//! the tests are skipped, unless `STEADY_REQUIRE_PYTHON_GRPC` is set, as the script sets
//! it. Once the script has made it: `cargo test -p steady-tests --test a119_interop`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde_json::{json, Value};
use steady_balance::BalanceConfig;
use steady_proto::autosharding::key_bytes;
use steady_proto::autosharding::keys::start_bytes;
use steady_proto::autosharding::ranges::{self, RangeRates, ReportRules};
use steady_proto::autosharding::v1::RangeLoad;
use steady_proto::autosharding::{follow_autosharding, AutoshardingConfig, AutoshardingError};
use steady_slice::{Assignment, Slice, SliceKey};
use steady_slicer::autosharding::{Autosharding, EndpointNames};
use steady_slicer::Distributor;
use steady_testing::echo::echo_client::EchoClient;
use steady_testing::echo::{echo, serve_echo};
use steady_testing::loopback::{endpoint, serve, ServerGuard};
use steady_testing::{eventually, within, PythonGrpc, PythonPeer};
use steady_tonic::SteadyChannel;
use tokio::sync::mpsc;
use tokio_stream::{Stream, StreamExt};

/// The longest wait for one event: the peers start an interpreter and run protoc first.
const WAIT: Duration = Duration::from_secs(60);

/// A peer's own bound on its life, past which it stops by itself.
const PEER_DEADLINE: &str = "120";

fn peer_script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("a119").join(name)
}

fn proto() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../proto/proto/autosharding.proto")
        .to_string_lossy()
        .into_owned()
}

/// `server.py` serving `target` with `endpoints`, and where it listens.
async fn python_server(
    python: &PythonGrpc,
    target: &str,
    endpoints: &[&str],
    extra: &[&str],
) -> (PythonPeer, SocketAddr) {
    let joined = endpoints.join(",");
    let mut args =
        vec!["--proto", &proto(), "--target", target, "--endpoints", &joined, "--deadline", PEER_DEADLINE]
            .into_iter()
            .map(String::from)
            .collect::<Vec<_>>();
    args.extend(extra.iter().map(|a| a.to_string()));
    let mut server = python.spawn(&peer_script("server.py"), &args);
    let listening = server.event("listening", WAIT).await;
    let port = listening["port"].as_u64().expect("a port") as u16;
    (server, SocketAddr::from(([127, 0, 0, 1], port)))
}

/// `client.py` following `target` at `server`.
fn python_client(python: &PythonGrpc, server: SocketAddr, target: &str, extra: &[&str]) -> PythonPeer {
    let mut args = vec![
        "--proto".to_owned(),
        proto(),
        "--server".to_owned(),
        server.to_string(),
        "--target".to_owned(),
        target.to_owned(),
        "--deadline".to_owned(),
        PEER_DEADLINE.to_owned(),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    python.spawn(&peer_script("client.py"), &args)
}

/// Runs `peer` to its end and checks it exited cleanly.
async fn finish(peer: &mut PythonPeer) {
    let status = peer.finish(WAIT).await;
    assert!(status.success(), "the peer exited with {status}: {:?}\n{}", peer.seen(), peer.stderr());
}

/// `(generation, accepted)` of each assignment a client event list holds.
fn verdicts(events: &[&Value]) -> Vec<(i64, bool)> {
    events.iter().map(|e| (e["generation"].as_i64().unwrap(), e["accepted"].as_bool().unwrap())).collect()
}

/// A client's report event as steady would receive it.
fn as_report(event: &Value) -> steady_proto::autosharding::v1::LoadReport {
    let time = |field: &str| SystemTime::UNIX_EPOCH + Duration::from_secs_f64(event[field].as_f64().unwrap());
    let ranges = event["ranges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| RangeLoad {
            start_key: hex(r["start"].as_str().unwrap()),
            load: r["load"].as_f64().unwrap(),
        })
        .collect();
    ranges::report(event["metric"].as_str().unwrap(), ranges, time("start"), time("end"))
}

fn hex(text: &str) -> Vec<u8> {
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap()).collect()
}

/// Per-key load, as the client's `--loads` takes it: a key far over a quarter of the
/// total (it must get a range of its own), a neighbour, and small ones spread out.
fn loads() -> String {
    json!({
        "0000000000000001": 5.0,
        "4000000000000000": 2.0,
        "8000000000000000": 50.0,
        "8000000000000001": 1.0,
        "c000000000000000": 3.0,
    })
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_client_follows_the_python_server_and_each_checks_the_other() {
    let Some(python) = PythonGrpc::find() else { return };
    let endpoints = ["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"];
    let (mut server, address) = python_server(
        &python,
        "jobs/a",
        &endpoints,
        &["--chunks", "3", "--quantum", "0.25", "--interval", "0.1"],
    )
    .await;
    let mut client = python_client(
        &python,
        address,
        "jobs/a",
        &["--assignments", "3", "--reports", "2", "--loads", &loads(), "--stay"],
    );
    client.event("done", WAIT).await;
    // The server: every ack came back (the client stays until then: an ack is never
    // answered).
    let mut acks = Vec::new();
    for _ in 0..3 {
        let ack = server.event("ack", WAIT).await;
        acks.push((ack["generation"].as_i64().unwrap(), ack["accepted"].as_bool().unwrap()));
    }
    assert_eq!(acks, [(10, true), (11, true), (10, false)]);
    client.close_input();
    finish(&mut client).await;

    // The client: the configuration, then G and G+1 accepted, G again refused as stale.
    let config = &client.seen_named("config")[0];
    assert_eq!(config["load_quantum_fraction"], 0.25);
    assert_eq!(config["max_load_balancing_resolution_bytes"], 8);
    assert_eq!(config["load_reporting_interval"], 0.1);
    let assignments = client.seen_named("assignment");
    assert_eq!(verdicts(&assignments), [(10, true), (11, true), (10, false)]);
    assert!(assignments.iter().all(|a| a["chunks"] == 3 && a["endpoints"] == json!(endpoints)));
    assert!(client.seen_named("violation").is_empty(), "{:?}", client.seen());

    // What the server sent is what the client put together.
    let sent = server.seen_named("sent");
    assert_eq!(sent[0]["slices"], assignments[0]["slices"], "the chunks put together again");
    assert_eq!(sent[1]["slices"], assignments[1]["slices"]);
    assert_ne!(sent[0]["slices"], sent[1]["slices"], "G+1 moved the slices");

    // The reports: within the quantum and resolution by the server's reading and by
    // steady's own validation of a report.
    for _ in 0..2 {
        let report = server.event("report", WAIT).await;
        assert_eq!(report["violations"], json!([]), "{report}");
    }
    let rules = ReportRules { resolution_bytes: 8, ..ReportRules::default() };
    for report in client.seen_named("report") {
        let ranges = ranges::validate(&as_report(report), &rules, SystemTime::now()).expect("a valid report");
        let total: f64 = ranges.ranges.iter().map(|r| r.2).sum::<f64>() * ranges.interval.as_secs_f64();
        assert!((total - 61.0).abs() < 1e-6, "every key's load is reported: {total}");
    }
    assert!(server.seen_named("violation").is_empty(), "{:?}", server.seen());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_client_is_told_not_found_for_a_target_the_python_server_does_not_serve() {
    let Some(python) = PythonGrpc::find() else { return };
    let (mut server, address) = python_server(&python, "jobs/a", &["0"], &[]).await;
    let mut client = python_client(&python, address, "jobs/unknown", &[]);
    finish(&mut client).await;
    let status = &client.seen_named("status")[0];
    assert_eq!(status["code"], "NOT_FOUND", "{:?}", client.seen());
    assert!(client.seen_named("config").is_empty() && client.seen_named("assignment").is_empty());
    let stream = server.event("stream", WAIT).await;
    assert_eq!(stream["target"], "jobs/unknown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_client_fills_a_gap_refuses_one_on_purpose_and_gets_it_again_on_its_next_stream() {
    let Some(python) = PythonGrpc::find() else { return };
    let (mut server, address) =
        python_server(&python, "jobs/a", &["0", "1"], &["--gap", "--slices", "4"]).await;
    let mut client = python_client(
        &python,
        address,
        "jobs/a",
        &["--uuid", "c-1", "--assignments", "4", "--reject-first", "--stay"],
    );
    let refused = client.event("assignment", WAIT).await;
    assert_eq!((refused["generation"].as_i64(), refused["accepted"].as_bool()), (Some(10), Some(false)));
    let ack = server.event("ack", WAIT).await;
    assert_eq!(
        (ack["stream"].as_i64(), ack["generation"].as_i64(), ack["accepted"].as_bool()),
        (Some(1), Some(10), Some(false))
    );
    client.send_line("reconnect").await;
    client.event("done", WAIT).await;
    let mut acks = Vec::new();
    for _ in 0..3 {
        let ack = server.event("ack", WAIT).await;
        acks.push((
            ack["stream"].as_i64().unwrap(),
            ack["generation"].as_i64().unwrap(),
            ack["accepted"].as_bool().unwrap(),
        ));
    }
    // Refused on the first stream, so sent again on the second, where G+1 and the stale
    // G follow.
    assert_eq!(acks, [(2, 10, true), (2, 11, true), (2, 10, false)]);
    client.close_input();
    finish(&mut client).await;

    let streams = client.seen_named("stream");
    assert_eq!(streams.len(), 2);
    assert_eq!(streams[1]["latest_generation"], 0, "nothing accepted before the reconnection");
    let assignments = client.seen_named("assignment");
    assert_eq!(verdicts(&assignments), [(10, false), (10, true), (11, true), (10, false)]);
    // G lacks its second slice: the client fills the hole with a slice of no endpoint.
    let slices = assignments[1]["slices"].as_array().unwrap();
    assert_eq!(slices.len(), 4);
    assert_eq!(slices[1], json!({"start": "4000000000000000", "end": "8000000000000000", "endpoints": []}));
    assert_eq!(assignments[1]["error_message"], "gaps filled: 1");

    let hellos = server.seen_named("stream");
    assert!(hellos.iter().all(|h| h["client_uuid"] == "c-1"), "one uuid across streams: {hellos:?}");
    assert!(server.seen_named("violation").is_empty(), "{:?}", server.seen());
}

// steady's server (`steady_slicer::autosharding::Autosharding`) and the Python client.

/// A steady assignment as the Python client prints it: per slice, its start, its end
/// (`null`: open) and its tasks' names.
fn as_printed(assignment: &Assignment, names: &EndpointNames, job: &str) -> Value {
    let slices = assignment.slices();
    let printed: Vec<Value> = slices
        .iter()
        .enumerate()
        .map(|(i, slice)| {
            let end = slices.get(i + 1).map(|next| to_hex(&key_bytes(next.start)));
            let endpoints: Vec<String> = slice.replicas().iter().map(|&t| names.name(job, t)).collect();
            json!({"start": to_hex(&start_bytes(slice.start)), "end": end, "endpoints": endpoints})
        })
        .collect();
    Value::Array(printed)
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An assignment of `count` slices over 12 tasks, each slice on two of them.
fn spread(generation: u64, count: u64) -> Assignment {
    let step = u64::MAX / count;
    let slices = (0..count)
        .map(|i| Slice::new(SliceKey(i * step), [(i % 12) as u32, ((i + 5) % 12) as u32]))
        .collect();
    Assignment::new(generation, slices).unwrap()
}

/// A control plane's A119 service for job `users`, its tasks named by address, serving
/// on 127.0.0.1.
async fn steady_server(
    configure: impl FnOnce(Autosharding) -> Autosharding,
) -> (Distributor, Autosharding, SocketAddr, ServerGuard) {
    let distributor = Distributor::new();
    let names = EndpointNames::new();
    names.set("users", (0..12).map(|t| (t, format!("10.1.0.{t}:8080"))));
    let autosharding = configure(Autosharding::new(distributor.clone()).with_endpoint_names(names));
    let (address, guard) = serve(autosharding.service()).await;
    (distributor, autosharding, address, guard)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_client_follows_steadys_server_through_chunks_and_a_newer_generation() {
    let Some(python) = PythonGrpc::find() else { return };
    let (distributor, autosharding, address, _server) =
        steady_server(|a| a.with_max_chunk_bytes(8 * 1024).with_load_quantum(0.05)).await;
    let first = spread(1, 1500);
    distributor.publish("users", first.clone());
    let mut client = python_client(&python, address, "users", &["--assignments", "2", "--stay"]);

    let config = client.event("config", WAIT).await;
    assert_eq!(config["load_quantum_fraction"], 0.05);
    assert_eq!(config["max_load_balancing_resolution_bytes"], 8);
    let assignment = client.event("assignment", WAIT).await;
    assert_eq!((assignment["generation"].as_i64(), assignment["accepted"].as_bool()), (Some(1), Some(true)));
    assert!(
        assignment["chunks"].as_u64().unwrap() >= 3,
        "1,500 slices in chunks of 8 KiB: {}",
        assignment["chunks"]
    );
    assert_eq!(assignment["error_message"], "", "no slice dropped, no gap");
    let names = autosharding.endpoint_names();
    assert_eq!(assignment["slices"], as_printed(&first, names, "users"));

    let second = spread(2, 40);
    distributor.publish("users", second.clone());
    let assignment = client.event("assignment", WAIT).await;
    assert_eq!((assignment["generation"].as_i64(), assignment["accepted"].as_bool()), (Some(2), Some(true)));
    assert_eq!(assignment["slices"], as_printed(&second, names, "users"));
    client.event("done", WAIT).await;
    eventually("both acks counted", || autosharding.acks_accepted() == 2).await;
    client.close_input();
    finish(&mut client).await;
    assert!(client.seen_named("violation").is_empty(), "{:?}", client.seen());
    assert_eq!(
        (autosharding.acks_rejected(), autosharding.acks_invalid(), autosharding.invalid_messages()),
        (0, 0, 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steadys_server_answers_not_found_to_the_python_client_for_an_unknown_job() {
    let Some(python) = PythonGrpc::find() else { return };
    let (distributor, _autosharding, address, _server) =
        steady_server(|a| a.with_known_jobs(|job| job == "users")).await;
    distributor.publish("users", Assignment::single(1, vec![0]).unwrap());
    let mut client = python_client(&python, address, "orders", &[]);
    finish(&mut client).await;
    let status = &client.seen_named("status")[0];
    assert_eq!(status["code"], "NOT_FOUND", "{:?}", client.seen());
    assert!(client.seen_named("config").is_empty(), "nothing sent for an unknown job");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steadys_server_counts_and_keeps_the_python_clients_refusal() {
    let Some(python) = PythonGrpc::find() else { return };
    let (distributor, autosharding, address, _server) = steady_server(|a| a).await;
    distributor.publish("users", spread(7, 24));
    let mut client = python_client(&python, address, "users", &["--reject-first", "--stay"]);
    client.event("done", WAIT).await;
    eventually("the refusal counted", || autosharding.acks_rejected() == 1).await;
    client.close_input();
    finish(&mut client).await;
    assert_eq!(verdicts(&client.seen_named("assignment")), [(7, false)]);
    let rejections = autosharding.rejections("users");
    assert_eq!(rejections.len(), 1, "{rejections:?}");
    let kept = format!("{:?}", rejections[0]);
    assert!(kept.contains("refused on purpose by the interop client"), "{kept}");
    assert_eq!((autosharding.acks_accepted(), autosharding.acks_invalid()), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_client_reconnects_with_its_generation_and_steadys_server_sends_only_newer() {
    let Some(python) = PythonGrpc::find() else { return };
    let (distributor, autosharding, address, _server) = steady_server(|a| a).await;
    distributor.publish("users", spread(3, 24));
    let mut client = python_client(&python, address, "users", &["--assignments", "2", "--stay"]);
    assert_eq!(client.event("assignment", WAIT).await["generation"], 3);
    eventually("the first ack counted", || autosharding.acks_accepted() == 1).await;
    client.send_line("reconnect").await;
    let stream = client.event("stream", WAIT).await;
    assert_eq!((stream["stream"].as_i64(), stream["latest_generation"].as_i64()), (Some(2), Some(3)));
    // Configured again on the new stream, and nothing older than it holds.
    assert_eq!(client.event("config", WAIT).await["stream"], 2);
    distributor.publish("users", spread(4, 24));
    let assignment = client.event("assignment", WAIT).await;
    assert_eq!((assignment["stream"].as_i64(), assignment["generation"].as_i64()), (Some(2), Some(4)));
    client.event("done", WAIT).await;
    eventually("both acks counted", || autosharding.acks_accepted() == 2).await;
    client.close_input();
    finish(&mut client).await;
    assert!(client.seen_named("violation").is_empty(), "{:?}", client.seen());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steadys_server_takes_the_python_clients_load_reports_as_rates_per_range() {
    let Some(python) = PythonGrpc::find() else { return };
    type Received = Arc<Mutex<Vec<(String, String, RangeRates)>>>;
    let received: Received = Arc::default();
    let sink = Arc::clone(&received);
    let (distributor, autosharding, address, _server) = steady_server(move |a| {
        a.with_load_quantum(0.25).with_report_interval(Duration::from_millis(100)).with_client_load(
            move |job: &str, client: &str, rates| {
                sink.lock().unwrap().push((job.to_owned(), client.to_owned(), rates));
            },
        )
    })
    .await;
    distributor.publish("users", spread(1, 24));
    let mut client = python_client(
        &python,
        address,
        "users",
        &["--uuid", "py-7", "--reports", "3", "--loads", &loads(), "--stay"],
    );
    client.event("done", WAIT).await;
    eventually("three reports taken", || autosharding.reports_accepted() == 3).await;
    client.close_input();
    finish(&mut client).await;
    assert_eq!(autosharding.reports_invalid(), 0);
    let received = received.lock().unwrap();
    for (job, client, rates) in received.iter() {
        assert_eq!((job.as_str(), client.as_str()), ("users", "py-7"));
        let seconds = rates.interval.as_secs_f64();
        let total: f64 = rates.ranges.iter().map(|r| r.2 * seconds).sum();
        assert!((total - 61.0).abs() < 1e-6, "every key's load arrives: {total}");
        // The key over the quantum came alone: a range of one key, with all its load.
        let heavy = SliceKey(1 << 63);
        let alone = rates.ranges.iter().find(|r| r.0 == heavy).expect("a range at the heavy key");
        assert_eq!(alone.1, Some(SliceKey((1 << 63) + 1)));
        assert!((alone.2 * seconds - 50.0).abs() < 1e-6, "{alone:?}");
    }
}

// steady's client (`steady_proto::autosharding::follow_autosharding`, and a
// `SteadyChannel` following through it) and the Python server.

/// What `follow_autosharding` yields, read on a task of its own (the client sends its acks
/// and reports only while its stream is polled).
fn drive(
    stream: impl Stream<Item = Result<Assignment, AutoshardingError>> + Send + 'static,
) -> mpsc::UnboundedReceiver<Result<Assignment, AutoshardingError>> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(item) = stream.next().await {
            if tx.send(item).is_err() {
                return;
            }
        }
    });
    rx
}

async fn next_item(
    items: &mut mpsc::UnboundedReceiver<Result<Assignment, AutoshardingError>>,
) -> Option<Result<Assignment, AutoshardingError>> {
    within(WAIT, "the client's next item", items.recv()).await
}

/// The Python server's assignment of generation `generation`: `count` equal slices of
/// the key space, slice `i` on task `(i + generation) % tasks`, as `(start, tasks)`.
fn scripted(generation: u64, count: u64, tasks: u64) -> Vec<(u64, Vec<u32>)> {
    let step = (1u128 << 64) / count as u128;
    (0..count).map(|i| ((i as u128 * step) as u64, vec![((i + generation) % tasks) as u32])).collect()
}

fn slices_of(assignment: &Assignment) -> Vec<(u64, Vec<u32>)> {
    assignment.slices().iter().map(|s| (s.start.get(), s.replicas().to_vec())).collect()
}

/// The Python server's acks so far, as `(generation, accepted)`, waiting for `count`.
async fn acks_of(server: &mut PythonPeer, count: usize) -> Vec<(i64, bool)> {
    let mut acks = Vec::new();
    for _ in 0..count {
        let ack = server.event("ack", WAIT).await;
        acks.push((ack["generation"].as_i64().unwrap(), ack["accepted"].as_bool().unwrap()));
    }
    acks
}

/// The total load of one metric in a Python server's report event.
fn report_total(report: &Value, metric: &str) -> f64 {
    report["metrics"][metric].as_array().map_or(0.0, |r| r.iter().map(|r| r["load"].as_f64().unwrap()).sum())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steadys_client_follows_the_python_server_refuses_its_stale_assignment_and_reports_within_the_quantum(
) {
    let Some(python) = PythonGrpc::find() else { return };
    let (mut server, address) = python_server(
        &python,
        "jobs/a",
        &["0", "1", "2"],
        &["--chunks", "3", "--slices", "8", "--quantum", "0.25", "--interval", "1"],
    )
    .await;
    // Per drain: a key far over a quarter of the load, and small ones.
    let load = vec![
        (SliceKey(1), 5.0),
        (SliceKey(1 << 62), 2.0),
        (SliceKey(1 << 63), 50.0),
        (SliceKey((1 << 63) + 1), 1.0),
        (SliceKey(3 << 62), 3.0),
    ];
    let config = AutoshardingConfig {
        load_source: Some(Arc::new(move || load.clone())),
        ..AutoshardingConfig::default()
    };
    let mut items = drive(follow_autosharding(endpoint(address), "jobs/a", config).unwrap());

    let first = next_item(&mut items).await.unwrap().expect("G accepted");
    assert_eq!(first.generation(), 10);
    assert_eq!(slices_of(&first), scripted(10, 8, 3), "three chunks, slices in reverse order");
    let second = next_item(&mut items).await.unwrap().expect("G+1 accepted");
    assert_eq!(slices_of(&second), scripted(11, 8, 3));
    match next_item(&mut items).await.unwrap() {
        Err(AutoshardingError::Rejected { generation, .. }) => assert_eq!(generation, 10),
        other => panic!("the stale G must be rejected: {other:?}"),
    }
    assert_eq!(acks_of(&mut server, 3).await, [(10, true), (11, true), (10, false)]);
    let hello = &server.seen_named("stream")[0];
    assert_eq!((hello["target"].as_str(), hello["latest_generation"].as_i64()), (Some("jobs/a"), Some(0)));
    assert!(!hello["client_uuid"].as_str().unwrap().is_empty());

    for _ in 0..2 {
        let report = server.event("report", WAIT).await;
        assert_eq!(report["violations"], json!([]), "{report}");
        assert!((report_total(&report, "requests") - 61.0).abs() < 1e-6, "{report}");
    }
    assert!(server.seen_named("violation").is_empty(), "{:?}", server.seen());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steadys_client_refuses_an_assignment_the_python_server_left_a_gap_in() {
    let Some(python) = PythonGrpc::find() else { return };
    let (mut server, address) =
        python_server(&python, "jobs/a", &["0", "1"], &["--gap", "--slices", "4"]).await;
    let mut items =
        drive(follow_autosharding(endpoint(address), "jobs/a", AutoshardingConfig::default()).unwrap());
    // Valid by the protocol's rules (the client fills the gap with no endpoint), but
    // steady routes every key: it refuses, says why, and keeps what it had (nothing).
    match next_item(&mut items).await.unwrap() {
        Err(AutoshardingError::Rejected { generation, reason }) => {
            assert_eq!(generation, 10);
            assert!(!reason.is_empty());
        }
        other => panic!("an assignment with a gap must be rejected: {other:?}"),
    }
    let ack = server.event("ack", WAIT).await;
    assert_eq!((ack["generation"].as_i64(), ack["accepted"].as_bool()), (Some(10), Some(false)));
    assert!(!ack["error_message"].as_str().unwrap().is_empty(), "the refusal says why: {ack}");
    assert!(ack["error_message"].as_str().unwrap().chars().count() <= 512);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steadys_client_stops_when_the_python_server_answers_not_found() {
    let Some(python) = PythonGrpc::find() else { return };
    let (mut server, address) = python_server(&python, "jobs/a", &["0"], &[]).await;
    let mut items =
        drive(follow_autosharding(endpoint(address), "jobs/unknown", AutoshardingConfig::default()).unwrap());
    match next_item(&mut items).await.unwrap() {
        Err(AutoshardingError::Refused(status)) => assert_eq!(status.code(), tonic::Code::NotFound),
        other => panic!("NOT_FOUND ends the stream: {other:?}"),
    }
    assert!(next_item(&mut items).await.is_none(), "and nothing follows");
    let hello = server.event("stream", WAIT).await;
    assert_eq!(hello["target"], "jobs/unknown");
    assert_eq!(server.seen_named("stream").len(), 1, "not asked again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steady_channel_routes_by_the_python_servers_assignment_and_reports_its_keyed_requests() {
    let Some(python) = PythonGrpc::find() else { return };
    let mut backends = Vec::new();
    for task in 0..3 {
        backends.push(serve_echo(task).await);
    }
    let names: Vec<String> = backends.iter().map(|(a, _)| a.to_string()).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let (mut server, address) = python_server(
        &python,
        "jobs/echo",
        &names,
        &["--slices", "8", "--quantum", "0.25", "--interval", "1"],
    )
    .await;
    let channel = SteadyChannel::builder(BalanceConfig::new(0, backends.len()))
        .from_endpoints(backends.iter().map(|&(a, _)| endpoint(a)).collect())
        .unwrap();
    channel.follow_autosharding(endpoint(address), "jobs/echo", AutoshardingConfig::default()).unwrap();
    // The server names tasks by address; the channel maps them through its own view.
    assert_eq!(acks_of(&mut server, 3).await, [(10, true), (11, true), (10, false)]);
    eventually("the channel routes by G+1", || channel.stats().assignment_generation == Some(11)).await;
    assert!(channel.balance().wait_for_members(3, Duration::from_secs(10)).await);

    let mut client = EchoClient::new(channel.clone());
    let requests = 40;
    for n in 0..requests {
        let key = format!("user:{n}");
        let slice = SliceKey::of(&key).get() >> 61; // eight equal slices
        let owner = ((slice + 11) % 3) as u32;
        let served = echo(&mut client, Some(&key), b"hi").await.unwrap();
        assert_eq!(served, owner, "{key} (slice {slice}) served by the task the Python server named");
    }

    // Every keyed request comes back as load, within the quantum, in one report or more.
    let mut reported = 0.0;
    while reported < requests as f64 {
        let report = server.event("report", WAIT).await;
        assert_eq!(report["violations"], json!([]), "{report}");
        reported += report_total(&report, "requests");
    }
    assert_eq!(reported, requests as f64, "each keyed request counted once");
    assert!(server.seen_named("violation").is_empty(), "{:?}", server.seen());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steadys_client_reports_at_the_coarser_resolution_and_finer_quantum_the_python_server_asks() {
    let Some(python) = PythonGrpc::find() else { return };
    let (mut server, address) = python_server(
        &python,
        "jobs/a",
        &["0"],
        &["--slices", "1", "--resolution", "2", "--quantum", "0.05", "--interval", "1"],
    )
    .await;
    // 200 keys spread over the key space, some sharing their first two bytes, one hot.
    let load: Vec<(SliceKey, f64)> = (0..200u64)
        .map(|i| (SliceKey(i.wrapping_mul(0x9E37_79B9_7F4A_7C15)), if i == 7 { 100.0 } else { 1.0 }))
        .collect();
    let total: f64 = load.iter().map(|(_, l)| l).sum();
    let config = AutoshardingConfig {
        load_source: Some(Arc::new(move || load.clone())),
        ..AutoshardingConfig::default()
    };
    let mut items = drive(follow_autosharding(endpoint(address), "jobs/a", config).unwrap());
    assert_eq!(next_item(&mut items).await.unwrap().expect("G accepted").generation(), 10);

    let report = server.event("report", WAIT).await;
    assert_eq!(report["violations"], json!([]), "{report}");
    assert!((report_total(&report, "requests") - total).abs() < 1e-6, "{report}");
    let ranges = report["metrics"]["requests"].as_array().unwrap();
    assert!(
        ranges.iter().all(|r| r["start"].as_str().unwrap().len() <= 4),
        "start keys of at most 2 bytes: {report}"
    );
    // 199 of the load in keys of 1 under a limit of 5% of 299 (14.95): 14 ranges at least,
    // and the hot key's own.
    assert!(ranges.len() >= 15, "a 5% quantum cuts the load into many ranges: {}", ranges.len());
}
