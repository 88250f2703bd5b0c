//! The `steady-slicer` binary's pages (`--metrics-listen`), a fleet of one instance
//! serving one job: `/metrics` parses as Prometheus text and carries the control plane's
//! instruments (the Assigner's labelled by job, the fleet's); the overview at `/` lists
//! the job, led here; the job's page at `/jobs/users`, loaded in a real headless Chromium
//! (`steady_testing::Browser`; mandatory in `scripts/test.sh`), names the job's tasks, the
//! generation and the imbalance of the load six reporting Slicelets send, and
//! `/jobs/users.json` gives the six tasks with their loads. Under a job spec the tasks
//! cannot meet, `/metrics` counts the slices that miss each constraint and the job's page
//! shows the missed constraint, marked, with why.
//!
//! `STEADY_SCREENSHOT=$PWD/docs/status-page.png cargo test -p steady-slicer-server --test pages`
//! (run from the workspace root: a test runs in its crate's folder)
//! also writes the README's screenshot.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use steady_slice::SliceKey;
use steady_slicelet::Slicelet;
use steady_testing::eventually_blocking;
use tonic::transport::Endpoint;

mod a119_client;
use a119_client::A119Client;

const BIN: &str = env!("CARGO_BIN_EXE_steady-slicer");
/// The most any wait may take.
const WAIT: Duration = Duration::from_secs(30);
const TASKS: u32 = 6;

/// The binary, killed when the test ends; its stdout kept open.
struct Running {
    child: std::process::Child,
    _stdout: std::io::Lines<BufReader<std::process::ChildStdout>>,
    grpc: String,
    pages: String,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start() -> Running {
    start_with(&[])
}

/// [`start`], with `extra` arguments.
fn start_with(extra: &[&str]) -> Running {
    let mut child = Command::new(BIN)
        .args(["--job", "users", "--tasks", &TASKS.to_string(), "--listen", "127.0.0.1:0"])
        .args(["--cadence-ms", "200", "--metrics-listen", "0"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    // "steady-slicer: job users on 127.0.0.1:PORT (Memory store), candidate assigner, eventual"
    let first = stdout.next().unwrap().unwrap();
    let grpc = first.split_whitespace().nth(4).unwrap().to_owned();
    // "steady-slicer: status page http://127.0.0.1:PORT/ and metrics http://..."
    let second = stdout.next().unwrap().unwrap();
    let pages = second.split_whitespace().nth(3).unwrap().trim_end_matches('/').to_owned();
    assert!(pages.starts_with("http://127.0.0.1:"), "a bare port listens on loopback: {second}");
    Running { child, _stdout: stdout, grpc, pages }
}

/// The body of `GET url` (plain HTTP/1.1), which must answer 200.
fn get(url: &str) -> String {
    let (head, body) = get_response(url);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body
}

/// The head and body of `GET url` (plain HTTP/1.1).
fn get_response(url: &str) -> (String, String) {
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_once('/').map_or((rest, "/".to_owned()), |(h, p)| (h, format!("/{p}")));
    let mut stream = TcpStream::connect(host).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    (head.to_owned(), body.to_owned())
}

/// One sample: the metric's name, its labels, its value.
type Sample = (String, BTreeMap<String, String>, f64);

/// Parses Prometheus text (format 0.0.4) strictly: every sample's name is valid and
/// declared by a `# TYPE` line before it, labels are well formed, values are numbers.
fn parse_prometheus(text: &str) -> Vec<Sample> {
    let valid = |name: &str| {
        !name.is_empty()
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    };
    let mut typed = BTreeSet::new();
    let mut samples = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            assert!(valid(name), "{line}");
            assert!(["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind), "{line}");
            assert!(typed.insert(name.to_owned()), "declared twice: {line}");
            continue;
        }
        if line.starts_with("# HELP ") || line.is_empty() {
            continue;
        }
        assert!(!line.starts_with('#'), "{line}");
        let (series, value) = line.rsplit_once(' ').unwrap();
        let value: f64 = value.parse().unwrap_or_else(|_| panic!("not a number: {line}"));
        let (name, labels) = match series.split_once('{') {
            Some((name, labels)) => (name, labels.strip_suffix('}').unwrap_or_else(|| panic!("{line}"))),
            None => (series, ""),
        };
        assert!(valid(name), "{line}");
        assert!(typed.contains(name), "no # TYPE before {line}");
        let mut map = BTreeMap::new();
        for pair in labels.split(',').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or_else(|| panic!("{line}"));
            assert!(valid(key), "{line}");
            let value =
                value.strip_prefix('"').and_then(|v| v.strip_suffix('"')).unwrap_or_else(|| panic!("{line}"));
            map.insert(key.to_owned(), value.to_owned());
        }
        samples.push((name.to_owned(), map, value));
    }
    samples
}

fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples
        .iter()
        .find(|(n, l, _)| n == name && labels.iter().all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v)))
        .map(|(_, _, v)| *v)
}

/// Scrapes until `ready` holds for the parsed samples (bounded by [`WAIT`]).
fn scrape_until(pages: &str, what: &str, ready: impl Fn(&[Sample]) -> bool) -> Vec<Sample> {
    let mut samples = Vec::new();
    eventually_blocking(WAIT, what, || {
        samples = parse_prometheus(&get(&format!("{pages}/metrics")));
        ready(&samples)
    });
    samples
}

/// Six backends: each follows the binary's assignments, serves keys (task `t` ten times
/// the keys of task 0, so the load is uneven) and reports its load every 100 ms.
fn backends(runtime: &tokio::runtime::Runtime, grpc: &str) -> Vec<(Slicelet, steady_slicelet::LoadReporter)> {
    let _guard = runtime.enter();
    let endpoint = Endpoint::from_shared(format!("http://{grpc}")).unwrap();
    (0..TASKS)
        .map(|task| {
            let slicelet = Slicelet::new(task);
            let watch =
                steady_proto::watch_assignments(endpoint.clone(), "users", Default::default()).unwrap();
            slicelet.follow(watch);
            let reporter = slicelet.report_to(endpoint.clone(), "users", Duration::from_millis(100));
            (slicelet, reporter)
        })
        .collect()
}

/// Traffic until `stop`: every 20 ms each backend records requests for 200 keys,
/// `1 + 10 * task` times (so the load is uneven, and every report after a new
/// generation carries load again).
fn serve_keys(
    slicelets: Vec<Slicelet>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            for slicelet in &slicelets {
                for round in 0..=slicelet.task() * 10 {
                    for k in 0..200u64 {
                        slicelet.record(SliceKey(k.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(round)));
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    })
}

#[test]
fn metrics_parse_as_prometheus_text_and_carry_the_control_plane_s_instruments() {
    let running = start();
    // The Assigner records its generation when the store has it, and publishes it to the
    // Distributor after: wait for the publication itself, not for the generation.
    let users = [("steady_job", "users"), ("steady_candidate", "assigner")];
    let samples = scrape_until(&running.pages, "the first generation published, and the leadership", |s| {
        value(s, "steady_assigner_generation", &users).is_some_and(|g| g >= 1.0)
            && value(s, "steady_assigner_leader", &users) == Some(1.0)
            && value(s, "steady_distributor_publications_total", &[]).is_some_and(|p| p >= 1.0)
            && value(s, "steady_fleet_assigners", &[("steady_state", "leading")]) == Some(1.0)
    });
    for name in [
        "steady_assigner_runs_total",
        "steady_assigner_publications_total",
        "steady_distributor_publications_total",
        "steady_distributor_watchers",
        "steady_autosharding_streams",
        "steady_autosharding_encodings_total",
        "steady_collector_streams",
        "steady_assigner_run_time_seconds",
        "steady_assigner_recalls_total",
        "steady_assigner_recall_pending",
    ] {
        assert!(samples.iter().any(|(n, _, _)| n == name), "no {name}");
    }
    assert!(value(&samples, "steady_collector_reports_total", &[("steady_outcome", "refused")]) == Some(0.0));
    assert!(value(&samples, "steady_distributor_publications_total", &[]).is_some_and(|p| p >= 1.0));
    // Every Assigner series names the job and this instance; the fleet's instruments
    // count one job, one instance, one Assigner leading here.
    for name in
        ["steady_assigner_runs_total", "steady_assigner_publications_total", "steady_assigner_errors_total"]
    {
        assert!(value(&samples, name, &users).is_some(), "no {name} of users");
    }
    for (name, labels, _) in samples.iter().filter(|(n, _, _)| n.starts_with("steady_assigner_")) {
        assert_eq!(labels.get("steady_job").map(String::as_str), Some("users"), "{name} {labels:?}");
    }
    assert_eq!(value(&samples, "steady_fleet_jobs", &[]), Some(1.0));
    assert_eq!(value(&samples, "steady_fleet_instances", &[]), Some(1.0));
    assert_eq!(value(&samples, "steady_fleet_assigners", &[("steady_state", "leading")]), Some(1.0));
    assert_eq!(value(&samples, "steady_fleet_assigners", &[("steady_state", "campaigning")]), Some(0.0));
}

/// An assignment an A119 client refuses is on the job's page: the client, the generation
/// and its words (escaped), for as long as the instance keeps them.
#[test]
fn the_job_page_lists_an_assignment_an_a119_client_refused() {
    let running = start();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let refused = async {
        loop {
            // NOT_FOUND until the instance's fleet shows the job it was started with.
            let mut client = A119Client::open(&running.grpc, "users", "go-client-7").await.unwrap();
            match client.assignment().await {
                Ok(assignment) => {
                    client.ack(assignment.generation, false, "<unknown> endpoint 10.0.0.9:80").await;
                    return (client, assignment.generation);
                }
                Err(status) => assert_eq!(status.code(), tonic::Code::NotFound, "{status:?}"),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let client = runtime.block_on(async { tokio::time::timeout(WAIT, refused).await });
    let client = client.expect("an assignment over A119");
    let (_stream, generation) = client;
    let mut section = String::new();
    eventually_blocking(WAIT, "the refusal on the job's page", || {
        let page = get(&format!("{}/jobs/users", running.pages));
        let Some(after) = page.split("id=\"refusals\"").nth(1) else { return false };
        section = after.split("</table>").next().unwrap().to_owned();
        true
    });
    assert!(section.contains("<td>go-client-7</td>"), "{section}");
    assert!(section.contains(&format!("<td>{generation}</td>")), "{section}");
    assert!(section.contains("&lt;unknown&gt; endpoint 10.0.0.9:80"), "{section}");
}

/// The overview lists the job, led here, linking to its page; `/jobs/users.json` gives
/// the six tasks, each with the load of its latest report once reports arrive; an
/// unknown job is 404.
#[test]
fn the_overview_lists_the_job_and_its_json_gives_six_tasks_with_loads() {
    let running = start();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let backends = backends(&runtime, &running.grpc);
    eventually_blocking(WAIT, "the backends to get an assignment", || {
        backends.iter().all(|(s, _)| s.load_report("users").is_some())
    });
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let traffic = serve_keys(backends.iter().map(|(s, _)| s.clone()).collect(), stop.clone());

    // The backends hold an assignment once the Assigner has published it; the pages show
    // its leadership from the instance's status, which follows: wait for the row to say so.
    let mut row = String::new();
    eventually_blocking(WAIT, "the overview's row of users to show it led here", || {
        let overview = get(&format!("{}/", running.pages));
        assert!(overview.contains("<a href=\"/jobs/users\">users</a>"), "{overview}");
        row = overview
            .split("<a href=\"/jobs/users\">")
            .nth(1)
            .unwrap()
            .split("</tr>")
            .next()
            .unwrap()
            .to_owned();
        row.contains("<td class=\"here\">leading</td>")
    });
    assert!(row.contains("weighted-move"), "{row}");

    let mut json = serde_json::Value::Null;
    // Task 5 serves 51 times the requests of task 0 per key (the traffic above): its
    // reported load passes task 0's once reports carry the traffic (on a loaded machine,
    // the first reports may predate it).
    let load = |json: &serde_json::Value, task: usize| json["tasks"][task]["load"].as_f64();
    eventually_blocking(WAIT, "a load for every task in /jobs/users.json, task 5's above task 0's", || {
        json = serde_json::from_str(&get(&format!("{}/jobs/users.json", running.pages))).unwrap();
        json["tasks"].as_array().is_some_and(|t| t.iter().all(|t| t["load"].as_f64().is_some()))
            && load(&json, 5) > load(&json, 0)
            && json["here"] == "leading"
    });
    assert_eq!(
        (&json["job"], &json["here"], &json["owner"]),
        (&"users".into(), &"leading".into(), &"assigner".into())
    );
    assert!(json["generation"].as_u64().is_some_and(|g| g >= 1), "{json}");
    let tasks = json["tasks"].as_array().unwrap();
    assert_eq!(
        tasks.iter().map(|t| t["task"].as_u64().unwrap()).collect::<Vec<_>>(),
        (0..u64::from(TASKS)).collect::<Vec<_>>()
    );
    assert!(tasks.iter().all(|t| t["state"] == "serving" && t["slices"].as_u64().unwrap() >= 1), "{json}");
    let share: f64 = tasks.iter().map(|t| t["key_share"].as_f64().unwrap()).sum();
    assert!((share - 1.0).abs() < 1e-9, "{json}");

    let (head, _) = get_response(&format!("{}/jobs/orders.json", running.pages));
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    traffic.join().unwrap();
    drop(backends);
}

#[test]
fn the_status_page_renders_the_tasks_generation_and_imbalance_in_a_real_browser() {
    let Some(browser) = steady_testing::Browser::find() else { return };
    let running = start();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let backends = backends(&runtime, &running.grpc);
    // Wait for every backend to hold the assignment, then load them unevenly.
    eventually_blocking(WAIT, "the backends to get an assignment", || {
        backends.iter().all(|(s, _)| s.load_report("users").is_some())
    });
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let traffic = serve_keys(backends.iter().map(|(s, _)| s.clone()).collect(), stop.clone());
    // The page shows an imbalance once reports with load have arrived: load it in the
    // browser until it does (each load a real render), within the bound.
    let deadline = Instant::now() + WAIT;
    let (dom, imbalance) = loop {
        let dom = browser.dump_dom(&format!("{}/jobs/users", running.pages));
        // The page shows the leadership from the instance's status, which follows the
        // Assigner's start: wait for it too.
        if let Ok(imbalance) = text_of(&dom, "imbalance").parse::<f64>() {
            if dom.contains("assigner leads") {
                break (dom, imbalance);
            }
        }
        assert!(
            Instant::now() < deadline,
            "no imbalance and leader on the page within {WAIT:?}: {:?}",
            text_of(&dom, "imbalance")
        );
    };
    assert!(imbalance >= 1.0, "imbalance {imbalance}: the busiest task's load over the mean");
    for task in 0..TASKS {
        assert!(dom.contains(&format!(" task {task}</td>")), "task {task} not on the page");
    }
    let generation: u64 = text_of(&dom, "generation").parse().unwrap();
    assert!(generation >= 1, "generation {generation}");
    assert!(
        dom.contains("id=\"keyspace\"") && dom.contains("assigner leads"),
        "the key space and the leader"
    );
    // A screenshot renders too; on request it becomes the README's.
    let shot = std::env::temp_dir().join(format!("steady-status-{}.png", std::process::id()));
    browser.screenshot(&format!("{}/jobs/users", running.pages), &shot, 1100, 820);
    if let Ok(target) = std::env::var("STEADY_SCREENSHOT") {
        std::fs::copy(&shot, &target).unwrap();
    }
    let _ = std::fs::remove_file(shot);
    // The overview, rendered too: the job, led here, links to its page (the page above
    // says the Assigner here leads, so the overview, from the same status, does too).
    let overview = browser.dump_dom(&format!("{}/", running.pages));
    assert_eq!(text_of(&overview, "instance"), "assigner");
    assert_eq!(text_of(&overview, "jobs-count"), "1");
    assert!(overview.contains("<a href=\"/jobs/users\">users</a>"), "{overview}");
    assert!(overview.contains("<td class=\"here\">leading</td>"), "{overview}");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    traffic.join().unwrap();
    drop(backends);
}

/// The text of the element with `id` in a serialized DOM.
fn text_of<'a>(dom: &'a str, id: &str) -> &'a str {
    let marker = format!("id=\"{id}\">");
    let start = dom.find(&marker).unwrap_or_else(|| panic!("no #{id}")) + marker.len();
    dom[start..].split('<').next().unwrap_or_default()
}

/// A job spec the six tasks cannot meet: a replica of every slice in each of zones a, b
/// and c, and the tasks only in a (0-2) and b (3-5). Written to a file of its own, removed
/// when dropped.
struct SpecFile(std::path::PathBuf);

impl SpecFile {
    fn infeasible(name: &str) -> Self {
        let path = std::env::temp_dir().join(format!("steady-pages-{name}-{}.json", std::process::id()));
        std::fs::write(
            &path,
            r#"{
              "replicas": { "min": 2 },
              "constraints": { "spread": "zones", "replica_per_zone": true, "zones": ["a", "b", "c"] },
              "tasks": [ { "range": [0, 2], "zone": "a" }, { "range": [3, 5], "zone": "b" } ]
            }"#,
        )
        .unwrap();
        Self(path)
    }

    fn arg(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for SpecFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The placement the spec misses is in `/metrics`: slices per constraint (every slice
/// misses replica-per-zone, none spread-zones) and the constraint the tasks cannot meet.
#[test]
fn metrics_name_the_constraint_an_infeasible_spec_misses() {
    let spec = SpecFile::infeasible("metrics");
    let running = start_with(&["--spec", spec.arg()]);
    let violations = "steady_assigner_placement_violations";
    let samples = scrape_until(&running.pages, "the first generation published", |s| {
        value(s, "steady_distributor_publications_total", &[]).is_some_and(|p| p >= 1.0)
            && value(s, violations, &[("steady_constraint", "replica-per-zone")]).is_some_and(|v| v > 0.0)
    });
    for constraint in ["min-replicas", "spread-zones", "spread-racks"] {
        assert_eq!(
            value(&samples, violations, &[("steady_constraint", constraint)]),
            Some(0.0),
            "{constraint}"
        );
    }
    let infeasible = |c| value(&samples, "steady_assigner_placement_infeasible", &[("steady_constraint", c)]);
    assert_eq!(infeasible("replica-per-zone"), Some(1.0));
    assert_eq!(infeasible("spread-zones"), Some(0.0));
    assert!(samples
        .iter()
        .any(|(n, l, _)| n == violations && l.get("steady_job").map(String::as_str) == Some("users")));
}

/// The page of a job whose spec cannot be met shows, in a real browser, the
/// constraint it misses (marked, with its slices) and why: zone c has no serving task.
#[test]
fn the_status_page_shows_the_constraint_an_infeasible_spec_misses_in_a_real_browser() {
    let Some(browser) = steady_testing::Browser::find() else { return };
    let spec = SpecFile::infeasible("page");
    let running = start_with(&["--spec", spec.arg()]);
    // The first loads may come before the first run, or before the instance's status
    // shows its own Assigner leading (the page then sends readers to "the Assigner's
    // pages"): load until the page has this instance's run.
    let deadline = Instant::now() + WAIT;
    let dom = loop {
        let dom = browser.dump_dom(&format!("{}/jobs/users", running.pages));
        if !["no run yet", "on the Assigner's pages"].contains(&text_of(&dom, "placement")) {
            break dom;
        }
        assert!(Instant::now() < deadline, "no run on the page within {WAIT:?}");
    };
    assert_eq!(text_of(&dom, "placement"), "VIOLATED (below)", "{dom}");
    assert!(dom.contains("<section id=\"violations\" class=\"violated\""), "{dom}");
    assert_eq!(
        text_of(&dom, "infeasible"),
        "Infeasible: constraint replica-per-zone cannot be met: zone c has no serving task."
    );
    // The missed constraint's row: every slice, the whole key space.
    let row =
        dom.split("<td class=\"constraint\">replica-per-zone</td>").nth(1).expect("a replica-per-zone row");
    let cells: Vec<&str> = row
        .split("</tr>")
        .next()
        .unwrap()
        .split("<td>")
        .skip(1)
        .map(|c| c.trim_end_matches("</td>"))
        .collect();
    let slices: usize = cells[0].parse().unwrap();
    assert!(slices >= 1, "{cells:?}");
    assert_eq!(cells[1], "100.0%", "{cells:?}");
    assert!(!dom.contains("<td class=\"constraint\">spread-zones</td>"), "the spread is met: {dom}");
}
