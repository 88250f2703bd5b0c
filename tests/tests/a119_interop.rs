//! gRPC's autosharding protocol (gRFC A119) between steady and peers that are not steady:
//! a client and a server written in Python with `grpcio`, from the protocol's rules
//! (`tests/a119/`), their messages generated at test time from steady's .proto.
//!
//! First the peers check each other (Python against Python), so that a failure against
//! steady is steady's and not the peers'. Each peer prints what it received and what it
//! found wrong as JSON lines; the tests assert on them, waiting for each event with a
//! deadline. The peers run under the virtual environment `scripts/test.sh` makes
//! (`steady_testing::PythonGrpc`); without it the tests are skipped, unless
//! `STEADY_REQUIRE_PYTHON_GRPC` is set, as the script sets it.
//!
//! ```text
//! scripts/test.sh -p steady-tests --test a119_interop    # or, with the environment made:
//! cargo test -p steady-tests --test a119_interop
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde_json::{json, Value};
use steady_proto::autosharding::ranges::{self, ReportRules};
use steady_proto::autosharding::v1::RangeLoad;
use steady_testing::{PythonGrpc, PythonPeer};

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
